"""Dynamic int8 variants and how closely they agree with fp32.

quantize_dynamic with QInt8 weights and per-channel scales (per-tensor loses too much on MiniLM:
cosine 0.93 against 0.99). quant_pre_process is skipped: it fails on these opset-18 exports and
leaves temporary files in the working directory. Agreement is measured one row at a time, since a
dynamic int8 graph's output depends on what else is in the batch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic

from converters.readout import cosine, pool, sigmoid, softmax
from converters.verify import Row


@contextlib.contextmanager
def _in_dir(path: Path) -> Iterator[None]:
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def quantize_int8(src: Path, dst: Path) -> Path:
    """Write a dynamic int8 (QInt8, per-channel) copy of the graph ``src`` to ``dst``."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer's "consider pre-processing" warning: skipped on purpose
    with tempfile.TemporaryDirectory(prefix="er-quant-") as tmp, _in_dir(Path(tmp)):
        # run inside a scratch directory: onnxruntime's quantizer may drop helper files in the CWD
        try:
            quantize_dynamic(model_input=str(src), model_output=str(dst), weight_type=QuantType.QInt8,
                             per_channel=True)
        finally:
            root.setLevel(level)
    return dst


def _run_rows(session: ort.InferenceSession, rows: Sequence[Row], output: str) -> list[np.ndarray]:
    names = [i.name for i in session.get_inputs()]
    return [session.run([output], {n: r[n][None, :] for n in names})[0] for r in rows]


def measure_agreement(kind: str, head: dict[str, Any], labels: Sequence[str], fp32: ort.InferenceSession,
                      int8: ort.InferenceSession, rows: Sequence[Row]) -> dict[str, Any]:
    """Agreement of int8 with fp32 on ``rows``, each run alone.

    embedding: cosine of the pooled vectors (mean, min); classifiers: top-label agreement and max
    |dp| of the probabilities; rerank: max and mean |dp| of the relevance scores.
    """
    if kind == "embedding":
        a = _run_rows(fp32, rows, "last_hidden_state")
        b = _run_rows(int8, rows, "last_hidden_state")
        va = np.concatenate([pool(x, r["attention_mask"][None, :], head["pooling"], head["normalize"])
                             for x, r in zip(a, rows)])
        vb = np.concatenate([pool(x, r["attention_mask"][None, :], head["pooling"], head["normalize"])
                             for x, r in zip(b, rows)])
        cos = cosine(va, vb)
        return {"metric": "cosine", "mean_cosine": round(float(cos.mean()), 6),
                "min_cosine": round(float(cos.min()), 6), "cases": len(rows)}
    a = _run_rows(fp32, rows, head["output"])
    b = _run_rows(int8, rows, head["output"])
    if kind == "rerank":
        dp = np.array([abs(float(sigmoid(x).ravel()[0] - sigmoid(y).ravel()[0])) for x, y in zip(a, b)])
        return {"metric": "relevance", "max_abs_dp": round(float(dp.max()), 6),
                "mean_abs_dp": round(float(dp.mean()), 6), "cases": len(rows)}
    activate = sigmoid if kind == "multi-label" else softmax
    pa = np.concatenate([activate(x).reshape(-1, x.shape[-1]) for x in a])  # token kinds: one row per token
    pb = np.concatenate([activate(y).reshape(-1, y.shape[-1]) for y in b])
    result = {"metric": "probability",
              "top_label_agreement": round(float(np.mean(pa.argmax(-1) == pb.argmax(-1))), 6),
              "max_abs_dp": round(float(np.max(np.abs(pa - pb))), 6), "cases": len(rows)}
    if kind == "multi-label":
        t = np.array([head["thresholds"][label] for label in labels])
        result["selection_agreement"] = round(float(np.mean((pa >= t) == (pb >= t))), 6)
    if kind == "token-classification":
        result["tokens"] = int(pa.shape[0])
    return result
