"""The process heap between requests: what a load leaves alive is kept out of the cycle collector's
walks, and what a released version held is collected and handed back to the operating system.

CPython's full (generation 2) collection walks every tracked object. A loaded server holds some
65,000 of them (tokenizers, tables, configuration) and such a walk took 70-90 ms with the GIL held on
a 2-vCPU Xeon, every so often in the middle of a request: /health/live waited for it (issue 23's
100 ms bound failed in CI at 107 ms). Frozen after a load, those objects are no longer walked, and a
full collection costs what requests made since (under 1 ms measured).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
import threading

log = logging.getLogger("edge_runtime.heap")

__all__ = ["give_back", "keep_loaded"]

_libc: ctypes.CDLL | None = None
# Loads (the startup thread, an update's) and releases may run at once; freezing is process-wide.
_lock = threading.Lock()


def keep_loaded() -> None:
    """After a load: collect what the load left as garbage, then freeze everything alive, so later
    full collections skip it. What a request holds at that moment is frozen too; refcounting still
    frees it, only a reference cycle among it waits for the next :func:`give_back`."""
    with _lock:
        gc.collect()
        gc.freeze()


def give_back() -> None:
    """After a release: collect cycles, the frozen objects included (a released version's were frozen
    when it loaded), freeze what is still alive again, then ask glibc to return freed heap pages to
    the OS (malloc_trim): without it a released session's arenas stay resident and RSS would only
    ever grow across swaps."""
    global _libc
    with _lock:
        gc.unfreeze()
        gc.collect()
        gc.freeze()
    if os.name != "posix":
        return
    try:
        if _libc is None:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        _libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim): nothing to ask
        log.debug("malloc_trim is not available")
