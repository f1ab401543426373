"""The benches' seeded history: a window of back-dated partitions written by one process per core,
with a progress line (done, rate, time left) instead of minutes of silence.

A partition's content depends only on the generator config and the partition (``partition_records``), so the
partitions are independent and are written in parallel; the result is the same as writing them one by one.
"""

from __future__ import annotations

import datetime as dt
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from freshidx.store.partitions import PartitionId
from freshidx.tools.generate import history_partitions, write_partition
from freshidx.tools.generator import GeneratorConfig

PROGRESS_EVERY_S = 15.0


@dataclass(frozen=True)
class SeedProgress:
    """How far a seeding is, and the time it still needs at its rate so far."""

    done: int
    total: int
    records: int
    elapsed_s: float

    @property
    def records_per_s(self) -> float:
        return self.records / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def left_s(self) -> float | None:
        if self.done == 0:
            return None
        return self.elapsed_s * (self.total - self.done) / self.done

    def line(self) -> str:
        left = "?" if self.left_s is None else f"{self.left_s:.0f} s"
        return (f"seeding: {self.done}/{self.total} partitions, {self.records:,} records, "
                f"{self.records_per_s:,.0f} records/s, about {left} left")


def _write_one(store_dir: str, cfg: GeneratorConfig, at_iso: str) -> int:
    """One history partition, its files stamped with the partition's time as upstream's would be: otherwise
    every seeded file is newer than the first full index's listing minus the clock-skew margin
    (segments.files_to_read), and the first micro-batch after it re-reads the whole window."""
    from freshidx.store import StoreConfig, open_store

    root = Path(store_dir)
    store = open_store(StoreConfig(uri=root.as_uri()))
    partition = PartitionId(dt.datetime.fromisoformat(at_iso))
    written = write_partition(store, cfg, partition)
    at = partition.at.timestamp()
    for key in written.keys:
        os.utime(root / key, (at, at))
    return written.records


def seed_history(store_dir: Path, cfg: GeneratorConfig, now: dt.datetime, window_minutes: int,
                 progress: Callable[[str], None] | None = None, workers: int | None = None) -> tuple[int, float]:
    """Every 5-minute partition of ``(now - window, now)`` written into the local store at ``store_dir``;
    returns (records written, seconds). ``progress`` gets a line at most every :data:`PROGRESS_EVERY_S`."""
    parts = history_partitions(now, dt.timedelta(minutes=window_minutes))
    t0 = time.monotonic()
    n_workers = max(1, min(workers or os.cpu_count() or 1, len(parts) or 1))
    records = 0
    done = 0
    last_report = t0
    # spawn: the caller may hold threads (a server's supervisor), which a forked child must not inherit.
    with ProcessPoolExecutor(n_workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        pending: set[Future[int]] = {pool.submit(_write_one, str(store_dir), cfg, p.at.isoformat()) for p in parts}
        while pending:
            finished, pending = wait(pending, timeout=PROGRESS_EVERY_S, return_when=FIRST_COMPLETED)
            for f in finished:
                records += f.result()
                done += 1
            now_m = time.monotonic()
            if progress is not None and pending and now_m - last_report >= PROGRESS_EVERY_S:
                last_report = now_m
                progress(SeedProgress(done, len(parts), records, now_m - t0).line())
    return records, round(time.monotonic() - t0, 1)
