"""Delta segments: what a delta version is made of, and what the next micro-batch reads
(docs/architecture.md#segments-and-kill-lists).

A delta version is *base full cutoff + ordered segments*. Each segment is the index of every ad of
the products one micro-batch touched (or, for a window rebuild, of the whole window) plus its
kill-list; a newer segment's kill-list hides older segments and the full index. A segment's files
live under the version that built it (``indexes/delta/versions/<built-by>/shards/…``) and are
immutable; later versions' manifests list them again (no copying), and garbage collection keeps a
version as long as a kept version references its segment.

Everything here is pure: it decides from manifests and a listing, the build does the I/O.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from freshidx.store import ObjectInfo
from freshidx.store.partitions import PartitionId
from freshidx.store.records import Manifest
from freshidx.store.records import Segment as Segment

#: Manifest key of a segment-built delta version (older delta manifests lack it: window builds).
SEGMENTS_KEY = "segments"
#: Store clocks (S3, NFS) and ours disagree by up to this much; comparisons of a file's modification time
#: with a listing time are shifted by it so that a doubt means "read it again", never "skip it".
CLOCK_SKEW = dt.timedelta(seconds=60)


class BuildKind(StrEnum):
    """How a delta version was built."""

    INCREMENTAL = "incremental"  # one new segment over the earlier ones (reads only what is new)
    REBUILD = "rebuild"  # one segment over the whole window (the fallback)


class RebuildReason(StrEnum):
    """Why a micro-batch fell back to a window rebuild (recorded in the manifest and the ledger)."""

    FORCED = "forced"  # launchpad/CLI asked for it, or FRESHIDX_DELTA_BUILD=window
    NO_DELTA = "no_delta"  # nothing published yet, neither a delta nor a full index
    NOT_SEGMENTED = "not_segmented"  # the serving delta was written by a window build of an older format
    NO_FULL = "no_full"  # no full index: the delta alone covers the window
    FULL_BEHIND_WINDOW = "full_behind_window"  # the full cutoff is older than the window's start (outage)
    SEGMENT_LIMIT = "segment_limit"  # the version would hold more than delta_max_segments segments
    UNREADABLE = "unreadable"  # the serving delta's manifest cannot be read


def segments_of(manifest: Manifest | Mapping[str, Any]) -> list[Segment] | None:
    """The segments of a delta manifest (the record, or its JSON), oldest first; ``None`` for a manifest
    without segments."""
    return Manifest.from_json(manifest).segment_list()


@dataclass(frozen=True)
class FullBase:
    """What the next delta version is based on: the serving full version."""

    version: str
    cutoff: dt.datetime
    listed_at: dt.datetime | None  # files modified after this were not in the full build's listing


@dataclass(frozen=True)
class MicroBatchPlan:
    """What a delta build for partition P does (:func:`plan`)."""

    kind: BuildKind
    reason: str  # why (a RebuildReason for a rebuild; "" for incremental)
    window_start: dt.datetime  # exclusive: what a rebuild reads, and where the listing for late files starts
    kept: tuple[Segment, ...]  # earlier segments the new version keeps (incremental only)
    dropped: int  # earlier segments the full index now covers


def _parse(s: str) -> dt.datetime:
    return dt.datetime.fromisoformat(s)


def plan(
    partition: PartitionId,
    window: dt.timedelta,
    full: FullBase | None,
    previous: Sequence[Segment] | None,
    *,
    has_previous_delta: bool,
    max_segments: int,
    force_rebuild: bool,
) -> MicroBatchPlan:
    """Incremental micro-batch or window rebuild, and which earlier segments survive.

    ``previous``: segments of the serving delta version (``None``: it has none or cannot be read).
    Segments whose position is not after the full cutoff are dropped: the full index holds what they
    consumed (files it did not list are read again, see :func:`files_to_read`). The first delta after
    a full index (no delta published yet) is incremental over the full index's state alone. A rebuild
    is needed when there is no full index to rest on, the serving delta's segment chain cannot be read,
    or the full index is older than the window (an outage longer than the window: restart = jump to
    latest).
    """
    window_start = partition.at - window
    if not has_previous_delta:
        previous = ()  # the first delta rests on the full index alone: the state its build wrote
    rebuild: str | None = None
    if force_rebuild:
        rebuild = RebuildReason.FORCED
    elif full is None:
        rebuild = RebuildReason.NO_FULL if has_previous_delta else RebuildReason.NO_DELTA
    elif previous is None:
        rebuild = RebuildReason.NOT_SEGMENTED
    elif full.cutoff < window_start:
        rebuild = RebuildReason.FULL_BEHIND_WINDOW
    if rebuild is not None or full is None or previous is None:
        return MicroBatchPlan(BuildKind.REBUILD, str(rebuild), window_start, (), len(previous or ()))
    kept = tuple(s for s in previous if _parse(s.position) > full.cutoff)
    if len(kept) + 1 > max_segments:
        return MicroBatchPlan(BuildKind.REBUILD, RebuildReason.SEGMENT_LIMIT, window_start, (), len(previous))
    return MicroBatchPlan(BuildKind.INCREMENTAL, "", window_start, kept, len(previous) - len(kept))


def segment_shard_count(input_bytes: int, *, max_shards: int, shard_mb: float) -> int:
    """How many shards (tasks) an incremental segment gets: one per ``shard_mb`` MiB of raw input, at least
    one and at most ``max_shards`` (``shard_mb`` 0: always ``max_shards``). A small batch in one task pays
    no shuffle of its copies and opens no extra searcher per kept segment; a batch of tens of thousands of
    changes re-indexes and reads enough to keep several cores busy."""
    if shard_mb <= 0:
        return max_shards
    return max(1, min(max_shards, math.ceil(input_bytes / (shard_mb * 2**20))))


def files_to_read(
    files: Mapping[PartitionId, Iterable[ObjectInfo]],
    full: FullBase,
    kept: Sequence[Segment],
) -> dict[PartitionId, list[ObjectInfo]]:
    """Of the files listed in the window, those an incremental micro-batch must read.

    A file is read unless a kept segment consumed it or the full index holds it. The full index holds
    a file of a partition up to its cutoff that was there when it listed the store; a file newer than
    the first kept segment's listing was not in the state that segment was built from, so it is read
    even if the full index listed it (else that segment's older copy would keep hiding it). So every
    new partition (watermark, P] is read, and so is every late file, whatever its partition time.
    """
    consumed = {k for s in kept for k in s.files}
    since = _parse(kept[0].listed_at) if kept else None
    out: dict[PartitionId, list[ObjectInfo]] = {}
    for pid, objs in files.items():
        for o in objs:
            if o.key in consumed:
                continue
            in_full = (pid.at <= full.cutoff and full.listed_at is not None
                       and o.last_modified < full.listed_at - CLOCK_SKEW)
            if in_full and (since is None or o.last_modified < since - CLOCK_SKEW):
                continue
            out.setdefault(pid, []).append(o)
    return out
