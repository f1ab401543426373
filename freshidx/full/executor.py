"""A full version built from the published state, one product bucket per task
(docs/architecture.md#full-index-from-state; when it applies: :mod:`freshidx.full.full_plan`).

The serving full version's shards are its product buckets: a full build sends every product to shard
``pmod(hash(xxhash64(product_id)), N)`` (Spark's hash partitioning of ``shard_rows``), so one product's
ads are in one shard. The new version keeps that split. Task b:

* reads bucket b of the serving full version itself (its ``docs.parquet`` and ``covered.parquet``: no
  shuffle of the state),
* receives the changed rows of bucket b: the latest row per ad over the used segments (Spark aggregates
  the segments' rows, the size of the change), and a copy of every changed ad id, the small pass that
  tells it which of its ads have a newer row elsewhere (an ad that moved to another product's bucket
  leaves this one, whatever bucket it moved to),
* writes shard b of the new version: its own ads minus the changed ones, plus the changed rows of its
  bucket, with product features computed over whole products as in every build. Its index extends a copy
  of shard b's index, indexing again only the ads whose document changed and the ads of products whose
  features changed (:mod:`freshidx.spark.index_reuse`), unless too many of its documents would then be
  deleted ones.

A segment's row for an ad is at least the full version's (``full_plan`` only lays segments that knew
everything the full version knows), so the changed row always wins and no task needs another bucket's
rows. One marker row per bucket makes every task run even when nothing of its bucket changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from freshidx.delta.executor.segment_parts import label_of_part
from freshidx.delta.segments import Segment
from freshidx.spark import transform
from freshidx.spark.index_format import INDEX_DIR
from freshidx.spark.index_reuse import IndexBase
from freshidx.spark.index_shards import (
    StateWritten,
    read_state_files,
    state_file_rows,
    version_files,
    write_one_index_shard,
)
from freshidx.spark.shards import (
    COVERED_FILE,
    DOCS_ARROW_SCHEMA,
    DOCS_FILE,
    ShardCommit,
    ShardFile,
    ShardWriter,
    conform,
    write_sharded,
)
from freshidx.store import StoreConfig

#: Columns of the rows sent to bucket tasks besides the record: its bucket, and whether it only names a
#: changed ad (a copy sent to every bucket) or is the ad's new row.
TO_COLUMN = "_freshidx_bucket"
KEY_COLUMN = "_freshidx_key_only"
_LABEL = "_freshidx_label"
_BATCH_ROWS = 131072


def bucket_of(product_id: Any, num_shards: int) -> Any:
    """The shard a full build sends a product to: Spark's hash partitioning of ``xxhash64(product_id)``
    (``index_shards.shard_rows``) is ``pmod(murmur3(xxhash64(product_id)), N)``, and ``hash`` is murmur3."""
    return F.pmod(F.hash(F.xxhash64(product_id)), F.lit(num_shards))


def bucket_shards(spark: SparkSession, store_config: StoreConfig, full_shards: Sequence[dict[str, Any]],
                  segments: Sequence[Segment], *, index: str, version: str,
                  reuse_deleted_share: float, written: StateWritten | None = None) -> list[ShardCommit]:
    """Stage ``len(full_shards)`` shards: the full version whose shards (ShardCommit dicts, one per bucket)
    are ``full_shards``, with the latest rows of ``segments`` (oldest first) laid over it. Each extends its
    bucket's index while its deleted share stays within ``reuse_deleted_share`` (:mod:`freshidx.spark.index_reuse`)."""
    num_shards = len(full_shards)
    files = _bucket_files(full_shards)
    seg_keys = [(k, kind) for s in segments for kind in (DOCS_FILE, COVERED_FILE)
                for k in version_files({"shards": s.shards}, kind)]
    changed = transform.latest_per_ad(read_state_files(spark, store_config, seg_keys)).select(*transform.TYPED_FIELDS)
    rows = _to_buckets(spark, changed, num_shards)
    return write_sharded(rows, store_config, num_shards,
                         _bucket_writer(files, index, version, written, reuse_deleted_share),
                         what="full_from_state")


@dataclass(frozen=True)
class BucketFiles:
    """What a bucket task reads of the serving full version's shard: its state files and its index files."""

    docs_key: str
    covered_key: str
    index: tuple[ShardFile, ...]


def _bucket_files(full_shards: Sequence[dict[str, Any]]) -> dict[int, BucketFiles]:
    out: dict[int, BucketFiles] = {}
    for s in full_shards:
        files = [ShardFile.from_dict(f) for f in s["files"]]
        keys = {f.key.rsplit("/", 1)[-1]: f.key for f in files}
        if DOCS_FILE not in keys or COVERED_FILE not in keys:
            raise ValueError(f"full shard {s['shard']} lacks {DOCS_FILE} or {COVERED_FILE}: build it from raw")
        index = tuple(f for f in files if "/" + INDEX_DIR in f.key)
        out[int(s["shard"])] = BucketFiles(keys[DOCS_FILE], keys[COVERED_FILE], index)
    if sorted(out) != list(range(len(full_shards))):
        raise ValueError(f"full shards are not 0..{len(full_shards) - 1}: {sorted(out)}")
    return out


def _to_buckets(spark: SparkSession, changed: DataFrame, num_shards: int) -> DataFrame:
    """``changed`` rows to their bucket, every changed ad id to every bucket, one marker per bucket; split
    into ``num_shards`` partitions, partition b holding what bucket b's task needs."""
    bucket = bucket_of(F.col("product_id"), num_shards).cast("int")
    own = changed.select(*transform.TYPED_FIELDS, bucket.alias(TO_COLUMN), F.lit(False).alias(KEY_COLUMN))
    everywhere = F.explode(F.sequence(F.lit(0), F.lit(num_shards - 1)))
    ids = changed.select("ad_id", everywhere.alias(TO_COLUMN), F.lit(True).alias(KEY_COLUMN))
    markers = spark.range(num_shards).select(F.lit(None).cast("string").alias("ad_id"),
                                             F.col("id").cast("int").alias(TO_COLUMN), F.lit(True).alias(KEY_COLUMN))
    sent = own.unionByName(ids.unionByName(markers), allowMissingColumns=True)
    labels = F.array(*(F.lit(v) for v in label_of_part(num_shards)))
    return sent.withColumn(_LABEL, F.element_at(labels, F.col(TO_COLUMN) + 1)).repartition(num_shards, _LABEL)


def _bucket_writer(files: dict[int, BucketFiles], index: str, version: str,
                   written: StateWritten | None, reuse_deleted_share: float) -> ShardWriter:
    def write(config: StoreConfig, shard: int, attempt: int, batches: Iterable[pa.RecordBatch]) -> ShardCommit:
        received = pa.Table.from_batches(list(batches))
        targets = set(pc.unique(received.column(TO_COLUMN)).to_pylist()) if received.num_rows else set()
        if targets != {shard}:
            # Spark's hash partitioning is not what label_of_part computed: refuse rather than mix buckets.
            raise RuntimeError(f"bucket task {shard} received rows of buckets {sorted(targets)}")
        key_only = received.column(KEY_COLUMN)
        gone = pc.unique(received.filter(key_only).column("ad_id").drop_null())
        new_rows = received.filter(pc.invert(key_only))
        mine = files[shard]
        base = IndexBase(list(mine.index), new_ids=new_rows.column("ad_id").combine_chunks(),
                         max_deleted_share=reuse_deleted_share)
        rows = _bucket_rows(config, mine, gone, new_rows, base)
        return write_one_index_shard(config, index, version, shard, attempt, rows, written=written, base=base)

    return write


def _bucket_rows(config: StoreConfig, files: BucketFiles, gone: pa.Array, new_rows: pa.Table,
                 base: IndexBase) -> Iterator[pa.RecordBatch]:
    """The bucket's rows of the new version: the full version's ads not in ``gone`` (active ones whole from
    ``docs.parquet``, paused/deleted ones from ``covered.parquet``), then ``new_rows``. Streamed batch by
    batch (the writer spills them to disk), so a task holds one batch of its bucket, not the bucket. The
    full version's active rows go to ``base`` on the way (what its index serves)."""
    fs = config.arrow_fs()
    for key, kind in ((files.docs_key, DOCS_FILE), (files.covered_key, COVERED_FILE)):
        for b in state_file_rows(fs, config, key, kind, _BATCH_ROWS):
            # is_in hashes ``gone`` per call: large batches keep that small next to the probing.
            newer = pc.is_in(b.column("ad_id"), value_set=gone).fill_null(False)
            if kind == DOCS_FILE:
                base.add_old(b, newer)
            yield b.filter(pc.invert(newer))
    for b in new_rows.to_batches():
        yield conform(b, DOCS_ARROW_SCHEMA)
