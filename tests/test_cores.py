"""engine/cores.py: forwards share the process's cores, first come first served, never oversubscribed."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from edge_runtime.engine.cores import CoreGate


def test_forwards_run_while_their_threads_fit_and_a_wide_one_runs_alone() -> None:
    gate = CoreGate(4)
    with gate.held(2), gate.held(2):
        assert gate.used == 4
    with gate.held(16):  # wider than the cores: alone, holding them all
        assert gate.used == 4
    assert gate.used == 0


def test_waiters_go_in_arrival_order_and_never_past_the_cores() -> None:
    gate = CoreGate(2)
    order: list[int] = []
    peak = [0]
    lock = threading.Lock()

    def forward(i: int) -> None:
        with gate.held(2):
            with lock:
                order.append(i)
                peak[0] = max(peak[0], gate.used)
            time.sleep(0.01)

    first = threading.Thread(target=forward, args=(0,))
    with gate.held(2):  # every forward queues behind this one
        first.start()
        time.sleep(0.05)
        rest = []
        for i in range(1, 5):
            rest.append(threading.Thread(target=forward, args=(i,)))
            rest[-1].start()
            time.sleep(0.02)  # arrival order 1, 2, 3, 4
    for t in [first, *rest]:
        t.join(5)
    assert order == [0, 1, 2, 3, 4] and peak[0] == 2


def test_two_models_sharing_the_cores_never_overlap_their_forwards() -> None:
    import asyncio

    from edge_runtime.engine import ModelExecutor

    gate = CoreGate(2)
    running, overlaps = [0], [0]
    lock = threading.Lock()

    class SlowForward:
        def length(self, row: Any) -> int:
            return 1

        def __call__(self, rows: Sequence[Any]) -> list[Any]:
            with lock:
                running[0] += 1
                overlaps[0] = max(overlaps[0], running[0])
            time.sleep(0.02)
            with lock:
                running[0] -= 1
            return list(rows)

    executors = [ModelExecutor(f"m{i}", SlowForward(), "alone", max_queue=8, cores=gate, threads=2) for i in range(3)]

    async def main() -> list[Any]:
        return await asyncio.gather(*(ex.submit([i]) for ex in executors for i in range(2)))

    results = asyncio.run(main())
    for ex in executors:
        ex.close()
    assert [r.outputs for r in results] == [[0], [1]] * 3
    assert overlaps[0] == 1
