"""Garbage collection's plan (:func:`freshidx.publish.gc_plan.plan_gc`): pure, over a hand-made survey."""

from __future__ import annotations

import datetime as dt

import pytest

from freshidx.publish.commit import Pointer, iso
from freshidx.publish.gc_plan import GcSurvey, VersionListing, plan_gc
from freshidx.store import ObjectInfo, layout

T0 = dt.datetime(2026, 11, 21, 12, 0, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)
NOW = T0 + 10 * HOUR


def entry(version: str, seq: int, published: dt.datetime) -> Pointer:
    return Pointer(index="delta", version=version, seq=seq, position=iso(published), manifest="m", doc_count=1,
                   published_at=iso(published))


def obj(key: str, modified: dt.datetime, size: int = 10) -> ObjectInfo:
    return ObjectInfo(key=key, size=size, etag="-", last_modified=modified)


def listing(version: str, modified: dt.datetime, *, manifest: bool = True, orphan: int | None = None,
            empty: bool = False) -> VersionListing:
    """A version with one shard (attempt 0), its manifest listing it, and optionally an attempt orphan."""
    prefix = layout.version_prefix("delta", version)
    shard = layout.shard_prefix("delta", version, 0, 0) + "docs.parquet"
    objects = [obj(shard, modified)]
    if orphan is not None:
        objects.append(obj(layout.shard_prefix("delta", version, 0, orphan) + "docs.parquet", modified))
    body = {"shards": [{"shard": 0, "attempt": 0, "files": [{"key": shard}]}]}
    if manifest:
        objects.append(obj(layout.manifest_key("delta", version), modified))
    return VersionListing(version, prefix, () if empty else tuple(objects), body if manifest and not empty else None)


def survey(*versions: VersionListing, segments: dict[str, tuple[str, ...]] | None = None) -> GcSurvey:
    # v5 serves (seq 5); v1..v4 published before it, an hour apart, all long ago.
    entries = tuple(entry(f"v{n}", n, T0 + n * HOUR) for n in range(5, 0, -1))
    return GcSurvey("delta", entries, segments or {}, tuple(versions))


def test_keeps_the_current_and_the_last_n_and_deletes_the_rest_and_staged_leftovers() -> None:
    s = survey(*(listing(f"v{n}", T0 + n * HOUR) for n in range(1, 6)),
               listing("v9-staged", T0, manifest=False))
    plan = plan_gc(s, keep_last=2, grace=HOUR, now=NOW)
    rules = {d.version: (d.action, d.rule) for d in plan.decisions}
    assert plan.current == "v5" and plan.kept == ("v5", "v4")
    assert rules == {"v5": ("keep", "current"), "v4": ("keep", "last"), "v3": ("delete", "expired"),
                     "v2": ("delete", "expired"), "v1": ("delete", "expired"), "v9-staged": ("delete", "abandoned")}
    report = plan.report(dry_run=True)
    assert report.deleted_versions == ["v1", "v2", "v3", "v9-staged"] and report.young == []
    assert report.deleted_objects == 3 * 2 + 1 and report.deleted_bytes == 10 * report.deleted_objects
    assert "no manifest" in next(d.why for d in plan.decisions if d.version == "v9-staged")


def test_keeps_what_is_younger_than_the_grace() -> None:
    # v1 was modified long ago but replaced no earlier than v4's publication (the oldest kept entry).
    s = survey(listing("v1", T0), listing("v5", T0 + 5 * HOUR), listing("v8-staged", NOW - HOUR / 2, manifest=False),
               listing("v7-staged", NOW - 8 * HOUR, manifest=False))  # staged: aged from its files alone
    young = plan_gc(s, keep_last=2, grace=7 * HOUR, now=NOW)  # v4 published at T0+4h: 6h ago
    assert {d.version: d.rule for d in young.decisions} == {
        "v1": "young", "v5": "current", "v8-staged": "young", "v7-staged": "abandoned"}
    assert young.report(dry_run=False).young == ["v1", "v8-staged"]
    old = plan_gc(s, keep_last=2, grace=5 * HOUR, now=NOW)
    assert [d.version for d in old.decisions if d.action == "delete"] == ["v1", "v7-staged"]


def test_a_version_whose_segment_a_kept_version_serves_is_kept() -> None:
    s = survey(listing("v2", T0), listing("v3", T0), listing("v5", T0), segments={"v5": ("v2", "v5")})
    plan = plan_gc(s, keep_last=1, grace=HOUR, now=NOW)
    assert {d.version: (d.action, d.rule) for d in plan.decisions} == {
        "v2": ("keep", "segment"), "v3": ("delete", "expired"), "v5": ("keep", "current")}


def test_attempt_orphans_of_kept_versions_go_and_listed_files_stay() -> None:
    s = survey(listing("v5", T0, orphan=3), listing("v4", NOW, orphan=1), listing("v1", T0, orphan=2))
    plan = plan_gc(s, keep_last=2, grace=HOUR, now=NOW)
    report = plan.report(dry_run=False)
    # v5's orphan is old: deleted; v4's is inside the grace: kept; v1's goes with its version.
    assert report.deleted_orphans == [layout.shard_prefix("delta", "v5", 0, 3)]
    assert report.deleted_versions == ["v1"] and report.deleted_objects == 1 + 3
    assert any(line.startswith("delete orphan ") for line in plan.describe())


def test_empty_directories_are_pruned_unless_kept_and_keep_last_is_checked() -> None:
    s = survey(listing("v0", T0, empty=True), listing("v5", T0, empty=True))
    plan = plan_gc(s, keep_last=1, grace=HOUR, now=NOW)
    assert [(d.version, d.action) for d in plan.decisions] == [("v0", "prune"), ("v5", "keep")]
    assert plan.report(dry_run=False).deleted_versions == []
    with pytest.raises(ValueError):
        plan_gc(s, keep_last=0, grace=HOUR, now=NOW)
