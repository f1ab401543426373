"""What both freshness measurements wait on (a partition's run per tick, :mod:`freshidx.tools.bench_measure`;
its micro-batch in the continuous run, :mod:`freshidx.tools.bench_continuous`): the delta pointer covering
the partition, then the Searcher serving it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from freshidx.store.partitions import PartitionId
from freshidx.tools.bench_common import POLL_S, Deadline, Probe, Visibility


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
        if version is not None and vis.visible(version, probe):
            events["searchable"] = time.time()
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
