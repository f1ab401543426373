"""Executor-side writers: shards (docs + covered Parquet with commit messages) and quarantine files."""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
from collections import Counter
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import DataFrame, SparkSession

from freshidx import raw_record as R
from freshidx.spark.shards import (
    COVERED_ARROW_SCHEMA,
    COVERED_FILE,
    DOCS_ARROW_SCHEMA,
    DOCS_FILE,
    QuarantineCommit,
    ShardCommit,
    ShardFile,
    quarantine_key,
    write_quarantine,
)
from freshidx.spark.transform import INVALID_COLUMNS
from freshidx.store import ObjectStore, StoreConfig, layout, open_store
from freshidx.store.partitions import PartitionId
from freshidx_tests.support.parquet_shards import write_empty_shards, write_shards

LATEST_DDL = (
    "ad_id string, campaign_id string, product_id string, title string, keywords array<string>, "
    "bid double, status string, updated_at timestamp, version long, partition string"
)
P = [f"year=2026/month=11/day=21/hour=14/minute={m:02d}" for m in (0, 5, 10, 15)]
T0 = dt.datetime(2026, 11, 21, 14, 5, 7, 123000, tzinfo=dt.UTC)


def ad(i: int, product: int, status: str = "active") -> dict[str, Any]:
    return {
        "ad_id": f"ad-{i:04d}", "campaign_id": f"c-{i % 3}", "product_id": f"p-{product:03d}",
        "title": f"title {i} ü", "keywords": None if i % 5 == 0 else [f"k{i}", "x"], "bid": i / 4,
        "status": status, "updated_at": T0 + dt.timedelta(seconds=i), "version": i % 7, "partition": P[i % 2],
    }


def latest_df(spark: SparkSession, ads: list[dict[str, Any]]) -> DataFrame:
    cols = [c.split()[0] for c in LATEST_DDL.split(", ")]
    return spark.createDataFrame([tuple(a[c] for c in cols) for a in ads], LATEST_DDL)


def read_parquet(store: ObjectStore, f: ShardFile) -> Any:
    data = store.get(f.key).data
    assert len(data) == f.bytes
    assert hashlib.sha256(data).hexdigest() == f.sha256
    table = pq.read_table(io.BytesIO(data))
    assert table.num_rows == f.rows
    return table


def check_commits(store: ObjectStore, commits: list[ShardCommit], index: str, version: str, n: int) -> list[Any]:
    """Common invariants; returns [(docs table, covered table)] per shard."""
    assert [c.shard for c in commits] == list(range(n))
    out = []
    for c in commits:
        prefix = layout.shard_prefix(index, version, c.shard, c.attempt)
        assert [f.key for f in c.files] == [prefix + DOCS_FILE, prefix + COVERED_FILE]
        docs, covered = (read_parquet(store, f) for f in c.files)
        assert docs.schema == DOCS_ARROW_SCHEMA and covered.schema == COVERED_ARROW_SCHEMA
        assert (docs.num_rows, covered.num_rows) == (c.doc_count, c.covered_count)
        for f in c.files:
            meta = pq.ParquetFile(io.BytesIO(store.get(f.key).data)).metadata
            assert all(meta.row_group(g).column(0).compression == "ZSTD" for g in range(meta.num_row_groups))
            assert meta.num_row_groups == (1 if f.rows else 0)
        out.append((docs, covered))
        assert ShardCommit.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    return out


def test_write_shards(spark: SparkSession, store_config: StoreConfig, store: ObjectStore) -> None:
    statuses = ["active", "active", "paused", "active", "deleted"]
    ads = [ad(i, product=i % 13, status=statuses[i % 5]) for i in range(120)]
    commits = write_shards(latest_df(spark, ads), store_config, "delta", "v-20261121T1405", 4)
    tables = check_commits(store, commits, "delta", "v-20261121T1405", 4)

    assert sum(c.covered_count for c in commits) == len(ads)
    assert sum(c.doc_count for c in commits) == sum(a["status"] == "active" for a in ads)
    products_per_shard = [set(cov_docs[1].column("ad_id").to_pylist()) for cov_docs in tables]
    # a product's ads all land in one shard
    shard_of_product: dict[str, set[int]] = {}
    for shard, ids in enumerate(products_per_shard):
        for a in ads:
            if a["ad_id"] in ids:
                shard_of_product.setdefault(a["product_id"], set()).add(shard)
    assert len(shard_of_product) == 13 and all(len(s) == 1 for s in shard_of_product.values())

    fields = [f.name for f in DOCS_ARROW_SCHEMA]
    got_docs = sorted((r for d, _ in tables for r in d.to_pylist()), key=lambda r: r["ad_id"])
    want_docs = [{k: a[k] for k in fields} for a in ads if a["status"] == R.ACTIVE]
    assert got_docs == want_docs
    got_cov = sorted(r for _, c in tables for r in (tuple(x.values()) for x in c.to_pylist()))
    assert got_cov == sorted((a["ad_id"], a["status"], a["version"], a["updated_at"]) for a in ads)


def test_empty_shards_still_commit(spark: SparkSession, local_store_config: StoreConfig) -> None:
    store = open_store(local_store_config)
    ads = [ad(i, product=7) for i in range(5)]  # one product: one non-empty shard out of 6
    commits = write_shards(latest_df(spark, ads), local_store_config, "full", "v1", 6)
    check_commits(store, commits, "full", "v1", 6)
    assert sorted(c.covered_count for c in commits) == [0, 0, 0, 0, 0, 5]


def test_input_already_partitioned_by_product(
    spark: SparkSession, local_store_config: StoreConfig, caplog: pytest.LogCaptureFixture
) -> None:
    # Grouping by product_id leaves the data hash-partitioned by it into spark.sql.shuffle.partitions
    # (4) partitions; a plain repartition(4, "product_id") would then be dropped and adaptive execution
    # would coalesce the tiny aggregation shuffle into one task. Every shard must still get its own task.
    from pyspark.sql import functions as F

    store = open_store(local_store_config)
    ads = [ad(i, product=i % 5) for i in range(40)]
    others = [c.split()[0] for c in LATEST_DDL.split(", ") if not c.startswith("product_id")]
    grouped = (
        latest_df(spark, ads).groupBy("product_id")
        .agg(F.collect_list(F.struct(*others)).alias("rows"))
        .select("product_id", F.explode("rows").alias("r"))
        .select("product_id", *[F.col("r")[c].alias(c) for c in others])
    )
    caplog.set_level("INFO", logger="freshidx.spark.shards")
    commits = write_shards(grouped, local_store_config, "delta", "v4", 4)
    check_commits(store, commits, "delta", "v4", 4)
    assert sum(c.covered_count for c in commits) == 40
    assert not [r for r in caplog.records if "received no task" in r.getMessage()]


def test_all_empty_input_after_aggregation(spark: SparkSession, local_store_config: StoreConfig) -> None:
    from freshidx.spark.transform import latest_per_ad

    store = open_store(local_store_config)
    empty = latest_per_ad(latest_df(spark, [ad(1, 1)]).filter("version > 100"))
    commits = write_shards(empty, local_store_config, "delta", "v2", 3)
    check_commits(store, commits, "delta", "v2", 3)
    assert all(c.doc_count == 0 and c.covered_count == 0 for c in commits)


def test_write_empty_shards(spark: SparkSession, local_store_config: StoreConfig) -> None:
    # The fallback write_shards uses for shards whose task Spark skipped (empty input).
    store = open_store(local_store_config)
    commits = write_empty_shards(spark, local_store_config, "delta", "v3", [1, 3, 4])
    assert [c.shard for c in commits] == [1, 3, 4]
    for c in commits:
        prefix = layout.shard_prefix("delta", "v3", c.shard, c.attempt)
        assert [f.key for f in c.files] == [prefix + DOCS_FILE, prefix + COVERED_FILE]
        assert (c.doc_count, c.covered_count) == (0, 0)
        docs, covered = (read_parquet(store, f) for f in c.files)
        assert (docs.schema, covered.schema) == (DOCS_ARROW_SCHEMA, COVERED_ARROW_SCHEMA)


def test_write_shards_rejects_bad_names(spark: SparkSession, local_store_config: StoreConfig) -> None:
    df = latest_df(spark, [ad(1, 1)])
    for index, version in (("../x", "v"), ("delta", "a/b"), ("delta", "..")):
        with pytest.raises(ValueError):
            write_shards(df, local_store_config, index, version, 2)
    with pytest.raises(ValueError):
        write_shards(df, local_store_config, "delta", "v", 0)


def invalid_df(spark: SparkSession) -> DataFrame:
    rows = [
        (P[0], "raw/a/0.jsonl", 1, "{", R.REASON_MALFORMED_JSON),
        (P[1], "raw/a/1.jsonl", 2, '{"x": "é"}', f"{R.REASON_MISSING_FIELD}:ad_id"),
        (P[1], "raw/a/1.jsonl", 1, "[1]", R.REASON_MALFORMED_JSON),
        (P[1], "raw/a/2.jsonl", 9, '{"bid": "abc"}', R.REASON_BAD_BID),
        (P[2], "raw/a/3.jsonl", 4, "oops", R.REASON_MALFORMED_JSON),
        (P[3], "raw/a/4.jsonl", 1, "x\ufffd", R.REASON_BAD_ENCODING),
    ]
    return spark.createDataFrame(rows, ", ".join(f"{c} {'long' if c == 'line' else 'string'}" for c in INVALID_COLUMNS))


def test_write_quarantine(spark: SparkSession, store_config: StoreConfig, store: ObjectStore) -> None:
    commits = write_quarantine(invalid_df(spark), store_config, "ads", "run-1", after_partition=P[0])
    assert [c.partition for c in commits] == P[1:]
    for c in commits:
        prefix = layout.quarantine_prefix("ads", PartitionId.parse(c.partition), "run-1")
        assert c.key.startswith(prefix) and c.key.endswith(".jsonl")
        assert QuarantineCommit.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    by_p = {c.partition: c for c in commits}
    assert by_p[P[1]].records == 3
    assert by_p[P[1]].reasons == {
        R.REASON_MALFORMED_JSON: 1, f"{R.REASON_MISSING_FIELD}:ad_id": 1, R.REASON_BAD_BID: 1,
    }
    assert (by_p[P[2]].records, by_p[P[2]].reasons) == (1, {R.REASON_MALFORMED_JSON: 1})
    lines = [json.loads(x) for x in store.get(by_p[P[1]].key).data.decode().splitlines()]
    v = {"format_version": 1}  # each line is a versioned store record (freshidx.store.records)
    assert lines == [  # file, line order
        {**v, "file": "raw/a/1.jsonl", "line": 1, "raw": "[1]", "reason": R.REASON_MALFORMED_JSON},
        {**v, "file": "raw/a/1.jsonl", "line": 2, "raw": '{"x": "é"}', "reason": f"{R.REASON_MISSING_FIELD}:ad_id"},
        {**v, "file": "raw/a/2.jsonl", "line": 9, "raw": '{"bid": "abc"}', "reason": R.REASON_BAD_BID},
    ]
    assert json.loads(store.get(by_p[P[3]].key).data)["raw"] == "x\ufffd"
    # nothing written for the partition at or before after_partition
    assert store.list("quarantine/ads/" + P[0] + "/").objects == []
    written = sorted(o.key for o in store.list("quarantine/").objects)
    assert written == sorted(c.key for c in commits)


def test_write_quarantine_all_and_nothing(spark: SparkSession, local_store_config: StoreConfig) -> None:
    store = open_store(local_store_config)
    df = invalid_df(spark)
    assert write_quarantine(df, local_store_config, "ads", "run-2", after_partition=P[3]) == []
    assert store.list("quarantine/").objects == []
    commits = write_quarantine(df, local_store_config, "ads", "run-3", after_partition=None)
    assert [c.partition for c in commits] == P
    assert sum((Counter(c.reasons) for c in commits), Counter()) == Counter(
        r["reason"] for r in df.collect()
    )
    assert commits[0].key == quarantine_key("ads", P[0], "run-3", int(commits[0].key[-14:-9]), 0)
    with pytest.raises(ValueError):
        write_quarantine(df, local_store_config, "ads", "run/4", None)
    with pytest.raises(ValueError):
        write_quarantine(df, local_store_config, "ads", "run-4", "minute=5")
