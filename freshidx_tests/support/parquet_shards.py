"""A Parquet-only shard writer (``docs.parquet`` + ``covered.parquet``, no tantivy index), for tests.

The package builds tantivy shards (:mod:`freshidx.spark.index_shards`); tests use this smaller writer
to exercise the shared sharded-job machinery (:func:`freshidx.spark.shards.write_sharded`) and to make
versions without an index (what a Searcher must refuse).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from freshidx.raw_record import ACTIVE
from freshidx.spark.shards import (
    COVERED_ARROW_SCHEMA,
    COVERED_FILE,
    DOCS_ARROW_SCHEMA,
    DOCS_FILE,
    BufferedParquet,
    ShardCommit,
    ShardWriter,
    check_name,
    conform,
    upload_file,
    write_empty_sharded,
    write_sharded,
)
from freshidx.spark.transform import TYPED_FIELDS
from freshidx.store import StoreConfig, layout

# Spark's Python workers need not import freshidx_tests (it is not installed): ship this by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def write_one_shard(
    config: StoreConfig, index: str, version: str, shard: int, attempt: int,
    batches: Iterable[pa.RecordBatch],
) -> ShardCommit:
    """Write ``docs.parquet`` + ``covered.parquet`` of one shard attempt (runs on an executor)."""
    fs = config.arrow_fs()
    prefix = layout.shard_prefix(index, version, shard, attempt)
    with tempfile.TemporaryDirectory(prefix="freshidx-shard-") as tmp:
        docs = BufferedParquet(os.path.join(tmp, DOCS_FILE), DOCS_ARROW_SCHEMA)
        covered = BufferedParquet(os.path.join(tmp, COVERED_FILE), COVERED_ARROW_SCHEMA)
        try:
            for raw_batch in batches:
                if raw_batch.num_rows == 0:
                    continue
                batch = conform(raw_batch, DOCS_ARROW_SCHEMA)
                covered.write(conform(batch, COVERED_ARROW_SCHEMA))
                docs.write(batch.filter(pc.equal(batch.column("status"), ACTIVE)))
        finally:
            docs.close()
            covered.close()
        files = (
            upload_file(fs, config, docs.path, prefix + DOCS_FILE, docs.rows),
            upload_file(fs, config, covered.path, prefix + COVERED_FILE, covered.rows),
        )
    return ShardCommit(
        shard=shard, attempt=attempt, doc_count=docs.rows, covered_count=covered.rows, files=files
    )


def _writer(index: str, version: str) -> ShardWriter:
    def write(config: StoreConfig, shard: int, attempt: int, batches: Iterable[pa.RecordBatch]) -> ShardCommit:
        return write_one_shard(config, index, version, shard, attempt, batches)

    return write


def write_shards(
    latest: DataFrame, store_config: StoreConfig, index: str, version: str, num_shards: int
) -> list[ShardCommit]:
    """Write ``num_shards`` shards of ``latest`` (one row per ad, hash-partitioned by ``product_id``)
    from Spark tasks; every shard gets files and a commit, even an empty one. Commits sorted by shard."""
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    check_name("index", index)
    check_name("version", version)
    rows = latest.select(*TYPED_FIELDS).repartition(num_shards, F.xxhash64("product_id"))
    return write_sharded(rows, store_config, num_shards, _writer(index, version), what="write_shards")


def write_empty_shards(
    spark: SparkSession, store_config: StoreConfig, index: str, version: str, shards: list[int]
) -> list[ShardCommit]:
    """Write empty ``docs``/``covered`` files for ``shards`` from Spark tasks; return their commits."""
    check_name("index", index)
    check_name("version", version)
    return write_empty_sharded(spark, store_config, shards, _writer(index, version))
