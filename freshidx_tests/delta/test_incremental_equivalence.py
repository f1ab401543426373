"""Incremental = rebuilt (docs/architecture.md#incremental-equals-rebuilt).

After every micro-batch of a randomized arrival sequence, what search answers equals a from-scratch
answer over the same inputs.

The arrivals mix updates, deletes, pauses and re-activations, products moving, versions out of order
across partitions (and across the full cutoff), exact re-deliveries, bursts (several partitions folded
into one micro-batch), late partitions (behind the watermark, before and after the full cutoff) and full
rebuilds in the middle. The reference is a brute-force latest-version-per-ad over every record written
so far; at the end, a real from-scratch full build of the same raw files in a second store must answer
the same, so the reference is itself checked against the rebuild path.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import dagster as dg

from freshidx.delta import segments
from freshidx.publish.commit import read_manifest, read_pointer
from freshidx.serve.searcher import Searcher
from freshidx.store import StoreConfig, layout, open_store
from freshidx_tests.conftest import make_s3_config
from freshidx_tests.spark.test_index_shards import docs_with_features
from freshidx_tests.support.harness import Harness, at

WINDOW = 120
FULL = dg.RunRequest(asset_selection=[dg.AssetKey("full_index")])
WORDS = ("amber", "birch", "cobalt", "dune", "ember", "fjord", "garnet", "harbor", "indigo", "juniper")
STATUSES = (("active", 6), ("paused", 2), ("deleted", 2))


def _record(rng: random.Random, ad: int, minutes: int) -> dict[str, Any]:
    status = rng.choices([s for s, _ in STATUSES], [w for _, w in STATUSES])[0]
    return {"ad_id": f"ad-{ad}", "campaign_id": "cmp", "product_id": f"p-{rng.randrange(6)}",
            "title": " ".join(rng.sample(WORDS, 2)), "keywords": ["k"], "bid": float(rng.randint(1, 9)),
            "status": status, "updated_at": at(minutes).at.strftime("%Y-%m-%dT%H:%M:%S.000Z"),
            "version": rng.randint(1, 30)}


def _batch(rng: random.Random, minutes: int, sent: list[dict[str, Any]], ads: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for _ in range(rng.randint(3, 9)):
        if sent and rng.random() < 0.15:
            out.append(dict(rng.choice(sent)))  # an exact re-delivery
        else:
            out.append(_record(rng, rng.randrange(ads), minutes))
    # Filler that stays active, so no version is ever empty (the gate refuses an empty index).
    out.append({"ad_id": "filler", "campaign_id": "cmp", "product_id": "p-filler", "title": "filler",
                "keywords": [], "bid": 1.0, "status": "active",
                "updated_at": at(minutes).at.strftime("%Y-%m-%dT%H:%M:%S.000Z"), "version": minutes + 1})
    return out


def _rank(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["version"], r["updated_at"], r["status"], r["campaign_id"], r["product_id"], r["title"],
            r["keywords"], r["bid"])


def latest(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    best: dict[str, dict[str, Any]] = {}
    for r in records:
        if r["ad_id"] not in best or _rank(r) > _rank(best[r["ad_id"]]):
            best[r["ad_id"]] = r
    return best


def expected(records: list[dict[str, Any]], word: str) -> set[str]:
    return {a for a, r in latest(records).items() if r["status"] == "active" and word in r["title"].split()}


def expected_features(records: list[dict[str, Any]]) -> dict[str, tuple[str, int, float]]:
    """Every active ad's served document: ``ad_id -> (product_id, product_active_ads, product_best_bid)``
    (every ad of a product carries its product's features, over the latest version of every ad)."""
    active = [r for r in latest(records).values() if r["status"] == "active"]
    count: dict[str, int] = {}
    best: dict[str, float] = {}
    for r in active:
        count[r["product_id"]] = count.get(r["product_id"], 0) + 1
        best[r["product_id"]] = max(best.get(r["product_id"], 0.0), float(r["bid"] or 0.0))
    return {r["ad_id"]: (r["product_id"], count[r["product_id"]], best[r["product_id"]]) for r in active}


def served_features(s: Searcher) -> dict[str, tuple[str, int, float]]:
    """What the reader serves for every ad, walked as a search walks it (newest segment first, each part
    minus the newer parts' kill-lists): ``ad_id -> (product_id, product_active_ads, product_best_bid)``.
    An ad served by two parts at once is an error (a part that indexes an ad must also kill it)."""
    s.refresh()
    out: dict[str, tuple[str, int, float]] = {}
    with s.snapshot() as snap:
        for index, version, part, kill in snap.searched:
            for sh in part.shards:
                for doc, n, b in docs_with_features(sh.searcher):
                    ad = str(doc["ad_id"][0])
                    if ad in kill:
                        continue
                    assert ad not in out, f"{ad} served twice (again by {index} {version})"
                    out[ad] = (str(doc["product_id"][0]), n, b)
    return out


def served(s: Searcher) -> dict[str, set[str]]:
    s.refresh()
    return {w: {h.ad_id for h in s.search(w, k=1000)} for w in WORDS}


def _write(h: Harness, minutes: int, records: list[dict[str, Any]], name: str = "part-0.jsonl") -> None:
    body = "".join(json.dumps(r) + "\n" for r in records).encode()
    h.store.put(layout.raw_partition_prefix("ad_updates", at(minutes)) + name, body)


def _micro_batch(h: Harness) -> None:
    reqs = h.tick().run_requests
    assert len(reqs) == 1, "the sensor must request one delta run for the newest partition"
    result = h.run(reqs[0])
    assert result.success
    # The materialization says how the version was built, as its manifest does.
    (mat,) = result.asset_materializations_for_node("delta_index")
    build, count = _delta_build(h)
    assert mat.metadata["build"].value == build and mat.metadata["segments"].value == count
    assert mat.metadata["step_index_seconds"].value > 0 and mat.metadata["folded_partitions"].value >= 0
    # ... and where the segment task's time went (every build's shard tasks report index and upload)
    steps = {"step_task_index_seconds", "step_task_upload_seconds"}
    if build == "incremental":  # every segment task (one per part) merges the state rows it read
        steps |= {"step_task_batch_seconds", "step_task_state_seconds", "step_task_merge_seconds"}
    assert steps <= mat.metadata.keys(), sorted(mat.metadata)


def _delta_build(h: Harness) -> tuple[str, int]:
    pointer, _ = read_pointer(h.store, "delta")
    assert pointer is not None
    m = read_manifest(h.store, "delta", pointer.version)
    return str(m["inputs"]["build"]), len(m["segments"])


def first_full(h: Harness, rng: random.Random, sent: list[dict[str, Any]], ads: int) -> int:
    """Three partitions (minutes 0, 5, 10; their records appended to ``sent``), then the first full
    index; returns the next partition's minute."""
    minute = 0
    for _ in range(3):
        sent += (b := _batch(rng, minute, sent, ads))
        _write(h, minute, b)
        minute += 5
    assert h.run(FULL).success
    return minute


def _full_build(h: Harness) -> str:
    pointer, _ = read_pointer(h.store, "full")
    assert pointer is not None
    return str(read_manifest(h.store, "full", pointer.version)["inputs"]["build"])


def scenario(cfg: StoreConfig, tmp: Path, seed: int, steps: int, **overrides: Any) -> dict[str, Any]:
    """Run the randomized sequence; assert equivalence after every micro-batch. Returns what it saw."""
    rng = random.Random(seed)
    ads = 25
    sent: list[dict[str, Any]] = []
    builds: list[str] = []
    fulls: list[str] = []  # how each full version in the middle was built (state or raw)
    with dg.instance_for_test() as instance:
        h = Harness(cfg, instance, window_minutes=WINDOW, full_max_age_seconds=10**9, **overrides)
        try:
            minute = first_full(h, rng, sent, ads)
            s = Searcher(h.store, tmp / f"cache-{seed}")
            watermark = -1
            full_at = minute - 5
            for step in range(steps):
                burst = rng.choice((1, 1, 1, 2, 3))  # several partitions folded into one micro-batch
                for _ in range(burst):
                    sent += (b := _batch(rng, minute, sent, ads))
                    _write(h, minute, b)
                    minute += 5
                if step and rng.random() < 0.35:  # a late partition, behind the watermark
                    late = rng.randrange(max(full_at - 10, 0), watermark + 1)
                    sent += (b := _batch(rng, late, sent, ads))
                    _write(h, late, b, name=f"late-{step}.jsonl")
                _micro_batch(h)
                watermark = minute - 5
                builds.append(_delta_build(h)[0])
                got = served(s)
                want = {w: expected(sent, w) for w in WORDS} | {"filler": {"filler"}}
                got["filler"] = {hit.ad_id for hit in s.search("filler", k=10)}
                wrong = {w: (got[w], want[w]) for w in want if got[w] != want[w]}
                assert not wrong, f"seed {seed} step {step} ({builds[-1]}): (served, expected) {wrong}"
                # ... and every served document carries its product's current features.
                got_f, want_f = served_features(s), expected_features(sent)
                stale = {a: (got_f.get(a), want_f.get(a)) for a in got_f.keys() | want_f.keys()
                         if got_f.get(a) != want_f.get(a)}
                assert not stale, f"seed {seed} step {step} ({builds[-1]}): (served, expected) {stale}"
                # A full rebuild in the middle (always before the delta would outgrow the window).
                if watermark - full_at >= 90 or (watermark - full_at >= 45 and rng.random() < 0.5):
                    assert h.run(FULL).success
                    full_at = watermark
                    fulls.append(_full_build(h))
            return {"builds": builds, "fulls": fulls, "sent": sent, "answers": served(s)}
        finally:
            h.close()


def rebuilt_answers(src: StoreConfig, tmp: Path) -> dict[str, set[str]]:
    """A from-scratch full build of the same raw files, in a fresh local store."""
    fresh = StoreConfig(uri=(tmp / "rebuilt").as_uri())
    src_store, dst = open_store(src), open_store(fresh)
    for o in src_store.iter_objects("raw/"):
        dst.put(o.key, src_store.get(o.key).data)
    with dg.instance_for_test() as instance:
        h = Harness(fresh, instance, window_minutes=WINDOW, full_max_age_seconds=10**9)
        try:
            assert h.run(FULL).success
            return served(Searcher(h.store, tmp / "cache-rebuilt"))
        finally:
            h.close()


def test_incremental_equals_rebuild_local(tmp_path: Path, spark: Any) -> None:
    cfg = StoreConfig(uri=(tmp_path / "store").as_uri())
    # At most 3 segments per version: the sequence also goes through a window rebuild (segment limit)
    # and appends again after it.
    seen = scenario(cfg, tmp_path, 12, steps=8, delta_max_segments=3)
    # The first delta after the full index is incremental over the state the full build wrote;
    # the segment limit forces a window rebuild later.
    assert seen["builds"][0] == "incremental", seen["builds"]
    assert "rebuild" in seen["builds"], seen["builds"]
    # Full versions in the middle were built from state (the serving full + the delta's segments) too.
    assert "state" in seen["fulls"], seen["fulls"]
    assert rebuilt_answers(cfg, tmp_path) == seen["answers"]


def test_incremental_equals_rebuild_s3(tmp_path: Path, spark: Any, moto_endpoint: str) -> None:
    cfg = make_s3_config(moto_endpoint)
    # Two shards per segment: two tasks, each with a copy of the batch, build the touched products of
    # their part (segment_parts; with one, the default, one task builds them all).
    seen = scenario(cfg, tmp_path, 13, steps=5, delta_segment_shards=2, delta_segment_shard_mb=0)
    assert "incremental" in seen["builds"], seen["builds"]
    assert rebuilt_answers(cfg, tmp_path) == seen["answers"]


def test_a_late_record_in_a_newer_full_version_is_healed_by_the_next_touch(tmp_path: Path, spark: Any) -> None:
    """A segment built over an older full version stays applied over a newer one (its position is after
    the newer cutoff), but that newer version read a late record the segment never saw: the documents
    of the late ad's product disagree until a micro-batch touches it. That micro-batch must re-index the
    product whole, although its features do not change (``segment_merge.segment_update``, distrusted
    rows): with every layer trusted, the segment's stale documents of the product stayed served."""
    def ad(a: str, bid: float, minute: int, version: int = 1) -> dict[str, Any]:
        return {"ad_id": a, "campaign_id": "c", "product_id": "p-x", "title": "amber", "keywords": [],
                "bid": bid, "status": "active", "updated_at": at(minute).at.strftime("%Y-%m-%dT%H:%M:%S.000Z"),
                "version": version}

    cfg = StoreConfig(uri=(tmp_path / "store").as_uri())
    sent: list[dict[str, Any]] = []
    with dg.instance_for_test() as instance:
        h = Harness(cfg, instance, window_minutes=WINDOW, full_max_age_seconds=10**9)
        try:
            first_full(h, random.Random(3), sent, 25)  # minutes 0, 5, 10
            s = Searcher(h.store, tmp_path / "cache")
            for minute, records in ((15, [ad("a1", 1.0, 15), ad("a2", 2.0, 15)]), (20, [ad("a3", 3.0, 20)])):
                sent += records
                _write(h, minute, records)
                _micro_batch(h)
            late = [ad("a4", 9.0, 12)]  # behind the watermark, before the next full cutoff (15)
            sent += late
            _write(h, 12, late, name="late.jsonl")
            cutoff = {"ops": {"full_index": {"config": {"cutoff_partition": at(15).compact}}}}
            assert h.run(dg.RunRequest(asset_selection=[dg.AssetKey("full_index")], run_config=cutoff)).success
            assert served_features(s)["a4"] == ("p-x", 3, 9.0)  # the full version's view at its cutoff
            assert served_features(s)["a3"] == ("p-x", 3, 3.0)  # the segment's, which never saw a4
            again = [ad("a1", 1.0, 15)]  # an exact re-delivery: p-x's features do not change
            sent += again
            _write(h, 25, again)
            _micro_batch(h)
            assert _delta_build(h)[0] == "incremental"
            assert served_features(s) == expected_features(sent)
            assert served_features(s)["a3"] == ("p-x", 4, 9.0)
        finally:
            h.close()


def test_plan_drops_segments_the_full_index_covers() -> None:
    """Pure planning: segments at or before the full cutoff go; a full index behind the window rebuilds."""
    import datetime as dt

    def seg(minutes: int) -> segments.Segment:
        return segments.Segment(version=f"v{minutes}", position=at(minutes).at.isoformat(), kind="incremental",
                                shards=[], doc_count=1, covered_count=1, files=[f"f{minutes}"],
                                listed_at=at(minutes).at.isoformat())

    prev = [seg(10), seg(20), seg(30)]
    full = segments.FullBase("full-v", at(20).at, at(21).at)
    window = dt.timedelta(minutes=WINDOW)
    mb = segments.plan(at(40), window, full, prev, has_previous_delta=True, max_segments=24, force_rebuild=False)
    assert mb.kind is segments.BuildKind.INCREMENTAL
    assert [s.version for s in mb.kept] == ["v30"] and mb.dropped == 2
    old_full = segments.FullBase("full-v", at(-200).at, at(-199).at)
    mb = segments.plan(at(40), window, old_full, prev, has_previous_delta=True, max_segments=24,
                       force_rebuild=False)
    assert (mb.kind, mb.reason) == (segments.BuildKind.REBUILD, segments.RebuildReason.FULL_BEHIND_WINDOW)
    mb = segments.plan(at(40), window, full, prev, has_previous_delta=True, max_segments=1, force_rebuild=False)
    assert (mb.kind, mb.reason) == (segments.BuildKind.REBUILD, segments.RebuildReason.SEGMENT_LIMIT)


def test_segment_shards_follow_the_bytes_a_micro_batch_reads() -> None:
    count = segments.segment_shard_count
    assert count(0, max_shards=4, shard_mb=8) == 1
    assert count(1_200_000, max_shards=4, shard_mb=8) == 1  # a partition of a 100k-document window
    assert count(12_000_000, max_shards=4, shard_mb=8) == 2  # one of a million-document window
    assert count(3 * 12_000_000, max_shards=4, shard_mb=8) == 4  # three folded into one micro-batch
    assert count(200 * 2**20, max_shards=4, shard_mb=8) == 4  # never more than the limit
    assert count(10, max_shards=3, shard_mb=0) == 3  # 0: always the limit
