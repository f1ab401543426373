"""Warm the Python workers for the next micro-batch, while the loop is idle (docs/architecture.md#warm-state).

A micro-batch's task looks its state rows up through the key indexes and row groups its Python worker
keeps (:mod:`freshidx.delta.executor.decoded_cache`). A worker that has not seen a state file builds them
first: all of them after a new full version; after each micro-batch, the new segment's files. And Spark
stops a Python worker that stayed idle for a minute, taking what it kept. So while the continuous loop
waits for a partition it runs this job, one task per worker slot, and each task decodes what the next
micro-batch will read (:func:`warm_files`):
the next micro-batch finds its workers alive and its state decoded, and pays only for what it changes.
A warm-up may be given a budget: its tasks start no read that would end after it (the first read of a call
always starts; after it, a read starts only while what the worker has learned of its reading pace says it
ends in time), so a partition that arrives meanwhile waits about that long, or one read at most when a
single state file's key index outlasts the budget; the next warm-up goes on where it stopped.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import NamedTuple

import pyarrow as pa
from pyspark.sql import SparkSession

from freshidx.delta.executor.decoded_cache import LOAD_THREADS, DecodedCache, resolve_worker_cache
from freshidx.delta.executor.state_files import FileRef, StateFile, open_state_files
from freshidx.delta.executor.state_lookup import (
    StateLayer,
    forget_other_state,
    is_cached,
    is_read_ahead,
    load_key_index,
    load_row_group,
    read_ahead,
    state_file_refs,
)
from freshidx.spark.raw_source import store_from_json, store_to_json
from freshidx.store import StoreConfig

_RESULT_DDL = "task long, decoded long, complete boolean"


@dataclasses.dataclass(frozen=True)
class WarmResult:
    seconds: float
    files: int  # state files warmed
    decoded: int  # values the workers had to decode (0: everything was warm)
    complete: bool  # False: the budget ran out before every task had decoded everything


def warm_state(spark: SparkSession, store_config: StoreConfig, layers: Sequence[StateLayer], *, tasks: int,
               cache_bytes: int, budget_s: float | None = None, disk_bytes: int = 0) -> WarmResult:
    """Decode the state ``layers`` in ``tasks`` Python tasks (one Spark job), each for at most ``budget_s``
    seconds of decoding (None: until done); with ``cache_bytes`` 0 the tasks decode nothing (the workers keep
    nothing) and only keep the workers alive."""
    t0 = time.monotonic()
    refs = state_file_refs(layers) if cache_bytes > 0 else []
    task = _task(store_to_json(store_config), refs, cache_bytes, budget_s, disk_bytes)
    rows = spark.range(0, tasks, 1, tasks).mapInArrow(task, _RESULT_DDL).collect()
    return WarmResult(round(time.monotonic() - t0, 3), len(refs), sum(int(r["decoded"]) for r in rows),
                      all(bool(r["complete"]) for r in rows))


def _task(store_json: str, refs: list[FileRef], cache_bytes: int, budget_s: float | None,
          disk_bytes: int) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        deadline = None if budget_s is None else time.monotonic() + budget_s  # the worker's own clock
        task = [int(v) for b in batches for v in b.column(0).to_pylist()]
        files = open_state_files(store_from_json(store_json), refs, disk_bytes) if refs else []
        cache = resolve_worker_cache(cache_bytes)
        if files:
            forget_other_state(cache, files)
        try:
            count = warm_files(files, cache, deadline)
        finally:
            for f in files:
                f.close()
        yield pa.record_batch({"task": pa.array(task[:1] or [-1], pa.int64()),
                               "decoded": pa.array([count.decoded], pa.int64()),
                               "complete": pa.array([count.complete], pa.bool_())})

    return run


class ReadPace:
    """Seconds a key-index read takes per state row, as this worker last measured it (None: not yet)."""

    def __init__(self) -> None:
        self.seconds_per_row: float | None = None

    def estimate(self, rows: int) -> float | None:
        return None if self.seconds_per_row is None else rows * self.seconds_per_row

    def measured(self, rows: int, seconds: float) -> None:
        if rows > 0:
            self.seconds_per_row = seconds / rows


#: The pace of this Python worker (one per process, like its decoded cache).
WORKER_PACE = ReadPace()


class WarmCount(NamedTuple):
    decoded: int  # values decoded (0: everything was warm)
    complete: bool  # False: the deadline came first


def warm_files(files: list[StateFile], cache: DecodedCache, deadline: float | None = None,
               pace: ReadPace = WORKER_PACE) -> WarmCount:
    """Decode what a micro-batch over ``files`` reads into ``cache``: every file's key index (several read at
    once: each is a few store round trips, mostly waiting), then the row groups, the newest layer first (what
    the budget cannot hold goes first); a mapped copy has none to decode, and is read ahead into the page cache
    instead, once per worker (``state_lookup.read_ahead``). No read starts that ``pace`` says would end after
    ``deadline`` (a ``time.monotonic()``; the call's first read always starts); a later call goes on where this
    one stopped.
    No row group is decoded that would push another out of ``cache``: a state larger than the cache is warm as
    far as it holds, and the micro-batch decodes the rest."""
    reads: list[None] = []  # appended from the pool's threads
    advised = 0  # copies read ahead

    def spent() -> bool:
        """The budget is spent, and this call has done something (so a short budget still gets there)."""
        return deadline is not None and time.monotonic() >= deadline and (bool(reads) or advised > 0)

    newest_first = sorted(files, key=lambda f: -f.layer)
    missing = [f for f in newest_first if not is_cached(f, cache)]
    started = _warm_key_indexes(missing, cache, deadline, pace, lambda: reads.append(None))
    if started < len(missing):
        return WarmCount(len(reads), False)
    for f in newest_first:
        reader = f.reader()
        if reader.mapped:  # its rows are taken from the page cache: nothing to decode, but the pages read in
            if not is_read_ahead(f, cache):
                if spent():
                    return WarmCount(len(reads), False)
                read_ahead(f, cache)
                advised += 1
            continue
        decoded = 0  # what this file's last row group weighed decoded (Parquet's own sizes are encoded ones)
        for g in range(len(reader.row_group_sizes)):
            if spent():
                return WarmCount(len(reads), False)
            if not is_cached(f, cache, g) and \
                    cache.nbytes + max(decoded, reader.row_group_bytes(g)) > cache.max_bytes:
                # Full: decoding more would only push out what is warm (a window larger than the cache, churned
                # on every idle tick, delays the micro-batch that arrives meanwhile). Done as far as it holds.
                return WarmCount(len(reads), True)
            decoded = load_row_group(f, g, cache, lambda: reads.append(None)).nbytes
    return WarmCount(len(reads), True)


def _warm_key_indexes(missing: list[StateFile], cache: DecodedCache, deadline: float | None, pace: ReadPace,
                      on_read: Callable[[], None]) -> int:
    """Read the key indexes of ``missing``, several at once, while they fit before ``deadline``; returns how
    many were started (in order: the rest are for the next call)."""
    running: dict[Future[object], int] = {}  # a read under way -> its file's rows (0 when no deadline asks)

    def read(f: StateFile) -> None:
        t0 = time.monotonic()
        load_key_index(f, cache, on_read)
        pace.measured(f.reader().num_rows, time.monotonic() - t0)  # open by now

    def fits(rows: int) -> bool:
        if deadline is None or started == 0:
            return True
        # Reads under way share the worker's cores with this one: it ends after their rows and its own.
        needed = pace.estimate(rows + sum(running.values()))
        return needed is not None and time.monotonic() + needed <= deadline

    started = 0
    with ThreadPoolExecutor(LOAD_THREADS) as pool:
        while True:
            while len(running) < LOAD_THREADS and started < len(missing):
                # Without a deadline nothing is estimated: the files are then opened on the pool's threads (opening
                # may copy one: StateFile.num_rows counts without it).
                rows = missing[started].num_rows() if deadline is not None else 0
                if not fits(rows):
                    break
                running[pool.submit(read, missing[started])] = rows
                started += 1
            if not running:
                return started
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for d in done:
                del running[d]
                d.result()  # a failed read fails the warm-up (the loop logs it; the micro-batch reads itself)
