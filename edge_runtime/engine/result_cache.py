"""The result cache: each row's forward output kept by the row's content, one cache per served version,
and each whole answer kept by its request.

Batching is exact (engine/probe.py): a row's output does not depend on the rows it ran beside, so an
output kept from one forward is, bit for bit, what a new forward of the same row gives. A request
then runs only the rows its version has not seen: repeated inputs, questions and windows are
answered from here, and a row repeated within one request runs once. A version's cache goes with
the version, so a swap or a reload never answers from another version's entries. (Under
``batching: padded`` a row's output may move with its neighbours by the stated difference; the
cache then keeps the first answer it was given.)

A row's key is a BLAKE2b digest of its structure: dataclasses, tuples, lists, dicts, numpy arrays
(with their dtype and shape), strings, bytes, numbers and None. A row holding anything else (a
callable, an object of unknown state) is never cached. Outputs are kept as read-only copies and
handed out as fresh copies, since a family's readout may write into the outputs it is given.

An answer is as much a function of its version and its request as a row's output is of its row: a
request seen before (its surface and its body in canonical JSON) is answered whole, as JSON kept from
the first time, without being parsed, tokenized or read out again (the service keeps only answers
that no deadline cut short, and none that carries timings). Rows and answers share one bound, in
entries and in bytes, least recently used first out.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import orjson


class CacheMetrics(Protocol):
    """Hooks the metrics module implements: hits and misses by model, and the cache's size."""

    def on_cache_lookups(self, model: str, hits: int, misses: int) -> None: ...
    def watch_cache(self, model: str, size: Callable[[], tuple[int, int]]) -> None: ...


class _Uncacheable(Exception):
    """A row holds something whose content cannot be read into a key."""


def row_key(row: Any) -> bytes | None:
    """The row's content digest, or None when the row cannot be cached (see the module)."""
    h = hashlib.blake2b(digest_size=20)
    try:
        _feed(h, row)
    except _Uncacheable:
        return None
    return h.digest()


def _feed(h: Any, value: Any) -> None:
    # Every value starts with a type tag and carries its length, so no two structures share a byte stream.
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise _Uncacheable
        array = np.ascontiguousarray(value)
        h.update(b"A%s|%r|" % (array.dtype.str.encode(), array.shape))
        h.update(array.reshape(-1).view(np.uint8) if array.size else b"")
    elif value is None or isinstance(value, bool | int | float | complex | np.generic):
        h.update(b"S%s|%r|" % (type(value).__name__.encode(), value))
    elif isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        h.update(b"U%d|" % len(data))
        h.update(data)
    elif isinstance(value, bytes):
        h.update(b"B%d|" % len(value))
        h.update(value)
    elif isinstance(value, tuple | list):
        h.update(b"L%s|%d|" % (type(value).__name__.encode(), len(value)))
        for item in value:
            _feed(h, item)
    elif isinstance(value, dict):
        h.update(b"D%d|" % len(value))
        for key in sorted(value, key=repr):
            _feed(h, key)
            _feed(h, value[key])
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        h.update(b"C%s.%s|" % (type(value).__module__.encode(), type(value).__qualname__.encode()))
        for f in dataclasses.fields(value):
            _feed(h, getattr(value, f.name))
    else:
        raise _Uncacheable


def answer_key(surface: str, body: Any) -> bytes | None:
    """A request's key: its surface and its body as canonical JSON (keys sorted); None when the body
    is not JSON-shaped."""
    try:
        data = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return None
    h = hashlib.blake2b(b"answer|%s|" % surface.encode(), digest_size=20)
    h.update(data)
    return h.digest()


@dataclass(frozen=True)
class KeptAnswer:
    """A whole answer (without ``model`` and ``meta``) as JSON, and what its request read."""

    body: bytes
    rows: int
    input_tokens: int


def _frozen(value: Any) -> tuple[Any, int]:
    """A read-only deep copy of an output, and its bytes."""
    if isinstance(value, np.ndarray):
        copy = value.copy()
        copy.flags.writeable = False
        return copy, copy.nbytes
    if isinstance(value, dict):
        items = {k: _frozen(v) for k, v in value.items()}
        return {k: v for k, (v, _) in items.items()}, sum(n for _, n in items.values()) + 64 * len(items)
    if isinstance(value, tuple | list):
        items_ = [_frozen(v) for v in value]
        return type(value)(v for v, _ in items_), sum(n for _, n in items_) + 16 * len(items_)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _frozen(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return (dataclasses.replace(value, **{k: v for k, (v, _) in fields.items()}),
                sum(n for _, n in fields.values()) + 64)
    return value, 32


def _thawed(value: Any) -> Any:
    """A writable deep copy of a kept output."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, dict):
        return {k: _thawed(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return type(value)(_thawed(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _thawed(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **fields)
    return value


@dataclass
class Lookup:
    """One request's rows against the cache: an output per row where kept, and the rows to run
    (each distinct missing row once, with the positions it answers)."""

    cache: ResultCache
    outputs: list[Any]
    run: list[Any]
    run_keys: list[bytes | None]
    run_positions: list[list[int]]

    def complete(self, ran: Sequence[Any]) -> list[Any]:
        """Keep the outputs of the rows that ran (``ran``, in ``run``'s order) and return every row's
        output, in row order."""
        outputs = self.outputs
        for key, positions, output in zip(self.run_keys, self.run_positions, ran):
            if key is not None:
                self.cache.keep(key, output)
            outputs[positions[0]] = output
            for i in positions[1:]:
                outputs[i] = _thawed(output)
        return outputs


class ResultCache:
    """Row outputs of one served version, by row key; safe from any thread."""

    def __init__(self, model: str, entries: int, max_bytes: int, metrics: CacheMetrics | None = None) -> None:
        self.model = model
        self.max_entries = entries
        self.max_bytes = max_bytes
        self._metrics = metrics
        self._lock = threading.Lock()
        self._items: OrderedDict[bytes, tuple[Any, int]] = OrderedDict()
        self.bytes = 0
        if metrics is not None and self.enabled:
            metrics.watch_cache(model, self.size)

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0 and self.max_bytes > 0

    def size(self) -> tuple[int, int]:
        """(entries, bytes) kept now."""
        with self._lock:
            return len(self._items), self.bytes

    def keys(self, rows: Sequence[Any]) -> list[bytes | None]:
        """Each row's key (None: not cached); every key None when the cache is off."""
        if not self.enabled:
            return [None] * len(rows)
        return [row_key(row) for row in rows]

    def lookup(self, rows: Sequence[Any], keys: Sequence[bytes | None]) -> Lookup:
        """Split ``rows`` into those answered here and those to run (a row repeated in the request
        runs once); counts the hits and misses."""
        outputs: list[Any] = [None] * len(rows)
        run: list[Any] = []
        run_keys: list[bytes | None] = []
        run_positions: list[list[int]] = []
        pending: dict[bytes, int] = {}
        hits = 0
        with self._lock:
            for i, (row, key) in enumerate(zip(rows, keys)):
                kept = self._items.get(key) if key is not None else None
                if kept is not None:
                    self._items.move_to_end(key)  # type: ignore[arg-type]
                    outputs[i] = kept[0]
                    hits += 1
                elif key is not None and key in pending:
                    run_positions[pending[key]].append(i)
                else:
                    if key is not None:
                        pending[key] = len(run)
                    run.append(row)
                    run_keys.append(key)
                    run_positions.append([i])
        for i, value in enumerate(outputs):
            if value is not None:
                outputs[i] = _thawed(value)
        if self._metrics is not None and self.enabled:
            self._metrics.on_cache_lookups(self.model, hits, len(rows) - hits)
        return Lookup(self, outputs, run, run_keys, run_positions)

    def answer(self, key: bytes) -> KeptAnswer | None:
        """The answer kept for a request's key; its rows count as hits."""
        with self._lock:
            kept = self._items.get(key)
            if kept is None or not isinstance(kept[0], KeptAnswer):
                return None
            self._items.move_to_end(key)
        answer: KeptAnswer = kept[0]
        if self._metrics is not None:
            self._metrics.on_cache_lookups(self.model, answer.rows, 0)
        return answer

    def keep_answer(self, key: bytes, answer: KeptAnswer) -> None:
        """Keep a whole answer under its request's key."""
        self._put(key, answer, len(answer.body) + 64)

    def keep(self, key: bytes, output: Any) -> None:
        """Keep a read-only copy of ``output`` under ``key``, dropping the least recently used past the bounds."""
        frozen, size = _frozen(output)
        self._put(key, frozen, size)

    def _put(self, key: bytes, value: Any, size: int) -> None:
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            self._items[key] = (value, size)
            self.bytes += size
            while len(self._items) > self.max_entries or self.bytes > self.max_bytes:
                _, (_, dropped) = self._items.popitem(last=False)
                self.bytes -= dropped

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.bytes = 0
