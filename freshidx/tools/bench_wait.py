"""What both freshness measurements wait on (a partition's run per tick, :mod:`freshidx.tools.bench_measure`;
its micro-batch in the continuous run, :mod:`freshidx.tools.bench_continuous`): the delta pointer covering
the partition, then the Searcher serving it; and the warm-up before them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from freshidx.store.partitions import PartitionId
from freshidx.tools.bench_common import POLL_S, Deadline, Probe, Visibility, log


def iso_epoch(text: str) -> float:
    """An ISO timestamp the pipeline wrote (pointer, run tag) as epoch seconds."""
    from freshidx.publish.commit import parse_iso

    return parse_iso(text).timestamp()


def wait_searchable(
    store: Any, vis: Visibility, partition: PartitionId, probe: Probe | None, timeout_s: float,
    events: dict[str, float | None], sample: dict[str, Any], check: Callable[[bool], str | None],
) -> None:
    """Poll until the delta pointer covers ``partition`` (``published``) and ``vis`` serves it
    (``searchable``); ``check()`` (about once a second) returns an error that ends the wait, or None.
    Errors go to ``sample["error"]``."""
    from freshidx.publish.commit import read_pointer

    deadline = Deadline(timeout_s)
    version: str | None = None
    next_check = 0.0
    while True:
        if version is None:
            ptr, _ = read_pointer(store, "delta")
            if ptr is not None and ptr.source_partition and PartitionId.parse(ptr.source_partition) >= partition:
                version = ptr.version
                events["published"] = iso_epoch(ptr.published_at)
                sample.update(version=ptr.version, doc_count=ptr.doc_count, covered_partition=ptr.source_partition)
        if version is not None and (at := vis.searchable_at(version, probe)) is not None:
            events["searchable"] = at
            sample["searchable_parts"] = vis.parts(events.get("published"), version)
            return
        if time.monotonic() >= next_check:
            next_check = time.monotonic() + 1.0
            if (err := check(version is not None)) is not None:
                sample["error"] = err
                return
        if deadline.passed():
            sample["error"] = (f"not {'searchable' if version else 'published'} after {timeout_s:.0f}s"
                               + (f" ({vis.error})" if vis.error else ""))
            return
        time.sleep(POLL_S)


def in_flight_runs(instance: Any) -> list[Any]:
    """Runs in flight, the long-lived continuous run (continuous mode) aside."""
    import dagster as dg

    from freshidx.trigger.continuous_rules import JOB_NAME

    statuses = [dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTING,
                dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]
    return [r for r in instance.get_runs(dg.RunsFilter(statuses=statuses), limit=20) if r.job_name != JOB_NAME]


WARM_UP_PROGRESS_S = 30.0


def warm_up_line(elapsed_s: float, delta: bool, full: bool, in_flight: list[str], left_s: float) -> str:
    """What a warm-up still waits for, after how long, and how long it may still take."""
    runs = ", ".join(in_flight) if in_flight else "none"
    return (f"warming up for {elapsed_s:.0f} s: delta {'published' if delta else 'not yet'}, full index "
            f"{'published' if full else 'not yet'}; runs in flight: {runs}; deadline in {left_s:.0f} s")


def warm_up(dev: Any, instance: Any, store: Any, timeout_s: float, full_warmup: bool) -> tuple[Any, Any]:
    """Wait until the first delta (and the first full index, if asked) is published and no run is in
    flight; returns the (delta, full) pointers."""
    import dagster as dg

    from freshidx.publish.commit import read_pointer

    # A ten-million-document window's first full index takes many minutes: the deadline is generous, and a
    # progress line says what the warm-up is waiting for.
    warm = Deadline(max(1800.0, timeout_s * 3))
    t0 = last_report = time.monotonic()
    while True:
        delta, _ = read_pointer(store, "delta")
        full, _ = read_pointer(store, "full")
        busy = in_flight_runs(instance)
        full_tried = not full_warmup or full is not None or any(
            dg.AssetKey("full_index") in (r.asset_selection or ()) for r in instance.get_runs(limit=20))
        if delta is not None and full_tried and not busy:
            return delta, full
        if time.monotonic() - last_report >= WARM_UP_PROGRESS_S:
            last_report = time.monotonic()
            log(warm_up_line(time.monotonic() - t0, delta is not None, full is not None,
                             [f"{r.job_name} {r.status.value}" for r in busy], warm.left()))
        if not dev.is_running:
            raise RuntimeError(f"dagster dev exited during warm-up; see {dev.log_path}")
        if warm.passed():
            raise TimeoutError(f"warm-up not done: delta={delta is not None} full={full is not None} "
                               f"in flight={[r.run_id[:8] for r in busy]}; see {dev.log_path}")
        time.sleep(1.0)
