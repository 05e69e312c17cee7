"""What every model family gives the runtime: plans of rows for the engine, and answers from outputs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from edge_runtime.engine.executor import Forward
from edge_runtime.errors import invalid_request
from edge_runtime.packages import Package
from edge_runtime.packages.golden import GoldenCase, require_passed, self_check


@dataclass
class Plan:
    """Rows for one request on one model, and how to turn their outputs into the response body.

    ``finish`` receives one output per row, in row order, and returns the answers: the body without
    ``model`` and ``meta`` (the service adds them), and without ``usage`` where ``usage`` is set.
    ``usage``: the request's usage when planning counted it (the decision families); None where the
    answers carry their own (the encoder surfaces count only the inputs answered). A plan without rows
    (every item failed validation) is finished with an empty list.
    ``keys`` are the rows' result-cache keys (engine/result_cache.py), set by the service when the
    model keeps a cache; None: every row runs. ``complete`` turns False when a deadline cut the
    request short: its answer then says so, and is not kept.
    """

    rows: list[Any]
    finish: Callable[[list[Any]], dict[str, Any]]
    input_tokens: int = 0
    extras: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, Any] | None = None
    keys: list[bytes | None] | None = None
    complete: bool = True


class ModelFamily(Protocol):
    """A loaded model of some family: every capability the runtime calls, and nothing it must probe for."""

    @property
    def surfaces(self) -> frozenset[str]:
        """The endpoints this model serves."""
        ...

    @property
    def forward(self) -> Forward:
        """The engine's forward over the model's session."""
        ...

    @property
    def max_input_tokens(self) -> int:
        """The most tokens one row reads (the probe's longest row, /v1/models' limit)."""
        ...

    @property
    def batchable(self) -> bool:
        """False when rows must always run alone (their shapes differ, or a row batches itself)."""
        ...

    def plan(self, surface: str, request: Any) -> Plan:
        """Validate against the model and tokenize; raises ApiError for request-level failures."""
        ...

    def probe_row(self, length: int) -> Any:
        """A synthetic row of ``length`` tokens for the load-time batch-invariance probe."""
        ...

    def warm(self) -> None:
        """Work done once at load so the first request does not pay for it (may do nothing)."""
        ...

    def describe(self) -> dict[str, Any]:
        """Surface-specific members of the model's /v1/models entry (labels, dimensions, ...)."""
        ...


@dataclass(frozen=True)
class ProbeRow:
    """A token row of the load-time batch-invariance probe (what EncoderForward reads of a row)."""

    ids: np.ndarray
    type_ids: np.ndarray


def random_row(rng: np.random.Generator, vocab_size: int, length: int) -> ProbeRow:
    """A fresh row of random token ids (equal rows would prove nothing about batching)."""
    ids = rng.integers(1, vocab_size, size=length, dtype=np.int64)
    return ProbeRow(ids, np.zeros_like(ids))


def token_budget(max_tokens: int | None, limit: int, what: str = "max_input_tokens") -> int:
    """The tokens a request may read: its ``options.max_tokens``, at most the model's ``limit``
    (named ``what`` in the 400 a larger one gets), else the limit itself."""
    if max_tokens is None:
        return limit
    if max_tokens > limit:
        raise invalid_request(f"options.max_tokens {max_tokens} exceeds the model's {what} {limit}")
    return max_tokens


@dataclass(frozen=True)
class Graph:
    """A graph a package holds beside its variant's own: the family's name for it, its file, and how
    to read its golden cases (None: the converter proved it, and the load-time probe runs it)."""

    name: str
    file: str
    golden: Callable[[Package], list[GoldenCase]] | None = None


def open_graphs(package: Package, graphs: Sequence[Graph], like: Any
                ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Open every graph as the variant's session ``like`` was opened (its device, threads and
    options: ``GraphSession.sibling``) and self-check those with goldens, through the one self-check
    and its device tolerance; a failed check raises RuntimeError (the model then fails to load with
    its reason). Returns the sessions by name and each check's result."""
    sessions: dict[str, Any] = {}
    checks: dict[str, dict[str, Any]] = {}
    for graph in graphs:
        session = sessions[graph.name] = like.sibling(package.file(graph.file))
        if graph.golden is not None:
            checks[graph.name] = require_passed(
                self_check(session, graph.golden(package), session.device, f"{graph.name} graph golden",
                           package.card.golden_class))
    return sessions, checks
