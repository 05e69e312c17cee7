"""Vela 2.0 answers from combined row logits (docs/reference/upstream-formats.md §2.8).

Choice, Noul and Score are softmaxes over the real options at the type's temperature (Noul uses
the ``choice`` temperature: it runs as a choice); a Choice also reports ``abstain_probability``,
the abstain marker's share of the softmax over every logit. A Set is one sigmoid per label,
answered as one Noul per label under ``<id>.<label>`` plus ``sets.<id>`` and ``thresholds.<id>``.
A Span decodes word probabilities into ``spans.<id>`` (code-point offsets into the part, or into
the one state key it was asked over) with a Noul under its id: the highest word probability.
Host math is float64; the span decoder compares in float32, as upstream does.

The family calls :class:`Calibration`, :func:`answer_question` per question and
:func:`response_body` once per request.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from edge_runtime.families.vela2.layout import RawRow
from edge_runtime.families.vela2.state import EngineQuestion, State
from edge_runtime.families.vela2.words import trim, word_units

INVALID_MODEL_OUTPUT = "invalid_model_output"
MAX_LENGTH_EXCEEDED = "max_length_exceeded"


def softmax(x: Any) -> np.ndarray:
    """float64 softmax with max subtraction."""
    v = np.asarray(x, dtype=np.float64)
    e = np.exp(v - v.max())
    return e / e.sum()


def sigmoid(x: Any) -> np.ndarray:
    """float64 logistic."""
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


def check_calibration(raw: Mapping[str, Any]) -> None:
    """ValueError unless calibration.json has what answers read (temperatures, ``set:*``, PII rule)."""
    if not isinstance(raw.get("temperature"), dict):
        raise ValueError("calibration.temperature must be an object")
    for k, v in raw["temperature"].items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"calibration.temperature.{k} must be a positive number")
    thresholds = raw.get("thresholds")
    if not isinstance(thresholds, dict) or "set:*" not in thresholds:
        raise ValueError("calibration.thresholds must hold set:*")
    for k, v in thresholds.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0.0 <= v <= 1.0:
            raise ValueError(f"calibration.thresholds[{k!r}] must be in [0, 1]")
    rule = raw.get("pii_length_rule")
    if rule is not None:
        anchors = rule.get("anchors") if isinstance(rule, dict) else None
        if not anchors or any(a.get("n_tokens", 0) < 1 or not 0 < a.get("threshold", 0) <= 1 for a in anchors):
            raise ValueError("calibration.pii_length_rule.anchors must be [{n_tokens >= 1, threshold in (0, 1]}]")
        ns = [a["n_tokens"] for a in anchors]
        if ns != sorted(ns):
            raise ValueError("calibration.pii_length_rule anchors must be sorted by n_tokens")


@dataclass(frozen=True)
class Calibration:
    """A package's calibration.json (temperatures, thresholds, PII rule and gate, schemas)."""

    raw: dict[str, Any]
    noul_calibration: bool | None = None  # None: the file's noul_calibration.default

    def temperature(self, engine_type: str) -> float:
        return float(self.raw["temperature"].get(engine_type, 1.0))

    @property
    def pii_types(self) -> frozenset[str]:
        return frozenset(self.raw.get("pii_types", ()))

    def set_threshold(self, key: str) -> float:
        t = self.raw["thresholds"]
        return float(t.get(f"set:{key}", t["set:*"]))

    def is_pii(self, key: str, labels: Sequence[str]) -> bool:
        return key == "pii" or bool(labels) and set(labels) <= self.pii_types

    def pii_length_threshold(self, tokens: int) -> float:
        """exp of the piecewise-linear interpolation of ln threshold in ln tokens (clamped at the ends)."""
        anchors = self.raw["pii_length_rule"]["anchors"]
        return float(np.exp(np.interp(np.log(max(tokens, 1)), [np.log(a["n_tokens"]) for a in anchors],
                                      [np.log(a["threshold"]) for a in anchors])))

    def span_threshold(self, key: str, labels: Sequence[str], tokens: int) -> tuple[float, str]:
        """The threshold before the sparse gate, and the rule that chose it.

        ``tokens``: the span part's token count before any cut. Order: PII (length rule, else the
        first bucket that holds ``tokens``), ``span:halu``/``span:toxic`` for those keys,
        ``span:<key>``, ``span:*``. (A request's own threshold is applied by the caller first.)
        """
        t = self.raw["thresholds"]
        if self.is_pii(key, labels):
            if "pii_length_rule" in self.raw:
                return self.pii_length_threshold(tokens), "pii:length"
            for bucket in self.raw.get("pii_buckets", []):
                if tokens <= bucket["max_tokens"]:
                    return float(bucket["threshold"]), f"pii:{bucket['name']}"
        if key in ("halu", "toxic") and f"span:{key}" in t:
            return float(t[f"span:{key}"]), key
        if f"span:{key}" in t:
            return float(t[f"span:{key}"]), f"span:{key}"
        return float(t.get("span:*", 0.5)), "span:*"

    def sparse_gate(self, probabilities: np.ndarray, offsets: np.ndarray, labels: Sequence[str], text: str,
                    threshold: float) -> float:
        """A sparse document (at most K spans at the probe threshold) decodes at ``t_sparse`` instead."""
        gate = self.raw.get("pii_sparse_gate")
        if not gate or gate.get("K", -1) < 0 or threshold >= gate["t_sparse"] or not len(offsets):
            return threshold
        probe = float(gate.get("probe_threshold", 0.5))
        if len(decode_spans(probabilities, offsets, labels, text, probe)) <= gate["K"]:
            return float(gate["t_sparse"])
        return threshold

    def noul(self, p: float) -> float:
        """Optional Noul calibration ``sigmoid(logit(p) / T + b)`` (decoder packages carry one)."""
        block = self.raw.get("noul_calibration")
        enabled = self.noul_calibration if self.noul_calibration is not None else \
            bool((block or {}).get("default", False))
        if not enabled or not block:
            return p
        q = min(max(p, 1e-12), 1.0 - 1e-12)
        return 1.0 / (1.0 + math.exp(-((math.log(q) - math.log1p(-q)) / float(block["T"]) + float(block["b"]))))


def decode_spans(probabilities: np.ndarray, offsets: np.ndarray, labels: Sequence[str], text: str,
                 threshold: float) -> list[dict[str, Any]]:
    """Spans from word x label probabilities (§2.8 steps 1-7); compared in float32.

    Each word takes its best label above the threshold; inside a unit (``UNIT_RE``) conflicting
    labels go to the largest summed best-probability (first seen on ties) and gaps between the
    unit's labelled words are filled; runs of one label become spans, trimmed, with the mean
    probability of their words.
    """
    probs = np.asarray(probabilities, dtype=np.float32)
    offsets = np.asarray(offsets)
    count = len(offsets)
    if count == 0:
        return []
    best = probs.argmax(1)
    best_p = probs[np.arange(count), best]
    label = np.where(best_p > np.float32(threshold), best, -1)
    labelled = np.flatnonzero(label >= 0)
    if not len(labelled):
        return []
    unit = word_units(text, offsets)
    change = np.ones(count, bool)
    change[1:] = unit[1:] != unit[:-1]
    run_start = np.flatnonzero(change)
    run_end = np.append(run_start[1:], count)
    run_of = np.cumsum(change) - 1
    for run in np.unique(run_of[labelled]):
        lo, hi = int(run_start[run]), int(run_end[run])
        if unit[lo] < 0:
            continue
        members = [i for i in range(lo, hi) if label[i] >= 0]
        values = [int(label[i]) for i in members]
        if len(set(values)) > 1:
            votes: dict[int, float] = {}
            for i, v in zip(members, values):
                votes[v] = votes.get(v, 0.0) + float(best_p[i])
            winner = max(votes, key=votes.__getitem__)  # dicts keep insertion order: first seen wins ties
            label[members] = winner
        a, b = members[0], members[-1]
        gap = label[a + 1: b] < 0
        label[a + 1: b][gap] = label[a]
    edges = np.flatnonzero(np.diff(np.concatenate(([-2], label, [-2]))) != 0)
    spans = []
    for begin, stop in pairwise(edges.tolist()):
        value = int(label[begin])
        if value < 0:
            continue
        start, end = trim(text, int(offsets[begin, 0]), int(offsets[stop - 1, 1]))
        if end <= start:
            continue
        spans.append({"start": start, "end": end, "label": labels[value],
                      "probability": float(np.mean(probs[begin:stop, value]))})
    return spans


class InvalidOutput(ValueError):
    """Non-finite logits: the question is answered invalid_model_output."""


def _finite(x: np.ndarray, what: str) -> np.ndarray:
    if not np.all(np.isfinite(x)):
        raise InvalidOutput(f"non-finite {what}")
    return x


def option_probabilities(q: EngineQuestion, logits: np.ndarray, cal: Calibration) -> tuple[np.ndarray, float | None]:
    """A Choice, Noul or Score's probabilities over its real options at the type's temperature, and
    (Choice and Noul) the abstain marker's share of the softmax over every logit."""
    values = np.asarray(logits, dtype=np.float64)
    k = len(q.names)
    if values.shape != (k + (1 if q.abstain else 0),):
        raise InvalidOutput(f"expected {k} option logits{' and abstain' if q.abstain else ''}, got {values.shape}")
    _finite(values, "option logits")
    temp = cal.temperature(q.type)
    abstain = float(softmax(values / temp)[-1]) if q.abstain else None
    return softmax(values[:k] / temp), abstain


def single_answer(q: EngineQuestion, logits: np.ndarray, cal: Calibration) -> dict[str, Any]:
    """Choice (with abstain_probability), Noul or Score from one question's logit vector, as upstream
    answers them (its own confidence statistics)."""
    p, abstain = option_probabilities(q, logits, cal)
    names = q.names
    k = len(names)
    if q.kind == "noul":
        return {"type": "noul", "noul": cal.noul(float(p[1]))}
    if q.kind == "choice":
        ordered = sorted((float(x) for x in p), reverse=True)
        margin = 1.0 if k == 1 else min(1.0, max(0.0, ordered[0] - ordered[1]))
        return {"type": "choice", "choice": names[int(np.argmax(p))], "confidence": margin,
                "probabilities": {n: float(x) for n, x in zip(names, p)}, "abstain_probability": abstain}
    levels = [float(x) for x in p]
    mean = math.fsum(i * x for i, x in enumerate(levels))
    var = math.fsum(x * (i - mean) ** 2 for i, x in enumerate(levels))
    return {"type": "score", "score": mean,
            "confidence": min(1.0, max(0.0, 1.0 - var / ((k * k - 1) / 12))),
            "legend": {str(i): text for i, text in enumerate(q.legend)},
            "probabilities": {str(i): x for i, x in enumerate(levels)}}


def set_probabilities(q: EngineQuestion, logits: np.ndarray, cal: Calibration) -> tuple[np.ndarray, float]:
    """A Set's independent label probabilities (one sigmoid each) and the threshold it applies."""
    values = _finite(np.asarray(logits, dtype=np.float64), "set logits")
    if values.shape != (len(q.names),):
        raise InvalidOutput(f"expected {len(q.names)} set logits, got {values.shape}")
    threshold = q.threshold if q.threshold is not None else cal.set_threshold(q.key)
    return sigmoid(values / cal.temperature("set")), float(threshold)


def set_answer(q: EngineQuestion, logits: np.ndarray, cal: Calibration, response: dict[str, Any]) -> None:
    """``sets.<id>``, ``thresholds.<id>`` and one Noul per label at ``answers["<id>.<label>"]``."""
    probs, threshold = set_probabilities(q, logits, cal)
    p = {n: float(x) for n, x in zip(q.names, probs)}
    response.setdefault("sets", {})[q.id] = {"selected": [n for n, x in p.items() if x > threshold],
                                             "probabilities": p}
    response.setdefault("thresholds", {})[q.id] = threshold
    for n, x in p.items():
        response["answers"][f"{q.id}.{n}"] = {"type": "noul", "noul": x}


def read_spans(q: EngineQuestion, raw: RawRow, state: State, cal: Calibration
               ) -> tuple[list[dict[str, Any]], float, float]:
    """A Span's spans ``{label, start, end, text, probability}`` in text order, its Noul (the highest
    word probability in its range) and the threshold it applied."""
    span = raw.span
    if span is None:
        raise InvalidOutput("no span logits for a span question")
    role = q.roles[0]
    text = state.text(role)
    probs = sigmoid(np.asarray(span.logits, dtype=np.float64) / cal.temperature("span"))
    _finite(probs, "span logits")
    if q.threshold is not None:
        threshold = q.threshold
    else:
        threshold, rule = cal.span_threshold(q.key, span.names, raw.part_tokens.get(role, 0))
        if rule.startswith("pii:"):
            threshold = cal.sparse_gate(probs, span.offsets, span.names, text, threshold)
    decoded = decode_spans(probs, span.offsets, span.names, text, threshold) if len(span.offsets) else []
    low, high = q.span_range or (0, len(text))
    spans = []
    for entry in decoded:
        start, end = entry["start"], entry["end"]
        if q.span_range is not None:
            start, end = trim(text, max(start, low), min(end, high))
            if end <= start:
                continue
        spans.append({"label": entry["label"], "start": start - low, "end": end - low, "text": text[start:end],
                      "probability": float(entry["probability"])})
    best = probs.max(1) if len(span.offsets) else np.zeros(0)
    if q.span_range is not None and len(best):
        offsets = np.asarray(span.offsets)
        best = best[(offsets[:, 0] >= low) & (offsets[:, 1] <= high)]
    return spans, float(np.max(best)) if len(best) else 0.0, float(threshold)


def span_answer(q: EngineQuestion, raw: RawRow, state: State, cal: Calibration, response: dict[str, Any]) -> None:
    """``spans.<id>``, ``thresholds.<id>`` and a Noul (max word probability) at ``answers[<id>]``."""
    spans, noul, threshold = read_spans(q, raw, state, cal)
    response.setdefault("spans", {})[q.id] = spans
    response.setdefault("thresholds", {})[q.id] = threshold
    response["answers"][q.id] = {"type": "noul", "noul": noul}


def answer_question(q: EngineQuestion, raw: RawRow, state: State, cal: Calibration, response: dict[str, Any]) -> None:
    """Write one question's answer (and its span/set entries) into ``response``; bad output ->
    ``{"type", "error": "invalid_model_output"}`` for that question only."""
    try:
        if q.type == "span":
            span_answer(q, raw, state, cal, response)
        elif q.type == "set":
            set_answer(q, raw.logits[q.id], cal, response)
        else:
            response["answers"][q.id] = single_answer(q, raw.logits[q.id], cal)
    except (InvalidOutput, KeyError, FloatingPointError) as e:
        response["answers"][q.id] = {"type": q.kind, "error": INVALID_MODEL_OUTPUT, "message": str(e)}


def response_body(order: Sequence[str], answers: Mapping[str, Any], extras: Mapping[str, Any],
                  input_tokens: int) -> dict[str, Any]:
    """The response in upstream's key order: answers (request order; a set's label answers in
    place of its id), usage, then spans, span_heads, sets, thresholds when present."""
    ordered: dict[str, Any] = {}
    for qid in order:
        if qid in answers:
            ordered[qid] = answers[qid]
        prefix = f"{qid}."
        for key, value in answers.items():
            if key.startswith(prefix) and key not in ordered and key not in order:
                ordered[key] = value
    for key, value in answers.items():  # anything not placed above keeps its place at the end
        ordered.setdefault(key, value)
    body: dict[str, Any] = {"answers": ordered, "usage": {"input_tokens": int(input_tokens), "output_tokens": 0}}
    for key in ("spans", "span_heads", "sets", "thresholds"):
        if key in extras:
            body[key] = {qid: extras[key][qid] for qid in order if qid in extras[key]}
    return body
