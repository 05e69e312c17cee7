"""The Decision 2.0 candidate head and answers in numpy (docs/reference/upstream-formats.md §1.7, §1.8).

Per question, with ``c_j = LN_c(h[endpoint_j])`` (the last token of option segment j) and
``q = LN_q(h[query])`` (the last token of the prompt), both LayerNorms eps 1e-5:

    logit_j = (K c_j) . (Q q) / sqrt(d) + w . GELU(Mc c_j + bc + Mq q)

GELU is the exact erf form. Tensors (``decision_head.safetensors``, exactly these ten):
``candidate_norm.weight|bias``, ``query_norm.weight|bias`` [H]; ``key.weight``, ``query.weight``,
``candidate_mlp.weight`` [d, H]; ``candidate_mlp.bias`` [d]; ``query_mlp.weight`` [d, H];
``scalar.weight`` [1, d]. Answers: score bias (score questions whose level count has offsets) is
added to the raw logits, then float64 softmax at the type's temperature; choice and score
confidence is ``1 - H / ln K``; noul is ``p(true)``. Every vector is computed on its own, so an
answer does not depend on what else was batched.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

HEAD_TENSORS = frozenset({
    "candidate_norm.weight", "candidate_norm.bias", "query_norm.weight", "query_norm.bias", "key.weight",
    "query.weight", "candidate_mlp.weight", "candidate_mlp.bias", "query_mlp.weight", "scalar.weight",
})
LN_EPS = 1e-5


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _ln(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True, dtype=np.float32)
    c = x - mean
    var = (c * c).mean(-1, keepdims=True, dtype=np.float32)
    return c / np.sqrt(var + np.float32(LN_EPS)) * w + b


@dataclass(frozen=True)
class CandidateHead:
    """The ten float32 tensors of a Decision 2.0 head."""

    t: dict[str, np.ndarray]
    dim: int

    @staticmethod
    def from_arrays(arrays: Mapping[str, np.ndarray]) -> CandidateHead:
        """Strict: exactly the ten names, with consistent shapes."""
        if set(arrays) != HEAD_TENSORS:
            missing, extra = sorted(HEAD_TENSORS - set(arrays)), sorted(set(arrays) - HEAD_TENSORS)
            raise ValueError(f"candidate head tensors must be exactly the ten of §1.7; missing {missing}, "
                             f"unexpected {extra}")
        t = {k: np.ascontiguousarray(np.asarray(v, dtype=np.float32)) for k, v in arrays.items()}
        d, h = t["key.weight"].shape
        shapes = {"candidate_norm.weight": (h,), "candidate_norm.bias": (h,), "query_norm.weight": (h,),
                  "query_norm.bias": (h,), "query.weight": (d, h), "candidate_mlp.weight": (d, h),
                  "candidate_mlp.bias": (d,), "query_mlp.weight": (d, h), "scalar.weight": (1, d)}
        for k, shape in shapes.items():
            if t[k].shape != shape:
                raise ValueError(f"{k} must be {list(shape)}, is {list(t[k].shape)}")
        return CandidateHead(t, int(d))

    def logits(self, endpoints: np.ndarray, query: np.ndarray) -> np.ndarray:
        """float32 [K] for one question: ``endpoints`` [K, H] states, ``query`` [H] state."""
        t = self.t
        c = _ln(np.asarray(endpoints, np.float32), t["candidate_norm.weight"], t["candidate_norm.bias"])
        q = _ln(np.asarray(query, np.float32)[None], t["query_norm.weight"], t["query_norm.bias"])[0]
        qq = t["query.weight"] @ q                                   # [d]
        mq = t["query_mlp.weight"] @ q                               # [d]
        out = np.empty(c.shape[0], dtype=np.float32)
        for j in range(c.shape[0]):  # one vector at a time: no batch-dependent matrix products
            bilinear = (t["key.weight"] @ c[j] * qq).sum(dtype=np.float32) / np.float32(math.sqrt(self.dim))
            pre = (t["candidate_mlp.weight"] @ c[j] + t["candidate_mlp.bias"] + mq).astype(np.float64)
            gelu = (0.5 * pre * (1.0 + _erf(pre / math.sqrt(2.0)))).astype(np.float32)
            out[j] = bilinear + (t["scalar.weight"][0] * gelu).sum(dtype=np.float32)
        return out


def _softmax(x: Sequence[float]) -> list[float]:
    m = max(x)
    e = [math.exp(v - m) for v in x]
    s = sum(e)
    return [v / s for v in e]


def _entropy_confidence(p: Sequence[float]) -> float:
    k = len(p)
    h = -sum(x * math.log(x) for x in p if x > 0)
    return min(1.0, max(0.0, 1.0 - h / math.log(k))) if k > 1 else 1.0


def answer(kind: str, keys: Sequence[str], logits: Sequence[float], temperature: float,
           score_bias: Mapping[int, Sequence[float]] | None = None,
           legend: Sequence[Any] | None = None) -> dict[str, Any]:
    """One Decision 2.0 answer (§1.8); ValueError for invalid model output (non-finite, wrong count)."""
    values = [float(v) for v in logits]
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError("temperature must be finite and positive")
    if len(values) != len(keys) or not 2 <= len(values) <= 255 or not all(math.isfinite(v) for v in values):
        raise ValueError("invalid model output")
    if kind == "score" and score_bias and len(values) in score_bias:
        values = [v + float(b) for v, b in zip(values, score_bias[len(values)])]
    p = _softmax([v / temperature for v in values])
    probs = dict(zip(keys, p))
    if kind == "noul":
        return {"type": "noul", "noul": probs["true"]}
    conf = _entropy_confidence(p)
    if kind == "choice":
        top = max(p)
        near = [k for k, v in probs.items() if abs(v - top) <= 1e-8]
        winner = near[0] if len(near) == 1 else next(k for k, v in probs.items() if v == top)
        return {"type": "choice", "choice": winner, "probabilities": probs, "confidence": conf}
    return {"type": "score", "score": math.fsum(int(k) * v for k, v in probs.items()), "probabilities": probs,
            "confidence": conf,
            "legend": {k: (d if isinstance(d, str) else _canonical(d)) for k, d in zip(keys, legend or [])}}


def _canonical(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
