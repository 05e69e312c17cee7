"""Memory: RSS of the server with the default models loaded, and after 20,000 mixed requests.

The server serves the repository's models.yaml (minilm-embedding and sparrow-nano) from the
packages directory. Requests cycle through single and batched embeddings of varied lengths and
decisions with Choice, Noul and Score questions, one at a time on a kept-alive connection. The
first WARMUP requests include each model's largest shape (ONNX Runtime keeps the arena for the
largest shape it has run), so growth after warm-up shows whether anything accumulates.
"""

from __future__ import annotations

import random
from typing import Any

import yaml

from bench.harness.lab import Lab
from bench.harness.report import ROOT, Table
from bench.harness.server import ServerProcess
from bench.harness.texts import sentences

REQUESTS = 20_000
WARMUP = 1_000
CHECKPOINTS = (WARMUP, 5_000, 10_000, REQUESTS)
MIB = 1024 * 1024


def _models(lab: Lab) -> list[dict[str, Any]]:
    """The repository's models.yaml, its package paths resolved into the bench's packages directory."""
    models = yaml.safe_load((ROOT / "models.yaml").read_text(encoding="utf-8"))["models"]
    for m in models:
        m["package"] = str((lab.settings.packages / m["package"].rsplit("/", 1)[-1]).resolve())
        m["threads"] = min(m.get("threads") or lab.settings.threads, lab.settings.threads)
    return models


def _decision(rng: random.Random, texts: list[str]) -> dict[str, Any]:
    state = " ".join(rng.sample(texts, rng.randint(1, 6)))
    kind = rng.choice(("choice", "noul", "score"))
    if kind == "choice":
        question = {"type": "choice", "instructions": "Which team should handle this?",
                    "choices": [{"key": k, "description": d} for k, d in
                                (("billing", "Payments"), ("shipping", "Deliveries"), ("account", "Logins"))]}
    elif kind == "noul":
        question = {"type": "noul", "instructions": "Is the customer upset?"}
    else:
        question = {"type": "score", "instructions": "How urgent is it?", "levels": ["Low", "Medium", "High"]}
    return {"model": "sparrow-nano", "state": state, "questions": {"q": question}}


def _requests(seed: int = 3) -> list[tuple[str, dict[str, Any]]]:
    """The mixed request sequence: the largest shapes first, then a seeded mix of lengths and surfaces."""
    rng = random.Random(seed)
    texts = sentences(400, seed=seed)
    long = " ".join(texts)[:4000]
    out: list[tuple[str, dict[str, Any]]] = [
        ("/v1/embeddings", {"model": "minilm-embedding", "input": [long] * 32,
                            "options": {"overflow": "truncate"}}),
        ("/v1/decisions", {"model": "sparrow-nano", "state": long * 3,
                           "questions": {"q": {"type": "noul", "instructions": "Is it long?"}}}),
    ]
    while len(out) < REQUESTS:
        roll = rng.random()
        if roll < 0.6:
            out.append(("/v1/embeddings", {"model": "minilm-embedding", "input": rng.choice(texts)}))
        elif roll < 0.75:
            batch = [" ".join(rng.sample(texts, rng.randint(1, 3))) for _ in range(rng.randint(2, 8))]
            out.append(("/v1/embeddings", {"model": "minilm-embedding", "input": batch,
                                           "options": {"overflow": "truncate"}}))
        else:
            out.append(("/v1/decisions", _decision(rng, texts)))
    return out


def run(lab: Lab) -> list[Table]:
    server = ServerProcess(lab.settings.package, "fp32", lab.settings.threads, log_dir=lab.log_dir,
                           models=_models(lab))
    try:
        server.wait_ready()
        loaded = server.memory()
        readings: dict[int, dict[str, int]] = {}
        failures = 0
        for i, (path, payload) in enumerate(_requests(), start=1):
            failures += server.post(path, payload).status != 200
            if i in CHECKPOINTS:
                readings[i] = server.memory()
    finally:
        server.stop()
    warm = readings[WARMUP]["VmRSS"]
    rows = [["loaded (ready, no request yet)", f"{loaded['VmRSS'] / MIB:.1f}", f"{loaded['VmHWM'] / MIB:.1f}", "–"]]
    for n in CHECKPOINTS:
        rss = readings[n]["VmRSS"]
        growth = "–" if n == WARMUP else f"{(rss - warm) / warm * 100:+.2f} %"
        rows.append([f"after {n:,} requests", f"{rss / MIB:.1f}", f"{readings[n]['VmHWM'] / MIB:.1f}", growth])
    return [Table(
        f"Memory: the default models (minilm-embedding, sparrow-nano), {REQUESTS:,} mixed requests",
        ["point", "VmRSS MiB", "VmHWM MiB (peak)", "RSS growth after warm-up"],
        rows,
        [f"Requests one at a time: 60 % single embeddings, 15 % batches of 2-8, 25 % sparrow decisions; the "
         f"first two are each model's largest shape. {failures} of {REQUESTS:,} answers were not 200 "
         "(expected 0)."],
    )]
