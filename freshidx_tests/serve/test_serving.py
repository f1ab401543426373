"""Serving (freshidx.serve.searcher.Searcher): pointers → manifest-listed downloads → fan-out, kill-list, top-k."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from freshidx import cli
from freshidx.delta.product_expansion import expand_to_products
from freshidx.publish.commit import read_manifest, read_pointer
from freshidx.publish.retention import rollback
from freshidx.serve.searcher import Hit, Searcher, ServingError
from freshidx.spark.index_shards import read_version_docs, write_index_shards
from freshidx.spark.transform import index_rows
from freshidx.store import StoreConfig, layout, open_store
from freshidx_tests.spark.test_index_shards import T0, ad, build_direct, publish_commits, rows_df
from freshidx_tests.support.parquet_shards import write_one_shard

FULL_AT = T0
DELTA_AT = T0 + dt.timedelta(minutes=10)


def full_ads() -> list[dict[str, Any]]:
    ads = [ad(i, product=i % 10, title=f"item{i} common widget") for i in range(50)]
    ads[1]["title"] = "old lantern common"  # product 1: ads 1, 11, 21, 31, 41
    ads[2]["title"] = "crimson kettle common"  # product 2
    ads[11]["title"] = "sibling lantern holder common"
    ads[3]["status"] = "paused"
    return ads


def delta_window() -> list[dict[str, Any]]:
    return [
        ad(1, product=1, title="shiny beacon common", bid=30.0, version=2),  # changed title and bid
        ad(2, product=2, status="deleted", title="crimson kettle common", version=2),  # deleted
    ]


def build_and_publish(spark: SparkSession, cfg: StoreConfig) -> tuple[str, str]:
    """A full version (Spark) and a delta version (Spark, expanded to whole products), published."""
    store = open_store(cfg)
    commits = write_index_shards(index_rows(rows_df(spark, full_ads())), cfg, "full", "full-v1", 3)
    publish_commits(store, "full", "full-v1", FULL_AT, commits)
    full_docs = read_version_docs(spark, cfg, read_manifest(store, "full", "full-v1"))
    delta_rows = expand_to_products(rows_df(spark, delta_window()), full_docs)
    commits = write_index_shards(delta_rows, cfg, "delta", "delta-v1", 2)
    publish_commits(store, "delta", "delta-v1", DELTA_AT, commits)
    return "full-v1", "delta-v1"


def results(searcher: Searcher, queries: list[str], k: int = 10) -> dict[str, list[tuple[str, str, float]]]:
    return {q: [(h.ad_id, h.index, round(h.score, 5)) for h in searcher.search(q, k)] for q in queries}


QUERIES = ["beacon", "lantern", "crimson kettle", "common", "widget item7", "gizmo", "holder", "item3"]


def test_end_to_end_local_and_s3(
    spark: SparkSession, local_store_config: StoreConfig, s3_store_config: StoreConfig, tmp_path: Path
) -> None:
    answers = []
    for name, cfg in (("local", local_store_config), ("s3", s3_store_config)):
        build_and_publish(spark, cfg)
        searcher = Searcher(open_store(cfg), tmp_path / f"cache-{name}")
        assert searcher.versions() == {"full": "full-v1", "delta": "delta-v1"}

        beacon = searcher.search("beacon")
        assert [(h.ad_id, h.index, h.version, h.title, h.bid) for h in beacon] == [
            ("ad-0001", "delta", "delta-v1", "shiny beacon common", 30.0)]
        # the old title matches only the full index's stale copy, which the kill-list hides
        assert [h.ad_id for h in searcher.search("lantern")] == ["ad-0011"]
        # the deleted ad is absent, although the full index still holds it
        assert "ad-0002" not in [h.ad_id for h in searcher.search("crimson kettle", k=50)]
        snap = searcher.current
        assert snap.full is not None and snap.delta is not None
        full_hits = [
            sh.searcher.doc(addr).get_first("ad_id")
            for sh in snap.full.shards
            for _, addr in sh.searcher.search(sh.index.parse_query("crimson", ["title"]), 5, count=False).hits
        ]
        assert full_hits == ["ad-0002"]
        # product grouping: the delta re-emits every ad of a touched product, with recomputed features
        assert snap.kill_list == {"ad-0001", "ad-0011", "ad-0021", "ad-0031", "ad-0041",
                                  "ad-0002", "ad-0012", "ad-0022", "ad-0032", "ad-0042"}
        sibling = searcher.search("holder")
        assert [(h.ad_id, h.index) for h in sibling] == [("ad-0011", "delta")]
        best = [
            sh.searcher.fast_field_values("product_best_bid", [a for _, a in hits])
            for sh in snap.delta.shards
            if (hits := sh.searcher.search(sh.index.parse_query("ad_id:ad-0011"), 1, count=False).hits)
        ]
        assert best == [[30.0]]
        everything = searcher.search("common", k=100)
        assert len({h.ad_id for h in everything}) == len(everything) == 48  # 50 - paused - deleted
        assert [h.score for h in everything] == sorted((h.score for h in everything), reverse=True)
        assert {h.index for h in everything if h.ad_id in snap.kill_list} == {"delta"}
        # k caps the merged list; the best hits come first
        assert searcher.search("common", k=5) == everything[:5]
        answers.append(results(searcher, QUERIES, k=20))
        # the shards searched one after another in the caller's thread answer the same
        with Searcher(open_store(cfg), tmp_path / f"cache-{name}-1", search_threads=1) as sequential:
            assert results(sequential, QUERIES, k=20) == answers[-1]
        # cache layout: cache/<index>/<version>/shard-NNNNN/index/...; no lock files were shipped
        assert sorted(p.name for p in (tmp_path / f"cache-{name}" / "full").iterdir()) == ["full-v1"]
    assert answers[0] == answers[1]


def test_bad_queries_do_not_raise(local_store_config: StoreConfig, tmp_path: Path) -> None:
    store = open_store(local_store_config)
    commits = build_direct(local_store_config, "full", "f1", [ad(1, 1, title="red shoes"), ad(2, 2, title="blue hat")])
    publish_commits(store, "full", "f1", FULL_AT, commits)
    s = Searcher(store, tmp_path / "cache")
    assert s.parse_query("red")[1] is False
    for q in ('title:"red', "red AND (", "nosuchfield:red", "red OR", "red]"):
        query, fell_back = s.parse_query(q)
        assert fell_back and query is not None, q
        assert [h.ad_id for h in s.search(q)] == ["ad-0001"], q
    for q in ("", "   ", "-", "((", '"'):
        assert s.search(q) == [], q
    assert s.search("red", k=0) == []
    assert {h.ad_id for h in s.search("red OR hat")} == {"ad-0001", "ad-0002"}
    assert s.parse_query("") == (None, False)


def test_search_threads_must_be_at_least_one(local_store_config: StoreConfig, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="search_threads must be >= 1, got 0"):
        Searcher(open_store(local_store_config), tmp_path / "cache", search_threads=0)


def test_refresh_swaps_and_cleans_cache(local_store_config: StoreConfig, tmp_path: Path) -> None:
    store = open_store(local_store_config)
    cache = tmp_path / "cache"
    s = Searcher(store, cache)  # nothing published yet
    assert s.search("anything") == [] and s.versions() == {"full": None, "delta": None}
    publish_commits(store, "full", "f1", FULL_AT,
                    build_direct(local_store_config, "full", "f1", [ad(1, 1, title="one")]))
    assert s.refresh() is True
    first = s.last_refresh  # where the refresh that swapped f1 in spent its time
    assert first is not None and first.parts_loaded == 1
    on_disk = sum(f.stat().st_size for f in (cache / "full" / "f1").rglob("*") if f.name != ".complete.json")
    assert 0 < first.downloaded_bytes <= on_disk  # opening adds tantivy's own files
    steps = first.pointers_s + first.manifests_s + first.download_s + first.open_s + first.kill_list_s
    assert 0 < steps <= first.total_s and first.open_s > 0 and first.download_s > 0
    assert s.refresh() is False and s.last_refresh is first  # a refresh that changed nothing is not recorded
    assert [h.version for h in s.search("one")] == ["f1"]
    publish_commits(store, "full", "f2", FULL_AT + dt.timedelta(minutes=1),
                    build_direct(local_store_config, "full", "f2", [ad(1, 1, title="two")]))
    assert s.refresh() is True
    assert [h.version for h in s.search("two")] == ["f2"] and s.search("one") == []
    assert sorted(p.name for p in (cache / "full").iterdir()) == ["f2"]  # the old version is gone
    # A delta older than the full version is ignored (the full rebuild already holds everything newer).
    publish_commits(store, "delta", "d-old", FULL_AT - dt.timedelta(minutes=5),
                    build_direct(local_store_config, "delta", "d-old", [ad(1, 1, title="stale")]))
    assert s.refresh() is True
    assert s.search("stale") == [] and [h.index for h in s.search("two")] == ["full"]
    # A second Searcher on a fresh cache sees the same thing.
    assert Searcher(store, tmp_path / "cache2").search("two") == s.search("two")


def test_unservable_versions_are_refused(local_store_config: StoreConfig, tmp_path: Path) -> None:
    import pyarrow as pa

    from freshidx.spark.shards import DOCS_ARROW_SCHEMA

    store = open_store(local_store_config)
    good = build_direct(local_store_config, "full", "f1", [ad(1, 1, title="good")])
    publish_commits(store, "full", "f1", FULL_AT, good)
    s = Searcher(store, tmp_path / "cache")
    # a version written by the Parquet-only shard writer has no tantivy files
    batch = pa.RecordBatch.from_pylist([{k: v for k, v in ad(2, 2).items()}], schema=DOCS_ARROW_SCHEMA)
    parquet_only = [write_one_shard(local_store_config, "full", "f2", 0, 0, [batch])]
    publish_commits(store, "full", "f2", FULL_AT + dt.timedelta(minutes=1), parquet_only)
    with pytest.raises(ServingError, match="no tantivy index"):
        s.refresh()
    assert s.versions()["full"] == "f1" and [h.ad_id for h in s.search("good")] == ["ad-0001"]
    # a corrupted file: checksum mismatch, nothing half-downloaded left in the cache
    bad = build_direct(local_store_config, "full", "f3", [ad(3, 3, title="bad")])
    publish_commits(store, "full", "f3", FULL_AT + dt.timedelta(minutes=2), bad)
    victim = next(f for f in bad[0].files if f.key.endswith(".store"))
    data = bytearray(store.get(victim.key).data)
    data[-1] ^= 0xFF
    store.put(victim.key, bytes(data))
    with pytest.raises(ServingError, match="sha256"):
        s.refresh()
    assert sorted(p.name for p in (tmp_path / "cache" / "full").iterdir()) == ["f1"]
    assert [h.ad_id for h in s.search("good")] == ["ad-0001"]


def test_concurrent_refresh_sees_one_version_of_each(local_store_config: StoreConfig, tmp_path: Path) -> None:
    store = open_store(local_store_config)
    marker = {"fa": "fulla", "fb": "fullb", "da": "deltaa", "db": "deltab"}

    def version_ads(tag: str, ids: range) -> list[dict[str, Any]]:
        return [ad(i, i % 7, title=f"common {marker[tag]} item{i}") for i in ids]

    for tag, index, at, ids in (("fa", "full", FULL_AT, range(40)), ("da", "delta", DELTA_AT, range(0, 40, 3)),
                                ("fb", "full", FULL_AT + dt.timedelta(minutes=1), range(40)),
                                ("db", "delta", DELTA_AT + dt.timedelta(minutes=1), range(1, 40, 4))):
        publish_commits(store, index, tag, at, build_direct(local_store_config, index, tag, version_ads(tag, ids), 3))
    for index, to in (("full", "fa"), ("delta", "da")):
        rollback(store, index, to)
    s = Searcher(store, tmp_path / "cache")
    assert s.versions() == {"full": "fa", "delta": "da"}

    stop = threading.Event()
    errors: list[BaseException] = []
    seen: list[tuple[str | None, str | None]] = []

    def check(hits: list[Hit]) -> None:
        by_index: dict[str, set[str]] = {}
        for h in hits:
            by_index.setdefault(h.index, set()).add(h.version)
            assert marker[h.version] in h.title, (h, "content of another version")
        assert all(len(v) == 1 for v in by_index.values()), by_index
        ids = [h.ad_id for h in hits]
        assert len(ids) == len(set(ids)), "an ad from both indexes"
        delta_versions = by_index.get("delta", set())
        if delta_versions:  # kill-list of *that* delta applied: its ads come from it only
            assert {h.ad_id for h in hits if h.index == "full"}.isdisjoint(
                {h.ad_id for h in hits if h.index == "delta"})
        seen.append((next(iter(by_index.get("full", {None}))), next(iter(delta_versions or {None}))))

    def reader() -> None:
        try:
            while not stop.is_set():
                check(s.search("common", k=60))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=reader, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    swaps = 0
    plan = [("full", "fb"), ("delta", "db"), ("full", "fa"), ("delta", "da")] * 3
    for index, to in plan:
        before = len(seen)
        deadline = time.monotonic() + 20
        while len(seen) < before + 5 and time.monotonic() < deadline and not stop.is_set():
            time.sleep(0.005)  # let readers run against this version set (poll with a deadline)
        rollback(store, index, to)
        assert s.refresh() is True
        swaps += 1
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors, errors[0]
    assert swaps == len(plan) and len(seen) >= 5 * len(plan)
    assert {pair for pair in seen} >= {("fa", "da"), ("fb", "da"), ("fb", "db"), ("fa", "db")}
    # after the readers are done only the current versions remain cached
    assert {p.name for p in (tmp_path / "cache" / "full").iterdir()} == {s.versions()["full"]}
    assert {p.name for p in (tmp_path / "cache" / "delta").iterdir()} == {s.versions()["delta"]}


def test_search_cli(local_store_config: StoreConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = open_store(local_store_config)
    publish_commits(store, "full", "f1", FULL_AT,
                    build_direct(local_store_config, "full", "f1", [ad(1, 1, title="red shoes"), ad(2, 1)]))
    base = ["--store", local_store_config.uri, "--cache", str(tmp_path / "cache")]
    assert cli.main(["search", "red shoes", "--k", "3", "--json", *base]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert [(h["ad_id"], h["index"], h["version"]) for h in hits] == [("ad-0001", "full", "f1")]
    assert isinstance(hits[0]["score"], float)
    assert cli.main(["search", 'title:"red', *base]) == 0
    assert "ad-0001" in capsys.readouterr().out
    pointer, _ = read_pointer(store, "full")
    assert pointer is not None and pointer.version == "f1" and layout.pointer_key("full").endswith("CURRENT")


def test_pointer_follower_swaps_in_what_is_published_and_outlives_an_unservable_version(
        local_store_config: StoreConfig, tmp_path: Path) -> None:
    import queue

    import pyarrow as pa

    from freshidx.serve.follow import PointerFollower
    from freshidx.spark.shards import DOCS_ARROW_SCHEMA

    store = open_store(local_store_config)
    s = Searcher(store, tmp_path / "cache")
    swaps: queue.Queue[tuple[dict[str, str | None], int, float]] = queue.Queue()
    with PointerFollower(s, interval_s=0.01,
                         on_swap=lambda vs, t, started: swaps.put((vs.versions(), t.parts_loaded, started))) as f:
        before = time.time()
        publish_commits(store, "full", "f1", FULL_AT, build_direct(local_store_config, "full", "f1", [ad(1, 1)]))
        versions, parts, started = swaps.get(timeout=300)
        assert versions == {"full": "f1", "delta": None} and parts == 1 and started >= before - 1
        # a version that cannot be served: the follower keeps serving f1 and says why
        batch = pa.RecordBatch.from_pylist([dict(ad(2, 2))], schema=DOCS_ARROW_SCHEMA)
        publish_commits(store, "full", "f2", FULL_AT + dt.timedelta(minutes=1),
                        [write_one_shard(local_store_config, "full", "f2", 0, 0, [batch])])
        while not isinstance(f.last_error, ServingError):
            assert f.tick() is False  # the test's own ticks, beside the thread's: refresh is serialized
        assert s.versions()["full"] == "f1"
        publish_commits(store, "full", "f3", FULL_AT + dt.timedelta(minutes=2),
                        build_direct(local_store_config, "full", "f3", [ad(3, 3, title="three")]))
        assert swaps.get(timeout=300)[0] == {"full": "f3", "delta": None}
    assert [h.ad_id for h in s.search("three")] == ["ad-0003"]
    with pytest.raises(ValueError, match="interval_s"):
        PointerFollower(s, interval_s=0)
