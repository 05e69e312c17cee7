"""The Vela 2.0 marker head in numpy (docs/reference/upstream-formats.md §2.7).

Option (and abstain, and set label) logits are read at each ``[O]``/``[ABS]`` marker against its
question's ``[Q]`` marker and the mean of the parts it reads; span logits are word x label cosine
similarities between each word's first token and each label's ``[E]`` marker. Everything is
float32, as upstream computes it; one shared LayerNorm (eps 1e-5) normalises every input, and
``normalize`` is L2 with eps 1e-12 (PyTorch's ``F.normalize``). Every row is computed on its own
(no matrix product over the batch), so a row's logits are bit-identical alone or batched.

Tensors (head.npz, upstream names): ``norm.weight|bias`` [H]; ``w_o|w_q|w_p|w_t|w_e.weight`` [P, H]
and ``.bias`` [P]; ``log_tau``, ``log_tau_span`` scalars; with readout ``mlp`` or ``both`` also
``cls_mlp.0.weight`` [2H, H], ``cls_mlp.0.bias`` [2H], ``cls_mlp.3.weight`` [1, 2H],
``cls_mlp.3.bias`` [1].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

READOUTS = ("cosine", "mlp", "both")
_PROJECTIONS = ("w_o", "w_q", "w_p", "w_t", "w_e")
_COSINE = ("norm.weight", "norm.bias", *(f"{p}.{k}" for p in _PROJECTIONS for k in ("weight", "bias")),
           "log_tau", "log_tau_span")
_MLP = ("cls_mlp.0.weight", "cls_mlp.0.bias", "cls_mlp.3.weight", "cls_mlp.3.bias")
LN_EPS = 1e-5
NORM_EPS = 1e-12


def head_tensor_names(readout: str) -> frozenset[str]:
    """The exact tensor set a readout mode loads (the span head and norms are always there)."""
    if readout not in READOUTS:
        raise ValueError(f"readout must be one of {READOUTS}, got {readout!r}")
    return frozenset(_COSINE + (_MLP if readout != "cosine" else ()))


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True, dtype=np.float32)
    centred = x - mean
    var = (centred * centred).mean(-1, keepdims=True, dtype=np.float32)
    return (centred / np.sqrt(var + np.float32(LN_EPS))) * w + b


def _linear_rows(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """``x @ weight.T + bias`` one row at a time.

    A matrix product over all rows lets BLAS pick its kernel and blocking by the row count, so a
    row's result would change with whatever else shares its batch; one matrix-vector product per
    row keeps every answer the same alone or batched.
    """
    out = np.empty((x.shape[0], weight.shape[0]), dtype=np.float32)
    for i in range(x.shape[0]):
        out[i] = weight @ x[i]
    return out + bias


def _normalize(x: np.ndarray) -> np.ndarray:
    norm = np.sqrt((x * x).sum(-1, keepdims=True, dtype=np.float32))
    return x / np.maximum(norm, np.float32(NORM_EPS))


@dataclass(frozen=True)
class MarkerHead:
    """The head's float32 tensors and its readout mode."""

    tensors: dict[str, np.ndarray]
    readout: str
    hidden: int
    proj: int

    @staticmethod
    def from_arrays(arrays: Mapping[str, np.ndarray], readout: str) -> MarkerHead:
        """Strict load: exactly the tensors of the readout mode, with consistent shapes."""
        want = head_tensor_names(readout)
        got = set(arrays)
        if got != want:
            missing, extra = sorted(want - got), sorted(got - want)
            raise ValueError(f"marker head tensors do not match readout {readout!r}: "
                             f"missing {missing}, unexpected {extra}")
        t = {k: np.ascontiguousarray(np.asarray(v, dtype=np.float32)) for k, v in arrays.items()}
        proj, hidden = t["w_o.weight"].shape
        for p in _PROJECTIONS:
            if t[f"{p}.weight"].shape != (proj, hidden) or t[f"{p}.bias"].shape != (proj,):
                raise ValueError(f"{p} must be [{proj}, {hidden}] with a [{proj}] bias")
        if t["norm.weight"].shape != (hidden,) or t["norm.bias"].shape != (hidden,):
            raise ValueError(f"norm must be [{hidden}]")
        for k in ("log_tau", "log_tau_span"):
            if t[k].size != 1:
                raise ValueError(f"{k} must be a scalar")
            t[k] = t[k].reshape(())
        if readout != "cosine" and (
                t["cls_mlp.0.weight"].shape != (2 * hidden, hidden) or t["cls_mlp.0.bias"].shape != (2 * hidden,)
                or t["cls_mlp.3.weight"].shape != (1, 2 * hidden) or t["cls_mlp.3.bias"].shape != (1,)):
            raise ValueError("cls_mlp must be Linear(H, 2H), ReLU, Linear(2H, 1)")
        return MarkerHead(t, readout, int(hidden), int(proj))

    def _ln(self, x: np.ndarray) -> np.ndarray:
        return _layer_norm(x, self.tensors["norm.weight"], self.tensors["norm.bias"])

    def _proj(self, name: str, x: np.ndarray) -> np.ndarray:
        return _linear_rows(x, self.tensors[f"{name}.weight"], self.tensors[f"{name}.bias"])

    def option_logits(self, hidden: np.ndarray, q_index: np.ndarray, opt_index: np.ndarray) -> np.ndarray:
        """float32 [No]: one logit per ``opt_index`` row (row, marker, owner) of batch ``hidden`` [B, T, H].

        ``q_index`` rows are (row, [Q] position, pool start, pool end); the pool is the plain mean of
        the hidden states in ``[start, end)`` (upstream's cumulative-sum difference agrees within fp32).
        """
        h = np.asarray(hidden, dtype=np.float32)
        q_index = np.asarray(q_index, dtype=np.int64)
        opt_index = np.asarray(opt_index, dtype=np.int64)
        pools = np.stack([h[r, a:b].mean(0, dtype=np.float32) if b > a else np.zeros(h.shape[-1], np.float32)
                          for r, _, a, b in q_index.tolist()])
        owner = opt_index[:, 2]
        marker = h[opt_index[:, 0], opt_index[:, 1]]                     # [No, H]
        query = h[q_index[owner, 0], q_index[owner, 1]]                  # [No, H]
        logits = np.zeros(opt_index.shape[0], dtype=np.float32)
        if self.readout in ("cosine", "both"):
            u = _normalize(self._proj("w_o", self._ln(marker)) + self._proj("w_q", self._ln(query)))
            v = _normalize(self._proj("w_p", self._ln(pools)))[owner]
            logits = logits + (u * v).sum(-1, dtype=np.float32) / np.exp(self.tensors["log_tau"])
        if self.readout in ("mlp", "both"):
            z = np.maximum(_linear_rows(marker, self.tensors["cls_mlp.0.weight"], self.tensors["cls_mlp.0.bias"]), 0)
            logits = logits + _linear_rows(z, self.tensors["cls_mlp.3.weight"], self.tensors["cls_mlp.3.bias"])[:, 0]
        return logits.astype(np.float32)

    def span_logits(self, hidden: np.ndarray, unit_index: np.ndarray, ent_index: np.ndarray) -> np.ndarray:
        """float32 [Nw, Ne]: word (first token) x label ([E] marker) scaled cosine similarities."""
        h = np.asarray(hidden, dtype=np.float32)
        unit_index = np.asarray(unit_index, dtype=np.int64)
        ent_index = np.asarray(ent_index, dtype=np.int64)
        words = _normalize(self._proj("w_t", self._ln(h[unit_index[:, 0], unit_index[:, 1]])))
        labels = _normalize(self._proj("w_e", self._ln(h[ent_index[:, 0], ent_index[:, 1]])))
        # per-element dot products (a reduction over the contiguous last axis), not a matrix product,
        # for the same reason as _linear_rows: a word's logit must not depend on its batch
        sims = np.empty((words.shape[0], labels.shape[0]), dtype=np.float32)
        for i in range(words.shape[0]):
            sims[i] = (labels * words[i]).sum(-1, dtype=np.float32)
        return (sims / np.exp(self.tensors["log_tau_span"])).astype(np.float32)
