"""The HTTP contract's example bodies, each written once, as the contract writes them.

Source: docs/reference/http-api-reference.txt (the contract, copied verbatim). test_openapi checks these against the
reference text where it is on the machine, so a change to the contract shows up there; tests that
need a variant (another model name, a broken member) copy one of these and change the copy, and
never change these objects in place, since every test module shares them.
"""

from __future__ import annotations

from typing import Any

# The Decisions and System One requests live with the `examples` command, which sends them to servers.
from edge_runtime.examples import (  # noqa: F401  (re-exported for the tests)
    DECISIONS_EXAMPLE_1,
    DECISIONS_EXAMPLE_2,
    DECISIONS_EXAMPLE_BATCH,
    SYSTEMONE_EXAMPLE_ASSETS,
    SYSTEMONE_EXAMPLE_MEDIA,
)

CLASSIFY_EXAMPLE: dict[str, Any] = {
    "model": "vela-pii",
    "input": ["Hi, I'm Tom Baker (tom.baker@example.com)."],
    "options": {"overflow": "window", "window": {"tokens": 512, "overlap": 64}},
}
"""Classify: the `POST /v1/classify` request, a windowed PII scan."""

EMBEDDINGS_EXAMPLE: dict[str, Any] = {
    "model": "vela-embedding", "input": ["How do I reset my password?"], "dimensions": 256, "layer": 11,
}
"""Embeddings: the `POST /v1/embeddings` request, with dimensions and layer."""

RERANK_EXAMPLE: dict[str, Any] = {
    "model": "vela-reranker", "query": "How do I reset my password?",
    "documents": ["Open Settings, then Security.", "Our offices are closed on Sunday."], "top_n": 1,
}
"""Rerank: the `POST /v1/rerank` request."""

BUNDLE_EXAMPLE: dict[str, Any] = {
    "tasks": [
        {"id": "domain", "classify": {"model": "vela-domain", "input": ["What is 2 + 2?"]}},
        {"id": "kind", "decisions": {
            "model": "decision-edge", "state": "What is 2 + 2?",
            "questions": {"math": {"type": "noul", "instructions": "Is this a math question?"}},
        }},
    ],
    "options": {"deadline_ms": 80},
}
"""Bundle: the `POST /v1/bundle` request, a classify task and a decisions task."""


DECISIONS_RESPONSE_1: dict[str, Any] = {
    "model": "Vela-2.0-0.3B",
    "answers": {
        "domain": {
            "type": "choice",
            "choice": "code",
            "confidence": 1.0,
            "probabilities": {"code": 1.0, "math": 0.0, "other": 0.0},
            "abstain_probability": 0.01,
        },
        "reasoning": {"type": "noul", "noul": 0.34},
        "difficulty": {
            "type": "score",
            "score": 1.3,
            "confidence": 0.0,
            "legend": {"0": "Trivial", "1": "Moderate", "2": "Hard"},
            "probabilities": {"0": 0.13, "1": 0.43, "2": 0.43},
        },
    },
}
"""Decisions, the `Response` to DECISIONS_EXAMPLE_1 (Vela 2.0 on CPU, rounded, without usage)."""


DECISIONS_RESPONSE_2: dict[str, Any] = {
    "model": "Vela-2.0-0.3B",
    "answers": {
        "problems.billing": {"type": "noul", "noul": 0.95},
        "problems.shipping": {"type": "noul", "noul": 0.7},
        "problems.account": {"type": "noul", "noul": 0.03},
        "contacts": {"type": "noul", "noul": 1.0},
    },
    "spans": {
        "contacts": [
            {"label": "EMAIL_ADDRESS", "start": 71, "end": 91, "text": "jane.doe@example.com", "probability": 1.0}
        ]
    },
    "sets": {
        "problems": {
            "selected": ["billing", "shipping"],
            "probabilities": {"billing": 0.95, "shipping": 0.7, "account": 0.03},
        }
    },
    "thresholds": {"problems": 0.3, "contacts": 0.65},
}
"""Decisions, the `Response` to DECISIONS_EXAMPLE_2 (rounded, without usage)."""


