"""What the converters' checks share: the server's own session for a graph, tokenized rows and their
right-padded batches, and how a card names and rounds what a graph was compared with."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

Row = dict[str, np.ndarray]  # one tokenized input: 1-D int64 arrays by graph input name


def create_session(path: Path) -> ort.InferenceSession:
    """The server's own CPU session (edge_runtime.engine.session: its pinned optimisation level and
    settings) with one thread, so goldens and parity are measured as the server will run the graph."""
    from edge_runtime.engine.session import create_session as server_session

    return server_session(path, "cpu", 1).session


def encode_rows(tokenizer: Tokenizer, items: Sequence[str | tuple[str, str]], max_tokens: int) -> list[Row]:
    """Tokenize texts or (text, pair) items with specials, truncated to ``max_tokens``."""
    tok = Tokenizer.from_str(tokenizer.to_str())
    tok.no_padding()
    tok.enable_truncation(max_tokens)
    rows = []
    for item in items:
        enc = tok.encode(item[0], item[1]) if isinstance(item, tuple) else tok.encode(item)
        rows.append({
            "input_ids": np.asarray(enc.ids, dtype=np.int64),
            "attention_mask": np.asarray(enc.attention_mask, dtype=np.int64),
            "token_type_ids": np.asarray(enc.type_ids, dtype=np.int64),
        })
    return rows


def pad_batch(rows: Sequence[Row], input_names: Sequence[str], pad_id: int) -> dict[str, np.ndarray]:
    """Right-pad rows into one batch of the graph's inputs (ids with pad_id, mask and types with 0)."""
    width = max(len(r["input_ids"]) for r in rows)
    feeds = {}
    for name in input_names:
        fill = pad_id if name == "input_ids" else 0
        arr = np.full((len(rows), width), fill, dtype=np.int64)
        for i, r in enumerate(rows):
            arr[i, : len(r[name])] = r[name]
        feeds[name] = arr
    return feeds


def torch_reference(what: str) -> str:
    """A card's verification reference: the PyTorch and Transformers versions, then ``what`` was compared."""
    import torch
    import transformers

    return f"PyTorch {torch.__version__.split('+')[0]} / transformers {transformers.__version__} {what}"


def rounded(value: float) -> float:
    """A measured difference as cards record it: three significant digits."""
    return float(f"{value:.3g}")
