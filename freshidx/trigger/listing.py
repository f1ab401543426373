"""Discovering upstream partitions without listing history (docs/architecture.md#listing-costs-what-is-recent).

Keys are ``raw/<source>/year=YYYY/month=MM/day=DD/hour=HH/minute=mm/<file>``; zero padding makes
key order chronological. Two bounded operations:

* :func:`newest_partition` walks down the hierarchy with delimiter listings, taking the largest
  valid segment at each level (≈5 LIST calls, whatever the history size).
* :func:`partitions_after` lists with ``StartAfter`` just past the watermark partition, never
  further back than ``max_scan_hours`` before the newest partition. The cost is proportional to
  what is new, not to what exists.

Names that do not parse are returned as :class:`Ignored` with a reason and are never turned into
a path of ours.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from freshidx.store import ObjectInfo, ObjectStore, layout
from freshidx.store.partitions import SEGMENT_NAMES, PartitionError, PartitionId, parse_segment


@dataclass(frozen=True)
class Ignored:
    key: str
    reason: str


@dataclass
class Listing:
    """What a listing found after the watermark, oldest first."""

    partitions: list[PartitionId] = field(default_factory=list)
    files: dict[PartitionId, list[ObjectInfo]] = field(default_factory=dict)
    ignored: list[Ignored] = field(default_factory=list)
    unlisted_before: PartitionId | None = None  # gap start when the watermark was too far behind
    list_calls: int = 0

    @property
    def newest(self) -> PartitionId | None:
        return self.partitions[-1] if self.partitions else None


def _start_after(prefix_without_slash: str) -> str:
    # "…/minute=15" + "0" sorts after every key under "…/minute=15/" ('/' < '0') and before
    # "…/minute=16/": the first key strictly after that partition.
    return prefix_without_slash + "0"


def newest_partition(store: ObjectStore, source: str) -> tuple[PartitionId | None, list[Ignored]]:
    """The newest partition that has at least one object, found with a bounded descent."""
    ignored: list[Ignored] = []
    root = layout.raw_root(source)

    def descend(prefix: str, depth: int) -> PartitionId | None:
        name = SEGMENT_NAMES[depth]
        page = store.list(prefix, delimiter="/")
        candidates: list[tuple[int, str]] = []
        for p in page.prefixes:
            seg = p[len(prefix):].rstrip("/")
            try:
                candidates.append((parse_segment(seg, name), p))
            except PartitionError as exc:
                ignored.append(Ignored(p, str(exc)))
        if depth == len(SEGMENT_NAMES) - 1:
            # minute level: the partition must hold at least one object
            for _, p in sorted(candidates, reverse=True):
                try:
                    pid = PartitionId.parse(p[len(root):])
                except PartitionError as exc:
                    ignored.append(Ignored(p, str(exc)))
                    continue
                direct = store.list(p, delimiter="/").objects  # nested dirs are not data files
                if any(not o.key.rpartition("/")[2].startswith((".", "_")) for o in direct):
                    return pid
            return None
        for _, p in sorted(candidates, reverse=True):
            found = descend(p, depth + 1)
            if found is not None:
                return found
        return None

    return descend(root, 0), ignored


def partitions_after(
    store: ObjectStore,
    source: str,
    watermark: PartitionId | None,
    *,
    max_scan_hours: int,
    newest: PartitionId | None = None,
) -> Listing:
    """Partitions strictly newer than ``watermark`` with their files, oldest first.

    Without a watermark, or when it is more than ``max_scan_hours`` behind the newest partition,
    only the last ``max_scan_hours`` hours are listed and ``unlisted_before`` says where listing
    started, so the gap can be recorded. The caller processes only the newest (restart = jump to
    latest) and records the others as superseded.
    """
    calls_before = store.stats.list_calls
    out = Listing()
    if newest is None:
        newest, ignored = newest_partition(store, source)
        out.ignored.extend(ignored)
    if newest is None or (watermark is not None and newest <= watermark):
        out.list_calls = store.stats.list_calls - calls_before
        return out
    root = layout.raw_root(source)
    floor = PartitionId(newest.hour_start - dt.timedelta(hours=max_scan_hours - 1))
    if watermark is None or watermark < floor:
        # No watermark (first start, reset) or too far behind: list only the last `max_scan_hours`
        # hours; anything older is recorded as one gap, never listed.
        out.unlisted_before = floor
        # "…/hour=HH" (no slash) sorts just before every key of that hour
        start_after = layout.raw_hour_prefix(source, floor.hour_path)[:-1]
        lower = PartitionId(floor.at - dt.timedelta(minutes=1))
    else:
        start_after = _start_after(layout.raw_partition_prefix(source, watermark).rstrip("/"))
        lower = watermark
    for obj in store.iter_objects(root, start_after=start_after):
        rel = obj.key[len(root):]
        part_path, _, name = rel.rpartition("/")
        try:
            pid = PartitionId.parse(part_path)
        except PartitionError as exc:
            out.ignored.append(Ignored(obj.key, str(exc)))
            continue
        if lower is not None and pid <= lower:
            continue
        if name.startswith((".", "_")):
            continue  # hidden/temporary upstream files and markers are not data
        out.files.setdefault(pid, []).append(obj)
    out.partitions = sorted(out.files)
    out.list_calls = store.stats.list_calls - calls_before
    return out
