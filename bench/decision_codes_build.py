"""The decision-codes bench's subject: a random-weight Qwen3 of Qwen3-0.6B's shape exported as two packages
(``causal`` and ``prefix_causal`` with its exact int8 backbone) into a cache, built in a subprocess
(``python -m bench.decision_codes build``: it imports torch) as many layers as memory allows, and reused.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.report import ROOT
from bench.harness.runners import offline_env

CACHE_DIR = ROOT / ".cache" / "bench-decision-codes"
SEED = 0
#: How the build directory is laid out.
SOURCE = "source"
PACKAGES = {"causal": "causal", "prefix_causal": "state-once"}
#: The state-once package is also quantized: the issue's targets are for the exact int8 backbone.
INT8 = "int8"
INT8_FILE = "model.int8.onnx"
BUILD_FILE = "build.json"
BUILD_TIMEOUT_S = 1200
#: Peak memory of the build per backbone byte (fp32 weights): the torch model, its ONNX export and the
#: verification's ORT session are alive together (measured 9.8 GB peak RSS at 28 layers, 1.77 GB).
BUILD_MEMORY_PER_WEIGHT_BYTE = 6.0
#: The run's processes hold about a copy of the weights each: two servers, the engine worker, torch.
RUN_MEMORY_PER_WEIGHT_BYTE = 5.0
MEMORY_MARGIN_BYTES = 2 * 1024**3


@dataclass(frozen=True)
class Shape:
    """The backbone's shape (Qwen3Config fields)."""

    hidden_size: int = 1024
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    head_dim: int = 128
    intermediate_size: int = 3072

    def backbone_parameters(self) -> int:
        """Parameters of the decoder layers (attention, MLP, norms), the embedding excluded."""
        h, q, kv = self.hidden_size, self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        attention = h * q + 2 * h * kv + q * h + 2 * self.head_dim  # q, k, v, o and the q/k norms
        mlp = 3 * h * self.intermediate_size
        return self.num_hidden_layers * (attention + mlp + 2 * h)


QWEN3_0_6B = Shape()
#: Layers to build: all of Qwen3-0.6B's unless memory does not allow (see ensure_build).
LAYERS = QWEN3_0_6B.num_hidden_layers


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo's fields in bytes (the file gives kB)."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        fields = value.split()
        if sep and fields and fields[0].isdigit():
            out[key.strip()] = int(fields[0]) * (1024 if len(fields) > 1 and fields[1] == "kB" else 1)
    return out


def layers_that_fit(available: int, shape: Shape, per_weight_byte: float, margin: int = MEMORY_MARGIN_BYTES) -> int:
    """The most decoder layers (at most the shape's) whose fp32 weights, times ``per_weight_byte``,
    fit in ``available`` bytes after ``margin``; 0 when not even one does."""
    per_layer = 4 * shape.backbone_parameters() / shape.num_hidden_layers
    budget = available - margin
    if budget <= 0:
        return 0
    return int(min(shape.num_hidden_layers, budget // (per_layer * per_weight_byte)))


def token_rows(vocab: int, prefix: int, branch: int, branches: int,
               seed: int = SEED) -> tuple[list[int], list[list[int]]]:
    """Random ids (the same for a seed): a prefix and ``branches`` continuations of ``branch`` tokens.

    Ids below 8 are left out so that no row starts with the fixture's special tokens (it would not
    change the cost, only what the ids read as).
    """
    rng = np.random.default_rng(seed)
    draw = lambda n: rng.integers(8, vocab, size=n).tolist()  # noqa: E731
    return draw(prefix), [draw(branch) for _ in range(branches)]


# ---- the build (a subprocess: it imports torch) --------------------------------------------------


def build_source(d: Path, shape: Shape, seed: int = SEED) -> Path:
    """A random-weight Qwen3ForCausalLM directory of ``shape`` with the converters' fixture tokenizer.

    Everything but the shape is the converters' decision-codes fixture: its tokenizer, chat
    template, positions and ids; the initialisation is Qwen's own (std 0.02), which keeps 28 layers
    of random weights numerically tame.
    """
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    from converters.decision_codes.fixture import FIXTURE_CHAT_TEMPLATE, FIXTURE_MAX_POSITIONS, train_fixture_tokenizer

    tok = train_fixture_tokenizer()
    config = Qwen3Config(
        vocab_size=tok.get_vocab_size(), tie_word_embeddings=True, max_position_embeddings=FIXTURE_MAX_POSITIONS,
        rope_theta=1_000_000.0, rms_norm_eps=1e-6, initializer_range=0.02,
        pad_token_id=tok.token_to_id("<|endoftext|>"), eos_token_id=tok.token_to_id("<|im_end|>"),
        bos_token_id=None, **asdict(shape))
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).eval()
    d.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        model_input_names=["input_ids", "attention_mask"], model_max_length=FIXTURE_MAX_POSITIONS,
        chat_template=FIXTURE_CHAT_TEMPLATE).save_pretrained(d)
    return d


def build(out: Path, shape: Shape, seed: int = SEED) -> dict[str, Any]:
    """The source and both packages under ``out``, and build.json saying what was built and how long it took."""
    from converters.decision_codes.export import DecisionCodesOptions, export_decision_codes
    from converters.decision_codes.fixture import FIXTURE_LIMITS, FIXTURE_RELEASE_DATE

    out.mkdir(parents=True, exist_ok=True)
    (out / BUILD_FILE).unlink(missing_ok=True)  # a half-built cache is never taken for a built one
    timings: dict[str, float] = {}
    started = time.perf_counter()
    src = build_source(out / SOURCE, shape, seed)
    timings["source"] = time.perf_counter() - started
    for mode, name in PACKAGES.items():
        t0 = time.perf_counter()
        opts = DecisionCodesOptions(
            attention_mode=mode, name=f"qwen3-0.6b-shape-{name}",
            description=f"Random-weight Qwen3 of Qwen3-0.6B's shape ({shape.num_hidden_layers} layers, {mode}); "
                        "a benchmark subject, not a model",
            version="0.0.1", release_date=FIXTURE_RELEASE_DATE, license="Apache-2.0",
            source_name=f"edge-runtime bench qwen3-0.6b-shape (seed {seed})",
            validated_input_tokens=FIXTURE_LIMITS["validated_input_tokens"],
            max_request_tokens=FIXTURE_LIMITS["max_request_tokens"] if mode == "prefix_causal" else None,
            quantize=INT8 if mode == "prefix_causal" else None)
        export_decision_codes(src, out / name, opts)
        timings[name] = time.perf_counter() - t0
    record = {"shape": asdict(shape), "seed": seed, "timings_s": {k: round(v, 1) for k, v in timings.items()},
              "graph_bytes": {name: (out / name / "model.onnx").stat().st_size for name in PACKAGES.values()}}
    int8_graph = out / PACKAGES["prefix_causal"] / INT8_FILE
    record["graph_bytes"][f"state-once {INT8}"] = int8_graph.stat().st_size + _data_bytes(int8_graph)
    (out / BUILD_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


def build_main(args: argparse.Namespace) -> int:
    shape = Shape(**{**asdict(QWEN3_0_6B), "num_hidden_layers": args.layers})
    record = build(args.out, shape, args.seed)
    print(json.dumps(record))
    return 0


def _data_bytes(graph: Path) -> int:
    """Bytes of a graph's external data file, when it has one."""
    data = graph.with_name(graph.name + ".data")
    return data.stat().st_size if data.is_file() else 0


def read_build(cache: Path) -> dict[str, Any] | None:
    """build.json of a complete build in ``cache`` (both packages and the int8 graph written), else None."""
    path = cache / BUILD_FILE
    if not path.is_file() or not all((cache / n / "card.json").is_file() for n in PACKAGES.values()):
        return None
    if not (cache / PACKAGES["prefix_causal"] / INT8_FILE).is_file():
        return None  # built before the int8 backbone was part of the comparison
    return json.loads(path.read_text(encoding="utf-8"))


def mem_available() -> int:
    """MemAvailable in bytes."""
    return parse_meminfo(Path("/proc/meminfo").read_text())["MemAvailable"]


def ensure_build(cache: Path, log_dir: Path) -> dict[str, Any]:
    """A build of LAYERS of Qwen3-0.6B's layers (fewer if memory does not allow), reused when already there.

    A cached build is kept when it has at least the layers that fit now (so a briefly busy machine
    does not throw away a full build); otherwise it is built in a subprocess, which imports torch.
    """
    fit = min(LAYERS, layers_that_fit(mem_available(), QWEN3_0_6B, BUILD_MEMORY_PER_WEIGHT_BYTE))
    existing = read_build(cache)
    if existing is not None and existing["shape"]["num_hidden_layers"] >= max(fit, 1):
        return existing
    if fit < 1:
        raise RuntimeError(f"not enough free memory to build even one layer "
                           f"({mem_available() / 1024**3:.1f} GiB available)")
    command = [sys.executable, "-m", "bench.decision_codes", "build", "--out", str(cache), "--layers", str(fit)]
    print(f"building the decision-codes packages ({fit} layers) into {cache}: {' '.join(command[1:])}", flush=True)
    env = offline_env()
    with open(log_dir / "decision-codes-build.log", "wb") as log:
        done = subprocess.run(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S)
    built = read_build(cache)
    if done.returncode != 0 or built is None:
        tail = (log_dir / "decision-codes-build.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the decision-codes build failed ({done.returncode}):\n{tail}")
    return built


def build_arguments(b: argparse.ArgumentParser) -> None:
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--layers", type=int, default=QWEN3_0_6B.num_hidden_layers)
    b.add_argument("--seed", type=int, default=SEED)
