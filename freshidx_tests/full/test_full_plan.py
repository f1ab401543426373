"""Pure planning of a full build (:mod:`freshidx.full.full_plan`): from state only when the serving full version
and the delta's segments hold every raw file up to the cutoff and every segment knew what the full version
knows; otherwise raw, with the reason."""

from __future__ import annotations

import datetime as dt
from typing import Any

from freshidx.delta.compaction_plan import merged_segment
from freshidx.delta.segments import Segment
from freshidx.full.full_plan import FullBuildKind, RawReason, ServingFull, plan_full
from freshidx.spark.index_format import FORMAT
from freshidx.store import ObjectInfo
from freshidx.store.partitions import PartitionId
from freshidx_tests.support.harness import at


def seg(minutes: int, full_version: str | None = "F", files: list[str] | None = None) -> Segment:
    return Segment(version=f"d{minutes}", position=at(minutes).at.isoformat(), kind="incremental", shards=[],
                   doc_count=1, covered_count=1, files=files if files is not None else [f"raw/{minutes}"],
                   listed_at=at(minutes).at.isoformat(), full_version=full_version)


def full(cutoff: int = 20, *, version: str = "F", chain: int = 0, bases: tuple[str, ...] = (),
         shards: int = 2) -> ServingFull:
    return ServingFull(version=version, cutoff=at(cutoff).at, listed_at=at(cutoff).at + dt.timedelta(minutes=3),
                       num_shards=shards, format=FORMAT, chain=chain, bases=bases)


def listing(*parts: tuple[int, dt.datetime | None]) -> dict[PartitionId, list[ObjectInfo]]:
    """Raw files by partition (minute, modified at: None = right after the partition)."""
    out: dict[PartitionId, list[ObjectInfo]] = {}
    for minutes, modified in parts:
        when = modified or at(minutes).at + dt.timedelta(seconds=5)
        out.setdefault(at(minutes), []).append(ObjectInfo(f"raw/{minutes}", 10, "e", when))
    return out


def plan(requested: int = 40, *, configured: bool = False, serving: ServingFull | None = None,
         delta_at: int | None = 35, segs: list[Segment] | None = None, files: Any = None,
         raw_every: int = 8, force_raw: bool = False, shards: int = 2) -> Any:
    segs = [seg(25), seg(30), seg(35)] if segs is None else segs
    files = listing(*[(m, None) for m in range(0, 45, 5)]) if files is None else files
    return plan_full(at(requested), configured, full() if serving is None else serving,
                     None if delta_at is None else at(delta_at).at, segs, files, num_shards=shards,
                     index_format=FORMAT, raw_every=raw_every, force_raw=force_raw)


def test_state_build_stops_at_the_delta_position_unless_a_cutoff_is_asked_for() -> None:
    p = plan()
    assert (p.kind, p.cutoff) == (FullBuildKind.STATE, at(35))
    assert [s.version for s in p.segments] == ["d25", "d30", "d35"]
    assert p.inputs(full()) == {"build": "state", "raw_reason": None, "raw_detail": None, "state_chain": 1,
                                "state_bases": ["F"], "base_full_version": "F",
                                "segments_used": ["d25", "d30", "d35"]}
    # Asked for 30: the segments up to 30 hold every file up to it.
    p = plan(30, configured=True)
    assert (p.kind, p.cutoff, [s.version for s in p.segments]) == (FullBuildKind.STATE, at(30), ["d25", "d30"])
    # Asked for 40: partition 40 is in no segment, so every partition is read.
    p = plan(40, configured=True)
    assert (p.kind, p.reason, p.cutoff) == (FullBuildKind.RAW, RawReason.UNCOVERED_FILES, at(40))
    assert p.detail.startswith("raw/40 ")
    assert p.inputs(full())["state_chain"] == 0 and p.inputs(full())["state_bases"] == []


def test_raw_reasons() -> None:
    assert plan(force_raw=True).reason == RawReason.FORCED
    assert plan(raw_every=1).reason == RawReason.FORCED
    assert plan_full(at(40), False, None, at(35).at, [seg(25)], listing(), num_shards=2, index_format=FORMAT,
                     raw_every=8, force_raw=False).reason == RawReason.NO_FULL
    # The safety net: every raw_every-th build in a row reads every raw partition.
    assert plan(serving=full(chain=6), raw_every=8).kind is FullBuildKind.STATE
    assert plan(serving=full(chain=7), raw_every=8).reason == RawReason.SAFETY_NET
    assert plan(shards=3).reason == RawReason.LAYOUT_CHANGED
    assert plan(serving=ServingFull("F", at(20).at, at(21).at, 2, "tantivy-v0", 0, ())).reason == \
        RawReason.LAYOUT_CHANGED
    assert plan_full(at(40), False, full(), at(35).at, None, listing(), num_shards=2, index_format=FORMAT,
                     raw_every=8, force_raw=False).reason == RawReason.DELTA_UNREADABLE
    assert plan(segs=[seg(15), seg(20)], delta_at=20).reason == RawReason.NO_SEGMENTS
    assert plan(delta_at=None, segs=[]).reason == RawReason.NO_SEGMENTS


def test_only_segments_that_knew_what_the_full_version_knows() -> None:
    # Built over another full version (e.g. one published later with late data the segment never saw).
    p = plan(segs=[seg(25), seg(30, full_version="G"), seg(35)])
    assert (p.reason, p.detail) == (RawReason.FOREIGN_SEGMENT, "segment d30 rests on ['G']")
    assert plan(segs=[seg(25, full_version=None), seg(30), seg(35)]).reason == RawReason.FOREIGN_SEGMENT
    # Over the full version this one was built from by state: it knew everything F knows.
    p = plan(serving=full(chain=1, bases=("E",)), segs=[seg(25, full_version="E"), seg(30), seg(35)])
    assert p.kind is FullBuildKind.STATE
    assert p.inputs(full(chain=1, bases=("E",)))["state_bases"] == ["F", "E"]
    # A compaction of segments over E and F holds both; one of an older merge format records none.
    m = merged_segment([seg(25, full_version="E"), seg(30)], version="m", shards=[], doc_count=2,
                       covered_count=2, compacted_at=at(36).at.isoformat())
    assert m.full_version is None
    assert plan(serving=full(chain=1, bases=("E",)), segs=[m, seg(35)]).kind is FullBuildKind.STATE
    assert plan(serving=full(), segs=[m, seg(35)]).reason == RawReason.FOREIGN_SEGMENT
    old = Segment(**{**m.to_dict(), "extra": {"merged": [{"version": "d25"}, {"version": "d30"}]}})
    assert plan(serving=full(chain=1, bases=("E",)), segs=[old, seg(35)]).reason == RawReason.FOREIGN_SEGMENT


def test_every_raw_file_up_to_the_cutoff_is_in_the_full_version_or_a_segment() -> None:
    # A late file of an old partition, written after the full version listed the store and read by no
    # segment: only a raw build reads it.
    late = at(10).at + dt.timedelta(minutes=20)
    files = listing(*[(m, None) for m in range(0, 40, 5)], (10, late))
    assert plan(files=files).reason == RawReason.UNCOVERED_FILES
    # ... unless a micro-batch consumed it.
    files = listing(*[(m, None) for m in range(0, 40, 5)])
    files[at(10)].append(ObjectInfo("raw/10-late", 10, "e", late))
    p = plan(files=files, segs=[seg(25), seg(30, files=["raw/30", "raw/10-late"]), seg(35)])
    assert p.kind is FullBuildKind.STATE
    # A file written again well after the micro-batch that consumed it listed the store (a repair in place).
    files = listing(*[(m, None) for m in range(0, 40, 5)])
    files[at(30)][0] = ObjectInfo("raw/30", 10, "e2", at(30).at + dt.timedelta(minutes=10))
    assert plan(files=files).reason == RawReason.UNCOVERED_FILES
    # A file the full version listed within the clock-skew margin counts as not listed: read again.
    files = listing(*[(m, None) for m in range(0, 40, 5)])
    files[at(20)].append(ObjectInfo("raw/20-b", 10, "e", at(20).at + dt.timedelta(minutes=2, seconds=30)))
    assert plan(files=files).reason == RawReason.UNCOVERED_FILES
