"""`python -m bench.graph_identity OLD NEW [OLD NEW ...]`: whether two encoder graphs answer bit for bit the same.

Each pair (for example a package's `model.int8.onnx` from converter 0.4.0 and the same file from 0.5.0, whose
attention is ONNX Runtime's fused kernel) runs the card's corpus (the 2,500 STS Benchmark train sentences of
converters/data, tokenized by `--tokenizer`), every sentence alone and all of them in length-sorted,
right-padded batches of 32, with the server's pinned session settings at each `--threads` count, and every
output is compared byte for byte (padded positions included: both graphs must agree there too). Prints one
line per pair and thread count and exits 1 when any pair differs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from converters.quantize import AGREEMENT_BATCH, real_sentences
from converters.verify import Row, encode_rows, pad_batch
from edge_runtime.engine.session import session_options


def corpus_feeds(tokenizer: Path, inputs: Sequence[str], max_tokens: int) -> list[dict[str, np.ndarray]]:
    """Every corpus sentence alone, then all of them in length-sorted padded batches of AGREEMENT_BATCH."""
    from tokenizers import Tokenizer

    rows: list[Row] = encode_rows(Tokenizer.from_file(str(tokenizer)), real_sentences(), max_tokens)
    ordered = sorted(rows, key=lambda r: len(r["input_ids"]))
    return ([{n: r[n][None, :] for n in inputs} for r in rows]
            + [pad_batch(ordered[i:i + AGREEMENT_BATCH], inputs, 0) for i in range(0, len(ordered), AGREEMENT_BATCH)])


def differing(old: Path, new: Path, feeds: Sequence[dict[str, np.ndarray]], threads: int) -> int:
    """How many of ``feeds`` give any output of ``new`` that differs from ``old``'s in any byte."""
    sessions = [ort.InferenceSession(str(p), session_options(threads), providers=["CPUExecutionProvider"])
                for p in (old, new)]
    count = 0
    for f in feeds:
        a, b = (s.run(None, f) for s in sessions)
        count += any(x.shape != y.shape or x.tobytes() != y.tobytes() for x, y in zip(a, b))
    return count


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.graph_identity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("graphs", type=Path, nargs="+", help="pairs of graphs: OLD NEW [OLD NEW ...]")
    parser.add_argument("--tokenizer", type=Path, default=Path("models/minilm-embedding/tokenizer.json"))
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args(argv)
    if len(args.graphs) % 2:
        parser.error("graphs come in pairs: OLD NEW")
    pairs = list(zip(args.graphs[::2], args.graphs[1::2]))
    inputs = [i.name for i in ort.InferenceSession(str(pairs[0][0]), providers=["CPUExecutionProvider"]).get_inputs()]
    feeds = corpus_feeds(args.tokenizer, inputs, args.max_tokens)
    failed = False
    for old, new in pairs:
        for threads in args.threads:
            bad = differing(old, new, feeds, threads)
            failed |= bad > 0
            print(f"{old} vs {new}, {threads} thread(s): {len(feeds) - bad} of {len(feeds)} forwards bit-identical",
                  flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
