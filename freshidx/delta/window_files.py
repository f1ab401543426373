"""Every raw data file of a delta micro-batch's window (docs/architecture.md#listing-costs-what-is-recent).

The delta reads the partitions of ``(window start, newest]``: one listing per hour of the window, the hours
listed concurrently; names that do not parse set aside as :class:`~freshidx.trigger.listing.Ignored` (the
trigger's record of them), never turned into a path of ours. Which of these files a micro-batch then reads is
:func:`freshidx.delta.segments.files_to_read`.
"""

from __future__ import annotations

import datetime as dt
from concurrent.futures import ThreadPoolExecutor

from freshidx.store import ObjectInfo, ObjectStore, layout
from freshidx.store.partitions import PartitionError, PartitionId
from freshidx.trigger.listing import Ignored

#: Hours listed at once: a 5-hour window's six listings cost the time of one.
LISTING_THREADS = 8


def files_in_window(
    store: ObjectStore, source: str, start_exclusive: dt.datetime, end_inclusive: PartitionId,
    threads: int = LISTING_THREADS,
) -> tuple[dict[PartitionId, list[ObjectInfo]], list[Ignored]]:
    """Every data file of partitions in ``(start_exclusive, end_inclusive]``: one listing per hour, up to
    ``threads`` hours listed at once (their number follows the window, the time they take need not; the
    deterministic simulator, whose store calls switch greenlets, lists them one by one)."""
    first = start_exclusive + dt.timedelta(minutes=1)
    hours: list[dt.datetime] = []
    cur = first.replace(minute=0, second=0, microsecond=0)
    while cur <= end_inclusive.at:
        hours.append(cur)
        cur += dt.timedelta(hours=1)

    def list_hour(hour: dt.datetime) -> list[ObjectInfo]:
        return list(store.iter_objects(layout.raw_hour_prefix(source, PartitionId(hour).hour_path)))

    if len(hours) > 1 and threads > 1:
        with ThreadPoolExecutor(min(threads, len(hours))) as pool:
            listings = list(pool.map(list_hour, hours))
    else:
        listings = [list_hour(h) for h in hours]
    files: dict[PartitionId, list[ObjectInfo]] = {}
    ignored: list[Ignored] = []
    root = layout.raw_root(source)
    for obj in (o for listing in listings for o in listing):
        rel = obj.key[len(root):]
        part_path, _, name = rel.rpartition("/")
        try:
            pid = PartitionId.parse(part_path)
        except PartitionError as exc:
            ignored.append(Ignored(obj.key, str(exc)))
            continue
        if name.startswith((".", "_")) or not (start_exclusive < pid.at <= end_inclusive.at):
            continue
        files.setdefault(pid, []).append(obj)
    return dict(sorted(files.items())), ignored
