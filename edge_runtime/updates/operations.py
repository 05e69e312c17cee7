"""Operations: one admin or reload action each, queued and run one at a time on one loader thread (a load
must not starve serving: the only CPU it takes beyond its own thread is its session's threads while it
verifies), and kept for GET /admin/v1/operations/{id}."""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edge_runtime.errors import ApiError

log = logging.getLogger("edge_runtime.updates")

#: Operations kept for GET /admin/v1/operations/{id}.
OPERATIONS_KEPT = 64


@dataclass
class Operation:
    """One admin or reload action, followed by GET /admin/v1/operations/{id}."""

    kind: str
    model: str | None
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    state: str = "queued"  # queued, running, succeeded, failed
    reason: str | None = None
    code: str | None = None
    created_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    result: dict[str, Any] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event, repr=False)

    def step(self, text: str) -> None:
        self.steps.append({"at": time.time(), "step": text})
        log.info("%s %s: %s", self.kind, self.model or "", text)

    def fail(self, code: str, reason: str) -> None:
        self.state, self.code, self.reason = "failed", code, reason
        self.step(f"failed: {reason}")

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "kind": self.kind, "model": self.model, "state": self.state,
                               "created_at": self.created_at, "steps": list(self.steps)}
        for key in ("reason", "code", "finished_at"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.result:
            out["result"] = self.result
        return out


class OperationQueue:
    """The loader thread and the operations it ran or will run (the latest OPERATIONS_KEPT)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: OrderedDict[str, Operation] = OrderedDict()
        self._queue: queue.Queue[tuple[Operation, Callable[..., None], tuple[Any, ...]] | None] = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def submit(self, kind: str, model: str | None, action: Callable[..., None], *args: Any) -> Operation:
        """Queue ``action(op, *args)`` for the loader thread; its Operation, queued."""
        op = Operation(kind, model)
        with self._lock:
            self._kept[op.id] = op
            while len(self._kept) > OPERATIONS_KEPT:
                self._kept.popitem(last=False)
        self._queue.put((op, action, args))
        return op

    def get(self, op_id: str) -> Operation | None:
        with self._lock:
            return self._kept.get(op_id)

    def idle(self) -> bool:
        """Nothing is waiting to run."""
        return self._queue.empty()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="updates-loader", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Stop the loader (an operation in progress finishes its current step first)."""
        self._stop.set()
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None or self._stop.is_set():
                return
            op, action, args = item
            op.state = "running"
            try:
                action(op, *args)
                if op.state == "running":
                    op.state = "succeeded"
            except ApiError as exc:
                op.fail(exc.code, str(exc))
            except Exception as exc:  # an operation's bug must not stop the loader
                log.exception("operation %s failed", op.id)
                op.fail("internal_error", f"{type(exc).__name__}: {exc}")
            finally:
                op.finished_at = time.time()
                op.done.set()


__all__ = ["OPERATIONS_KEPT", "Operation", "OperationQueue"]
