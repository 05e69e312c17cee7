"""Comparison: a Vela 2.0 package at the 0.3B's shape, our server against the same model in PyTorch.

The subject is the upstream-format Vela 2.0 fixture (converters/vela2/source.py) at the 0.3B's
ModernBERT-base shape: hidden 768, 22 layers, 12 heads, intermediate 1152, global attention every
3rd layer, local window 128, random weights, the fixture's small byte-level BPE (the embedding is a
table lookup: its size barely changes the cost). ``max_length`` is 2048, not the 0.3B's 8192, so
that the long state (~3,000 tokens) is read in windows as upstream reads a part longer than one
model input. The source is written and converted (``export_vela2``, its parity check within 1e-4,
see TOLERANCE) once into the packages directory, in a subprocess (``python -m bench.vela2 build``).

Contestants, each in its own process with the same intra-op thread count:

- our server (``python -m edge_runtime serve``) over HTTP POST /v1/decisions, keep-alive: client
  wall time from the request body to the decoded JSON answers;
- PyTorch (``python -m bench.vela2 torch``): upstream's own algorithm, the converter's pipeline
  (``vela2_pipeline.run_request``: plan, rows, windows, sorted batches, combine, answers) reading
  HF ``ModernBertModel`` (SDPA, fp32) and the marker head in torch (``converters.vela2.torch_readout``,
  each sequence alone), timed in-process from state and questions to the response body.

Measured, in interleaved rounds: the contract's two examples (a Choice, a Noul and a Score; a Set
and a Span) and a Noul and a Span over a ~3,000-token state; and agreement of every answer's
probabilities between the two.

This module is also the entry point of its subprocesses (``build`` and ``torch`` import torch; the
harness imports neither torch nor onnxruntime).
"""

from __future__ import annotations

import functools
import json
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.harness.answers import max_abs_diff, response_probabilities
from bench.harness.clients import HttpDecider
from bench.harness.lab import Lab
from bench.harness.report import Table, fmt_ms, fmt_ratio
from bench.harness.runners import Answer, WorkerProcess, build_in_subprocess, contestant_main, interleaved_rounds
from bench.harness.server import ServerProcess
from bench.harness.stats import Summary, ratio, summarize
from bench.harness.texts import fit_words, sentences
from edge_runtime.examples import DECISIONS_EXAMPLE_1, DECISIONS_EXAMPLE_2

#: The 0.3B's encoder shape (ModernBERT-base's), as encoder_config overrides of the fixture writer.
SHAPE: dict[str, Any] = {"hidden_size": 768, "intermediate_size": 1152, "num_hidden_layers": 22,
                         "num_attention_heads": 12, "global_attn_every_n_layers": 3, "local_attention": 128}
MAX_LENGTH = 2048   # tokens of one model input; the long state needs two windows of it
#: ModernBERT's own initializer_range. The fixture's 0.05 (meant for 4 layers of 64) over 22 layers of
#: 768 grows float32 rounding further: the golden request's answers alone missed 1e-5 (a span probability).
WEIGHT_STD = 0.02
SEED = 0
#: The converter's parity check, loosened from its 1e-5 for this subject: at the 0.3B's depth
#: (22 layers of 768) float32 rounding alone differs by more between ONNX Runtime and torch (seen on
#: the golden request: option logits 3.8e-5 apart; a Score's expected score 1.1e-5). A wrong graph
#: misses by orders of magnitude more; the card records the bound.
TOLERANCE = 1e-4
CHECK_REQUESTS = 2  # generated requests besides the golden one (short ones: the conversion stays short)
SOURCE_DIR = "bench-vela2-0.3b-shape-source"
PACKAGE_DIR = "bench-vela2-0.3b-shape"
MODEL = "Vela-2.0-0.3B"  # served under the contract examples' own name
BUILD_TIMEOUT_S = 1800
SERVER_READY_TIMEOUT_S = 300.0

LONG_TOKENS = 3000  # tokens of the long state's text
EXAMPLE_1, EXAMPLE_2, LONG = "example 1", "example 2", "long state"
#: Timed calls per contestant and round: the long state costs about twenty times an example.
CALLS = {EXAMPLE_1: 5, EXAMPLE_2: 5, LONG: 1}
TIMED_BUDGET_S = 240.0  # no round starts after this many seconds of timed rounds
SETTLE_S = 0.3
OURS, TORCH = "ours", "torch"


# ---- build ---------------------------------------------------------------------------------------


def _complete_source(path: Path) -> bool:
    # SHA256SUMS is the writer's last file: without it the source is half-written.
    return (path / "SHA256SUMS").is_file()


def build(source: Path, package: Path) -> None:
    """Write the upstream-format source at the 0.3B's shape when missing, then convert it into ``package``
    (imports torch: ``python -m bench.vela2 build`` runs it in a subprocess)."""
    from converters.vela2.export import Vela2Options, export_vela2
    from converters.vela2.fixture import FIXTURE_RELEASE_DATE, write_source_fixture

    if not _complete_source(source):
        shutil.rmtree(source, ignore_errors=True)  # the writer refuses an existing directory
        write_source_fixture(source, seed=SEED, max_length=MAX_LENGTH, weight_std=WEIGHT_STD, **SHAPE)
    opts = Vela2Options(
        name=MODEL, version="0.0.1", release_date=FIXTURE_RELEASE_DATE, license="Apache-2.0",
        description="Random-weight Vela 2.0 encoder of the 0.3B's shape; a benchmark subject, not a model",
        source_name=f"edge-runtime bench vela2 0.3B shape (seed {SEED})", check_requests=CHECK_REQUESTS,
        seed=SEED, tolerance=TOLERANCE, quantize=None)  # this comparison serves fp32 (its int8 is not timed yet)
    export_vela2(source, package, opts)


def prepare(packages: Path, log_dir: Path) -> tuple[Path, Path, float | None]:
    """(source, package, seconds the build took this run or None when reused), built once into ``packages``."""
    source, package = packages / SOURCE_DIR, packages / PACKAGE_DIR
    if _complete_source(source) and (package / "card.json").is_file():
        return source, package, None
    return source, package, build_in_subprocess("bench.vela2", "vela2", source, package, log_dir, BUILD_TIMEOUT_S)


# ---- requests ------------------------------------------------------------------------------------


def bench_requests(count_tokens: Callable[[str], int], model: str = MODEL) -> dict[str, dict[str, Any]]:
    """The three timed requests under ``model``: the contract's two examples, and the first example's
    Noul and the second's Span over a state of about LONG_TOKENS tokens (``count_tokens`` counts them)."""
    words = " ".join(sentences(200, seed=31)).split()
    long_state = fit_words(count_tokens, words, LONG_TOKENS)
    questions = {"reasoning": DECISIONS_EXAMPLE_1["questions"]["reasoning"],
                 "contacts": DECISIONS_EXAMPLE_2["questions"]["contacts"]}
    return {EXAMPLE_1: {**DECISIONS_EXAMPLE_1, "model": model},
            EXAMPLE_2: {**DECISIONS_EXAMPLE_2, "model": model},
            LONG: {"model": model, "state": long_state, "questions": questions}}


def package_token_counter(package: Path) -> Callable[[str], int]:
    """Tokens of a text as the package's tokenizer counts them (tokenizers only: no model runtime)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(package / "tokenizer.json"))
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


def decisions_of(body: Mapping[str, Any]) -> dict[str, Any]:
    """The discrete answers of a body: each Choice's choice, each Set's selection, each Span's spans."""
    out: dict[str, Any] = {qid: a["choice"] for qid, a in body["answers"].items() if a.get("type") == "choice"}
    out.update({f"sets.{q}": s["selected"] for q, s in body.get("sets", {}).items()})
    out.update({f"spans.{q}": [(s["label"], s["start"], s["end"]) for s in spans]
                for q, spans in body.get("spans", {}).items()})
    return out


# ---- contestants ---------------------------------------------------------------------------------


class TorchVela2(WorkerProcess):
    """``python -m bench.vela2 torch``: upstream's pipeline on HF ModernBertModel, in its own process."""

    label = "PyTorch (run_request + ModernBertModel + head in torch, in-process)"

    def __init__(self, threads: int, source: Path, package: Path, log_path: Path) -> None:
        super().__init__(self.label, "bench.vela2", ["torch", "--source", str(source), "--package", str(package)],
                         threads, log_path)

    def answers(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._ask({"op": "answer", "body": body})

    def time(self, body: dict[str, Any], n: int) -> list[float]:
        return [float(s) for s in self._ask({"op": "time", "body": body, "n": n})["seconds"]]


def load_torch_pipeline(source: Path, package: Path, threads: int) -> Answer:
    """A decisions body -> upstream's response body, the backbone and head in torch at ``threads`` threads.

    The weights are read from the upstream source; the tokenizer, layout and calibration from the
    package (the source's, as the converter wrote them), so both contestants tokenize alike.
    """
    import torch

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    from converters.vela2.export import load_backbone
    from converters.vela2.source import load_tensors, read_source
    from converters.vela2.verify import torch_readout
    from edge_runtime.families.registry import read_package
    from edge_runtime.families.vela2.pipeline import Vela2Assets, run_request

    src = read_source(source)
    backbone, head = load_tensors(src)
    readout = torch_readout(load_backbone(src, backbone), head, src.config["readout"], threads)
    assets = Vela2Assets.from_package(read_package(package))
    if "onnxruntime" in sys.modules:
        raise RuntimeError("onnxruntime was imported into the torch contestant")

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        return run_request(body["state"], body["questions"], tokens=assets.tokens, layout=assets.layout,
                           calibration=assets.calibration, readout=readout).body

    return answer


# ---- the comparison ------------------------------------------------------------------------------


def run(lab: Lab) -> list[Table]:
    """Build (or reuse) the package, start both contestants, time them in interleaved rounds."""
    settings = lab.settings
    source, package, built_s = prepare(settings.packages, lab.log_dir)
    requests = bench_requests(package_token_counter(package))
    server = lab.adopt(ServerProcess(package, "fp32", settings.threads, name=MODEL, log_dir=lab.log_dir))
    worker = TorchVela2(settings.threads, source, package, lab.log_dir / "vela2-torch.log")
    started = time.perf_counter()
    try:
        server.wait_ready(SERVER_READY_TIMEOUT_S)
        worker.wait_ready(SERVER_READY_TIMEOUT_S)
        load_s = time.perf_counter() - started
        contestants: dict[str, HttpDecider | TorchVela2] = {
            OURS: HttpDecider("edge-runtime (HTTP POST /v1/decisions, keep-alive)", server), TORCH: worker}
        # One untimed call each warms every contestant; its answers are the agreement check.
        answers = {name: {k: c.answers(body) for k, c in contestants.items()} for name, body in requests.items()}
        samples = interleaved_rounds(settings.rounds, TIMED_BUDGET_S, SETTLE_S, {
            name: {k: functools.partial(c.time, body, CALLS[name]) for k, c in contestants.items()}
            for name, body in requests.items()})
    finally:
        worker.stop()
        server.stop()
    stats = {n: {k: summarize(v) for k, v in by.items()} for n, by in samples.items()}
    rounds = len(samples[EXAMPLE_1][OURS])
    tokens = {n: int(a[OURS]["usage"]["input_tokens"]) for n, a in answers.items()}
    verification = json.loads((package / "card.json").read_text(encoding="utf-8"))["verification"]
    return [subject_table(built_s, verification, load_s, settings.threads),
            latency_table(stats, tokens, rounds),
            agreement_table(answers)]


def subject_table(built_s: float | None, verification: Mapping[str, Any], load_s: float, threads: int) -> Table:
    """What was measured; ``verification`` is the package card's record of the converter's parity check."""
    built = "reused from an earlier run" if built_s is None else f"{built_s:.0f} s this run"
    rows = [
        ["backbone", f"random-weight ModernBERT, the Vela 2.0 0.3B's shape: hidden {SHAPE['hidden_size']}, "
                     f"{SHAPE['num_hidden_layers']} layers, {SHAPE['num_attention_heads']} heads, intermediate "
                     f"{SHAPE['intermediate_size']}, global attention every {SHAPE['global_attn_every_n_layers']}rd "
                     f"layer, local window {SHAPE['local_attention']}; weights N(0, {WEIGHT_STD}²); the "
                     "fixture's ~400-token vocabulary"],
        ["model input", f"max_length {MAX_LENGTH} (the 0.3B's is 8192): a longer part is read in windows"],
        ["head", "the upstream fixture's marker head (readout both: cosine + MLP), random weights"],
        ["build (once, into the packages directory)", built],
        ["converter's parity check (card)",
         f"max |Δ logit| {verification['max_abs_diff']:g} over {verification['cases']} requests, within "
         f"{verification['tolerance']:g} (its default 1e-5 is below float32's reach at this depth)"],
        ["threads", f"{threads} intra-op, 1 inter-op for both contestants"],
        ["start-up", f"{load_s:.0f} s until the server was ready and torch had loaded (in parallel)"],
    ]
    return Table("vela2: what was measured", ["item", "value"], rows)


def latency_table(stats: Mapping[str, Mapping[str, Summary]], tokens: Mapping[str, int], rounds: int) -> Table:
    shapes = {EXAMPLE_1: "contract example 1: choice, noul, score (short state)",
              EXAMPLE_2: "contract example 2: set, span (short state)",
              LONG: f"noul + span over a {LONG_TOKENS:,}-token state, in windows"}
    rows = []
    for name, s in stats.items():
        ours, torch = s[OURS], s[TORCH]
        digits = 0 if name == LONG else 1
        rows.append([shapes[name], f"{tokens[name]:,}", f"{CALLS[name]} × {rounds}",
                     fmt_ms(ours.median, digits), f"{fmt_ms(ours.round_low, digits)}–{fmt_ms(ours.round_high, digits)}",
                     fmt_ms(torch.median, digits),
                     f"{fmt_ms(torch.round_low, digits)}–{fmt_ms(torch.round_high, digits)}",
                     fmt_ratio(ratio(torch.median, ours.median)),
                     fmt_ratio(ratio(torch.round_low, ours.round_low))])
    return Table(
        f"vela2 at the 0.3B's shape: per-request latency, ours vs PyTorch ({rounds} rounds)",
        ["request", "tokens read", "calls", "ours p50 ms", "ours round medians", "torch p50 ms",
         "torch round medians", "speed vs torch", "(best rounds)"],
        rows,
        ["Ours: client wall time over HTTP (JSON, planning, tokenization and answers included); the server "
         "batches a request's sequences right-padded. PyTorch: the same pipeline in-process, from state and "
         "questions to the response body, each sequence through ModernBertModel alone (no padding).",
         "Tokens read: the request's model inputs as the response's usage counts them (schema, markers and "
         "windows' overlap included). Speed vs torch: torch p50 ÷ ours p50."],
    )


def agreement_table(answers: Mapping[str, Mapping[str, dict[str, Any]]]) -> Table:
    rows = []
    for name, by in answers.items():
        ours, torch = by[OURS], by[TORCH]
        worst = max_abs_diff(response_probabilities(ours), response_probabilities(torch))
        a, b = decisions_of(ours), decisions_of(torch)
        same = sum(a[k] == b.get(k) for k in a)
        rows.append([name, f"{worst:.2e}", f"{same}/{len(a)}" if a else "–"])
    return Table("vela2 at the 0.3B's shape: agreement, ours vs PyTorch",
                 ["request", "max |Δp| (every answer's probabilities)", "same choices, selections and spans"], rows,
                 ["ONNX Runtime's graph plus the numpy head against ModernBertModel plus the head in torch, fp32 "
                  "both, on the timed requests (the long one in windows). The package passed the converter's own "
                  "parity check (the first table)."])


def main(argv: Sequence[str] | None = None) -> int:
    return contestant_main(argv, "python -m bench.vela2", build, load_torch_pipeline, "PyTorch")


if __name__ == "__main__":
    sys.exit(main())
