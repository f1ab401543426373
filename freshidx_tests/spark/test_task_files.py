"""What every shard task writes and how it runs (freshidx.spark.task_files): Parquet written with
dictionaries only where values repeat and without statistics, read back exactly; a task's Arrow pool
sized to the cores Spark gave it (local Spark)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from freshidx.spark.shards import COVERED_ARROW_SCHEMA, DOCS_ARROW_SCHEMA
from freshidx.spark.task_files import DICTIONARY_COLUMNS, BufferedParquet


def _docs(n: int) -> pa.Table:
    at = dt.datetime(2026, 11, 29, tzinfo=dt.UTC)
    return pa.table({
        "ad_id": [f"ad-{i}" for i in range(n)], "campaign_id": [f"c-{i % 3}" for i in range(n)],
        "product_id": [f"p-{i % 5}" if i % 7 else None for i in range(n)], "title": [f"title {i}" for i in range(n)],
        "keywords": [["red", "shoe"] if i % 2 else None for i in range(n)], "bid": [i / 4 for i in range(n)],
        "status": ["active", "paused"] * (n // 2), "updated_at": [at] * n, "version": list(range(n)),
    }, schema=DOCS_ARROW_SCHEMA)


def test_parquet_dictionaries_only_where_values_repeat_and_no_statistics(tmp_path: Path) -> None:
    docs = _docs(1000)
    out = BufferedParquet(str(tmp_path / "docs.parquet"), DOCS_ARROW_SCHEMA)
    out.write(docs.to_batches()[0])
    out.close()
    assert pq.read_table(out.path).equals(docs)
    group = pq.ParquetFile(out.path).metadata.row_group(0)
    columns = {group.column(i).path_in_schema: group.column(i) for i in range(group.num_columns)}
    dictionary = {p for p, c in columns.items() if any("DICT" in e for e in c.encodings)}
    assert dictionary == {"campaign_id", "product_id", "status", "keywords.list.element"}
    assert {p.split(".")[0] for p in dictionary} == set(DICTIONARY_COLUMNS)
    assert not [p for p, c in columns.items() if c.is_stats_set]
    covered = BufferedParquet(str(tmp_path / "covered.parquet"), COVERED_ARROW_SCHEMA)  # a schema with fewer of them
    covered.close()
    assert pq.read_table(covered.path).schema.equals(COVERED_ARROW_SCHEMA)


def test_a_file_written_in_order_holds_its_rows_only_up_to_a_bound(tmp_path: Path) -> None:
    docs = _docs(1000).select(COVERED_ARROW_SCHEMA.names).cast(COVERED_ARROW_SCHEMA)
    shuffled = docs.take(pa.array([(i * 7919) % 1000 for i in range(1000)]))  # every row once, out of order
    ids = shuffled.column("ad_id").to_pylist()

    def written(name: str, max_rows: int) -> tuple[BufferedParquet, pa.Table]:
        out = BufferedParquet(str(tmp_path / name), COVERED_ARROW_SCHEMA, sort_by="ad_id", sorted_rows_max=max_rows)
        for batch in shuffled.to_batches(max_chunksize=64):
            out.write(batch)
        out.close()
        return out, pq.read_table(out.path)

    small, back = written("in-order.parquet", 1000)
    assert small.ordered and back.column("ad_id").to_pylist() == sorted(ids)  # byte order ("ad-10" < "ad-2")
    by_id = {r["ad_id"]: r for r in docs.to_pylist()}
    assert all(by_id[r["ad_id"]] == r for r in back.to_pylist())  # each row moved whole
    large, back = written("as-came.parquet", 999)
    assert not large.ordered and back.column("ad_id").to_pylist() == ids


def test_a_task_sizes_arrows_pool_to_its_cores(spark: SparkSession) -> None:
    def task(batches):  # type: ignore[no-untyped-def]
        from freshidx.spark.task_files import use_task_cores

        for _ in batches:
            pass
        pa.set_cpu_count(4)  # as a worker that ran something else may have left it
        yield pa.RecordBatch.from_pydict({"cores": [use_task_cores()], "pool": [pa.cpu_count()]})

    rows = spark.range(0, 2, 1, 2).mapInArrow(task, "cores long, pool long").collect()
    assert [(r.cores, r.pool) for r in rows] == [(1, 1), (1, 1)]  # spark.task.cpus = 1
