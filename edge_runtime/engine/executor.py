"""One executor per model: a bounded queue of jobs, a worker thread that batches their rows, deadlines.

Threading model: the event loop only enqueues jobs and awaits futures; a dedicated worker thread
plans batches and calls the forward, so a forward never blocks the loop. A lock guards the queue
and is never held during a forward. Between forwards the worker re-plans from every waiting row,
so a new short request waits at most for the forward in flight.

Inline path: a job whose forwards are estimated to cost less than handing them to the worker
and back (two thread wake-ups and the loop's wake: ~0.3 ms on 2 busy cores, measured as the
queue time of sparrow-nano decisions on an idle executor) runs on the caller's thread when the
executor is idle, with the same batch plan the worker would make for it alone, so its outputs are
bit-identical to the worker path. The estimate is the running cost per token of this model's own
forwards; until one has run, every job takes the worker path. A job submitted ``alone`` (its request
the only one being answered: Runtime.alone) may run inline up to a longer bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .batching import BatchLimits, Buckets, plan_batch
from .errors import (
    DeadlineExceeded,
    EngineError,
    ExecutorClosed,
    ForwardError,
    Overloaded,
    RequestTooLarge,
    is_out_of_memory,
)
from .forward import GROUPINGS, Forward, Grouping

__all__ = [
    "INLINE_ALONE_FORWARD_MAX_S", "INLINE_FORWARD_MAX_S", "QUEUE_MEAN_TAU_S", "ExecutorLoad", "ExecutorMetrics",
    "Forward", "JobResult", "ModelExecutor",
]

log = logging.getLogger(__name__)

#: The longest estimated forward time (all of a job's forwards) that runs inline on an idle
#: executor. It bounds how long the event loop is held (1 ms), and sits above a hand-off's cost so
#: that sub-millisecond models (sparrow-nano: ~0.2 ms a question) skip the hand-off entirely.
INLINE_FORWARD_MAX_S = 1e-3
#: The same bound for a job whose request is the only one the server is answering: one sentence
#: through a MiniLM-sized encoder (~2 ms on one core) then skips the hand-off too (one client:
#: 296 -> 364 req/s, p50 3.21 -> 2.64 ms). Not with company: a request arriving during an inline
#: forward is read only when it ends, so it can neither be prepared meanwhile nor join a batch
#: (four clients lost 28 % of their requests a second when every such forward ran inline).
INLINE_ALONE_FORWARD_MAX_S = 3e-3
#: Weight of the newest forward in the running cost per token.
_COST_SMOOTHING = 0.2
#: Time constant of the queue's running mean (ExecutorLoad.queued_mean): about one KEDA polling
#: interval, so that a scaler reading it every 10-15 s sees the queue between its reads, not the
#: instant of the read (with sub-10 ms forwards the instant is mostly 0 or 1).
QUEUE_MEAN_TAU_S = 10.0


@dataclass(frozen=True)
class ExecutorLoad:
    """A model's jobs at one instant: waiting, running, and how many it holds before refusing one.

    queued counts jobs with rows not yet started (queue_depth); in_flight the jobs whose every row
    has started and that have not finished (their rows are in the forward running now, or the
    job runs inline); capacity is the most jobs the model holds at once before it answers 429:
    max_queue waiting plus one per row a forward can hold.
    """

    queued: int
    in_flight: int
    capacity: int
    queued_mean: float = 0.0  # queued, exponentially weighted over time (time constant QUEUE_MEAN_TAU_S)


class ExecutorMetrics(Protocol):
    """Hooks the metrics module implements; called from the event loop and the worker thread.

    watch is called once, from the constructor, with a callable that reads the executor's load
    (a lock and three integers), so that gauges computed at scrape time cost requests nothing.
    """

    def observe_queue(self, model: str, seconds: float) -> None: ...
    def observe_forward(self, model: str, seconds: float, rows: int, tokens: int) -> None: ...
    def set_queue_depth(self, model: str, n: int) -> None: ...
    def on_dropped(self, model: str, n: int) -> None: ...
    def watch(self, model: str, load: Callable[[], ExecutorLoad]) -> None: ...


@dataclass(frozen=True)
class JobResult:
    """A finished job: one output per submitted row (same order) and where its time went.

    queue_s is the time waiting for the model, before its first forward and between its forwards
    (wall time of the job minus forward_s); forward_s sums the forwards that held its rows;
    batches counts those forwards.
    """

    outputs: list[Any]
    queue_s: float
    forward_s: float
    batches: int


@dataclass(eq=False)
class _Job:
    rows: list[Any]
    lengths: list[int]
    deadline: float | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[JobResult]
    submitted: float
    pending: list[int]  # row indices not yet handed to a forward, in order
    outputs: list[Any]
    remaining: int  # rows without an output yet
    forward_s: float = 0.0
    batches: int = 0
    first_forward: float | None = None
    done: bool = False
    # The submitting request's context: a line logged about this job on the worker thread is
    # logged in it, so the log filter names the request (a forward may serve several requests).
    context: contextvars.Context = field(default_factory=contextvars.copy_context)

    def log(self, level: int, message: str, *args: Any, exc_info: BaseException | None = None) -> None:
        """Log one line about this job in its request's context."""
        self.context.run(log.log, level, message, *args, exc_info=exc_info)


class ModelExecutor:
    """Runs one model's forwards on its own worker thread, batching concurrent jobs as `grouping` allows.

    max_queue bounds the jobs waiting (jobs with rows not yet started); one more raises Overloaded.
    max_batch_tokens caps a forward's padded tokens (rows x longest), max_batch_rows its rows.
    inline_max_s > 0 lets jobs estimated to run within that many seconds run on the caller's
    thread when the executor is idle (0, the default, never does); inline_alone_max_s is that bound
    for a job submitted ``alone`` (its request the only one being answered), at least inline_max_s.
    """

    def __init__(
        self,
        name: str,
        forward: Forward,
        grouping: Grouping,
        max_queue: int,
        max_batch_tokens: int = 16384,
        max_batch_rows: int = 64,
        metrics: ExecutorMetrics | None = None,
        inline_max_s: float = 0.0,
        inline_alone_max_s: float = 0.0,
    ) -> None:
        if grouping not in GROUPINGS:
            raise ValueError(f"grouping must be one of {', '.join(GROUPINGS)}, not {grouping!r}")
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, not {max_queue}")
        self.name = name
        self.forward = forward
        self.grouping: Grouping = grouping
        self.max_queue = max_queue
        self.limits = BatchLimits(max_tokens=max_batch_tokens, max_rows=max_batch_rows)
        self.pads = bool(getattr(forward, "pads", True))  # see Forward: False drops the length buckets
        self.buckets: Buckets | None = getattr(forward, "buckets", None)  # a bucketed forward's shapes
        self.row_multiple = int(getattr(forward, "row_multiple", 1))  # see Forward: widths it pads to
        if grouping == "buckets" and self.buckets is None:
            raise ValueError("grouping 'buckets' needs a bucketed forward (Forward.bucketed)")
        self.metrics = metrics
        self.dropped_rows = 0  # rows never run: client gone or deadline passed
        self.forward_started_at: float | None = None  # time.monotonic() of the forward in flight
        self.forwards = 0
        self.inline_max_s = float(inline_max_s)
        self.inline_alone_max_s = max(self.inline_max_s, float(inline_alone_max_s))
        self.inline_jobs = 0  # jobs that ran on the caller's thread
        self._token_cost: float | None = None  # running seconds per token of this model's forwards
        self._inline_running = False
        self._waiting: list[_Job] = []  # FIFO; jobs with rows not yet started
        self._admitted = 0  # jobs queued and not yet done: the waiting ones and those in the forward
        self._queued_mean = 0.0  # len(_waiting), exponentially weighted over time
        self._queued_since = time.monotonic()  # when len(_waiting) last changed (or was folded in)
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name=f"engine-{name}", daemon=True)
        self._thread.start()
        self._metric("watch", self.load)

    # ---- event-loop side -------------------------------------------------------------------

    async def submit(self, rows: Sequence[Any], deadline: float | None = None, refusable: bool = True,
                     alone: bool = False) -> JobResult:
        """Run `rows` (batched with other jobs' rows as allowed) and return their outputs.

        ``alone``: the job's request is the only one being answered (its bound to run inline is
        inline_alone_max_s).

        deadline is a time.monotonic() instant. Raises Overloaded when the queue is full (unless
        ``refusable`` is False: a task of a request admitted whole, which is queued all the same),
        DeadlineExceeded when the deadline passes first (rows not yet run never run),
        RequestTooLarge/Overloaded when its forward ran out of memory (alone/shared),
        ForwardError when the forward failed, ExecutorClosed after close(). If the awaiting task
        is cancelled, the job's rows that have not started are dropped.
        """
        loop = asyncio.get_running_loop()
        rows = list(rows)
        if not rows:
            return JobResult([], 0.0, 0.0, 0)
        lengths = [self.forward.length(row) for row in rows]
        now = time.monotonic()
        if deadline is not None and deadline <= now:
            raise DeadlineExceeded("the deadline passed before the job was queued", [None] * len(rows))
        if self._inline_worthwhile(lengths, self.inline_alone_max_s if alone else self.inline_max_s):
            inline = self._run_inline(rows, lengths, now)
            if inline is not None:
                return inline
        job = _Job(
            rows=rows,
            lengths=lengths,
            deadline=deadline,
            loop=loop,
            future=loop.create_future(),
            submitted=now,
            pending=list(range(len(rows))),
            outputs=[None] * len(rows),
            remaining=len(rows),
        )
        with self._cond:
            if self._closed:
                raise ExecutorClosed(f"model {self.name} is shut down")
            if refusable and len(self._waiting) >= self.max_queue:
                raise Overloaded(f"model {self.name} has {len(self._waiting)} jobs waiting")
            self._fold_queue(now)
            self._waiting.append(job)
            self._admitted += 1
            depth = len(self._waiting)
            self._cond.notify()
        self._metric("set_queue_depth", depth)
        try:
            if deadline is None:
                return await job.future
            done, _ = await asyncio.wait({job.future}, timeout=max(0.0, deadline - time.monotonic()))
            if done:
                return job.future.result()
            if self._abandon(job):
                raise DeadlineExceeded("the deadline passed before the job's rows ran", list(job.outputs))
            # The worker answered just as the deadline passed: the result is on its way.
            return await job.future
        except asyncio.CancelledError:
            self._abandon(job)
            raise

    def _abandon(self, job: _Job) -> bool:
        """Give up on a job (deadline or cancellation): drop its unstarted rows. False if it already finished."""
        with self._cond:
            if job.done:
                return False
            dropped = self._retire(job)
            depth = len(self._waiting)
        self._drop(dropped)
        self._metric("set_queue_depth", depth)
        return True

    # ---- inline path (caller's thread) -------------------------------------------------------

    def _inline_worthwhile(self, lengths: Sequence[int], bound: float) -> bool:
        cost = self._token_cost
        return bound > 0 and cost is not None and cost * max(1, sum(lengths)) <= bound

    def _run_inline(self, rows: list[Any], lengths: list[int], submitted: float) -> JobResult | None:
        """Run a job here when nothing is queued or running; None when the executor is busy.

        The rows are planned exactly as the worker plans a job alone in its queue (plan_batch over
        the rows not yet run, forward by forward), so the outputs are the worker path's, bit for bit.
        """
        with self._cond:
            if self._closed:
                raise ExecutorClosed(f"model {self.name} is shut down")
            if self._waiting or self.forward_started_at is not None or self._inline_running:
                return None
            self._inline_running = True
        self._metric("observe_queue", 0.0)
        outputs: list[Any] = [None] * len(rows)
        pending = list(range(len(rows)))
        forward_s = 0.0
        batches = 0
        try:
            while pending:
                chosen = plan_batch([lengths[i] for i in pending], self.grouping, self.limits, self.pads, self.buckets,
                                    self.row_multiple)
                if not chosen:
                    raise ValueError("the batch planner chose no row")
                picked = [pending[k] for k in chosen]
                started = time.monotonic()
                try:
                    result = list(self.forward([rows[i] for i in picked]))
                    if len(result) != len(picked):
                        raise ValueError(f"the forward returned {len(result)} results for {len(picked)} rows")
                except Exception as exc:  # mapped as the worker maps a forward holding one job's rows
                    raise self._forward_error(exc, rows=len(picked), jobs=1) from exc
                elapsed = time.monotonic() - started
                self._observe(elapsed, len(picked), sum(lengths[i] for i in picked))
                forward_s += elapsed
                batches += 1
                for i, output in zip(picked, result):
                    outputs[i] = output
                taken = set(picked)
                pending = [i for i in pending if i not in taken]
        finally:
            with self._cond:
                self._inline_running = False
                if self._waiting:
                    self._cond.notify()
        self.inline_jobs += 1
        wall = time.monotonic() - submitted
        return JobResult(outputs, max(0.0, wall - forward_s), forward_s, batches)

    def _observe(self, seconds: float, rows: int, tokens: int) -> None:
        """Count a successful forward and fold it into the running cost per token."""
        self.forwards += 1
        self._metric("observe_forward", seconds, rows, tokens)
        per_token = seconds / max(1, tokens)
        old = self._token_cost
        self._token_cost = per_token if old is None else old + _COST_SMOOTHING * (per_token - old)

    # ---- public state ----------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        """Jobs waiting with rows not yet started."""
        with self._cond:
            return len(self._waiting)

    @property
    def capacity(self) -> int:
        """The most jobs held at once before one is refused: max_queue waiting, plus those in a forward
        (one per row it may hold, since a job whose rows have all started has at least one there)."""
        return self.max_queue + (1 if self.grouping == "alone" else self.limits.max_rows)

    def load(self) -> ExecutorLoad:
        """Jobs waiting and in flight now, the capacity, and the queue's running mean (for the pod-level
        scaling gauges)."""
        with self._cond:
            self._fold_queue(time.monotonic())
            queued = len(self._waiting)
            in_flight = self._admitted - queued + (1 if self._inline_running else 0)
            mean = self._queued_mean
        return ExecutorLoad(queued, in_flight, self.capacity, mean)

    def _fold_queue(self, now: float) -> None:
        """Fold the time since the queue last changed into its running mean (lock held): the queue
        held len(_waiting) jobs all that while, so the mean decays towards it with QUEUE_MEAN_TAU_S."""
        elapsed = now - self._queued_since
        if elapsed > 0:
            keep = math.exp(-elapsed / QUEUE_MEAN_TAU_S)
            self._queued_mean = len(self._waiting) + (self._queued_mean - len(self._waiting)) * keep
            self._queued_since = now

    def stalled(self, timeout_s: float) -> str | None:
        """A reason when a forward has run longer than timeout_s or the worker is gone, else None."""
        if not self._thread.is_alive() and not self._closed:
            return f"model {self.name}: the worker thread is not running"
        started = self.forward_started_at
        if started is not None:
            running = time.monotonic() - started
            if running > timeout_s:
                return f"model {self.name}: a forward has run for {running:.1f} s (limit {timeout_s:g} s)"
        return None

    def close(self, timeout: float | None = None) -> None:
        """Stop taking work: waiting jobs fail with ExecutorClosed; the forward in flight finishes."""
        with self._cond:
            self._closed = True
            self._fold_queue(time.monotonic())
            waiting, self._waiting = self._waiting, []
            for job in waiting:
                self._finish(job, error=ExecutorClosed(f"model {self.name} is shut down"))
            self._cond.notify_all()
        self._metric("set_queue_depth", 0)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # ---- worker side -----------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                try:
                    batch, expired = self._next_batch(time.monotonic())
                except Exception as exc:  # a planning bug must not kill the worker: fail what waits
                    for job in list(self._waiting):
                        job.log(logging.ERROR, "model %s: batch planning failed", self.name, exc_info=exc)
                        error = ForwardError(f"model {self.name}: batch planning failed: {exc}")
                        self._retire(job, error)
                    batch, expired = [], 0
                depth = len(self._waiting)
                if batch:
                    self.forward_started_at = time.monotonic()
            self._drop(expired)
            self._metric("set_queue_depth", depth)
            if batch:
                self._run(batch)

    def _next_batch(self, now: float) -> tuple[list[tuple[_Job, int]], int]:
        """Fail expired jobs, then take the next batch's rows off the queue. Called with the lock held."""
        expired = 0
        for job in list(self._waiting):
            if job.deadline is not None and job.deadline <= now:
                error = DeadlineExceeded("the deadline passed before the job's rows ran", list(job.outputs))
                expired += self._retire(job, error)
        candidates = [(job, i) for job in self._waiting for i in job.pending]
        if not candidates:
            return [], expired
        chosen = plan_batch([job.lengths[i] for job, i in candidates], self.grouping, self.limits, self.pads,
                            self.buckets, self.row_multiple)
        batch = [candidates[k] for k in chosen]
        taken: dict[int, set[int]] = {}
        for job, i in batch:
            taken.setdefault(id(job), set()).add(i)
        for job in {id(job): job for job, _ in batch}.values():
            job.pending = [i for i in job.pending if i not in taken[id(job)]]
            if job.first_forward is None:
                job.first_forward = now
                self._metric("observe_queue", now - job.submitted)
        self._fold_queue(now)
        self._waiting = [job for job in self._waiting if job.pending]
        return batch, expired

    def _run(self, batch: list[tuple[_Job, int]]) -> None:
        rows = [job.rows[i] for job, i in batch]
        tokens = sum(job.lengths[i] for job, i in batch)
        started = self.forward_started_at or time.monotonic()
        failure: Exception | None = None
        outputs: list[Any] = []
        try:
            outputs = list(self.forward(rows))
            if len(outputs) != len(rows):
                raise ValueError(f"the forward returned {len(outputs)} results for {len(rows)} rows")
        except Exception as exc:  # any failure fails this batch only; the worker keeps serving
            failure = exc
        elapsed = time.monotonic() - started
        if failure is None:
            self._observe(elapsed, len(rows), tokens)
        else:
            self.forwards += 1
            self._metric("observe_forward", elapsed, len(rows), tokens)
        with self._cond:
            self.forward_started_at = None
            jobs = {id(job): job for job, _ in batch}
            for job in jobs.values():
                job.forward_s += elapsed
                job.batches += 1
            if failure is not None:
                self._fail_batch(failure, len(rows), list(jobs.values()))
                return
            for (job, i), output in zip(batch, outputs):
                if job.done:
                    continue  # abandoned while its rows ran
                job.outputs[i] = output
                job.remaining -= 1
            finished = time.monotonic()
            for job in jobs.values():
                if not job.done and job.remaining == 0:
                    wall = finished - job.submitted
                    result = JobResult(job.outputs, max(0.0, wall - job.forward_s), job.forward_s, job.batches)
                    self._finish(job, result=result)

    def _fail_batch(self, exc: Exception, rows: int, jobs: list[_Job]) -> None:
        """Fail every job of a failed forward (lock held): out of memory maps to RequestTooLarge
        when the forward held one job's rows and to Overloaded when it was shared."""
        oom = is_out_of_memory(exc)
        for job in jobs:
            # One line per job, in its request's context, so each request's log names the failure.
            if oom:
                job.log(logging.WARNING, "model %s: forward of %d rows (%d jobs) ran out of memory: %s",
                        self.name, rows, len(jobs), exc)
            else:
                job.log(logging.ERROR, "model %s: forward of %d rows (%d jobs) failed", self.name, rows,
                        len(jobs), exc_info=exc)
            if job.done:
                continue
            self._retire(job, self._forward_error(exc, rows, len(jobs), logged=True))

    def _forward_error(self, exc: Exception, rows: int, jobs: int, logged: bool = False) -> EngineError:
        """The error a job sees when a forward holding its rows failed (shared by ``jobs`` jobs)."""
        oom = is_out_of_memory(exc)
        if not logged:
            if oom:
                log.warning("model %s: forward of %d rows ran out of memory: %s", self.name, rows, exc)
            else:
                log.error("model %s: forward of %d rows failed", self.name, rows, exc_info=exc)
        error: EngineError
        if oom and jobs == 1:
            error = RequestTooLarge(f"model {self.name}: the request's forward ran out of memory")
        elif oom:
            error = Overloaded(f"model {self.name}: a shared forward ran out of memory")
        else:
            error = ForwardError(f"model {self.name}: the forward failed: {type(exc).__name__}: {exc}")
        error.__cause__ = exc
        return error

    # ---- helpers (lock held unless noted) ----------------------------------------------------

    def _retire(self, job: _Job, error: EngineError | None = None) -> int:
        """Take a job off the queue, failing it with `error` if given; returns its unstarted rows."""
        dropped = len(job.pending)
        job.pending = []
        if job in self._waiting:
            self._fold_queue(time.monotonic())
            self._waiting.remove(job)
        if error is not None:
            self._finish(job, error=error)
        else:
            self._mark_done(job)
        return dropped

    def _mark_done(self, job: _Job) -> None:
        if not job.done:
            job.done = True
            self._admitted -= 1

    def _finish(self, job: _Job, result: JobResult | None = None, error: BaseException | None = None) -> None:
        self._mark_done(job)
        with contextlib.suppress(RuntimeError):  # the job's event loop is closed: nobody is waiting
            job.loop.call_soon_threadsafe(_settle, job.future, result, error)

    def _drop(self, n: int) -> None:
        """Count rows that will never run (lock not held)."""
        if n:
            with self._cond:
                self.dropped_rows += n
            self._metric("on_dropped", n)

    def _metric(self, hook: str, *args: Any) -> None:
        if self.metrics is None:
            return
        try:
            getattr(self.metrics, hook)(self.name, *args)
        except Exception:  # a metrics bug must never fail a request or kill the worker
            log.exception("model %s: metrics hook %s failed", self.name, hook)

    def __repr__(self) -> str:
        return f"ModelExecutor({self.name!r}, grouping={self.grouping!r}, max_queue={self.max_queue})"


def _settle(future: asyncio.Future[JobResult], result: JobResult | None, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)  # type: ignore[arg-type]
