"""How the next full version is built: from the published state, or from every raw partition
(docs/architecture.md#full-index-from-state).

A full version at cutoff C holds the latest record per ad over every raw file up to C. The serving full
version F already holds that for its own inputs, and the serving delta's segments hold the latest rows of
every ad that changed after it (each segment's rows are the newest its micro-batch knew over F and the
segments before it). So when every raw file up to C is in F or was consumed by a segment at or before C,
the new version is F with those segments' rows laid over it, built per product bucket (F's shards: one
product lives in one shard) by a task that reads its own bucket's files; only the change travels between
tasks (:mod:`freshidx.full.executor`). No raw file is read again.

That holds only if every used segment's rows beat F's for its ads. A segment built over F does; one built
over the full version F rests on (F itself built from state, with nothing read besides that version and
segments built before this one) does too: it knew everything F knows. Anything else (a file no segment
consumed, a segment over an unrelated full version, changed shard count or format, the serving delta
unreadable) makes the build read every raw partition, with the reason recorded; so does every
``full_raw_every``-th build in a row, the safety net against anything the chain of state builds could carry
forward.

Pure: manifests, segments and a listing in, a decision out.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from freshidx.delta.compaction_plan import constituents
from freshidx.delta.segments import CLOCK_SKEW, FullBase, Segment
from freshidx.store import ObjectInfo
from freshidx.store.partitions import PartitionId
from freshidx.store.records import Manifest

#: Manifest ``inputs`` keys a full version records about how it was built.
BUILD_KEY = "build"
CHAIN_KEY = "state_chain"  # full versions built from state in a row ending with this one (0: raw)
BASES_KEY = "state_bases"  # earlier full versions this one holds everything of (state builds in a row)


class FullBuildKind(StrEnum):
    STATE = "state"  # the serving full version + the serving delta's segments, per product bucket
    RAW = "raw"  # every raw partition up to the cutoff, parsed again


class RawReason(StrEnum):
    """Why a full build reads every raw partition (recorded in the manifest)."""

    FORCED = "forced"  # launchpad `from_raw`, or full_raw_every = 1
    NO_FULL = "no_full"  # nothing published yet
    SAFETY_NET = "safety_net"  # full_raw_every - 1 state builds in a row
    LAYOUT_CHANGED = "layout_changed"  # full_shards or the index format differ from the serving version's
    NO_SEGMENTS = "no_segments"  # the serving delta has no segment at or before the cutoff after the full's
    DELTA_UNREADABLE = "delta_unreadable"  # no segmented delta manifest to read
    FOREIGN_SEGMENT = "foreign_segment"  # a segment rests on a full version this one does not hold whole
    UNCOVERED_FILES = "uncovered_files"  # a raw file up to the cutoff is in neither the full nor a segment


@dataclass(frozen=True)
class ServingFull:
    """The serving full version as the planner needs it (from its pointer and manifest)."""

    version: str
    cutoff: dt.datetime
    listed_at: dt.datetime | None
    num_shards: int
    format: str | None
    chain: int  # state builds in a row ending with it (0: it was built from raw)
    bases: tuple[str, ...]  # full versions it holds everything of

    @classmethod
    def from_manifest(cls, base: FullBase, manifest: Manifest) -> ServingFull:
        return cls(version=base.version, cutoff=base.cutoff, listed_at=base.listed_at,
                   num_shards=manifest.num_shards or len(manifest.shards), format=manifest.index_format,
                   chain=manifest.state_chain, bases=manifest.state_bases)


@dataclass(frozen=True)
class FullPlan:
    kind: FullBuildKind
    reason: str  # a RawReason for a raw build ("" for a state build)
    cutoff: PartitionId
    segments: tuple[Segment, ...] = ()  # the segments laid over the serving full version (state builds)
    detail: str = ""  # what made the build raw, in words (e.g. the first uncovered file)

    def inputs(self, full: ServingFull | None) -> dict[str, Any]:
        """What the manifest's ``inputs`` record about the build."""
        out: dict[str, Any] = {BUILD_KEY: str(self.kind), "raw_reason": self.reason or None,
                               "raw_detail": self.detail or None, CHAIN_KEY: 0, BASES_KEY: []}
        if self.kind is FullBuildKind.STATE and full is not None:
            out.update({CHAIN_KEY: full.chain + 1, BASES_KEY: [full.version, *full.bases],
                        "base_full_version": full.version, "segments_used": [s.version for s in self.segments]})
        return out


def plan_full(
    requested: PartitionId,
    configured: bool,
    full: ServingFull | None,
    delta_position: dt.datetime | None,
    segments: Sequence[Segment] | None,
    listing: Mapping[PartitionId, Sequence[ObjectInfo]],
    *,
    num_shards: int,
    index_format: str,
    raw_every: int,
    force_raw: bool,
) -> FullPlan:
    """State build or raw build, and at which cutoff.

    ``requested``: the configured cutoff, or the newest visible partition (``configured`` False). An
    unconfigured state build stops at the serving delta's position when that is older: the full index
    then holds exactly what the delta consumed, and the newer partitions stay the delta's (no raw read).
    ``segments``: the serving delta's (``None``: not segmented or unreadable); ``listing``: every raw file
    up to ``requested`` by partition.
    """
    def raw(reason: RawReason, detail: str = "") -> FullPlan:
        return FullPlan(FullBuildKind.RAW, str(reason), requested, (), detail)

    if force_raw or raw_every <= 1:
        return raw(RawReason.FORCED)
    if full is None:
        return raw(RawReason.NO_FULL)
    if full.chain + 1 >= raw_every:
        return raw(RawReason.SAFETY_NET, f"{full.chain} state builds in a row (full_raw_every={raw_every})")
    if full.num_shards != num_shards or full.format != index_format:
        return raw(RawReason.LAYOUT_CHANGED, f"serving: {full.num_shards} shards, format {full.format}; "
                                             f"now: {num_shards} shards, format {index_format}")
    if segments is None:
        return raw(RawReason.DELTA_UNREADABLE)
    cutoff = requested
    if not configured and delta_position is not None and full.cutoff < delta_position < requested.at:
        cutoff = PartitionId(delta_position)
    used = tuple(s for s in segments if full.cutoff < dt.datetime.fromisoformat(s.position) <= cutoff.at)
    if not used:
        return raw(RawReason.NO_SEGMENTS)
    held = {full.version, *full.bases}
    for s in used:
        bases = {c.full_version for c in constituents(s)}
        if not bases <= held:
            return raw(RawReason.FOREIGN_SEGMENT, f"segment {s.version} rests on {sorted(map(str, bases))}")
    uncovered = _first_uncovered(full, used, cutoff, listing)
    if uncovered is not None:
        return raw(RawReason.UNCOVERED_FILES, f"{uncovered.key} (modified {uncovered.last_modified.isoformat()})")
    return FullPlan(FullBuildKind.STATE, "", cutoff, used)


def _first_uncovered(full: ServingFull, used: Sequence[Segment], cutoff: PartitionId,
                     listing: Mapping[PartitionId, Sequence[ObjectInfo]]) -> ObjectInfo | None:
    """The first raw file up to ``cutoff`` that neither ``full`` nor a segment of ``used`` holds, if any."""
    # Each consumed file with the latest time it can have been listed (a compacted segment: its newest
    # original's listing): a file written again clearly after that (a repair in place) holds records no
    # segment read.
    consumed: dict[str, dt.datetime] = {}
    for s in used:
        listed = max(dt.datetime.fromisoformat(c.listed_at or s.listed_at) for c in constituents(s))
        for k in s.files:
            consumed[k] = max(listed, consumed.get(k, listed))
    for pid, objs in listing.items():
        if pid > cutoff:
            continue
        for o in objs:
            in_full = (pid.at <= full.cutoff and full.listed_at is not None
                       and o.last_modified < full.listed_at - CLOCK_SKEW)
            read_at = consumed.get(o.key)
            in_segment = read_at is not None and o.last_modified <= read_at + CLOCK_SKEW
            if not in_full and not in_segment:
                return o
    return None
