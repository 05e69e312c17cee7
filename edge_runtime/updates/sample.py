"""The opt-in sample of recent requests an agreement report replays, and how two answers compare.

Off unless an entry's ``update.sample_requests`` is above 0. Each served name keeps a ring of its
last requests (the JSON bodies that the active version answered under the plain name or an
alias), bounded by count and by bytes (``update.sample_bytes``); nothing is written to disk and
the ring of a name goes when the name is removed. Before a promotion the old and the new version
answer every sampled body (pinned as ``name@<version_id>``) and their answers are read by the
contract's member names: ``embedding`` vectors (cosine), ``probabilities`` and ``scores`` (a row
each: max |dp| and argmax agreement) and ``relevance_score`` (max |dp|).
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from edge_runtime.updates.agreement import cosines

VECTOR_KEYS = ("embedding",)
PROBABILITY_KEYS = ("probabilities", "scores", "relevance_score")
SKIPPED_KEYS = ("meta", "usage", "input")


class RecentRequests:
    """Per served name, a ring of recent request bodies bounded by count and bytes; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rings: dict[str, deque[tuple[str, bytes]]] = {}
        self._bytes: dict[str, int] = {}

    def record(self, name: str, surface: str, body: Any, count: int, max_bytes: int) -> None:
        """Keep ``body`` as the newest of ``name``'s sample, dropping the oldest past either bound.
        A body larger than ``max_bytes`` on its own is not kept."""
        if count <= 0:
            return
        data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if len(data) > max_bytes:
            return
        with self._lock:
            ring = self._rings.setdefault(name, deque())
            ring.append((surface, data))
            self._bytes[name] = self._bytes.get(name, 0) + len(data)
            while len(ring) > count or self._bytes[name] > max_bytes:
                _, old = ring.popleft()
                self._bytes[name] -= len(old)

    def take(self, name: str) -> list[tuple[str, dict[str, Any]]]:
        """A copy of ``name``'s sample, oldest first, as (surface, body)."""
        with self._lock:
            items = list(self._rings.get(name, ()))
        return [(surface, json.loads(data)) for surface, data in items]

    def held(self, name: str) -> tuple[int, int]:
        """(requests, bytes) held for ``name``."""
        with self._lock:
            return len(self._rings.get(name, ())), self._bytes.get(name, 0)

    def forget(self, name: str) -> None:
        with self._lock:
            self._rings.pop(name, None)
            self._bytes.pop(name, None)


def numbers(answer: Any, path: str = "") -> Iterator[tuple[str, str, np.ndarray]]:
    """(path, "vector" or "probability", values) for every member of an answer the report reads."""
    if isinstance(answer, dict):
        for key in sorted(answer):
            if key in SKIPPED_KEYS:
                continue
            value, where = answer[key], f"{path}/{key}"
            if key in VECTOR_KEYS and isinstance(value, list):
                yield where, "vector", np.asarray(value, dtype=np.float64)
            elif key in PROBABILITY_KEYS and isinstance(value, dict | list | float | int):
                row = list(value.values()) if isinstance(value, dict) else value
                row = row if isinstance(row, list) else [row]
                if all(isinstance(v, int | float) and not isinstance(v, bool) for v in row):
                    yield where, "probability", np.asarray(row, dtype=np.float64)
            else:
                yield from numbers(value, where)
    elif isinstance(answer, list):
        for i, value in enumerate(answer):
            yield from numbers(value, f"{path}/{i}")


def compare_answers(pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    """Figures over pairs of (old answer, new answer) to the same requests: min and mean cosine of
    the vectors, max |dp| and argmax agreement of the probability rows. A pair whose answers do not
    have the same members (another label set, another dimension) is counted as not comparable."""
    cos: list[float] = []
    dps: list[float] = []
    agree: list[bool] = []
    incomparable = 0
    for old, new in pairs:
        a = {p: (k, v) for p, k, v in numbers(old)}
        b = {p: (k, v) for p, k, v in numbers(new)}
        if a.keys() != b.keys() or any(a[p][1].shape != b[p][1].shape for p in a):
            incomparable += 1
            continue
        for p, (kind, x) in a.items():
            y = b[p][1]
            if kind == "vector":
                cos.append(float(cosines(x, y)))
            elif x.size:
                dps.append(float(np.max(np.abs(x - y))))
                if x.size > 1:
                    agree.append(bool(np.argmax(x) == np.argmax(y)))
    out: dict[str, Any] = {"requests": len(pairs), "not_comparable": incomparable}
    if cos:
        out.update(min_cosine=min(cos), mean_cosine=float(np.mean(cos)))
    if dps:
        out["max_abs_dp"] = max(dps)
    if agree:
        out["argmax_agreement"] = float(np.mean(agree))
    return out
