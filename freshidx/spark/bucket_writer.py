"""Executor-side writer of hourly bucket parts (``ads_hourly``): Parquet files + commit messages.

A bucket version is ``parts`` zstd Parquet files of :data:`~freshidx.spark.shards.DOCS_ARROW_SCHEMA`
(every typed record field), rows hash-partitioned by ``ad_id`` and sorted by ``(ad_id, version)``
inside each part. Each Spark task writes one part straight to the store and yields one small commit
message (a :class:`~freshidx.spark.shards.ShardCommit` whose ``shard`` is the part number); the driver
collects only those. The attempt number is in every key (:func:`freshidx.layout.bucket_part_key`), so a
retried task never overwrites the upload of another attempt, and only the attempts that reported a
commit end up in the manifest.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from freshidx import layout
from freshidx.spark.raw_source import store_from_json, store_to_json
from freshidx.spark.shards import (
    _SHARD_RESULT_DDL,
    DOCS_ARROW_SCHEMA,
    ShardCommit,
    _BufferedParquet,
    _check_name,
    _collect_commits,
    _conform,
    _shard_result,
    _task_ids,
    upload_file,
)
from freshidx.store import StoreConfig
from freshidx.transform import TYPED_FIELDS

__all__ = ["BUCKET_SORT", "write_bucket_parts", "write_empty_bucket_parts", "write_one_part"]

log = logging.getLogger(__name__)

#: Order of rows inside a part.
BUCKET_SORT = ("ad_id", "version")


def _check_hour(hour: dt.datetime) -> dt.datetime:
    if hour.tzinfo is None or hour.utcoffset() is None:
        raise ValueError(f"hour must be timezone-aware UTC, got {hour!r}")
    utc = hour.astimezone(dt.UTC)
    if (utc.minute, utc.second, utc.microsecond) != (0, 0, 0):
        raise ValueError(f"hour must be a whole UTC hour, got {hour.isoformat()}")
    return utc


def write_one_part(
    config: StoreConfig, asset: str, hour: dt.datetime, version: str, part: int, attempt: int,
    batches: Iterable[pa.RecordBatch],
) -> ShardCommit:
    """Write one part attempt from ``batches`` (already in order) and upload it. Runs on an executor."""
    fs = config.arrow_fs()
    key = layout.bucket_part_key(asset, hour, version, part, attempt)
    with tempfile.TemporaryDirectory(prefix="freshidx-bucket-") as tmp:
        out = _BufferedParquet(os.path.join(tmp, "part.parquet"), DOCS_ARROW_SCHEMA)
        try:
            for batch in batches:
                if batch.num_rows:
                    out.write(_conform(batch, DOCS_ARROW_SCHEMA))
        finally:
            out.close()
        file = upload_file(fs, config, out.path, key, out.rows)
    return ShardCommit(shard=part, attempt=attempt, doc_count=out.rows, covered_count=0, files=(file,))


def _part_task(
    store_json: str, asset: str, hour: dt.datetime, version: str, parts: int
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        part, attempt = _task_ids()
        if not 0 <= part < parts:
            raise RuntimeError(f"task partition {part} outside 0..{parts - 1}: parts must not be re-split")
        yield _shard_result(write_one_part(store_from_json(store_json), asset, hour, version, part, attempt, batches))

    return run


def _fill_task(
    store_json: str, asset: str, hour: dt.datetime, version: str
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    # Empty parts whose numbers come from the data (the tasks of this job are not parts).
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        _, attempt = _task_ids()
        config = store_from_json(store_json)
        for batch in batches:
            for part in batch.column("shard").to_pylist():
                yield _shard_result(write_one_part(config, asset, hour, version, int(part), attempt, []))

    return run


def write_bucket_parts(
    rows: DataFrame, store_config: StoreConfig, asset: str, hour: dt.datetime, version: str, parts: int
) -> list[ShardCommit]:
    """Write exactly ``parts`` Parquet parts of ``rows`` from Spark tasks; return commits sorted by part.

    ``rows`` needs the :data:`~freshidx.transform.TYPED_FIELDS` columns (others are dropped). Rows are
    hash-partitioned by ``ad_id`` (all versions of an ad in one part), sorted by ``(ad_id, version)``
    within a part. A part that receives no rows still gets an empty file (written by an executor).
    Each commit's ``shard`` is the part number, ``doc_count`` its rows, ``files`` its single file.
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    _check_name("asset", asset)
    _check_name("version", version)
    hour = _check_hour(hour)
    store_json = store_to_json(store_config)
    # An exchange on an expression (not the bare column) is never elided or coalesced, even if the
    # input is already partitioned by ad_id (e.g. grouped by it): exactly `parts` tasks.
    ordered = (
        rows.select(*TYPED_FIELDS)
        .repartition(parts, F.xxhash64("ad_id"))
        .sortWithinPartitions(*BUCKET_SORT)
    )
    task = _part_task(store_json, asset, hour, version, parts)
    commits = _collect_commits(ordered.mapInArrow(task, _SHARD_RESULT_DDL))
    seen = [c.shard for c in commits]
    if len(seen) != len(set(seen)):
        raise RuntimeError(f"more than one commit for a part: {sorted(seen)}")
    missing = sorted(set(range(parts)) - set(seen))
    if missing:
        # Spark may skip the tasks of an empty shuffle (adaptive execution propagating an empty
        # relation); those parts have no rows, so write them empty, still from executors.
        log.info("write_bucket_parts: %d part(s) received no task, writing them empty: %s", len(missing), missing)
        commits += write_empty_bucket_parts(rows.sparkSession, store_config, asset, hour, version, missing)
    commits.sort(key=lambda c: c.shard)
    if [c.shard for c in commits] != list(range(parts)):
        raise RuntimeError(f"expected parts 0..{parts - 1}, got {[c.shard for c in commits]}")
    return commits


def write_empty_bucket_parts(
    spark: SparkSession, store_config: StoreConfig, asset: str, hour: dt.datetime, version: str, parts: list[int]
) -> list[ShardCommit]:
    """Write empty part files for ``parts`` from Spark tasks; return their commits sorted by part."""
    _check_name("asset", asset)
    _check_name("version", version)
    hour = _check_hour(hour)
    if not parts:
        return []
    fill = spark.createDataFrame([(p,) for p in parts], "shard int").repartition(min(len(parts), 4))
    task = _fill_task(store_to_json(store_config), asset, hour, version)
    return sorted(_collect_commits(fill.mapInArrow(task, _SHARD_RESULT_DDL)), key=lambda c: c.shard)
