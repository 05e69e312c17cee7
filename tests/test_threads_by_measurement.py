"""Threads by measurement: a CPU model with a budget above one thread serves each forward size at the
count measured fastest, and the count never moves an output (the probe's grouping holds whatever
count a forward takes)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_runtime.config import ModelConfig
from edge_runtime.engine.probe import bitwise_equal
from edge_runtime.engine.session import planned_threads
from edge_runtime.engine.threads import LONG_FORWARD_MS, RUNS, _plan, choose_threads, counts
from edge_runtime.loading import ServedModel, load_model

KINDS = ("embedding", "sequence-classification", "token-classification", "rerank", "decision-codes", "vela2")


def test_counts_and_the_plan_from_the_timings() -> None:
    assert counts(1) == [1] and counts(2) == [1, 2] and counts(6) == [1, 2, 4, 6] and counts(8) == [1, 2, 4, 8]
    timings = [(1, 16, {1: 1.0, 2: 1.4}), (1, 64, {1: 2.0, 2: 2.2}), (8, 64, {1: 9.0, 2: 6.0}),
               (32, 64, {1: 30.0, 2: 17.0})]
    assert _plan(timings, [1, 2], 2) == ((64, 1), (2048, 2))
    assert _plan(timings, [2], 2) == ((2048, 2),)  # a count whose outputs differed is never chosen


class _Session:
    """A CPU session with a budget of two whose forced count the fake forward reads."""

    device, threads = "cpu", 2

    def __init__(self) -> None:
        self.now = 2

    def forced_threads(self, n: int) -> Any:
        outer = self

        class _Forced:
            def __enter__(self) -> None:
                outer.now = n

            def __exit__(self, *exc: object) -> None:
                outer.now = 2
        return _Forced()


def test_a_plan_gives_each_forward_size_the_first_step_that_holds_it() -> None:
    plan = ((32, 1), (256, 2))
    assert [planned_threads(plan, tokens, 4) for tokens in (1, 32, 33, 256, 10_000)] == [1, 1, 2, 2, 2]
    assert planned_threads((), 10, 4) == 4  # no plan: the session's own count


def test_the_counts_take_turns_in_every_measured_shape() -> None:
    session, calls = _Session(), []

    def forward(batch: list[int]) -> list[np.ndarray]:
        calls.append((len(batch), batch[0], session.now))
        return [np.zeros(1)]

    choose_threads(session, forward, lambda n: n, max_tokens=16, batches=False)  # type: ignore[arg-type]
    # one untimed forward at the budget, each count's equality check, then the timed runs alternating
    assert [n for _, _, n in calls] == [2, 1, 2] + [1, 2] * RUNS


def test_a_long_forward_and_every_larger_one_take_the_budget_unmeasured() -> None:
    session, calls = _Session(), []

    def forward(batch: list[int]) -> list[np.ndarray]:
        calls.append((len(batch), batch[0], session.now))
        if len(batch) * batch[0] >= 256:  # a shape past the long-forward bound
            time.sleep(LONG_FORWARD_MS * 1.5 / 1000)
        return [np.zeros(1)]

    choice = choose_threads(session, forward, lambda n: n, max_tokens=512)  # type: ignore[arg-type]
    assert choice is not None
    assert [t[:2] for t in choice.timings] == [(1, 16), (1, 32), (1, 64), (1, 256)]
    assert set(choice.timings[-1][2]) == {2} and choice.plan[-1] == (256, 2)
    assert not any(rows * tokens > 256 for rows, tokens, _ in calls)  # nothing larger ran at all


@pytest.mark.parametrize("kind", KINDS)
def test_every_count_gives_the_same_outputs_and_the_plan_is_shown(kind: str,
                                                                  fixture_package: Callable[..., Path]) -> None:
    quantize = kind == "embedding"  # the exact int8 as well as fp32 graphs
    model = ServedModel(ModelConfig(name="m", package=fixture_package(kind, quantize=quantize),
                                    variant="int8" if quantize else "fp32", device="cpu", threads=2))
    load_model(model)
    assert model.status == "ready", model.reason
    try:
        choice = model.thread_choice
        assert choice is not None and choice.unequal == ()
        shown = model.info()["engine_args"]["threads_by_tokens"]
        assert shown["plan"] and {p["threads"] for p in shown["plan"]} <= {1, 2}
        family, session = model.family, model.session
        assert family is not None and session is not None
        rows = [family.probe_row(n) for n in (5, 17, 40)]
        batch = rows if model.grouping != "alone" else rows[:1]
        with session.forced_threads(1):
            one = family.forward(batch)
        with session.forced_threads(2):
            two = family.forward(batch)
        assert bitwise_equal(one, two)
    finally:
        if model.executor is not None:
            model.executor.close()
