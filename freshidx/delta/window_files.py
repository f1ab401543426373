"""Every raw data file of a delta micro-batch's window (docs/architecture.md#listing-costs-what-is-recent).

The delta reads the partitions of ``(window start, newest]``: one listing per hour of the window, names that
do not parse set aside as :class:`~freshidx.trigger.listing.Ignored` (the trigger's record of them), never turned
into a path of ours. Which of these files a micro-batch then reads is :func:`freshidx.delta.segments.files_to_read`.
"""

from __future__ import annotations

import datetime as dt

from freshidx.store import ObjectInfo, ObjectStore, layout
from freshidx.store.partitions import PartitionError, PartitionId
from freshidx.trigger.listing import Ignored


def files_in_window(
    store: ObjectStore, source: str, start_exclusive: dt.datetime, end_inclusive: PartitionId
) -> tuple[dict[PartitionId, list[ObjectInfo]], list[Ignored]]:
    """Every data file of partitions in ``(start_exclusive, end_inclusive]``: one listing per hour."""
    files: dict[PartitionId, list[ObjectInfo]] = {}
    ignored: list[Ignored] = []
    root = layout.raw_root(source)
    first = start_exclusive + dt.timedelta(minutes=1)
    cur = first.replace(minute=0, second=0, microsecond=0)
    while cur <= end_inclusive.at:
        hour_prefix = layout.raw_hour_prefix(source, PartitionId(cur).hour_path)
        for obj in store.iter_objects(hour_prefix):
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
        cur += dt.timedelta(hours=1)
    return dict(sorted(files.items())), ignored
