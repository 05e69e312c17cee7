"""`python -m bench.int8_quality --stsb-dev PATH`: choose the exact-int8 recipe of MiniLM by measurement.

For each candidate recipe (converters.quantize.Int8Recipe) it builds the int8 graph from the package's
fp32 `model.onnx` and measures, on the STS Benchmark *dev* split (never the test split: that is how
the result is judged), against the same package's fp32:

- Spearman of cos(s1, s2) with the human scores (x100, as published), int8 and fp32;
- every unique dev sentence's cosine to its fp32 embedding (min, 1st percentile, mean);
- nearest-neighbour agreement: the share of dev sentences whose nearest other dev sentence is the
  same under int8 as under fp32;
- batch-32 forward time against fp32, interleaved rounds in one process (ratios, not absolutes).

The STSb file is read from disk, never downloaded: the official `sts-dev.csv` (tab-separated: genre,
file, year, id, score, sentence1, sentence2) or a three-column `sentence1,sentence2,score` CSV. Its
text is under its sources' licences (see the archive's LICENSE.txt); nothing of it is committed.
Embeddings go through the package's tokenizer (truncated at the card's token limit), mean pooling and
L2 normalisation, as the server does; batches of 32 in length order (the exact variant's rows do not
depend on their batch, so this equals serving each sentence alone).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.report import conditions
from converters.quantize import CALIBRATED_RECIPE, DEFAULT_RECIPE, Int8Recipe, quantize_int8_exact
from converters.readout import pool
from edge_runtime.engine import create_session

BATCH = 32
#: Matmul kinds of a BERT layer, as they appear in the exported node names.
KINDS = {"query": r"/attention/self/query/", "key": r"/attention/self/key/",
         "value": r"/attention/self/value/", "attention-output": r"/attention/output/dense/",
         "intermediate": r"/intermediate/dense/", "output": r"/layer\.\d+/output/dense/"}


class Saturating(Int8Recipe):
    """A recipe whose pair sums can saturate AVX2's 16-bit lanes: built only to measure, never shipped."""

    def check(self) -> None:
        """No saturation check (the measurement runs on a CPU whose kernel computes it exactly)."""


#: Named candidates (`--recipes`); `sweep` adds one per matmul kind and one per layer kept in fp32.
CANDIDATES: dict[str, Int8Recipe] = {
    "w127-a127 (the old recipe; saturates on AVX2)": Saturating(weight_max=127, activation_max=127),
    "w64-a127 (unsmoothed: DEFAULT_RECIPE, what decision-codes backbones get)": DEFAULT_RECIPE,
    "w127-a63-s0.6": Int8Recipe(weight_max=127, activation_max=63, smooth_alpha=0.6),
    "w64-a127-s0.6 (the encoders' recipe before outlier channels)": Int8Recipe(weight_max=64, smooth_alpha=0.6),
    "w64-a127-s0.6-o16": Int8Recipe(weight_max=64, smooth_alpha=0.6, outliers=16),
    "w64-a127-o4 (outlier channels, no smoothing)": Int8Recipe(weight_max=64, outliers=4),
    "w64-a127-s0.5": Int8Recipe(weight_max=64, smooth_alpha=0.5),
    "w64-a127-s0.7": Int8Recipe(weight_max=64, smooth_alpha=0.7),
    "w64-a127-s0.6-ffn-out-fp32": Int8Recipe(weight_max=64, smooth_alpha=0.6, fp32=(KINDS["output"],)),
    "w64-a127-s0.6-split (every weight in two terms)": Int8Recipe(weight_max=64, smooth_alpha=0.6, split=(".",)),
    "w64-a127-s0.6-split-ffn-out-fp32": Int8Recipe(weight_max=64, smooth_alpha=0.6, fp32=(KINDS["output"],),
                                                   split=(".",)),
    "ov-fp32-split (FFN output and value in fp32, every other weight in two terms)": Int8Recipe(
        weight_max=64, smooth_alpha=0.6, fp32=(KINDS["output"], KINDS["value"]), split=(".",)),
    "w64-a127-s0.6-ffn-fp32": Int8Recipe(weight_max=64, smooth_alpha=0.6,
                                         fp32=(KINDS["output"], KINDS["intermediate"], KINDS["value"])),
}


def read_sts(path: Path) -> list[tuple[str, str, float]]:
    """(sentence1, sentence2, score) pairs from the official tab-separated file or a 3-column CSV."""
    text = path.read_text(encoding="utf-8")
    pairs: list[tuple[str, str, float]] = []
    if "\t" in text.splitlines()[0]:
        for line in text.splitlines():
            cols = line.split("\t")
            if len(cols) >= 7:
                pairs.append((cols[5], cols[6], float(cols[4])))
    else:
        for row in csv.reader(text.splitlines()):
            if len(row) == 3:
                pairs.append((row[0], row[1], float(row[2])))
    if not pairs:
        raise SystemExit(f"{path}: no STS pairs found (expected sts-dev.csv or sentence1,sentence2,score)")
    return pairs


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


@dataclass
class Encoded:
    """Token ids of the sentences, in length-sorted batches of BATCH."""

    batches: list[tuple[np.ndarray, dict[str, np.ndarray]]]  # (sentence indices, feeds)
    count: int


def encode(package: Path, texts: Sequence[str]) -> Encoded:
    """Tokenize with the package's tokenizer and card limit; padded, length-sorted batches."""
    from tokenizers import Tokenizer

    card = json.loads((package / "card.json").read_text())
    tok = Tokenizer.from_file(str(package / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(int(card["limits"]["max_input_tokens"]))
    encs = tok.encode_batch(list(texts))
    order = np.argsort([len(e.ids) for e in encs], kind="stable")
    batches = []
    for start in range(0, len(order), BATCH):
        idx = order[start:start + BATCH]
        width = max(len(encs[i].ids) for i in idx)
        ids = np.zeros((len(idx), width), np.int64)
        mask = np.zeros((len(idx), width), np.int64)
        for r, i in enumerate(idx):
            n = len(encs[i].ids)
            ids[r, :n] = encs[i].ids
            mask[r, :n] = 1
        batches.append((idx, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}))
    return Encoded(batches, len(texts))


def embed(graph: Path, encoded: Encoded, threads: int) -> np.ndarray:
    """Mean-pooled, normalised embeddings [n, d] of every encoded sentence, in input order."""
    session = create_session(graph, "cpu", threads)
    out: np.ndarray | None = None
    for idx, feeds in encoded.batches:
        hidden = session.run(feeds, ["last_hidden_state"])["last_hidden_state"]
        vecs = pool(hidden, feeds["attention_mask"], "mean", True)
        if out is None:
            out = np.zeros((encoded.count, vecs.shape[1]), np.float64)
        out[idx] = vecs
    assert out is not None
    return out


def calibration_rows(package: Path) -> list[dict[str, np.ndarray]]:
    """The converter's own calibration rows (its generated sample texts), so the bench measures what
    `python -m converters default` builds."""
    from tokenizers import Tokenizer

    from converters.encoder.verify import sample_items
    from converters.verify import encode_rows

    card = json.loads((package / "card.json").read_text())
    tok = Tokenizer.from_file(str(package / "tokenizer.json"))
    return encode_rows(tok, sample_items("embedding"), int(card["limits"]["max_input_tokens"]))


def nearest(vecs: np.ndarray) -> np.ndarray:
    """Index of each row's nearest other row by cosine (rows are unit vectors)."""
    sims = vecs @ vecs.T
    np.fill_diagonal(sims, -np.inf)
    return np.asarray(sims.argmax(axis=1))


def quality(vecs: np.ndarray, ref: np.ndarray, ref_nn: np.ndarray, pairs: Sequence[tuple[str, str, float]],
            index: dict[str, int]) -> dict[str, float]:
    """STS Spearman of ``vecs``, and its agreement with the fp32 embeddings ``ref``."""
    a = np.array([index[p[0]] for p in pairs])
    b = np.array([index[p[1]] for p in pairs])
    gold = np.array([p[2] for p in pairs])
    cos_pairs = (vecs[a] * vecs[b]).sum(axis=1)
    cos_ref = (vecs * ref).sum(axis=1)
    return {"spearman": 100 * spearman(cos_pairs, gold),
            "min_cosine": float(cos_ref.min()), "p1_cosine": float(np.percentile(cos_ref, 1)),
            "mean_cosine": float(cos_ref.mean()),
            "nn_agreement": float(np.mean(nearest(vecs) == ref_nn))}


def time_forwards(graphs: dict[str, Path], feeds: dict[str, np.ndarray], threads: int, rounds: int,
                  calls: int, clock: str) -> dict[str, float]:
    """Median forward ms of each graph on ``feeds``, rounds interleaved in a rotating order. ``clock``
    "cpu" counts the process's CPU time (with 1 thread the least disturbed by other work on a shared
    machine), "wall" the elapsed time."""
    now = time.process_time if clock == "cpu" else time.perf_counter
    sessions = {k: create_session(p, "cpu", threads) for k, p in graphs.items()}
    for s in sessions.values():
        for _ in range(2):
            s.run(feeds, ["last_hidden_state"])
    samples: dict[str, list[float]] = {k: [] for k in sessions}
    keys = list(sessions)
    for r in range(rounds):
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            t = now()
            for _ in range(calls):
                sessions[k].run(feeds, ["last_hidden_state"])
            samples[k].append((now() - t) * 1000 / calls)
    return {k: statistics.median(v) for k, v in samples.items()}


def sweep(base: Int8Recipe) -> dict[str, Int8Recipe]:
    """``base`` with each matmul kind, then each layer, kept in fp32 (sensitivity)."""
    out = {f"{name} fp32": dataclasses.replace(base, fp32=(pattern,)) for name, pattern in KINDS.items()}
    out.update({f"layer {i} fp32": dataclasses.replace(base, fp32=(rf"/layer\.{i}/",)) for i in range(6)})
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure every candidate; returns the results (and prints them as they come)."""
    pairs = read_sts(args.stsb_dev)
    texts = sorted({s for p in pairs for s in p[:2]})
    index = {t: i for i, t in enumerate(texts)}
    encoded = encode(args.package, texts)
    fp32_graph = args.package / "model.onnx"
    ref = embed(fp32_graph, encoded, args.threads)
    ref_nn = nearest(ref)
    results: dict[str, Any] = {"conditions": conditions(args.threads, args.rounds),
                               "data": f"{args.stsb_dev.name}: {len(pairs)} pairs, {len(texts)} unique sentences",
                               "recipes": {}}
    results["recipes"]["fp32"] = quality(ref, ref, ref_nn, pairs, index)
    print("fp32", json.dumps(results["recipes"]["fp32"]), flush=True)
    candidates: dict[str, Int8Recipe] = {"default": CALIBRATED_RECIPE}
    for name in args.recipes:
        if name == "sweep":
            candidates.update(sweep(CALIBRATED_RECIPE))
        else:
            key = next(k for k in CANDIDATES if k.split(" ")[0] == name)
            candidates[key] = CANDIDATES[key]
    graphs = {"fp32": fp32_graph}
    calibration = calibration_rows(args.package)
    with tempfile.TemporaryDirectory(prefix="int8-quality-") as tmp:
        for i, (name, recipe) in enumerate(candidates.items()):
            graph = quantize_int8_exact(fp32_graph, Path(tmp) / f"r{i}.onnx", recipe, calibration)
            q: dict[str, Any] = dict(quality(embed(graph, encoded, args.threads), ref, ref_nn, pairs, index))
            q["recipe"] = recipe.describe()
            results["recipes"][name] = q
            print(name, json.dumps({k: v for k, v in q.items() if k != "recipe"}), flush=True)
            if name == "default" or name in CANDIDATES:
                graphs[name] = graph
        if args.rounds:
            # a batch of 32 typical dev sentences (the middle of the length order), and its first alone
            mid = encoded.batches[len(encoded.batches) // 2][1]
            for label, feeds, calls in (("batch32", mid, args.calls), ("batch1", {k: v[:1] for k, v in mid.items()},
                                                                        args.calls * 8)):
                ms = time_forwards(graphs, feeds, args.threads, args.rounds, calls, args.clock)
                results[f"{label}_ms"] = ms
                for k, v in ms.items():
                    print(f"{label} ({feeds['input_ids'].shape[1]} tokens, {args.clock} time) {k}: {v:.2f} ms, "
                          f"fp32/this {ms['fp32'] / v:.2f}x", flush=True)
            results["tokens"] = int(mid["input_ids"].shape[1])
    return results


def served(args: argparse.Namespace) -> dict[str, Any]:
    """The package's fp32 and int8 as the server serves them (HTTP, base64 vectors, batches of 32 in
    dev order): Spearman of each, and int8's agreement with fp32."""
    from bench.harness.runners import HttpContestant
    from bench.harness.server import ServerProcess

    pairs = read_sts(args.stsb_dev)
    texts = sorted({s for p in pairs for s in p[:2]})
    index = {t: i for i, t in enumerate(texts)}
    vecs: dict[str, np.ndarray] = {}
    for variant in ("fp32", "int8"):
        server = ServerProcess(args.package, variant, args.threads)
        try:
            server.wait_ready()
            client = HttpContestant(variant, server, "base64")
            vecs[variant] = np.concatenate([client.embed(texts[i:i + BATCH]) for i in range(0, len(texts), BATCH)])
        finally:
            server.stop()
    ref_nn = nearest(vecs["fp32"].astype(np.float64))
    out = {v: quality(x.astype(np.float64), vecs["fp32"].astype(np.float64), ref_nn, pairs, index)
           for v, x in vecs.items()}
    for v, q in out.items():
        print(f"served {v}", json.dumps(q), flush=True)
    return {"conditions": conditions(args.threads, 0), "served": out,
            "data": f"{args.stsb_dev.name}: {len(pairs)} pairs, {len(texts)} unique sentences"}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.int8_quality", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stsb-dev", type=Path, required=True, help="the STS Benchmark dev split (sts-dev.csv)")
    parser.add_argument("--package", type=Path, default=Path("models/minilm-embedding"))
    parser.add_argument("--recipes", nargs="*", default=[],
                        help="candidates besides the default (CANDIDATES' first words, e.g. high-agreement), "
                             "or sweep")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5, help="timing rounds (0: no timing)")
    parser.add_argument("--calls", type=int, default=4, help="timed batch-32 calls per round (batch 1: 8x)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="time elapsed, or the process's CPU time (use with --threads 1 on a shared machine)")
    parser.add_argument("--served", action="store_true",
                        help="measure the package's own fp32 and int8 through the server over HTTP instead")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    results = served(args) if args.served else run(args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
