"""The executor's inline path: idle executors run cheap jobs on the caller's thread, same answers; a lone
request (Runtime.alone) may run a longer forward inline.

Every comparison is bit for bit (probe.bitwise_equal) between an executor that may run inline and
one that never does, over the same rows of real graphs: sparrow-nano (rows alone) and an int8
embedding fixture (padded batches, split by a small token cap into several forwards).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from converters.sparrow.export import build_sparrow_package
from edge_runtime.config import ModelConfig
from edge_runtime.engine import ModelExecutor, create_session
from edge_runtime.engine.errors import ForwardError
from edge_runtime.engine.probe import bitwise_equal
from edge_runtime.families.registry import build_family, read_package
from edge_runtime.requests.decisions import parse_decisions_request

BODIES = [
    {"state": "My card was charged twice and the parcel never arrived.",
     "questions": {"team": {"type": "choice", "instructions": "Which team should handle this?",
                            "criteria": {"billing": "payments and refunds", "shipping": "parcels", "tech": None}},
                   "urgent": {"type": "noul", "instructions": "Is this urgent?"},
                   "level": {"type": "score", "instructions": "How upset is the customer?",
                             "criteria": ["calm", "a little", "upset", "angry"]}}},
    {"state": "Please move the meeting to Thursday at 3 pm.",
     "questions": {"team": {"type": "choice", "instructions": "Which team should handle this?",
                            "criteria": {"billing": "payments and refunds", "shipping": "parcels", "tech": None}},
                   "urgent": {"type": "noul", "instructions": "Is this urgent?"}}},
]


def _family(path: Path, variant: str = "fp32") -> Any:
    package = read_package(path)
    session = create_session(package.graph(variant), "cpu", 1)
    return build_family(package, session, ModelConfig(name="m", package=path, variant=variant, device="cpu"))[0]


def _run_jobs(forward: Any, grouping: str, jobs: list[list[Any]], inline_max_s: float,
              max_batch_tokens: int = 16384) -> tuple[list[list[Any]], ModelExecutor]:
    """Submit each job in turn (the executor idle between them); their outputs and the executor."""
    ex = ModelExecutor("m", forward, grouping, max_queue=4, max_batch_tokens=max_batch_tokens,
                       inline_max_s=inline_max_s)

    async def main() -> list[list[Any]]:
        return [(await ex.submit(rows)).outputs for rows in jobs]

    try:
        return asyncio.run(main()), ex
    finally:
        ex.close()


@pytest.fixture(scope="module")
def sparrow(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return _family(build_sparrow_package(tmp_path_factory.mktemp("sparrow")))


def test_sparrow_inline_equals_executor_bit_for_bit(sparrow: Any) -> None:
    jobs = [sparrow.plan_request(parse_decisions_request(body)).rows for body in BODIES * 3]
    inline, ex_inline = _run_jobs(sparrow.forward, "alone", jobs, inline_max_s=1.0)
    queued, ex_queued = _run_jobs(sparrow.forward, "alone", jobs, inline_max_s=0.0)
    # the first job measures the model's cost on the worker; every later one runs inline
    assert ex_inline.inline_jobs == len(jobs) - 1 and ex_queued.inline_jobs == 0
    assert ex_inline.forwards == ex_queued.forwards == sum(len(rows) for rows in jobs)
    assert all(bitwise_equal(a, b) for a, b in zip(inline, queued))


def test_batched_inline_plan_equals_executor_bit_for_bit(fixture_package: Callable[..., Path]) -> None:
    """Padded grouping with a token cap: the inline path splits a job into the worker's batches."""
    family = _family(fixture_package("embedding", quantize=True), "int8")
    jobs = [[family.probe_row(n) for n in lengths] for lengths in ([5, 17, 3, 40, 9], [12], [30, 30, 2])]
    inline, ex_inline = _run_jobs(family.forward, "padded", jobs, inline_max_s=10.0, max_batch_tokens=64)
    queued, ex_queued = _run_jobs(family.forward, "padded", jobs, inline_max_s=0.0, max_batch_tokens=64)
    assert ex_inline.inline_jobs == len(jobs) - 1
    assert ex_inline.forwards == ex_queued.forwards > len(jobs)  # several forwards per job, the same plan
    assert all(bitwise_equal(a, b) for a, b in zip(inline, queued))


def test_expensive_jobs_and_busy_executors_take_the_worker(sparrow: Any) -> None:
    rows = sparrow.plan_request(parse_decisions_request(BODIES[0])).rows
    _, ex = _run_jobs(sparrow.forward, "alone", [rows] * 3, inline_max_s=1e-9)  # cheaper than any forward
    assert ex.inline_jobs == 0

    ex = ModelExecutor("m", sparrow.forward, "alone", max_queue=8, inline_max_s=1.0)

    async def main() -> None:
        await ex.submit(rows)  # measures the cost
        # submitted together: the first runs inline, the others find it busy or queued... all answered
        results = await asyncio.gather(*(ex.submit(rows) for _ in range(4)))
        assert all(bitwise_equal(r.outputs, results[0].outputs) for r in results)

    try:
        asyncio.run(main())
    finally:
        ex.close()


def test_inline_forward_failure_maps_as_on_the_worker(sparrow: Any) -> None:
    class Flaky:
        """sparrow's forward that fails from its second call on."""

        calls = 0
        length = staticmethod(sparrow.forward.length)

        def __call__(self, rows: list[Any]) -> list[Any]:
            self.calls += 1
            if self.calls > 1:
                raise RuntimeError("boom")
            return sparrow.forward(rows)

    flaky = Flaky()
    rows = sparrow.plan_request(parse_decisions_request(BODIES[1])).rows
    ex = ModelExecutor("m", flaky, "alone", max_queue=4, inline_max_s=1.0)

    async def main() -> None:
        await ex.submit(rows[:1])
        with pytest.raises(ForwardError, match="boom"):
            await ex.submit(rows[:1])
        assert ex.inline_jobs == 0 and flaky.calls == 2  # it ran inline, failed, and is not counted

    try:
        asyncio.run(main())
    finally:
        ex.close()


def test_cached_question_feeds_equal_fresh_feeds_bit_for_bit(sparrow: Any) -> None:
    """Repeated questions reuse their encoded feeds; every row still equals one built from scratch."""
    from edge_runtime.families.sparrow.family import KINDS, content

    text = sparrow.text
    first = sparrow.plan_request(parse_decisions_request(BODIES[0])).rows
    again = sparrow.plan_request(parse_decisions_request(BODIES[1])).rows  # same "team" and "urgent" questions
    assert again[0].feeds["option_ids"] is first[0].feeds["option_ids"]  # shared, not rebuilt
    assert not first[0].feeds["option_ids"].flags.writeable
    for body, rows in ((BODIES[0], first), (BODIES[1], again)):
        entry = parse_decisions_request(body).single
        state = text.read(content(entry.state), sparrow.max_input_tokens)[0]
        for q, row in zip(entry.questions, rows):
            fresh = text.feeds(state, text.segment_ids(content(q.instructions)),
                               [text.segment_ids(o) for o in text.options(q)], KINDS[q.type])
            assert bitwise_equal(row.feeds, fresh.feeds) and row.tokens == fresh.tokens


def test_a_lone_request_has_the_longer_inline_bound(sparrow: Any) -> None:
    rows = sparrow.plan_request(parse_decisions_request(BODIES[0])).rows
    ex = ModelExecutor("m", sparrow.forward, "alone", max_queue=4, inline_max_s=1e-9, inline_alone_max_s=1.0)

    async def main() -> None:
        await ex.submit(rows)  # measures the cost (worker path)
        for alone in (False, True, False, True):
            await ex.submit(rows, alone=alone)

    try:
        asyncio.run(main())
    finally:
        ex.close()
    assert ex.inline_jobs == 2  # only the lone ones ran inline
    assert ModelExecutor("n", sparrow.forward, "alone", max_queue=1, inline_max_s=0.5,
                         inline_alone_max_s=0.1).inline_alone_max_s == 0.5  # never below the shared bound


def test_a_request_is_alone_until_another_connection_is_heard_from(monkeypatch: pytest.MonkeyPatch) -> None:
    from edge_runtime import runtime as runtime_module
    from edge_runtime.config import ServeConfig

    rt = runtime_module.Runtime(ServeConfig(models_file=None, models=()))
    now = [100.0]
    # the runtime module's clock only: the process's own time.monotonic stays as it is
    monkeypatch.setattr(runtime_module, "time", SimpleNamespace(monotonic=lambda: now[0]))
    rt.answering = 1
    for _ in range(3):
        rt.arrived(1)
        assert rt.alone  # one connection, one request at a time
    now[0] += 0.01
    rt.arrived(2)
    assert not rt.alone  # a second client within the window
    now[0] += 0.01
    rt.arrived(2)
    assert not rt.alone
    now[0] += runtime_module.ALONE_WINDOW_S + 0.001
    rt.arrived(2)
    assert rt.alone  # connection 1 quiet for the whole window
    rt.answering = 2
    assert not rt.alone  # a bundle's tasks, or two requests in flight
