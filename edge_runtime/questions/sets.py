"""Set: any number of labels that apply, each an independent probability.

Every label is answered as a Noul under ``<id>.<label>`` (which must not be another question's ID);
``sets.<id>`` holds the labels at or above the threshold (``selected``) and every label's
probability, and ``thresholds.<id>`` the threshold used: the question's own, else
:data:`DEFAULT_THRESHOLD` (a family with calibrated thresholds, vela2, applies its own instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from edge_runtime.heads.decisions import InvalidModelOutput
from edge_runtime.questions.base import Json, Question, QuestionType
from edge_runtime.questions.labels import FIELDS, parse_labels
from edge_runtime.questions.noul import noul_answer

#: The threshold of a Set that gives none, on a model without calibrated ones (decision-codes reads
#: each label as a Noul, so 0.5 selects the labels the model finds more likely to apply than not).
DEFAULT_THRESHOLD = 0.5


def parse(qid: str, raw: dict[str, Any], instructions: Json | None, preset: str | None) -> Question:
    return parse_labels(qid, "set", raw, instructions, preset)


def label_id(question_id: str, label: str) -> str:
    """The answer key of one label's Noul: ``<id>.<label>``."""
    return f"{question_id}.{label}"


def threshold_of(q: Question) -> float:
    """The threshold a Set applies: its own, else :data:`DEFAULT_THRESHOLD`."""
    return DEFAULT_THRESHOLD if q.threshold is None else q.threshold


def clash(q: Question, ids: set[str]) -> str | None:
    """Set labels answer under ``<id>.<label>``, which must not shadow another question's answer
    (``ids``: the question IDs and the keys another Set writes too)."""
    taken = sorted(label_id(q.id, o.key) for o in q.options if label_id(q.id, o.key) in ids)
    return f"set labels answer under {taken}, which other questions answer under too" if taken else None


def set_answers(question_id: str, labels: Sequence[str], probs: np.ndarray | Sequence[float],
                threshold: float) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """(each label's Noul under ``<id>.<label>``, the ``sets`` entry); validates every probability."""
    p = np.asarray(probs, dtype=np.float64).reshape(-1)
    if p.shape[0] != len(labels):
        raise InvalidModelOutput(f"the model returned {p.shape[0]} probabilities for {len(labels)} labels")
    nouls = {label_id(question_id, label): noul_answer(x) for label, x in zip(labels, p)}
    entry = {
        "selected": [label for label, x in zip(labels, p) if x >= threshold],
        "probabilities": {label: float(x) for label, x in zip(labels, p)},
    }
    return nouls, entry


TYPE = QuestionType(name="set", fields=FIELDS, parse=parse, clash=clash)
