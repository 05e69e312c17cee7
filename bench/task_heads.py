"""Comparison: the Router's Vela 1.0 specialists at their real shape, our server against Transformers.

The subjects are six task-heads packages (converters/task_heads/) of the six sequence specialists the
Router sends every request to (Domain, Guard, Safety, FactCheck, Feedback, Modality: their labels and
pooling from the catalogue), each a random-weight mmBERT of Vela 1.0's shape: vocabulary 256,000, hidden
768, 22 layers, 12 heads, intermediate 1152, global attention every 3rd layer, local window 128, YaRN x4
(307M parameters, 1.2 GB in fp32), the fixtures' small byte-level BPE (its ids index the first rows of
the full-size embedding table). Sources and packages are written and converted once into the packages
directory, in a subprocess (``python -m bench.task_heads build``).

Contestants, each in its own process with the same intra-op thread count:

- our server (``python -m edge_runtime serve``: the six packages' exact int8, what a CPU serves by
  default, and Domain's fp32 beside them), over HTTP: POST /v1/classify to one specialist, and POST
  /v1/bundle with one classify task per specialist (as the Router sends a request's signals); client wall
  time from the request body to the decoded JSON;
- Transformers (``python -m bench.task_heads torch``): each specialist's ``ModernBertForSequenceClassification``
  (SDPA, fp32) read from its source, the texts tokenized by the package's tokenizer, a batch right-padded,
  the softmax read; the bundle runs the six models in turn. Timed in-process.

Measured, in interleaved rounds: one ~30-token text and eight texts of ~30 tokens in one call (ours int8,
ours fp32, Transformers), and the bundle of six specialists on one text (ours int8, Transformers); and the
largest probability difference of each of ours from Transformers. Both variants of every specialist would
not fit beside Transformers' six in this machine's memory (1.2 GB each in fp32), hence fp32 for Domain only.
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

from bench.harness.clients import JsonClient
from bench.harness.lab import Lab
from bench.harness.report import Table, fmt_ms, fmt_ratio
from bench.harness.runners import Answer, WorkerProcess, build_in_subprocess, contestant_main, interleaved_rounds
from bench.harness.server import ServerProcess
from bench.harness.stats import Summary, ratio, summarize, timed
from bench.harness.texts import fit_words, sentences
from edge_runtime.artifacts import built_by

#: Vela 1.0's encoder (mmBERT-base, 32K YaRN), as config overrides of the task-heads fixture writer.
SHAPE: dict[str, Any] = {"vocab_size": 256000, "hidden_size": 768, "intermediate_size": 1152,
                         "num_hidden_layers": 22, "num_attention_heads": 12, "global_attn_every_n_layers": 3,
                         "local_attention": 128, "max_position_embeddings": 32768}
SPECIALISTS = ("domain", "guard", "safety", "factcheck", "feedback", "modality")
WEIGHT_STD = 0.02  # ModernBERT's initializer_range: 0.05 over 22 layers of 768 grows float32 rounding
SEED = 0
PARITY_TOKENS = 128  # the build's parity rows: past the 128-token local window, short enough at this size
SOURCES, PACKAGES = "bench-task-heads-sources", "bench-task-heads"
BUILD_TIMEOUT_S = 3600
READY_TIMEOUT_S = 900.0
ONE, EIGHT, BUNDLE = "one text", "8 texts", "bundle of 6"
TEXT_TOKENS = 30  # each text's tokens, specials included
CALLS = {ONE: 10, EIGHT: 4, BUNDLE: 3}
TIMED_BUDGET_S = 300.0
SETTLE_S = 0.3
OURS, OURS_FP32, TORCH = "ours int8", "ours fp32", "torch"
#: the variant every specialist is served at, and the one Domain is also served at (as vela-domain-fp32)
SERVED, ALSO = "int8", "fp32"


# ---- build ---------------------------------------------------------------------------------------


def build(sources: Path, packages: Path) -> None:
    """Write each specialist's source at Vela 1.0's shape when missing, then convert it (imports torch)."""
    from converters.task_heads.export import TaskOptions, export_task_heads
    from converters.task_heads.fixture import FIXTURE_RELEASE_DATE, LAYOUTS, write_source

    for name in SPECIALISTS:
        source, package = sources / name, packages / name
        if _has_variant(package, SERVED):
            continue
        if not (source / "model.safetensors").is_file():
            shutil.rmtree(source, ignore_errors=True)
            write_source(name, source, seed=SEED, shape=SHAPE, weight_std=WEIGHT_STD)
        export_task_heads(source, package, TaskOptions(
            name=f"vela-{name}", version="0.0.1", release_date=FIXTURE_RELEASE_DATE, license="Apache-2.0",
            description=f"Random-weight task head of {LAYOUTS[name].stands_for}'s shape; a benchmark subject",
            source_name=f"edge-runtime bench {name} (seed {SEED})", parity_tokens=PARITY_TOKENS))


def _has_variant(package: Path, variant: str) -> bool:
    """Whether ``package`` is current: one converted before the exact int8 was the converter's default has
    fp32 only, and one an older converter made lacks its graph changes (both are rebuilt)."""
    from converters import CONVERTER_VERSION

    card = package / "card.json"
    return (card.is_file() and variant in json.loads(card.read_text(encoding="utf-8"))["variants"]
            and built_by(package) == CONVERTER_VERSION)


def prepare(root: Path, log_dir: Path) -> tuple[Path, Path, float | None]:
    """(sources, packages, seconds the build took this run or None when reused)."""
    sources, packages = root / SOURCES, root / PACKAGES
    if all(_has_variant(packages / name, SERVED) for name in SPECIALISTS):
        return sources, packages, None
    cards = [packages / name / "card.json" for name in SPECIALISTS]
    return sources, packages, build_in_subprocess("bench.task_heads", "task-heads", sources, packages, log_dir,
                                                  BUILD_TIMEOUT_S, cards=cards)


# ---- contestants ---------------------------------------------------------------------------------


def load_torch(sources: Path, packages: Path, threads: int) -> Answer:
    """``{"models": [name...], "texts": [...]}`` -> each model's softmax over the texts, in Transformers."""
    import torch
    from tokenizers import Tokenizer
    from transformers import ModernBertForSequenceClassification

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    models = {name: ModernBertForSequenceClassification.from_pretrained(
        sources / name, attn_implementation="sdpa", reference_compile=False).eval() for name in SPECIALISTS}
    tokenizer = Tokenizer.from_file(str(packages / SPECIALISTS[0] / "tokenizer.json"))

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        rows = [enc.ids for enc in tokenizer.encode_batch(body["texts"])]
        width = max(len(r) for r in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
        with torch.inference_mode():
            return {name: torch.softmax(models[name](input_ids=ids, attention_mask=mask).logits, -1).tolist()
                    for name in body["models"]}

    return answer


class TorchSpecialists(WorkerProcess):
    label = "Transformers (ModernBertForSequenceClassification, SDPA, fp32, in-process)"

    def __init__(self, threads: int, sources: Path, packages: Path, log_path: Path) -> None:
        super().__init__(self.label, "bench.task_heads", ["torch", "--source", str(sources), "--package",
                                                          str(packages)], threads, log_path)

    def answers(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._ask({"op": "answer", "body": body})

    def time(self, body: dict[str, Any], n: int) -> list[float]:
        return [float(s) for s in self._ask({"op": "time", "body": body, "n": n})["seconds"]]


class HttpSpecialists:
    """Our server: one specialist over /v1/classify, or every one of them in one /v1/bundle; ``suffix`` picks
    the served name (``-fp32``: the fp32 variant served beside the int8 one)."""

    label = "edge-runtime (HTTP POST /v1/classify and /v1/bundle, keep-alive)"

    def __init__(self, server: ServerProcess, suffix: str = "") -> None:
        self.client = JsonClient(server.port)
        self.suffix = suffix

    def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        status, _, data = self.client.post(path, json.dumps(payload).encode())
        if status != 200:
            raise RuntimeError(f"{path}: HTTP {status}: {data[:500]!r}")
        return dict(json.loads(data))

    def answers(self, body: dict[str, Any]) -> dict[str, Any]:
        names, texts = body["models"], body["texts"]
        if len(names) == 1:
            reply = self._post("/v1/classify", {"model": f"vela-{names[0]}{self.suffix}", "input": texts})
            return {names[0]: [r["probabilities"] for r in reply["results"]]}
        tasks = [{"id": name, "classify": {"model": f"vela-{name}{self.suffix}", "input": texts}} for name in names]
        reply = self._post("/v1/bundle", {"tasks": tasks})
        return {r["id"]: [x["probabilities"] for x in r["classify"]["results"]] for r in reply["results"]}

    def time(self, body: dict[str, Any], n: int) -> list[float]:
        return timed(lambda: self.answers(body), n)

    def stop(self) -> None:
        self.client.close()


# ---- the comparison ------------------------------------------------------------------------------


def bodies(count_tokens: Callable[[str], int]) -> dict[str, dict[str, Any]]:
    """The timed requests: one ~30-token text to Domain, eight to Domain, one to every specialist."""
    words = " ".join(sentences(60, seed=37)).split()
    texts = [fit_words(count_tokens, words[i * 25:], TEXT_TOKENS) for i in range(8)]
    return {ONE: {"models": ["domain"], "texts": texts[:1]}, EIGHT: {"models": ["domain"], "texts": texts},
            BUNDLE: {"models": list(SPECIALISTS), "texts": texts[:1]}}


def run(lab: Lab) -> list[Table]:
    """Build (or reuse) the six packages, start both contestants, time them in interleaved rounds."""
    from tokenizers import Tokenizer

    settings = lab.settings
    sources, packages, built_s = prepare(settings.packages, lab.log_dir)
    tokenizer = Tokenizer.from_file(str(packages / SPECIALISTS[0] / "tokenizer.json"))
    requests = bodies(lambda text: len(tokenizer.encode(text).ids))
    def entry(name: str, variant: str, suffix: str = "") -> dict[str, Any]:
        return {"name": f"vela-{name}{suffix}", "package": str((packages / name).resolve()), "variant": variant,
                "device": "cpu", "threads": settings.threads}

    models = [*(entry(n, SERVED) for n in SPECIALISTS), entry("domain", ALSO, "-fp32")]
    server = lab.adopt(ServerProcess(packages, SERVED, settings.threads, log_dir=lab.log_dir, models=models))
    worker = TorchSpecialists(settings.threads, sources, packages, lab.log_dir / "task-heads-torch.log")
    started = time.perf_counter()
    ours: list[HttpSpecialists] = []
    try:
        server.wait_ready(READY_TIMEOUT_S)
        worker.wait_ready(READY_TIMEOUT_S)
        load_s = time.perf_counter() - started
        ours = [HttpSpecialists(server), HttpSpecialists(server, "-fp32")]
        contestants: dict[str, HttpSpecialists | TorchSpecialists] = {OURS: ours[0], OURS_FP32: ours[1], TORCH: worker}

        def runs(name: str) -> dict[str, HttpSpecialists | TorchSpecialists]:
            return {k: c for k, c in contestants.items() if k != OURS_FP32 or name != BUNDLE}

        answers = {name: {k: c.answers(body) for k, c in runs(name).items()} for name, body in requests.items()}
        samples = interleaved_rounds(settings.rounds, TIMED_BUDGET_S, SETTLE_S, {
            name: {k: functools.partial(c.time, body, CALLS[name]) for k, c in runs(name).items()}
            for name, body in requests.items()})
    finally:
        for client in ours:
            client.stop()
        worker.stop()
        server.stop()
    stats = {n: {k: summarize(v) for k, v in by.items()} for n, by in samples.items()}
    tokens = {n: [len(tokenizer.encode(t).ids) for t in body["texts"]] for n, body in requests.items()}
    cards = {n: json.loads((packages / n / "card.json").read_text(encoding="utf-8")) for n in SPECIALISTS}
    return [subject_table(built_s, cards, load_s, settings.threads),
            latency_table(stats, tokens, len(samples[ONE][OURS])),
            agreement_table(answers)]


def subject_table(built_s: float | None, cards: Mapping[str, Mapping[str, Any]], load_s: float,
                  threads: int) -> Table:
    from edge_runtime.engine.cpu import cpu_class

    cpu = cpu_class()
    built = "reused from an earlier run" if built_s is None else f"{built_s:.0f} s this run (six sources and packages)"
    worst = max(c["verification"]["readout"]["value"] for c in cards.values())
    int8 = [c["variants"][SERVED]["agreement"] for c in cards.values()]
    products = [c["verification"]["integer_products"] for c in cards.values()]
    rows = [
        ["backbone", f"random-weight mmBERT of Vela 1.0's shape: vocabulary {SHAPE['vocab_size']:,}, hidden "
                     f"{SHAPE['hidden_size']}, {SHAPE['num_hidden_layers']} layers, {SHAPE['num_attention_heads']} "
                     f"heads, intermediate {SHAPE['intermediate_size']}, global every "
                     f"{SHAPE['global_attn_every_n_layers']}rd layer, local window {SHAPE['local_attention']}, YaRN "
                     f"x4; weights N(0, {WEIGHT_STD}²); the fixtures' ~500-token BPE"],
        ["specialists", ", ".join(f"{n} ({len(c['labels'])} labels, {c['head']['pooling']})"
                                  for n, c in cards.items())],
        ["build (once, into the packages directory)", built],
        ["converter's parity check (cards)", f"largest |Δp| against Transformers {worst:g} (tolerance 1e-5)"],
        ["exact int8 against fp32 (cards)", f"largest |Δp| {max(a['max_abs_dp'] for a in int8):g}, least top-label "
                                            f"agreement {min(a['top_label_agreement'] for a in int8):g} over "
                                            f"{int8[0]['cases']} real sentences each, alone"],
        ["exact int8 integer products (cards)", f"{sum(p['gemms'] for p in products)} integer GEMMs checked against "
                                                "int64 products, largest relative error "
                                                f"{max(p['max_relative_error'] for p in products):.2g}"],
        ["CPU", f"{cpu['model']}; int8 instructions: {', '.join(cpu['int8_instructions']) or 'none'}"],
        ["threads", f"{threads} intra-op, 1 inter-op for both contestants"],
        ["start-up", f"{load_s:.0f} s until the server's six models and Transformers' six were loaded"],
    ]
    return Table("task-heads: what was measured", ["item", "value"], rows)


def latency_table(stats: Mapping[str, Mapping[str, Summary]], tokens: Mapping[str, list[int]], rounds: int) -> Table:
    def cell(s: Summary | None) -> str:
        return "—" if s is None else f"{fmt_ms(s.median, 1)} ({fmt_ms(s.round_low, 1)}–{fmt_ms(s.round_high, 1)})"

    rows = []
    for name, s in stats.items():
        int8, fp32, torch = s[OURS], s.get(OURS_FP32), s[TORCH]
        rows.append([name, ", ".join(map(str, tokens[name])), f"{CALLS[name]} × {rounds}", cell(int8), cell(fp32),
                     cell(torch), fmt_ratio(ratio(torch.median, int8.median)),
                     "—" if fp32 is None else fmt_ratio(ratio(torch.median, fp32.median))])
    return Table(f"task-heads at Vela 1.0's shape: classify latency, ours exact int8 and fp32 vs Transformers fp32 "
                 f"({rounds} rounds)",
                 ["request", "tokens per text", "calls", "ours int8 p50 ms (round medians)",
                  "ours fp32 p50 ms (round medians)", "torch p50 ms (round medians)", "int8 vs torch",
                  "fp32 vs torch"], rows,
                 ["Ours: client wall time over HTTP (JSON, tokenization, numpy head included); eight texts are one "
                  "request, batched right-padded by the server; the bundle is one /v1/bundle of six classify tasks, "
                  "one per specialist, each at its exact int8. Transformers: the same texts as one right-padded batch "
                  "per model, in-process; the bundle runs the six models in turn. vs torch: torch p50 ÷ ours p50."])


def agreement_table(answers: Mapping[str, Mapping[str, Mapping[str, list[list[float]]]]]) -> Table:
    def worst(ours: Mapping[str, list[list[float]]], torch: Mapping[str, list[list[float]]]) -> str:
        largest = max(abs(a - b) for model, rows_ in ours.items() for row_a, row_b in zip(rows_, torch[model])
                      for a, b in zip(row_a, row_b))
        return f"{largest:.2e}"

    rows = [[name, worst(by[OURS], by[TORCH]), worst(by[OURS_FP32], by[TORCH]) if OURS_FP32 in by else "—"]
            for name, by in answers.items()]
    return Table("task-heads at Vela 1.0's shape: agreement, ours vs Transformers fp32",
                 ["request", "int8: max |Δp|", "fp32: max |Δp|"], rows,
                 ["Every probability of every text and specialist (Transformers reads a padded batch). Random "
                  "weights have none of a trained model's activation outliers: the cards' agreement on real "
                  "sentences is the int8 figure to read."])


def main(argv: Sequence[str] | None = None) -> int:
    return contestant_main(argv, "python -m bench.task_heads", build, load_torch, "Transformers")


if __name__ == "__main__":
    sys.exit(main())
