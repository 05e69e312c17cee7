"""Threads by measurement: a CPU model with a budget above one thread serves each forward size at the
count measured fastest, and the count never moves an output (the probe's grouping holds whatever
count a forward takes)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from edge_runtime.config import ModelConfig
from edge_runtime.engine.probe import bitwise_equal
from edge_runtime.engine.threads import _plan, counts
from edge_runtime.loading import ServedModel, load_model

KINDS = ("embedding", "sequence-classification", "token-classification", "rerank", "decision-codes", "vela2")


def test_counts_and_the_plan_from_the_timings() -> None:
    assert counts(1) == [1] and counts(2) == [1, 2] and counts(6) == [1, 2, 4, 6] and counts(8) == [1, 2, 4, 8]
    timings = [(1, 16, {1: 1.0, 2: 1.4}), (1, 64, {1: 2.0, 2: 2.2}), (8, 64, {1: 9.0, 2: 6.0}),
               (32, 64, {1: 30.0, 2: 17.0})]
    assert _plan(timings, [1, 2], 2) == ((64, 1), (2048, 2))
    assert _plan(timings, [2], 2) == ((2048, 2),)  # a count whose outputs differed is never chosen


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
