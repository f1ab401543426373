"""Background compaction of delta segments (docs/architecture.md#compaction; :mod:`freshidx.delta.compaction_plan`).

Pure planning and splicing first; then one Spark scenario through the real assets and the serving
library: micro-batches, a compaction that loses its compare-and-swap to a micro-batch and republishes
its merged segment over it, a compaction requested by the sensor, a micro-batch that loses to a
compaction and appends its segment to the compacted version. After each step search answers equal a
brute-force oracle over every record written, and at the end a from-scratch rebuild of the same files.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from freshidx.defs.shared.publishing_io_manager import Publication, PublishingIOManager
from freshidx.delta import compaction_plan
from freshidx.delta import compaction_run as cd
from freshidx.delta.compaction_run import PIPELINE, compact_delta
from freshidx.delta.segments import Segment, files_to_read, segments_of
from freshidx.publish import retention
from freshidx.publish.commit import DraftManifest, publish, read_manifest, read_pointer
from freshidx.serve.searcher import Searcher
from freshidx.settings import Settings
from freshidx.spark.shards import ShardCommit, ShardFile
from freshidx.store import ObjectInfo, ObjectStore, StoreConfig, layout, open_store
from freshidx.trigger import ledger
from freshidx_tests.delta.test_incremental_equivalence import (
    FULL,
    WORDS,
    _batch,
    _write,
    expected,
    rebuilt_answers,
    served,
)
from freshidx_tests.publish.test_publish import _segmented
from freshidx_tests.support.harness import Harness, at

WINDOW = 120  # the rebuilt reference (test_incremental_equivalence.rebuilt_answers) uses the same window


def seg(n: int, docs: int = 10, *, listed: int | None = None) -> Segment:
    return Segment(version=f"v{n}", position=at(n).at.isoformat(), kind="incremental",
                   shards=[{"shard": 0, "files": [{"key": f"k{n}/docs.parquet"}, {"key": f"k{n}/covered.parquet"}]}],
                   doc_count=docs, covered_count=docs, files=[f"f{n}"],
                   listed_at=at(listed if listed is not None else n).at.isoformat())


# --------------------------------------------------------------------------------------------- pure


def test_plan_merges_the_smallest_consecutive_run_down_to_half_the_limit() -> None:
    segs = [seg(0, 500), *(seg(n, 10) for n in range(5, 45, 5)), seg(45, 3)]  # 10 segments
    assert compaction_plan.plan_compaction(segs[:8], max_segments=8, full_cutoff=None) is None
    plan = compaction_plan.plan_compaction(segs, max_segments=8, full_cutoff=None)
    assert plan is not None
    # 10 -> 4 (= 8 // 2): a run of 7; the big window-rebuild segment first stays alone.
    assert (plan.start, plan.end, plan.segments_after) == (3, 9, 4), plan.describe()
    assert plan.versions == [f"v{n}" for n in range(15, 50, 5)]
    plan = compaction_plan.plan_compaction(segs, max_segments=8, full_cutoff=None, target=8)
    assert plan is not None and len(plan.run) == 3 and plan.segments_after == 8


def test_plan_ignores_segments_the_full_index_covers() -> None:
    segs = [seg(n) for n in range(0, 50, 5)]  # 10 segments at 0..45
    cutoff = at(20).at  # 0..20 are dropped by the next micro-batch: 5 left, within 8
    assert not compaction_plan.needs_compaction(segs, 8, cutoff)
    assert compaction_plan.plan_compaction(segs, max_segments=8, full_cutoff=cutoff) is None
    plan = compaction_plan.plan_compaction(segs, max_segments=4, full_cutoff=cutoff)
    assert plan is not None and plan.start >= 5 and all(s.position > cutoff.isoformat() for s in plan.run)


def test_merged_segment_replaces_the_run_in_place() -> None:
    segs = [seg(0), seg(5, listed=9), seg(10, listed=4), seg(15)]
    plan = compaction_plan.plan_compaction(segs, max_segments=3, full_cutoff=None, target=3)
    assert plan is not None and plan.versions == ["v0", "v5"]
    run = [segs[1], segs[2]]
    m = compaction_plan.merged_segment(run, version="m", shards=[], doc_count=7, covered_count=9, compacted_at="now")
    assert m.position == segs[2].position  # the newest partition it holds
    assert m.listed_at == segs[2].listed_at  # the earliest listing: late files are read again, never skipped
    assert m.files == ["f5", "f10"]
    assert [c["version"] for c in compaction_plan.constituents(m)] == ["v5", "v10"]
    spliced = compaction_plan.splice(segs, ["v5", "v10"], m)
    assert spliced is not None and [s.version for s in spliced] == ["v0", "m", "v15"]
    assert compaction_plan.original_versions(spliced) == ["v0", "v5", "v10", "v15"]
    # A newer micro-batch appended: still spliceable. The run broken up or gone: not.
    assert compaction_plan.splice([*segs, seg(20)], ["v5", "v10"], m) is not None
    assert compaction_plan.splice([segs[0], segs[2], segs[3]], ["v5", "v10"], m) is None
    assert compaction_plan.splice([seg(30)], ["v5", "v10"], m) is None
    # A merged segment of merged segments lists the originals.
    m2 = compaction_plan.merged_segment([segs[0], m], version="m2", shards=[], doc_count=1, covered_count=1,
                                   compacted_at="now")
    assert [c["version"] for c in compaction_plan.constituents(m2)] == ["v0", "v5", "v10"]


def test_a_merged_segment_rests_on_a_full_version_only_if_its_whole_run_does() -> None:
    # (the segment task then reads no full-version row of an ad the merged segment holds: state_lookup)
    on_f1 = [dataclasses.replace(seg(n), full_version="f1") for n in (5, 10)]

    def merged(run: list[Segment]) -> Segment:
        return compaction_plan.merged_segment(run, version="m", shards=[], doc_count=1, covered_count=1,
                                              compacted_at="x")

    assert merged(on_f1).full_version == "f1"
    assert merged([seg(0), *on_f1]).full_version is None  # seg(0): written before the field, or over none
    assert merged([on_f1[0], dataclasses.replace(seg(15), full_version="f2")]).full_version is None
    assert Segment.from_dict(merged(on_f1).to_dict()).full_version == "f1"
    assert Segment.from_dict({k: v for k, v in seg(0).to_dict().items() if k != "full_version"}).full_version is None


def test_files_to_read_is_unchanged_by_a_compaction_of_the_kept_segments() -> None:
    """The next micro-batch reads exactly the same files over the compacted version."""
    from freshidx.delta.segments import FullBase

    segs = [seg(10, listed=12), seg(15), seg(20)]
    m = compaction_plan.merged_segment(segs[:2], version="m", shards=[], doc_count=1, covered_count=1, compacted_at="x")
    compacted = compaction_plan.splice(segs, ["v10", "v15"], m)
    assert compacted is not None
    full = FullBase("f", at(5).at, at(6).at)
    t = at(0).at
    listing = {at(n): [ObjectInfo(key=f"f{n}", size=1, etag="e", last_modified=t + dt.timedelta(minutes=m_))]
               for n, m_ in ((0, 1), (10, 11), (15, 16), (20, 21), (25, 26), (3, 30))}
    assert files_to_read(listing, full, compacted) == files_to_read(listing, full, segs)


def test_rebase_a_micro_batch_onto_a_compaction_of_its_base() -> None:
    segs = [seg(10), seg(15), seg(20)]
    m = compaction_plan.merged_segment(segs[:2], version="m", shards=[], doc_count=1, covered_count=1, compacted_at="x")
    compacted = compaction_plan.splice(segs, ["v10", "v15"], m)
    assert compacted is not None
    new = seg(25)
    rebased = compaction_plan.rebase_after_compaction([*segs, new], "v25", compacted, None)
    assert rebased is not None and [s.version for s in rebased] == ["m", "v20", "v25"]
    # The micro-batch dropped v10 (a full index at 12): the merged segment mixes covered and uncovered.
    assert compaction_plan.rebase_after_compaction([segs[1], segs[2], new], "v25", compacted, at(12).at) is None
    # Anything else serving (another micro-batch's segment): never rebased, the next attempt builds on it.
    other = [*segs, seg(22)]
    assert compaction_plan.rebase_after_compaction([*segs, new], "v25", other, None) is None


# ------------------------------------------------------------- publication races, without Spark


def _fake_merge(store: ObjectStore) -> Any:
    """Stands in for the Spark step: stages one shard with the files the gate requires."""
    def write(_spark: Any, _cfg: Any, inputs: list[Any], *, index: str, version: str, num_shards: int,
              written: Any = None) -> list[Any]:
        files = []
        for name in ("index/meta.json", "docs.parquet", "covered.parquet"):
            key = layout.shard_prefix(index, version, 0, 0) + name
            store.put(key, b"{}")
            files.append(ShardFile(key=key, bytes=2, sha256="-", rows=1))
        return [ShardCommit(shard=0, attempt=0, doc_count=4, covered_count=6, files=tuple(files))]
    return write


def three_segments_published(store: ObjectStore, monkeypatch: pytest.MonkeyPatch
                             ) -> tuple[DraftManifest, DraftManifest, DraftManifest]:
    """Three incremental versions a, b, c published (c serves 3 segments), the merge step faked."""
    monkeypatch.setattr(cd, "write_merged_segment", _fake_merge(store))
    a = _segmented(store, 0, None)
    b = _segmented(store, 5, a)
    c = _segmented(store, 10, b)
    for d in (a, b, c):
        assert publish(store, d).outcome == "published"
    return a, b, c


@pytest.mark.parametrize("meanwhile", ["micro_batch", "rebuild", "compaction"])
def test_compaction_retries_over_a_micro_batch_or_gives_up(store_config: StoreConfig, meanwhile: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A micro-batch that extends the compacted version: M is republished over it (no rebuild). A window
    rebuild or another compaction that replaced the run: the compaction gives up, recorded. Nothing is
    lost either way. On the local store and on the moto S3 server (conditional writes)."""
    store = open_store(store_config)
    a, b, c = three_segments_published(store, monkeypatch)
    later: list[DraftManifest] = []
    settings = Settings.from_env({}, store=store_config.uri, delta_compact_segments=2)

    def publish_meanwhile(attempt: int) -> None:
        if attempt == 1 and meanwhile == "compaction":
            other = cd.compact_delta(None, store, store_config, settings, run_id="r-other")  # type: ignore[arg-type]
            assert other.outcome == "published", other
        elif attempt == 1:
            d = _segmented(store, 15, c if meanwhile == "micro_batch" else None)
            assert publish(store, d).outcome == "published"
            later.append(d)

    result = cd.compact_delta(None, store, store_config, settings, run_id="r-" + meanwhile,  # type: ignore[arg-type]
                              before_publish=publish_meanwhile)
    pointer, _ = read_pointer(store, "delta")
    assert pointer is not None
    segs = segments_of(read_manifest(store, "delta", pointer.version))
    assert segs is not None
    if meanwhile == "micro_batch":
        assert (result.outcome, result.attempts, pointer.version) == ("published", 2, result.version), result
        assert [s.version for s in segs][1:] == [later[0].version] and segs[0].kind == compaction_plan.MERGED_KIND
        assert compaction_plan.original_versions(segs) == [a.version, b.version, c.version, later[0].version]
        assert (pointer.position, pointer.source_partition) == (later[0].position, later[0].source_partition)
        # M's files stay under the version that built them (whose own manifest was refused): garbage
        # collection keeps them while a kept version serves M, and drops the merged segments' versions.
        report = retention.gc(store, "delta", keep_last=1, grace=dt.timedelta(0))
        assert retention.missing_files(store, "delta", pointer.version) == []
        assert {a.version, b.version, c.version} <= set(report.deleted_versions), report
    elif meanwhile == "rebuild":
        assert result.outcome == "gave_up" and "no longer holds" in result.reason, result
        assert pointer.version == later[0].version and [s.version for s in segs] == [later[0].version]
    else:
        assert result.outcome == "gave_up" and "no longer holds" in result.reason, result
        assert compaction_plan.original_versions(segs) == [a.version, b.version, c.version]
    (entry,) = [e for e in ledger.read(store, PIPELINE) if e["run_id"] == "r-" + meanwhile]
    assert entry["decision"] == ("published" if meanwhile == "micro_batch" else "refused")
    assert entry["extra"]["merged"] == [a.version, b.version, c.version]


def test_micro_batch_that_loses_to_a_compaction_appends_to_it(store_config: StoreConfig,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(store_config)
    a, b, c = three_segments_published(store, monkeypatch)
    micro = _segmented(store, 15, c)  # built on c while the compaction of c runs
    settings = Settings.from_env({}, store=store_config.uri, delta_compact_segments=2)
    done = cd.compact_delta(None, store, store_config, settings, run_id="r")  # type: ignore[arg-type]
    assert done.outcome == "published"
    result = publish(store, micro, rebase=cd.rebase_onto_compaction)  # what the delta hands publication
    assert result.outcome == "published" and "rebased" in result.reason, result
    manifest = read_manifest(store, "delta", micro.version)
    assert [s["version"] for s in manifest["segments"]] == [done.version, micro.version]
    assert manifest["inputs"]["based_on"] == done.version and manifest["inputs"]["rebased_from"] == c.version
    assert manifest["doc_count"] == sum(s["doc_count"] for s in manifest["segments"])
    # The result carries the draft publish() wrote (the rebased one), not the caller's.
    assert result.draft is not None and result.draft.to_dict() == manifest and result.draft is not micro
    segs = segments_of(manifest)
    assert segs is not None
    assert compaction_plan.original_versions(segs) == [a.version, b.version, c.version, micro.version]


def test_job_with_nothing_to_compact_records_no_materialization(make_harness: Any) -> None:
    h = make_harness()
    assert not h.tick("delta_compaction_sensor").run_requests
    result = h.defs.resolve_job_def("delta_compaction_job").execute_in_process(instance=h.instance)
    assert result.success
    assert not result.asset_materializations_for_node("delta_compaction")
    (obs,) = result.asset_observations_for_node("delta_compaction")
    assert obs.metadata["outcome"].value == "nothing_to_do"


# --------------------------------------------------------------------------------------------- Spark


def _micro_batch(h: Harness) -> dg.ExecuteInProcessResult:
    reqs = h.tick().run_requests
    assert len(reqs) == 1, "the sensor must request one delta run for the newest partition"
    result = h.run(reqs[0])
    assert result.success
    return result


def _serving(h: Harness) -> tuple[str, list[Segment]]:
    pointer, _ = read_pointer(h.store, "delta")
    assert pointer is not None
    segs = segments_of(read_manifest(h.store, "delta", pointer.version))
    assert segs is not None
    return pointer.version, segs


class _World:
    """Writes partitions and knows what search must answer."""

    def __init__(self, h: Harness, s: Searcher) -> None:
        self.h, self.s, self.rng, self.sent, self.minute = h, s, random.Random(21), [], 0

    def write(self) -> None:
        b = _batch(self.rng, self.minute, self.sent, 25)
        self.sent += b
        _write(self.h, self.minute, b)
        self.minute += 5

    def check(self, what: str) -> dict[str, set[str]]:
        got = served(self.s)
        want = {w: expected(self.sent, w) for w in WORDS}
        wrong = {w: (got[w], want[w]) for w in WORDS if got[w] != want[w]}
        assert not wrong, f"{what}: (served, expected) {wrong}"
        return got


def test_compaction_keeps_answers_and_never_loses_a_segment(tmp_path: Path, spark: Any,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = StoreConfig(uri=(tmp_path / "store").as_uri())
    with dg.instance_for_test() as instance:
        h = Harness(cfg, instance, window_minutes=WINDOW, full_max_age_seconds=10**9, delta_compact_segments=2)
        try:
            w = _World(h, Searcher(h.store, tmp_path / "cache"))
            for _ in range(3):
                w.write()
            assert h.run(FULL).success
            for _ in range(3):  # a window rebuild (the first delta), then 2 incremental segments
                w.write()
                _micro_batch(h)
            base, segs = _serving(h)
            assert len(segs) == 3
            before = w.check("before compaction")

            # 1. A micro-batch publishes between the compaction's build and its compare-and-swap: the
            #    compaction re-reads, finds its run still in a row, and republishes the merged segment.
            raced: list[str] = []

            def micro_batch_first(attempt: int) -> None:
                if attempt == 1:
                    w.write()
                    _micro_batch(h)
                    raced.append(_serving(h)[0])

            t0 = time.monotonic()
            result = compact_delta(spark, h.store, cfg, h.settings, run_id="compaction-race",
                                   before_publish=micro_batch_first)
            took = time.monotonic() - t0
            assert (result.outcome, result.attempts) == ("published", 2), result
            assert result.published_over == [base, raced[0]]
            version, after = _serving(h)
            assert version == result.version
            assert raced[0] in [s.version for s in after], "the micro-batch's segment was lost"
            assert compaction_plan.original_versions(after) == [*(s.version for s in segs), raced[0]]
            # K = 2: the 3 segments are merged down to K // 2 = 1, the micro-batch's segment follows.
            assert len(after) == 2 and after[0].kind == compaction_plan.MERGED_KIND
            w.check("after a compaction that lost its first compare-and-swap")
            entries = [e for e in ledger.read(h.store, PIPELINE) if e["run_id"] == "compaction-race"]
            assert [e["decision"] for e in entries] == ["published"] and entries[0]["extra"]["attempts"] == 2

            # 2. The sensor asks for a compaction once the limit is exceeded; the job merges; same answers.
            w.write()
            _micro_batch(h)
            assert len(_serving(h)[1]) == 3
            before = w.check("before the sensor's compaction")
            reqs = h.tick("delta_compaction_sensor").run_requests
            assert len(reqs) == 1
            job = h.defs.resolve_job_def("delta_compaction_job")
            run = job.execute_in_process(instance=h.instance, tags={**reqs[0].tags})
            (mat,) = run.asset_materializations_for_node("delta_compaction")
            assert mat.metadata["outcome"].value == "published" and mat.metadata["segments_after"].value == 1
            assert str(mat.metadata["spark_app_id"].value).startswith("local-")  # the application that built it
            _, segs = _serving(h)
            assert len(segs) == 1
            assert w.check("after the sensor's compaction") == before
            assert not h.tick("delta_compaction_sensor").run_requests

            # 3. A compaction publishes while a micro-batch builds: the micro-batch appends its segment to
            #    the compacted version instead of failing on a changed base.
            for _ in range(2):
                w.write()
                _micro_batch(h)
            compacted: list[str] = []
            timings: list[str] = []
            original = PublishingIOManager.before_publish

            def compaction_first(self: PublishingIOManager, pub: Publication[Any]) -> None:
                if not compacted:
                    r = compact_delta(spark, h.store, cfg, h.settings, run_id="compaction-meanwhile")
                    assert r.outcome == "published", r
                    timings.append(f"{r.run_docs} docs in {len(r.merged)} segments -> {r.merged_docs} docs: build "
                                   f"{r.build_seconds:.1f}s, publish {r.publish_seconds:.2f}s")
                    compacted.append(str(r.version))
                original(self, pub)

            monkeypatch.setattr(PublishingIOManager, "before_publish", compaction_first)
            w.write()
            rebased_run = _micro_batch(h)
            monkeypatch.undo()
            version, segs = _serving(h)
            manifest = read_manifest(h.store, "delta", version)
            assert manifest["inputs"]["based_on"] == compacted[0], manifest["inputs"]
            assert manifest["inputs"]["rebased_from"] not in (None, compacted[0])
            # The materialization describes what was published (the rebased draft), not the draft as built.
            (mat,) = rebased_run.asset_materializations_for_node("delta_index")
            assert mat.metadata["version"].value == version and mat.metadata["segments"].value == 2
            assert mat.metadata["doc_count"].value == manifest["doc_count"], (mat.metadata, manifest["doc_count"])
            assert mat.metadata["covered_ids"].value == manifest["covered_count"]
            assert [s.version for s in segs] == [compacted[0], version] and segs[-1].kind == "incremental"
            final = w.check("after a micro-batch rebased onto a compaction")
            assert rebuilt_answers(cfg, tmp_path) == final
            print(f"compaction with a concurrent micro-batch: {took:.1f}s (build {result.build_seconds:.1f}s, "
                  f"publish incl. the micro-batch {result.publish_seconds:.1f}s); alone: {timings[0]}")
        finally:
            h.close()
