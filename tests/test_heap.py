"""edge_runtime/heap.py: what a load leaves alive is frozen, and a release still collects it."""

from __future__ import annotations

import gc
import weakref

from edge_runtime.heap import give_back, keep_loaded


class _Node:
    """A reference cycle's member (plain objects cannot be weakly referenced)."""

    def __init__(self) -> None:
        self.other: _Node | None = None


def test_a_frozen_cycle_is_skipped_by_collections_and_collected_on_release() -> None:
    a, b = _Node(), _Node()
    a.other, b.other = b, a  # a cycle: only the collector frees it
    gone = weakref.ref(a)
    keep_loaded()
    assert gc.get_freeze_count() > 0
    del a, b
    gc.collect()  # what a collection in the middle of a request does: the frozen cycle is not walked
    assert gone() is not None
    give_back()  # a released version's cycles are collected after all
    assert gone() is None
    assert gc.get_freeze_count() > 0  # and what is still alive is frozen again
