"""Executor-side writer of hourly bucket parts (``ads_hourly``): Parquet files + commit messages.

A bucket version is ``parts`` zstd Parquet files of :data:`~freshidx.spark.shards.DOCS_ARROW_SCHEMA`
(every typed record field), rows hash-partitioned by ``ad_id`` and sorted by ``(ad_id, version)``
inside each part. Each Spark task writes one part straight to the store and yields one small commit
message (a :class:`~freshidx.spark.shards.ShardCommit` whose ``shard`` is the part number); the driver
collects only those. The attempt number is in every key (:func:`freshidx.store.layout.bucket_part_key`), so a
retried task never overwrites the upload of another attempt, and only the attempts that reported a
commit end up in the manifest.

:func:`write_buckets_parts` writes the parts of several buckets (one per hour) in a single job, task
``bucket * parts + part`` writing one part of one bucket.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from freshidx.spark.raw_source import store_from_json, store_to_json
from freshidx.spark.shards import (
    DOCS_ARROW_SCHEMA,
    BufferedParquet,
    ShardCommit,
    check_name,
    conform,
    task_ids,
    upload_file,
)
from freshidx.spark.transform import TYPED_FIELDS
from freshidx.store import StoreConfig, layout

__all__ = ["BUCKET_SORT", "write_buckets_parts", "write_empty_bucket_parts", "write_one_part"]

log = logging.getLogger(__name__)

#: Order of rows inside a part.
BUCKET_SORT = ("ad_id", "version")

_PID = "_freshidx_part_id"  # target task of a row: bucket * parts + part
_BUCKET_RESULT_DDL = "bucket int, shard int, attempt int, commit string"
_BUCKET_RESULT_SCHEMA = pa.schema(
    [pa.field("bucket", pa.int32()), pa.field("shard", pa.int32()), pa.field("attempt", pa.int32()),
     pa.field("commit", pa.string())]
)


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
        out = BufferedParquet(os.path.join(tmp, "part.parquet"), DOCS_ARROW_SCHEMA)
        try:
            for batch in batches:
                if batch.num_rows:
                    out.write(conform(batch, DOCS_ARROW_SCHEMA))
        finally:
            out.close()
        file = upload_file(fs, config, out.path, key, out.rows)
    return ShardCommit(shard=part, attempt=attempt, doc_count=out.rows, covered_count=0, files=(file,))


def _bucket_result(bucket: int, commit: ShardCommit) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [
            pa.array([bucket], pa.int32()),
            pa.array([commit.shard], pa.int32()),
            pa.array([commit.attempt], pa.int32()),
            pa.array([json.dumps(commit.to_dict(), sort_keys=True)], pa.string()),
        ],
        schema=_BUCKET_RESULT_SCHEMA,
    )


def _part_task(
    store_json: str, asset: str, buckets: list[tuple[dt.datetime, str]], parts: int
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    # Task (partition) id = bucket * parts + part; every row carries the id it was routed by.
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task, attempt = task_ids()
        if not 0 <= task < len(buckets) * parts:
            raise RuntimeError(f"task partition {task} outside 0..{len(buckets) * parts - 1}: must not be re-split")
        bucket, part = divmod(task, parts)
        hour, version = buckets[bucket]

        def checked() -> Iterator[pa.RecordBatch]:
            for batch in batches:
                if batch.num_rows:
                    pid = batch.column(_PID)
                    lo_hi = pc.min_max(pid)
                    if pid.null_count or lo_hi["min"].as_py() != task or lo_hi["max"].as_py() != task:
                        raise RuntimeError(f"task {task} received rows routed to another part")
                yield batch

        commit = write_one_part(store_from_json(store_json), asset, hour, version, part, attempt, checked())
        yield _bucket_result(bucket, commit)

    return run


def _fill_task(
    store_json: str, asset: str, buckets: list[tuple[dt.datetime, str]]
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    # Empty parts whose (bucket, part) come from the data (the tasks of this job are not parts).
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        _, attempt = task_ids()
        config = store_from_json(store_json)
        for batch in batches:
            for bucket, part in zip(batch.column("bucket").to_pylist(), batch.column("shard").to_pylist(), strict=True):
                hour, version = buckets[int(bucket)]
                yield _bucket_result(int(bucket), write_one_part(config, asset, hour, version, int(part), attempt, []))

    return run


def _collect_bucket_commits(df: DataFrame) -> list[tuple[int, ShardCommit]]:
    return [(int(r["bucket"]), ShardCommit.from_dict(json.loads(r["commit"]))) for r in df.collect()]


def _check_buckets(asset: str, buckets: Sequence[tuple[dt.datetime, str]]) -> list[tuple[dt.datetime, str]]:
    check_name("asset", asset)
    out = [(_check_hour(hour), check_name("version", version)) for hour, version in buckets]
    if len({(layout.bucket_name(asset, h), v) for h, v in out}) != len(out):
        raise ValueError("the same bucket version is listed twice")
    return out


def write_buckets_parts(
    rows: DataFrame,
    store_config: StoreConfig,
    asset: str,
    buckets: Sequence[tuple[dt.datetime, str]],
    parts: int,
    *,
    bucket_col: str = "_bucket",
) -> list[list[ShardCommit]]:
    """Write exactly ``parts`` Parquet parts of each of ``buckets`` (``(hour, version)``) in ONE Spark job.

    ``rows`` needs the :data:`~freshidx.spark.transform.TYPED_FIELDS` columns and ``bucket_col``, the index
    into ``buckets`` of the bucket a row belongs to. The job has ``len(buckets) * parts`` tasks; task
    ``i`` writes part ``i % parts`` of bucket ``i // parts``, so a (bucket, part) that receives no rows
    still gets an empty file from its task. Inside a bucket, rows go to part
    ``pmod(murmur3(xxhash64(ad_id)), parts)`` — exactly the hash partitioning of
    ``repartition(parts, xxhash64(ad_id))``, so a bucket's parts do not depend on which other buckets
    were written in the same job — and are sorted by ``(ad_id, version)``. Returns, per bucket (same
    order), its commits sorted by part.
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    checked = _check_buckets(asset, buckets)
    if not checked:
        return []
    n = len(checked) * parts
    store_json = store_to_json(store_config)
    part = F.pmod(F.hash(F.xxhash64("ad_id")), F.lit(parts))
    pid = (F.col(bucket_col).cast("int") * F.lit(parts) + part).cast("int")
    # repartitionById routes a row to partition `pid` (no hashing), and a shuffle with an explicit
    # number of partitions is never coalesced by adaptive execution: exactly n tasks. A null or
    # out-of-range bucket would land in a wrong task; the task checks every row's id and fails.
    ordered = (
        rows.select(*TYPED_FIELDS, pid.alias(_PID))
        .repartitionById(n, _PID)
        .sortWithinPartitions(*BUCKET_SORT)
    )
    got = _collect_bucket_commits(ordered.mapInArrow(_part_task(store_json, asset, checked, parts), _BUCKET_RESULT_DDL))
    seen = [(b, c.shard) for b, c in got]
    if len(seen) != len(set(seen)):
        raise RuntimeError(f"more than one commit for a part: {sorted(seen)}")
    missing = sorted({(b, p) for b in range(len(checked)) for p in range(parts)} - set(seen))
    if missing:
        # Spark may skip the tasks of an empty shuffle (adaptive execution propagating an empty
        # relation); those parts have no rows, so write them empty, still from executors.
        log.info("write_buckets_parts: %d part(s) received no task, writing them empty: %s", len(missing), missing)
        got += _write_empty(rows.sparkSession, store_json, asset, checked, missing)
    out: list[list[ShardCommit]] = [[] for _ in checked]
    for b, c in got:
        out[b].append(c)
    for b, commits in enumerate(out):
        commits.sort(key=lambda c: c.shard)
        if [c.shard for c in commits] != list(range(parts)):
            raise RuntimeError(f"bucket {b}: expected parts 0..{parts - 1}, got {[c.shard for c in commits]}")
    return out


def _write_empty(
    spark: SparkSession, store_json: str, asset: str, buckets: list[tuple[dt.datetime, str]],
    pairs: list[tuple[int, int]],
) -> list[tuple[int, ShardCommit]]:
    fill = spark.createDataFrame(list(pairs), "bucket int, shard int").repartition(min(len(pairs), 4))
    return _collect_bucket_commits(fill.mapInArrow(_fill_task(store_json, asset, buckets), _BUCKET_RESULT_DDL))


def write_empty_bucket_parts(
    spark: SparkSession, store_config: StoreConfig, asset: str, hour: dt.datetime, version: str, parts: list[int]
) -> list[ShardCommit]:
    """Write empty part files for ``parts`` from Spark tasks; return their commits sorted by part."""
    buckets = _check_buckets(asset, [(hour, version)])
    if not parts:
        return []
    got = _write_empty(spark, store_to_json(store_config), asset, buckets, [(0, p) for p in parts])
    return sorted((c for _, c in got), key=lambda c: c.shard)
