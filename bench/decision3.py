"""Comparison: a Decision 3.0 package at d3-edge's shape, our server against the same model in Transformers 5.

The subject is the upstream-format d3 fixture (``converters.decision3.fixture.write_source_fixture``, text
variant, ``causal``: the mode where state-once applies) with its text config at d3-edge's shape (SHAPE,
LAYER_TYPES; random BF16 weights as the fixture draws them) and the fixture's byte-level BPE (its ids are
a few hundred of the 248,320-row embedding table, which is built full size: it is memory, not time).
The format notes give no d3-edge config: SHAPE is d3-lite's backbone (Qwen3.5-0.8B's text model: its
752.4M text parameters plus a 100M vision tower are d3-lite's 853M) pruned, as d3-edge is, to 16 layers
in an irregular pattern (13 GDN, 3 full attention), which gives 589.8M parameters: d3-edge's 0.59B.
The source is written and converted once into the packages directory, in a subprocess
(``python -m bench.decision3 build``), with ``--no-reference`` (Transformers' side is measured here
instead, on the timed request, beside its own timings).

Contestants, each in its own process with the same intra-op thread count:

- our server (``python -m edge_runtime serve``) over HTTP POST /v1/decisions, keep-alive: the package is
  ``causal``, so the request's common prompt prefix runs once and each question continues from its states;
- the same server, each question as its own request (whole rows, one after the other);
- Transformers 5 (``.venv-ref/bin/python -m bench.decision3_torch``): ``Qwen3_5TextModel`` fp32 over the
  same token rows (rendered and tokenized here exactly as the server does), each row whole, and state-once
  with its own cache (the prefix once, each question from a copy of the DynamicCache); the code
  probabilities read through the package's readout with the server's numpy function.

Measured in interleaved rounds: one request (a state of ~STATE_TOKENS tokens, four questions: choice, noul,
score, choice); per-question latency (request time / questions), the agreement of every answer's
probabilities, and the memory each process held (VmHWM) beside the build's peak.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import resource
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

from bench.harness.answers import max_abs_diff, response_probabilities
from bench.harness.clients import HttpDecider, OneByOne
from bench.harness.lab import Lab
from bench.harness.report import Table, fmt_ms, fmt_ratio
from bench.harness.runners import Command, WorkerProcess, bench_main, build_in_subprocess, interleaved_rounds
from bench.harness.server import ServerProcess, parse_proc_status
from bench.harness.stats import Summary, ratio, summarize
from bench.harness.texts import fit_words, sentences

LIN, FULL = "linear_attention", "full_attention"
#: d3-edge's layers (see the module docstring): 16 of d3-lite's 24, irregular, 13 GDN and 3 full attention.
LAYER_TYPES = (LIN, LIN, LIN, FULL, LIN, LIN, LIN, LIN, LIN, FULL, LIN, LIN, LIN, LIN, FULL, LIN)
#: Qwen3.5-0.8B's text config (d3-lite's backbone), over the fixture's tiny one.
SHAPE: dict[str, Any] = {
    "hidden_size": 1024, "intermediate_size": 3584, "num_attention_heads": 8, "num_key_value_heads": 2,
    "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 16, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "vocab_size": 248_320,
    "max_position_embeddings": 262_144,
    "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "partial_rotary_factor": 0.25,
                        "rope_theta": 10_000_000, "rope_type": "default"}}
D3_EDGE, FIXTURE = "d3-edge", "fixture"
SHAPES = (D3_EDGE, FIXTURE)
SEED = 0
CHECK_REQUESTS = 4  # the converter's own check (graph vs its torch forward): short at this size
STATE_TOKENS = 200
SETTLE_S = 0.3
BUILD_TIMEOUT_S = 1800
READY_TIMEOUT_S = 600.0
#: No round starts after this many seconds of timed rounds. A round at d3-edge's shape is ~3 minutes on a busy
#: 2-core machine (Transformers ~60 s state-once and ~80 s whole rows a request): 2-3 rounds, ~10 minutes in all.
TIMED_BUDGET_S = 540.0
OURS, ONE_BY_ONE, TORCH_ONCE, TORCH_WHOLE = "ours", "ours-one-by-one", "torch-state-once", "torch-whole"
BUILD_RECORD = "bench-build.json"  # beside the package: the build's seconds and peak RSS


def text_config(vocab: int) -> dict[str, Any]:
    """The fixture's text config with d3-edge's shape over it (``vocab``, the fixture's, is a lower bound)."""
    from converters.decision3.fixture import qwen3_5_text_config

    config = {**qwen3_5_text_config(vocab, LAYER_TYPES), **SHAPE}
    config["vocab_size"] = max(vocab, SHAPE["vocab_size"])
    return config


def parameter_count(config: Mapping[str, Any]) -> int:
    """Text parameters plus the 255-row readout, as the manifest counts them (``loaded`` without vision)."""
    import math

    from converters.decision3.fixture import text_parameter_shapes

    return sum(math.prod(s) for s in text_parameter_shapes(dict(config)).values()) + 255 * int(config["hidden_size"])


# ---- build ---------------------------------------------------------------------------------------


def _source_dirs(packages: Path, shape: str) -> tuple[Path, Path]:
    name = f"bench-decision3-{shape}-shape"
    return packages / f"{name}-source", packages / name


def write_source(source: Path, shape: str) -> None:
    """The upstream-format d3 source (text, causal) at ``shape``; imports torch.

    The fixture writer takes no shape: its text config comes from ``qwen3_5_text_config``, which is
    replaced by :func:`text_config` while it writes (the tensors' shapes, the manifest's parameter counts
    and identity all follow that config).
    """
    from converters.decision3 import fixture

    shutil.rmtree(source, ignore_errors=True)  # the writer refuses an existing directory
    if shape == FIXTURE:
        fixture.write_source_fixture(source, "text", seed=SEED, attention_mode="causal")
        return
    shaped = text_config(0)
    with mock.patch.object(fixture, "qwen3_5_text_config",
                           lambda vocab, layers=None: {**shaped, "vocab_size": max(vocab, shaped["vocab_size"])}):
        fixture.write_source_fixture(source, "text", seed=SEED, attention_mode="causal")


def build(source: Path, package: Path, shape: str) -> None:
    """Write the source when missing and convert it with our converter (``--no-reference``); record the
    build's seconds and peak RSS beside the package. Imports torch: runs in a subprocess."""
    from converters.decision3.convert import Decision3Options, export_decision3

    started = time.perf_counter()
    written = not (source / "decision_config.json").is_file() or not any(source.glob("MODEL_MANIFEST*"))
    if written:
        write_source(source, shape)
    export_decision3(source, package, Decision3Options(
        name=f"bench-decision3-{shape}", version="0.0.1", release_date="2025-01-01", license="Apache-2.0",
        description=f"Random-weight Decision 3.0 at {shape}'s shape; a benchmark subject, not a model",
        source_name=f"edge-runtime bench decision3 {shape} shape (seed {SEED})", reference=False,
        check_requests=CHECK_REQUESTS))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kB
    (package.parent / f"{package.name}.{BUILD_RECORD}").write_text(json.dumps(
        {"seconds": time.perf_counter() - started, "peak_rss_bytes": peak, "source_written": written}) + "\n",
        encoding="utf-8")


def prepare(packages: Path, log_dir: Path, shape: str) -> tuple[Path, Path, dict[str, Any]]:
    """(source, package, the build record with ``this_run``), built once into ``packages``."""
    source, package = _source_dirs(packages, shape)
    record = package.parent / f"{package.name}.{BUILD_RECORD}"
    this_run = False
    if not ((source / "config.json").is_file() and (package / "card.json").is_file() and record.is_file()):
        build_in_subprocess("bench.decision3", f"decision3-{shape}", source, package, log_dir, BUILD_TIMEOUT_S,
                            ["--shape", shape])
        this_run = True
    return source, package, {**json.loads(record.read_text(encoding="utf-8")), "this_run": this_run}


# ---- the request and its rows ----------------------------------------------------------------------


#: Short questions, as a router asks them: the fixture's tokenizer spells most words a byte at a time, so
#: each question's part of the prompt is 40-60 tokens here (about half that with d3's own vocabulary).
QUESTIONS: dict[str, Any] = {
    "route": {"type": "choice", "instructions": "Which team should handle it?",
              "criteria": {"billing": None, "shipping": None, "technical": None, "sales": None}},
    "upset": {"type": "noul", "instructions": "Is the customer upset?"},
    "urgency": {"type": "score", "instructions": "How urgent is it?", "criteria": ["low", "medium", "high"]},
    "wants": {"type": "choice", "instructions": "What does the customer want?",
              "criteria": {"refund": None, "information": None, "cancel": None}},
}


class Rows:
    """The server's rows for a request: its prompts rendered and tokenized with the package's D3Prompt, and
    the common prefix a causal package runs once (the family's own functions; no onnxruntime)."""

    def __init__(self, package: Path) -> None:
        from edge_runtime.families.decision3.prompt import D3Prompt

        config = json.loads((package / "decision_config.json").read_text(encoding="utf-8"))
        self.prompt = D3Prompt.from_file(package / "tokenizer.json", config["codes"])
        self.limit = int(config["max_input_tokens"])

    def state_tokens(self, text: str) -> int:
        return len(self.prompt.encode(text))

    def body(self, request: Mapping[str, Any]) -> tuple[dict[str, Any], list[Any]]:
        """The worker's body (rows, option counts, prefix) and the parsed questions, in request order."""
        from edge_runtime.families.decision3.prompt import PromptTokens, common_prefix
        from edge_runtime.requests.decisions import parse_decisions_request

        entry = parse_decisions_request(dict(request)).single
        assert entry is not None
        rows = []
        for q in entry.valid:
            got = self.prompt.tokens(entry.state, q, self.limit)
            if not isinstance(got, PromptTokens):
                raise RuntimeError(f"question {q.id} does not fit: {got}")
            rows.append(list(got.ids))
        return {"rows": rows, "counts": [len(q.options) for q in entry.valid], "prefix": common_prefix(rows)}, \
            list(entry.valid)


def bench_request(rows: Rows, model: str) -> dict[str, Any]:
    """The timed request: a support message of about STATE_TOKENS tokens and the four QUESTIONS."""
    words = " ".join(sentences(60, seed=41)).split()
    return {"model": model, "state": fit_words(rows.state_tokens, words, STATE_TOKENS), "questions": QUESTIONS}


class TorchD3(WorkerProcess):
    """Transformers 5 in .venv-ref (bench/decision3_torch.py) over the server's rows; ``prefix`` on or off."""

    label = "Transformers 5 (Qwen3_5TextModel fp32, in-process)"

    def __init__(self, python: Path, threads: int, source: Path, package: Path, log_path: Path) -> None:
        super().__init__(self.label, "bench.decision3_torch", ["--source", str(source), "--package", str(package)],
                         threads, log_path, python=python)

    def probabilities(self, body: dict[str, Any]) -> list[list[float]]:
        return [list(map(float, p)) for p in self._ask({"op": "answer", "body": body})["probabilities"]]

    def time(self, body: dict[str, Any], n: int) -> list[float]:
        return [float(s) for s in self._ask({"op": "time", "body": body, "n": n})["seconds"]]


def torch_answers(worker: TorchD3, body: dict[str, Any], questions: Sequence[Any]) -> dict[str, Any]:
    """The worker's probabilities as a decisions response's answers (the server's answer function)."""
    import numpy as np

    from edge_runtime.questions import answer

    probs = worker.probabilities(body)
    return {"answers": {q.id: answer(q, np.asarray(p, dtype=np.float64)) for q, p in zip(questions, probs)}}


def reference_versions(python: Path) -> str:
    """The reference environment's Transformers, torch and tokenizers (the run's conditions list this one's)."""
    import subprocess

    code = ("from importlib.metadata import version as v; "
            "print(', '.join(f'{n} {v(n)}' for n in ('transformers', 'torch', 'tokenizers')))")
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60)
    return done.stdout.strip() or f"unknown ({done.stderr.strip()[-200:]})"


def peak_rss(pid: int) -> int | None:
    """A running process's VmHWM (peak resident memory) in bytes, None when unreadable."""
    try:
        return parse_proc_status(Path(f"/proc/{pid}/status").read_text()).get("VmHWM")
    except OSError:
        return None


# ---- the comparison ------------------------------------------------------------------------------


def run(lab: Lab) -> list[Table]:
    """The d3-edge-shape comparison (see the module docstring)."""
    return compare(lab, D3_EDGE)


def compare(lab: Lab, shape: str) -> list[Table]:
    """Build (or reuse) the package at ``shape``, start the contestants, time them in interleaved rounds."""
    from converters.decision3.export import reference_python

    settings = lab.settings
    python = reference_python()  # ConversionError naming scripts/reference_env.sh when .venv-ref is absent
    source, package, built = prepare(settings.packages, lab.log_dir, shape)
    rows = Rows(package)
    model = f"bench-decision3-{shape}"
    request = bench_request(rows, model)
    body, questions = rows.body(request)
    server = lab.adopt(ServerProcess(package, "fp32", settings.threads, name=model, log_dir=lab.log_dir))
    worker = TorchD3(python, settings.threads, source, package, lab.log_dir / f"decision3-{shape}-torch.log")
    whole = {**body, "prefix": 0}
    started = time.perf_counter()
    try:
        server.wait_ready(READY_TIMEOUT_S)
        worker.wait_ready(READY_TIMEOUT_S)
        load_s = time.perf_counter() - started
        ours = HttpDecider("edge-runtime (HTTP POST /v1/decisions, keep-alive)", server)
        one = OneByOne(HttpDecider(OneByOne.label, server))
        # One untimed call each warms every contestant; its answers are the agreement check.
        answers = {OURS: ours.answers(request), ONE_BY_ONE: one.answers(request),
                   TORCH_ONCE: torch_answers(worker, body, questions),
                   TORCH_WHOLE: torch_answers(worker, whole, questions)}
        samples = interleaved_rounds(settings.rounds, TIMED_BUDGET_S, SETTLE_S, {"request": {
            OURS: functools.partial(ours.time, request, 1), ONE_BY_ONE: functools.partial(one.time, request, 1),
            TORCH_ONCE: functools.partial(worker.time, body, 1),
            TORCH_WHOLE: functools.partial(worker.time, whole, 1)}})
        memory = {"server": peak_rss(server.proc.pid), "torch": peak_rss(worker.proc.pid)}
        ours.stop()
        one.server.stop()
    finally:
        worker.stop()
        server.stop()
    n = len(questions)
    stats = {k: summarize([[s / n for s in rnd] for rnd in v]) for k, v in samples["request"].items()}
    tokens = {"prefix": body["prefix"], "rows": [len(r) for r in body["rows"]],
              "state-once": int(answers[OURS]["usage"]["input_tokens"]),
              "one by one": int(answers[ONE_BY_ONE]["usage"]["input_tokens"])}
    card = json.loads((package / "card.json").read_text(encoding="utf-8"))
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))["text_config"]
    return [subject_table(shape, config, built, card["verification"], memory, load_s, settings.threads,
                          reference_versions(python)),
            latency_table(shape, stats, tokens, len(samples["request"][OURS])),
            agreement_table(shape, answers)]


def _gb(value: float | None) -> str:
    return "?" if value is None else f"{value / 1e9:.1f} GB"


def subject_table(shape: str, config: Mapping[str, Any], built: Mapping[str, Any], verification: Mapping[str, Any],
                  memory: Mapping[str, int | None], load_s: float, threads: int, versions: str) -> Table:
    """What was measured and what it took; ``verification`` is the card's record of the converter's check."""
    kinds = config["layer_types"]
    pattern = "".join("L" if k == LIN else "F" for k in kinds)
    when = "this run" if built["this_run"] else "an earlier run (reused)"
    rows = [
        ["text model", f"random-weight Qwen3.5 text model ({shape}): hidden {config['hidden_size']}, "
                       f"{len(kinds)} layers {pattern} (L GDN, F full attention: {kinds.count(LIN)} + "
                       f"{kinds.count(FULL)}), {config['num_attention_heads']} heads / {config['num_key_value_heads']} "
                       f"KV heads × {config['head_dim']}, GDN {config['linear_num_key_heads']} key / "
                       f"{config['linear_num_value_heads']} value heads × {config['linear_key_head_dim']}, "
                       f"intermediate {config['intermediate_size']}, vocabulary {config['vocab_size']:,}; "
                       f"{parameter_count(config) / 1e6:.1f}M parameters with the readout; BF16 weights "
                       "as the fixture draws them, run in fp32 by both"],
        ["tokenizer", "the fixture's byte-level BPE (the answer codes and 38 prompt words are single tokens; other "
                      "text is nearly a token per character)"],
        ["attention mode", "causal (state-once applies)"],
        ["build (convert: read, export, check, write)",
         f"{built['seconds']:.0f} s{' with writing the source' if built.get('source_written') else ''}, "
         f"peak RSS {_gb(built['peak_rss_bytes'])}, in {when}"],
        ["converter's check (card)", f"{verification['reference']}: max |Δp| {verification['max_abs_diff']:g}, "
                                     f"state-once vs whole rows (last hidden) "
                                     f"{verification['outputs'].get('state_once_vs_whole', '–')}, within "
                                     f"{verification['tolerance']:g}, over {verification['cases']} cases"],
        ["memory while timed (VmHWM)", f"our server {_gb(memory['server'])}, Transformers {_gb(memory['torch'])}"],
        ["Transformers contestant", f"in .venv-ref: {versions}"],
        ["threads", f"{threads} intra-op, 1 inter-op for both contestants"],
        ["start-up", f"{load_s:.0f} s until the server was ready and Transformers had loaded (in parallel)"],
    ]
    return Table(f"decision3 at {shape}'s shape: what was measured", ["item", "value"], rows)


def latency_table(shape: str, stats: Mapping[str, Summary], tokens: Mapping[str, Any], rounds: int) -> Table:
    rows = []
    for mode, ours_key, torch_key, read in (
            ("state-once", OURS, TORCH_ONCE, f"prefix {tokens['prefix']} once + continuations "
                                             f"{[r - tokens['prefix'] for r in tokens['rows']]}"),
            ("whole rows", ONE_BY_ONE, TORCH_WHOLE, f"rows {tokens['rows']}")):
        o, t = stats[ours_key], stats[torch_key]
        rows.append([mode, read, fmt_ms(o.median, 0), f"{fmt_ms(o.round_low, 0)}–{fmt_ms(o.round_high, 0)}",
                     fmt_ms(t.median, 0), f"{fmt_ms(t.round_low, 0)}–{fmt_ms(t.round_high, 0)}",
                     fmt_ratio(ratio(t.median, o.median))])
    rows.append(["state-once vs whole rows", "", fmt_ratio(ratio(stats[ONE_BY_ONE].median, stats[OURS].median)), "",
                 fmt_ratio(ratio(stats[TORCH_WHOLE].median, stats[TORCH_ONCE].median)), "", ""])
    return Table(
        f"decision3 at {shape}'s shape: per-question latency, one request of 4 questions ({rounds} rounds)",
        ["mode", "tokens read", "ours ms / question", "ours round medians", "Transformers ms / question",
         "Transformers round medians", "ours vs Transformers"],
        rows,
        ["Per question: a request's time ÷ its 4 questions (choice, noul, score, choice). Ours: client wall time "
         "over HTTP (JSON, prompt rendering and tokenization, ONNX Runtime, readout, answers); state-once is one "
         "request of 4 questions, whole rows are 4 requests of one question each. Transformers: in-process from "
         "the token rows to the code probabilities; state-once runs the prefix once and each question from a copy "
         "of its DynamicCache, whole rows run each question's prompt alone. Speed: Transformers ÷ ours.",
         f"Tokens: the server's usage counted {tokens['state-once']} tokens state-once and "
         f"{tokens['one by one']} one by one."],
    )


def max_log_diff(a: Mapping[str, Mapping[str, float]], b: Mapping[str, Mapping[str, float]]) -> float:
    """The largest |log p_a - log p_b| over every question and option (inf where one side is 0 and the other
    not): the code logits' agreement ÷ T, which stays visible where the probabilities saturate at 0 and 1."""
    worst = 0.0
    for qid, pa in a.items():
        for key, x in pa.items():
            y = b[qid][key]
            if x != y:
                worst = max(worst, abs(math.log(x) - math.log(y)) if x > 0 and y > 0 else math.inf)
    return worst


def agreement_table(shape: str, answers: Mapping[str, Mapping[str, Any]]) -> Table:
    probs = {k: response_probabilities(a) for k, a in answers.items()}

    def same(a: str, b: str) -> str:
        x, y = answers[a]["answers"], answers[b]["answers"]
        picks = [q for q, v in x.items() if v.get("type") == "choice"]
        return f"{sum(x[q].get('choice') == y[q].get('choice') for q in picks)}/{len(picks)}"

    pairs = ((OURS, TORCH_ONCE, "ours state-once vs Transformers state-once (its cache)"),
             (ONE_BY_ONE, TORCH_WHOLE, "ours whole rows vs Transformers whole rows"),
             (OURS, TORCH_WHOLE, "ours state-once vs Transformers whole rows"),
             (OURS, ONE_BY_ONE, "ours state-once vs ours whole rows"),
             (TORCH_ONCE, TORCH_WHOLE, "Transformers state-once vs its whole rows"))
    rows = [[label, f"{max_abs_diff(probs[a], probs[b]):.2e}", f"{max_log_diff(probs[a], probs[b]):.2e}", same(a, b)]
            for a, b, label in pairs]
    return Table(f"decision3 at {shape}'s shape: agreement on the timed request",
                 ["comparison", "max |Δp| (every answer's probabilities)", "max |Δ log p|", "same choices"], rows,
                 ["fp32 both: ONNX Runtime's graph (exported from our torch Qwen3.5 forward) against Transformers 5's "
                  "Qwen3_5TextModel on the same token rows, read through the same readout.",
                  "|Δ log p| is the code logits' difference ÷ T: the fixture's random readout (randn × 0.5 over a "
                  "normalised hidden state) saturates the probabilities at the larger shape, where |Δp| says little."])


def parity(tables: Sequence[Table]) -> float:
    """The largest |Δp| ours vs Transformers in ``compare``'s agreement table (the first two comparisons)."""
    table = next(t for t in tables if t.title.endswith("agreement on the timed request"))
    return max(float(row[1]) for row in table.rows[:2])


# ---- command line ----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    def arguments(b: argparse.ArgumentParser) -> None:
        b.add_argument("--source", type=Path, required=True)
        b.add_argument("--out", type=Path, required=True, help="the package directory")
        b.add_argument("--shape", choices=SHAPES, default=D3_EDGE)

    def run_build(args: argparse.Namespace) -> int:
        build(args.source, args.out, args.shape)
        return 0

    return bench_main(argv, "python -m bench.decision3", {
        "build": Command("write the d3 source when missing and convert it (imports torch)", arguments, run_build)})


if __name__ == "__main__":
    sys.exit(main())
