"""A Python worker hands its freed heap back to the kernel after a shard task
(docs/operations.md#arrow-memory-in-the-python-workers).

The workers allocate through the C library (``ARROW_DEFAULT_MEMORY_POOL=system``), which keeps what a task
freed for the next one: after a micro-batch at the window's rate a worker stays resident near its peak,
hundreds of MiB to GiBs, and every worker of the session does. ``malloc_trim`` returns the free pages
(what is still in use stays, the decoded state included); the next large task faults them in again, a
fraction of a second per GiB where transparent huge pages are not forced on every allocation. It runs on
a thread of its own once the task has handed over its result, so the task's latency does not include it.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from functools import cache

#: Held while a trim runs: a second request then is already served by the running one.
_TRIMMING = threading.Lock()


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    """The C library's ``malloc_trim``, or ``None`` where it has none (musl, macOS: nothing to do there)."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


def trim_now() -> bool:
    """Return the process's free heap pages to the kernel; ``False`` when the C library cannot, or another
    thread is doing it."""
    trim = _malloc_trim()
    if trim is None or not _TRIMMING.acquire(blocking=False):
        return False
    try:
        trim(0)
    finally:
        _TRIMMING.release()
    return True


def trim_soon() -> threading.Thread | None:
    """Start :func:`trim_now` on a daemon thread (``None`` where the C library has no trim): a task calls it
    last, so the trim overlaps the worker's wait for its next task."""
    if _malloc_trim() is None:
        return None
    thread = threading.Thread(target=trim_now, name="freshidx-malloc-trim", daemon=True)
    thread.start()
    return thread
