"""tantivy shards built in Spark tasks (freshidx.spark.index_shards), the index format, product features.

Also home of small helpers the serving/retention tests share (ads, direct builds, drafts).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import tantivy
from pyspark.sql import DataFrame, SparkSession

from freshidx.delta.product_expansion import expand_to_products
from freshidx.publish.commit import DraftManifest, Pointer, iso, publish
from freshidx.record_rules import ProductFeatures
from freshidx.spark.index_format import (
    FORMAT,
    INDEX_DIR,
    IndexBuilder,
    add_document,
    is_lock_file,
    open_index,
    schema,
)
from freshidx.spark.index_shards import read_version_docs, write_index_shards, write_one_index_shard
from freshidx.spark.shards import COVERED_FILE, DOCS_ARROW_SCHEMA, DOCS_FILE, ShardCommit
from freshidx.store import ObjectStore, StoreConfig, layout, open_store

DDL = (
    "ad_id string, campaign_id string, product_id string, title string, keywords array<string>, "
    "bid double, status string, updated_at timestamp, version long"
)
COLUMNS = [c.split()[0] for c in DDL.split(", ")]
T0 = dt.datetime(2026, 11, 21, 14, 0, tzinfo=dt.UTC)


# --------------------------------------------------------------------------- shared helpers


def ad(i: int, product: int, status: str = "active", title: str | None = None, bid: float | None = None,
       version: int = 1, keywords: list[str] | None = None) -> dict[str, Any]:
    return {
        "ad_id": f"ad-{i:04d}", "campaign_id": f"c-{i % 3}", "product_id": f"p-{product:03d}",
        "title": title if title is not None else f"item{i} common widget",
        "keywords": keywords if keywords is not None else [f"kw{i}", "gizmo"],
        "bid": bid if bid is not None else round(1 + i / 4, 2), "status": status,
        "updated_at": T0 + dt.timedelta(seconds=i), "version": version,
    }


def rows_df(spark: SparkSession, ads: list[dict[str, Any]]) -> DataFrame:
    return spark.createDataFrame([tuple(a[c] for c in COLUMNS) for a in ads], DDL)


def with_features(ads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Python twin of :class:`freshidx.record_rules.ProductFeatures` (attached to every row)."""
    active_ads: dict[str, int] = defaultdict(int)
    bids: dict[str, list[float]] = defaultdict(list)
    for a in ads:
        if a["status"] == "active":
            active_ads[a["product_id"]] += 1
            if a["bid"] is not None:
                bids[a["product_id"]].append(a["bid"])
    return [
        {**a, "product_active_ads": active_ads[a["product_id"]],
         "product_best_bid": max(bids[a["product_id"]], default=0.0)}
        for a in ads
    ]


def features_of(ads: list[dict[str, Any]], batch_rows: int = 2) -> dict[str, tuple[int, float]]:
    """``ad_id -> (product_active_ads, product_best_bid)`` by :class:`ProductFeatures`, fed in small
    batches (so partial aggregates are combined) and attached to every row."""
    table = pa.Table.from_pylist([{c: a[c] for c in COLUMNS} for a in ads], schema=DOCS_ARROW_SCHEMA)
    features = ProductFeatures()
    for batch in table.filter(pc.equal(table["status"], "active")).to_batches(max_chunksize=batch_rows):
        features.add(batch)
    out: dict[str, tuple[int, float]] = {}
    for batch in table.to_batches():
        for row in features.attach(batch).to_pylist():
            out[row["ad_id"]] = (row["product_active_ads"], row["product_best_bid"])
    return out


def build_direct(config: StoreConfig, index: str, version: str, ads: list[dict[str, Any]],
                 num_shards: int = 2) -> list[ShardCommit]:
    """Build a version without Spark (same per-shard code the Spark tasks run), for fast tests."""
    by_shard: dict[int, list[dict[str, Any]]] = {s: [] for s in range(num_shards)}
    for a in ads:
        by_shard[zlib.crc32(a["product_id"].encode()) % num_shards].append({c: a[c] for c in COLUMNS})
    commits = []
    for shard, rows in by_shard.items():
        batch = pa.RecordBatch.from_pylist(rows, schema=DOCS_ARROW_SCHEMA)
        commits.append(write_one_index_shard(config, index, version, shard, 0, [batch]))
    return commits


def draft(index: str, version: str, position: dt.datetime, commits: list[ShardCommit]) -> DraftManifest:
    return DraftManifest(
        index=index, version=version, position=iso(position), run_id=f"run-{version}",
        shards=[c.to_dict() for c in commits], doc_count=sum(c.doc_count for c in commits),
        num_shards=len(commits), covered_count=sum(c.covered_count for c in commits),
        cutoff=iso(position) if index == "full" else None,
        source_partition=None if index == "full" else position.strftime("year=%Y/month=%m/day=%d/hour=%H/minute=%M"),
        stats={"format": FORMAT},
    )


def publish_commits(store: ObjectStore, index: str, version: str, position: dt.datetime,
                    commits: list[ShardCommit]) -> Pointer:
    result = publish(store, draft(index, version, position, commits))
    assert result.outcome == "published", result.reason
    assert result.pointer is not None
    return result.pointer


def download_shard(store: ObjectStore, commit: ShardCommit, dest: Path) -> Path:
    """Download a shard's index files (checking bytes and sha256) into ``dest``; returns the index dir."""
    idx = dest / f"shard-{commit.shard}"
    idx.mkdir(parents=True)
    for f in commit.files:
        data = store.get(f.key).data
        assert len(data) == f.bytes
        assert hashlib.sha256(data).hexdigest() == f.sha256
        name = f.key.rsplit("/", 1)[-1]
        if f"/{INDEX_DIR}" in f.key:
            (idx / name).write_bytes(data)
    return idx


def all_docs(index: tantivy.Index) -> list[tuple[dict[str, Any], Any]]:
    s = index.searcher()
    res = s.search(tantivy.Query.all_query(), limit=max(1, s.num_docs), count=False)
    return [(s.doc(addr).to_dict(), addr) for _, addr in res.hits]


def docs_with_features(searcher: tantivy.Searcher) -> list[tuple[dict[str, Any], int, float]]:
    """Every document a searcher holds with its product features (fast fields, not stored)."""
    res = searcher.search(tantivy.Query.all_query(), limit=max(1, searcher.num_docs), count=False)
    addrs = [addr for _, addr in res.hits]
    counts = searcher.fast_field_values("product_active_ads", addrs)
    bests = searcher.fast_field_values("product_best_bid", addrs)
    return [(searcher.doc(a).to_dict(), int(n), float(b)) for a, n, b in zip(addrs, counts, bests, strict=True)]


# --------------------------------------------------------------------------- tests


def test_write_index_shards(spark: SparkSession, store_config: StoreConfig, tmp_path: Path) -> None:
    store = open_store(store_config)
    statuses = ["active", "active", "paused", "active", "deleted"]
    ads = [ad(i, product=i % 13, status=statuses[i % 5]) for i in range(120)]
    ads[8]["title"] = "Shiny Beacon lamp"
    stale = rows_df(spark, ads).selectExpr("*", "999L AS product_active_ads", "-1.0 AS product_best_bid")
    commits = write_index_shards(stale, store_config, "full", "v-1", 4)  # the tasks compute features
    assert [c.shard for c in commits] == [0, 1, 2, 3]
    expected = {a["ad_id"]: a for a in with_features(ads)}

    listed = {o.key for o in store.list(layout.version_prefix("full", "v-1")).objects}
    assert listed == {f.key for c in commits for f in c.files}  # everything uploaded is in a commit
    assert not [k for k in listed if is_lock_file(k)]
    shard_of_product: dict[str, set[int]] = defaultdict(set)
    found_beacon = []
    for c in commits:
        prefix = layout.shard_prefix("full", "v-1", c.shard, c.attempt)
        names = [f.key[len(prefix):] for f in c.files]
        assert names[-2:] == [DOCS_FILE, COVERED_FILE]
        assert all(n.startswith(INDEX_DIR) for n in names[:-2])
        assert f"{INDEX_DIR}meta.json" in names
        idx_dir = download_shard(store, c, tmp_path / "dl")
        index = open_index(str(idx_dir))
        docs = all_docs(index)
        assert len(docs) == c.doc_count
        searcher = index.searcher()
        active_ads = searcher.fast_field_values("product_active_ads", [addr for _, addr in docs])
        best_bids = searcher.fast_field_values("product_best_bid", [addr for _, addr in docs])
        for (doc, _), n_active, best in zip(docs, active_ads, best_bids, strict=True):
            want = expected[doc["ad_id"][0]]
            assert want["status"] == "active"
            assert doc["title"] == [want["title"]] and doc["product_id"] == [want["product_id"]]
            assert doc["bid"] == [want["bid"]] and doc["version"] == [want["version"]]
            assert "keywords" not in doc  # indexed, not stored
            assert (n_active, best) == (want["product_active_ads"], want["product_best_bid"])
        q = index.parse_query("beacon", ["title", "keywords"])
        found_beacon += [searcher.doc(a).get_first("ad_id") for _, a in searcher.search(q, 5, count=False).hits]
        covered = pq.read_table(io.BytesIO(store.get(c.files[-1].key).data)).to_pylist()
        assert len(covered) == c.covered_count
        for row in covered:
            assert row["status"] == expected[row["ad_id"]]["status"]
            shard_of_product[expected[row["ad_id"]]["product_id"]].add(c.shard)
        docs_pq = pq.read_table(io.BytesIO(store.get(c.files[-2].key).data))
        assert docs_pq.num_rows == c.doc_count
    assert found_beacon == ["ad-0008"]
    assert len(shard_of_product) == 13 and all(len(s) == 1 for s in shard_of_product.values())
    assert sum(c.covered_count for c in commits) == 120
    assert sum(c.doc_count for c in commits) == sum(a["status"] == "active" for a in ads)


def test_empty_shards_and_docs_roundtrip(spark: SparkSession, local_store_config: StoreConfig, tmp_path: Path) -> None:
    store = open_store(local_store_config)
    ads = [ad(i, product=7, status="active" if i % 4 else "paused") for i in range(6)]  # one product
    commits = write_index_shards(rows_df(spark, ads), local_store_config, "delta", "v-2", 4)
    assert sorted(c.covered_count for c in commits) == [0, 0, 0, 6]
    for c in commits:  # empty shards are valid, openable, empty indexes
        index = open_index(str(download_shard(store, c, tmp_path / "dl")))
        assert index.searcher().num_docs == c.doc_count
    manifest = {"shards": [c.to_dict() for c in commits]}
    back = sorted((r.asDict() for r in read_version_docs(spark, local_store_config, manifest).collect()),
                  key=lambda r: r["ad_id"])
    assert [r["ad_id"] for r in back] == [a["ad_id"] for a in ads if a["status"] == "active"]
    assert {k: v for k, v in back[0].items() if k != "updated_at"} == {
        k: v for k, v in ads[1].items() if k != "updated_at"}

    nothing = rows_df(spark, ads).filter("version > 100")
    empty = write_index_shards(nothing, local_store_config, "delta", "v-3", 2)
    assert [(c.shard, c.doc_count, c.covered_count) for c in empty] == [(0, 0, 0), (1, 0, 0)]
    with pytest.raises(ValueError):
        write_index_shards(nothing, local_store_config, "delta", "../x", 2)


def test_a_delta_shards_kill_list_is_written_in_id_order(local_store_config: StoreConfig) -> None:
    store = open_store(local_store_config)
    # ids arrive out of order, across batches, with the row group boundary inside none of them
    ads = [ad(i, product=i % 5, status="deleted" if i % 7 == 0 else "active", version=i) for i in range(300)]
    ads.reverse()
    rows = pa.Table.from_pylist([{c: a[c] for c in COLUMNS} for a in ads], schema=DOCS_ARROW_SCHEMA)

    def covered(index: str) -> pa.Table:
        commit = write_one_index_shard(local_store_config, index, f"v-{index}", 0, 0,
                                       rows.to_batches(max_chunksize=64))
        key = next(f.key for f in commit.files if f.key.endswith(COVERED_FILE))
        return pq.read_table(io.BytesIO(store.get(key).data))

    delta = covered("delta")
    assert delta.column("ad_id").to_pylist() == sorted(a["ad_id"] for a in ads)
    by_id = {a["ad_id"]: (a["status"], a["version"]) for a in ads}  # each row's columns moved with its id
    assert all(by_id[r["ad_id"]] == (r["status"], r["version"]) for r in delta.to_pylist())
    # a full shard's covered file is no reader's kill-list: written as it came
    assert covered("full").column("ad_id").to_pylist() == [a["ad_id"] for a in ads]


def test_product_features_and_expand_to_products(spark: SparkSession) -> None:
    full = [
        ad(1, 1, bid=2.0), ad(2, 1, bid=5.0), ad(3, 1, bid=9.0, status="paused"),
        ad(4, 2, bid=1.0), ad(5, 2, bid=3.0),
        ad(6, 3, bid=7.0),
        ad(7, 4, bid=4.0),
    ]
    feats = features_of(full)
    assert feats["ad-0001"] == (2, 5.0) and feats["ad-0003"] == (2, 5.0)  # paused ad: counted out
    assert feats["ad-0004"] == (2, 3.0) and feats["ad-0006"] == (1, 7.0)

    full_docs = rows_df(spark, [a for a in full if a["status"] == "active"])  # what docs.parquet holds
    window = [
        ad(2, 1, bid=1.5, version=2, title="new title"),  # product 1 touched: ads 1 and 2 re-emitted
        ad(5, 2, status="deleted", version=2),  # product 2 touched: ad 4 re-emitted with 1 active ad
        ad(7, 5, bid=6.0, version=2),  # ad 7 moved from product 4 to 5: both touched
        ad(8, 6, bid=1.0, version=2),  # a brand-new ad of a new product
    ]
    rows = {r["ad_id"]: r.asDict() for r in expand_to_products(rows_df(spark, window), full_docs).collect()}
    assert sorted(rows) == ["ad-0001", "ad-0002", "ad-0004", "ad-0005", "ad-0007", "ad-0008"]  # not 3 or 6
    assert rows["ad-0002"]["title"] == "new title" and rows["ad-0002"]["version"] == 2
    feats = features_of(list(rows.values()))  # what the shard tasks attach to these rows
    assert feats["ad-0001"] == (2, 2.0)
    assert feats["ad-0004"] == (1, 1.0)
    assert rows["ad-0005"]["status"] == "deleted" and feats["ad-0005"] == (1, 1.0)
    assert rows["ad-0007"]["product_id"] == "p-005" and feats["ad-0007"] == (1, 6.0)
    # a stale window row never overrides a newer full row
    stale = expand_to_products(rows_df(spark, [ad(1, 1, bid=0.5, version=0)]), full_docs)
    assert {r["ad_id"]: r["bid"] for r in stale.collect()} == {"ad-0001": 2.0, "ad-0002": 5.0}


def test_add_document_and_builder(tmp_path: Path) -> None:
    builder = IndexBuilder(str(tmp_path / "idx"))
    row = with_features([ad(1, 1, keywords=["Red", "running-shoes"], title="Trail Runner")])[0]
    add_document(builder.writer, row)
    builder.docs += 1
    assert builder.finish() == 1
    files = builder.files()
    assert "meta.json" in files and not [f for f in files if is_lock_file(f)]
    assert any(n.endswith(".store") for n in files)
    index = open_index(str(tmp_path / "idx"))
    s = index.searcher()
    for q in ("runner", "keywords:shoes", "red", "ad_id:ad-0001", "product_id:p-001", "status:active"):
        assert len(s.search(index.parse_query(q, ["title", "keywords"]), 3, count=False).hits) == 1, q
    assert len(s.search(index.parse_query("bid:[2 TO 3]", ["title"]), 3, count=False).hits) == 0
    assert schema() is schema()
