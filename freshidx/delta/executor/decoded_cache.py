"""Decoded parts of immutable store files, kept by a Python worker between tasks (docs/architecture.md#state-as-built).

A micro-batch's segment task reads the key columns of every state file and the row groups that hold
the rows it needs (:mod:`freshidx.delta.executor.state_lookup`). Those files never change: every key carries its
index version and task attempt. With Python worker reuse (``spark.python.worker.reuse``, on in
``freshidx spark-server``) a continuous run's micro-batches land on the same few workers, so what one
task decoded serves the next ones, and a micro-batch decodes only the newest segment's files instead
of the whole state again. Bounded by bytes (least recently used out first); 0 turns it off.
"""

from __future__ import annotations

import importlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

#: Store reads :meth:`DecodedCache.get_many` runs at once.
LOAD_THREADS = 8


class DecodedCache:
    """A byte-bounded LRU of decoded values; ``size`` says what a value weighs.

    Values loaded with ``lasting=True`` (small and costly to rebuild: a file's key index) are evicted only
    once no other value is left: a micro-batch touching more row groups than the budget holds would
    otherwise push every key index out on each pass (measured at 1M documents and a 256 MiB budget: the
    key indexes, ~25 % of the budget, were rebuilt every micro-batch, ~1 s of the segment task)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[Hashable, tuple[object, int]] = OrderedDict()
        self._lasting: OrderedDict[Hashable, tuple[object, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._items or key in self._lasting

    def resize(self, max_bytes: int) -> None:
        with self._lock:
            self.max_bytes = max_bytes
            self._evict()

    def get(self, key: Hashable, load: Callable[[], T], size: Callable[[T], int], *, lasting: bool = False) -> T:
        """The cached value of ``key``, or ``load()``'s (kept if it fits the budget)."""
        items = self._lasting if lasting else self._items
        with self._lock:
            found = items.get(key)
            if found is not None:
                items.move_to_end(key)
                return found[0]  # type: ignore[return-value]
        value = load()  # outside the lock: a slow read never blocks another key
        weight = size(value)
        with self._lock:
            if weight <= self.max_bytes and key not in items:
                items[key] = (value, weight)
                self._bytes += weight
                self._evict()
        return value

    def get_many(self, loads: Sequence[tuple[Hashable, Callable[[], T]]], size: Callable[[T], int], *,
                 lasting: bool = False) -> list[T]:
        """:meth:`get` of every ``(key, load)``, in order, the missing values loaded at the same time: each is a
        few store round trips, mostly waiting, so a worker that has none of them (a fresh one, a standby's first
        micro-batch) waits for the slowest file instead of the sum of all, and one slow answer holds up none of
        the others."""
        items = self._lasting if lasting else self._items
        with self._lock:
            # Held for this call: a value loaded below may push out one found here (values that outweigh the
            # budget, used in the same order each time, would otherwise each push out the next one needed).
            found: dict[int, T] = {}
            for i, (key, _) in enumerate(loads):
                if key in items:
                    items.move_to_end(key)
                    found[i] = items[key][0]  # type: ignore[assignment]
        missing = [i for i in range(len(loads)) if i not in found]
        loaded: dict[int, T] = {}
        if len(missing) > 1:
            with ThreadPoolExecutor(min(LOAD_THREADS, len(missing))) as pool:
                loaded = dict(zip(missing, pool.map(lambda i: loads[i][1](), missing), strict=True))
        return [found[i] if i in found else
                self.get(key, (lambda i=i: loaded[i]) if i in loaded else load, size, lasting=lasting)
                for i, (key, load) in enumerate(loads)]

    def retain(self, keep: Callable[[Hashable], bool]) -> None:
        """Drop every value whose key ``keep`` refuses."""
        with self._lock:
            for items in (self._items, self._lasting):
                for key in [k for k in items if not keep(k)]:
                    self._bytes -= items.pop(key)[1]

    def _evict(self) -> None:
        for items in (self._items, self._lasting):
            while self._bytes > self.max_bytes and items:
                _, (_, weight) = items.popitem(last=False)
                self._bytes -= weight


_WORKER: DecodedCache | None = None


def worker_cache(max_bytes: int) -> DecodedCache:
    """This process's cache, with its budget set to ``max_bytes``.

    Tasks must reach it through :func:`resolve_worker_cache`: a Spark Connect client may ship freshidx to
    the server *by value* (the fallback of ``code_shipping.ship_to_connect``), and a function pickled by value carries a
    copy of its module's globals, so a module-level cache reached directly would be new in every task.
    """
    global _WORKER
    if _WORKER is None:
        _WORKER = DecodedCache(max_bytes)
    else:
        _WORKER.resize(max_bytes)
    return _WORKER


def resolve_worker_cache(max_bytes: int) -> DecodedCache:
    """:func:`worker_cache` of the *installed* module (imported at run time, so the one instance of this
    worker process); a cache that keeps nothing where freshidx is not installed on the worker."""
    try:
        module = importlib.import_module(__name__)
    except ImportError:
        return DecodedCache(0)
    return module.worker_cache(max_bytes)  # type: ignore[no-any-return]
