"""The agreement report before a promotion, its gate, and the embedding-space guard.

Old and new versions run the same golden cases (the graph feeds recorded in both packages'
golden files, each case run on both sessions) and their outputs are read the way the model's
head reads them, so the figures measure what a client would see:

- probabilities (classifiers, rerank, decision heads that output probabilities): ``max_abs_dp``
  (the largest |p_new - p_old| over every case and label; per token for token classification)
  and ``argmax_agreement`` (the share of rows whose most probable label is the same);
- vectors (embeddings: pooled, normalised as the card says; decision families whose graph
  outputs hidden states: the last real token's state, from which their readout computes the
  probabilities): ``min_cosine`` and ``mean_cosine``.

A case whose feeds one graph does not take (another input set) is skipped and counted. The
output space of an embedding or rerank model changed when the cards' kind or head differ
(dimensions, pooling, normalisation, layers, output), when the vectors' shapes differ, when no
case could be compared, or when the figures pass the space bounds (min cosine below
``space_min_cosine``; for rerank, max |dp| above ``space_max_dp``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_runtime.config import UpdateRules
from edge_runtime.heads.activations import sigmoid, softmax
from edge_runtime.heads.pooling import embed
from edge_runtime.packages import Card
from edge_runtime.packages.golden import GoldenCase

PROBABILITY, VECTOR = "probability", "vector"
#: Surfaces whose answers clients store and compare later: a new output space is held pinned.
GUARDED_SURFACES = ("embeddings", "rerank")


@dataclass(frozen=True)
class Side:
    """One version as the report sees it: its card, its variant's session and its golden cases."""

    version_id: str | None
    card: Card
    session: Any  # anything with run(feeds, names), input_names and output_names (GraphSession)
    cases: Sequence[GoldenCase]


def guarded(card: Card) -> bool:
    """Whether the embedding-space guard applies to a model with this card."""
    return any(s in GUARDED_SURFACES for s in card.surfaces)


def readout(card: Card, feeds: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]
            ) -> tuple[str, np.ndarray, str]:
    """(PROBABILITY or VECTOR, rows [n, k], how it was read) from one case's graph outputs.

    Raises KeyError when the output the head reads is not among ``outputs``.
    """
    head, kind = card.head or {}, card.kind
    if kind == "embedding":
        layers = head.get("layers") or {}
        name = layers[max(layers, key=int)] if layers else "last_hidden_state"
        hidden = _real_tokens(np.asarray(outputs[name])[0], feeds)
        vector = embed(hidden, str(head.get("pooling", "mean")), bool(head.get("normalize")), None)
        return VECTOR, vector[None, :], f"{name}, {head.get('pooling', 'mean')} pooling"
    if "towers" in card.raw:  # multimodal embedding: the primary tower's output is the vector
        tower = next(t for t in card.raw["towers"].values() if t["graph"] == "model.onnx")
        value = np.asarray(outputs[tower["output"]], dtype=np.float64)
        rows = value.mean(axis=1) if value.ndim == 3 else value.reshape(value.shape[0], -1)
        return VECTOR, rows, f"{tower['output']} (primary tower)"
    name = str(head.get("output", "logits"))
    value = np.asarray(outputs[name], dtype=np.float64)
    if name == "last_hidden_state":  # decision families: their head reads the last real token's state
        return VECTOR, _real_tokens(value[0], feeds)[-1:], "last_hidden_state, last real token"
    if kind == "token-classification":
        return PROBABILITY, softmax(_real_tokens(value[0], feeds)), f"softmax({name}) per token"
    if kind == "rerank":
        flat = value.reshape(-1)
        score = sigmoid(flat[:1]) if flat.size == 1 else softmax(flat)[-1:]
        return PROBABILITY, score[None, :], f"relevance score from {name}"
    if "prob" in name:  # the graph outputs probabilities already (sparrow)
        return PROBABILITY, value.reshape(value.shape[0], -1), name
    read = sigmoid if kind == "multi-label" else softmax
    return PROBABILITY, read(value.reshape(value.shape[0], -1)), f"{read.__name__}({name})"


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine of each row of ``a`` [..., d] with the same row of ``b`` (0 for a zero row)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.asarray((a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-12))


def _real_tokens(hidden: np.ndarray, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
    """One row's token states [n, ...] without padding (the attention mask's zeros), when it has one."""
    mask = feeds.get("attention_mask")
    if mask is None or np.asarray(mask).shape[-1] != hidden.shape[0]:
        return hidden
    return hidden[np.asarray(mask)[0] > 0]


def _runs(side: Side, feeds: Mapping[str, np.ndarray], names: Sequence[str]) -> dict[str, np.ndarray] | None:
    if not set(side.session.input_names) <= set(feeds):
        return None
    wanted = [n for n in names if n in side.session.output_names]
    if not wanted:
        return None
    return dict(side.session.run({k: feeds[k] for k in side.session.input_names}, wanted))


def compare(old: Side, new: Side) -> dict[str, Any]:
    """The agreement report of ``new`` against ``old`` on both packages' golden cases (see the module)."""
    metric: str | None = None
    how = ""
    skipped: list[str] = []
    pairs: list[tuple[np.ndarray, np.ndarray]] = []
    sources = (("old", old.cases), ("new", new.cases))
    for origin, cases in sources:
        for i, case in enumerate(cases):
            names = list(case.outputs)
            try:
                got_old, got_new = _runs(old, case.feeds, names), _runs(new, case.feeds, names)
            except Exception as exc:  # onnxruntime refuses feeds of another shape or type: not comparable
                skipped.append(f"{origin} golden case {i}: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            if got_old is None or got_new is None:
                skipped.append(f"{origin} golden case {i}: its feeds do not fit both graphs")
                continue
            try:
                m_old, a, how = readout(old.card, case.feeds, got_old)
                m_new, b, _ = readout(new.card, case.feeds, got_new)
            except (KeyError, IndexError, ValueError) as exc:
                skipped.append(f"{origin} golden case {i}: cannot read its outputs ({exc})")
                continue
            if m_old != m_new:
                skipped.append(f"{origin} golden case {i}: the versions' heads read {m_old} and {m_new}")
                continue
            metric = m_new
            pairs.append((a, b))
    report: dict[str, Any] = {"from_version": old.version_id, "to_version": new.version_id,
                              "cases": len(pairs), "skipped": len(skipped), "metric": metric, "readout": how}
    if skipped:
        report["skipped_reasons"] = skipped[:8]
    if not pairs:
        return report
    if any(a.shape != b.shape for a, b in pairs):
        shapes = sorted({f"{a.shape[-1]} -> {b.shape[-1]}" for a, b in pairs if a.shape != b.shape})
        report["comparable"] = False
        report["reason"] = f"the outputs' shapes differ ({', '.join(shapes)})"
        return report
    # per case, then over cases: cases may differ in width (a decision model's questions have their
    # own option counts), only each pair's two sides must agree
    a_b = [(a.astype(np.float64), b.astype(np.float64)) for a, b in pairs]
    report["comparable"] = True
    if metric == PROBABILITY:
        report["max_abs_dp"] = max((float(np.max(np.abs(a - b))) for a, b in a_b if a.size), default=0.0)
        agree = [a.argmax(-1) == b.argmax(-1) if a.shape[-1] > 1 else np.ones(a.shape[0], bool) for a, b in a_b]
        report["argmax_agreement"] = float(np.concatenate(agree).mean())
        report["rows"] = int(sum(a.shape[0] for a, _ in a_b))
    else:
        cos = np.concatenate([cosines(a, b) for a, b in a_b])
        report["min_cosine"] = float(cos.min())
        report["mean_cosine"] = float(cos.mean())
    return report


#: Card head members that fix what an embedding or a relevance score means.
SPACE_KEYS = ("dimension", "dimensions", "pooling", "normalize", "layers", "output", "activation")


def space_change(old: Card, new: Card, report: Mapping[str, Any], rules: UpdateRules) -> str | None:
    """Why ``new``'s output space is not ``old``'s (None when it is the same; see the module)."""
    if old.kind != new.kind:
        return f"the kind changed ({old.kind} -> {new.kind})"
    old_head, new_head = old.head or {}, new.head or {}
    differ = [k for k in SPACE_KEYS if old_head.get(k) != new_head.get(k)]
    if differ:
        return "the card's head differs: " + ", ".join(f"{k} {old_head.get(k)!r} -> {new_head.get(k)!r}"
                                                       for k in differ)
    if not report.get("cases"):
        return "no golden case could be run on both versions, so the space cannot be shown to be the same"
    if report.get("comparable") is False:
        return str(report.get("reason"))
    if "min_cosine" in report and report["min_cosine"] < rules.space_min_cosine:
        return (f"the embeddings of {report['cases']} golden inputs differ: min cosine "
                f"{report['min_cosine']:.4f} < {rules.space_min_cosine:g}")
    if "max_abs_dp" in report and report["max_abs_dp"] > rules.space_max_dp:
        return (f"the scores of {report['cases']} golden inputs differ: max |dp| "
                f"{report['max_abs_dp']:.4f} > {rules.space_max_dp:g}")
    return None


def gate_failures(report: Mapping[str, Any], rules: UpdateRules, skip_cosine: bool = False,
                  sample: bool = False) -> list[str]:
    """The gate's bounds that ``report`` does not meet (empty: it passes or no bound is set).

    A bound on a figure the report does not have (max |dp| for an embedder) does not apply; a gate
    with a bound set and no golden case compared fails, since nothing shows the versions agree (the
    sample of recent requests, ``sample``, may be empty: it adds bounds, never the only ones).
    """
    bounds = {"max_abs_dp": rules.max_dp, "argmax_agreement": rules.min_argmax_agreement,
              "min_cosine": None if skip_cosine else rules.min_cosine}
    if all(v is None for v in bounds.values()):
        return []
    if not sample and (not report.get("cases") or report.get("comparable") is False):
        return [f"no golden case could be compared ({report.get('reason') or 'none fits both graphs'})"]
    out = []
    if rules.max_dp is not None and "max_abs_dp" in report and report["max_abs_dp"] > rules.max_dp:
        out.append(f"max |dp| {report['max_abs_dp']:.4g} > {rules.max_dp:g}")
    if (rules.min_argmax_agreement is not None and "argmax_agreement" in report
            and report["argmax_agreement"] < rules.min_argmax_agreement):
        out.append(f"argmax agreement {report['argmax_agreement']:.4g} < {rules.min_argmax_agreement:g}")
    if bounds["min_cosine"] is not None and "min_cosine" in report and report["min_cosine"] < rules.min_cosine:
        out.append(f"min cosine {report['min_cosine']:.4g} < {rules.min_cosine:g}")
    return out
