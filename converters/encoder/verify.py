"""Check an exported encoder graph against the PyTorch model, and record golden cases.

Parity runs the ONNX graph (ONNX Runtime, CPU, the server's optimisation level) and the PyTorch
model on the same tokenized samples: rows of several lengths alone (batch 1) and right-padded
together (batch 4), every graph output compared (token outputs at real tokens only: what a padded
position holds is unspecified and no head reads it). An export above the tolerance is refused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnxruntime as ort

from converters.errors import ConversionError
from converters.samples import SAMPLE_PAIRS, SAMPLE_TEXTS
from converters.verify import Row, pad_batch

#: The largest |onnx - torch| an fp32 export may show on any output element.
FP32_TOLERANCE = 1e-4
#: Golden cases are kept short so that golden files stay small.
GOLDEN_MAX_TOKENS = 64


def sample_items(kind: str) -> list[str | tuple[str, str]]:
    """The converter's sample inputs for a kind, with one long item that reaches the token limit."""
    if kind == "rerank":
        long_doc = " ".join(SAMPLE_TEXTS)
        return [*SAMPLE_PAIRS, ("Summarise the following passages.", long_doc)]
    return [*SAMPLE_TEXTS, " ".join(SAMPLE_TEXTS)]


def spread(rows: Sequence[Row], n: int, max_len: int | None = None) -> list[Row]:
    """``n`` rows whose lengths spread from the shortest to the longest (optionally capped)."""
    pool = [r for r in rows if max_len is None or len(r["input_ids"]) <= max_len]
    by_len = sorted(pool, key=lambda r: len(r["input_ids"]))
    if len(by_len) <= n:
        return by_len
    picks = sorted({round(i * (len(by_len) - 1) / (n - 1)) for i in range(n)})
    return [by_len[i] for i in picks]


def torch_outputs(model: Any, feeds: dict[str, np.ndarray], output_names: Sequence[str]) -> dict[str, np.ndarray]:
    """Run the PyTorch model and name its outputs as the graph does."""
    import torch

    want_hidden = any(n.startswith("hidden_states.") for n in output_names)
    with torch.no_grad():
        out = model(**{k: torch.from_numpy(v) for k, v in feeds.items()}, output_hidden_states=want_hidden)
    named = {}
    for name in output_names:
        if name.startswith("hidden_states."):
            named[name] = out.hidden_states[int(name.split(".", 1)[1])].numpy()
        else:
            named[name] = getattr(out, name).numpy()
    return named


@dataclass
class ParityReport:
    """How far the graph is from PyTorch over the parity cases."""

    max_abs_diff: float
    outputs: dict[str, float]
    cases: int
    lengths: list[int]
    batch_sizes: list[int] = field(default_factory=lambda: [1, 4])


def check_parity(model: Any, session: ort.InferenceSession, rows: Sequence[Row], pad_id: int,
                 tolerance: float) -> ParityReport:
    """Compare graph and PyTorch on batch-1 and batch-4 cases; ConversionError above ``tolerance``."""
    input_names = [i.name for i in session.get_inputs()]
    output_names = [o.name for o in session.get_outputs()]
    chosen = spread(rows, 6)
    batches = [[r] for r in chosen]
    # two padded batches of four that mix short and long rows
    batches += [[chosen[i % len(chosen)] for i in (0, 3, 1, 5)], [chosen[i % len(chosen)] for i in (4, 2, 5, 0)]]
    per_output = {n: 0.0 for n in output_names}
    for batch in batches:
        feeds = pad_batch(batch, input_names, pad_id)
        got = dict(zip(output_names, session.run(output_names, feeds)))
        ref = torch_outputs(model, feeds, output_names)
        for n in output_names:
            if got[n].shape != ref[n].shape:
                raise ConversionError(f"parity: output {n} has shape {got[n].shape}, PyTorch gives {ref[n].shape}")
            diff = np.abs(got[n].astype(np.float64) - ref[n])
            if not np.all(np.isfinite(got[n])):
                raise ConversionError(f"parity: output {n} is not finite")
            mask = pad_batch(batch, ["attention_mask"], 0)["attention_mask"].astype(bool)
            if diff.ndim >= 2 and diff.shape[:2] == mask.shape:
                diff = diff[mask]  # token outputs: padded positions are unspecified and never read
            per_output[n] = max(per_output[n], float(diff.max()))
    worst = max(per_output.values())
    report = ParityReport(max_abs_diff=worst, outputs=per_output, cases=len(batches),
                          lengths=sorted({len(r["input_ids"]) for r in chosen}))
    if math.isnan(worst) or worst > tolerance:
        name = max(per_output, key=per_output.__getitem__)
        raise ConversionError(f"parity check failed: max |onnx - torch| = {worst:.3g} on output {name} "
                              f"exceeds the tolerance {tolerance:g}; no package written")
    return report


def record_goldens(session: ort.InferenceSession, rows: Sequence[Row]) -> list[tuple[Row, dict[str, np.ndarray]]]:
    """Golden cases: each row alone (batch 1) with the outputs this session gives for it."""
    input_names = [i.name for i in session.get_inputs()]
    output_names = [o.name for o in session.get_outputs()]
    cases = []
    for row in rows:
        feeds = {n: row[n][None, :] for n in input_names}
        cases.append((feeds, dict(zip(output_names, session.run(output_names, feeds)))))
    return cases
