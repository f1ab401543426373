"""Executor-side writing: the sharded-job machinery, each task returning a small commit message.

Spark tasks write the files straight to the store (``pyarrow.fs``) and yield one row of metadata per
file set; the driver collects only those rows. A version's manifest is built from these commit
messages, never from listing a prefix, so uploads of failed or retried task attempts (which carry the
attempt number in their keys) are never published.

:func:`write_sharded` runs one writer per shard (the tantivy shards of
:mod:`freshidx.spark.index_shards`); the file helpers are :mod:`freshidx.spark.task_files` (which
:mod:`freshidx.catchup.bucket_writer` reuses), the quarantine files :mod:`freshidx.spark.quarantine_writer`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

# Re-exported: what a shard writes is part of this module's interface (defined Spark-free for serving).
from freshidx.spark.index_format import COVERED_FILE as COVERED_FILE
from freshidx.spark.index_format import DOCS_ARROW_SCHEMA as DOCS_ARROW_SCHEMA
from freshidx.spark.index_format import DOCS_FILE as DOCS_FILE
from freshidx.spark.quarantine_writer import QuarantineCommit, quarantine_key, write_quarantine
from freshidx.spark.raw_source import store_from_json, store_to_json
from freshidx.spark.task_files import (
    BufferedParquet,
    ShardFile,
    check_name,
    conform,
    task_ids,
    upload_file,
    use_task_cores,
)
from freshidx.spark.transform import COVERED_COLUMNS, TYPED_FIELDS
from freshidx.store import StoreConfig

# Defined beside this module (the file helpers, the quarantine); its callers import them from here.
__all__ = [
    "COVERED_ARROW_SCHEMA",
    "COVERED_FILE",
    "DOCS_ARROW_SCHEMA",
    "DOCS_FILE",
    "BufferedParquet",
    "QuarantineCommit",
    "ShardCommit",
    "ShardFile",
    "ShardWriter",
    "check_name",
    "conform",
    "quarantine_key",
    "task_ids",
    "upload_file",
    "write_empty_sharded",
    "write_quarantine",
    "write_sharded",
]

log = logging.getLogger(__name__)

#: Arrow schema of ``covered.parquet`` (the shard's part of the kill-list).
COVERED_ARROW_SCHEMA = pa.schema([DOCS_ARROW_SCHEMA.field(c) for c in COVERED_COLUMNS])
assert tuple(DOCS_ARROW_SCHEMA.names) == TYPED_FIELDS

_SHARD_RESULT_DDL = "shard int, attempt int, commit string"
_SHARD_RESULT_SCHEMA = pa.schema(
    [pa.field("shard", pa.int32()), pa.field("attempt", pa.int32()), pa.field("commit", pa.string())]
)


# --------------------------------------------------------------------------- commit messages


@dataclass(frozen=True)
class ShardCommit:
    shard: int
    attempt: int
    doc_count: int
    covered_count: int
    files: tuple[ShardFile, ...]
    #: Where the task's time went (e.g. ``state``, ``merge``, ``index``, ``upload``), for the manifest's
    #: stats; not part of what the commit is.
    seconds: dict[str, float] = dataclasses.field(default_factory=dict, compare=False)
    #: What the task hands back besides its shard (e.g. a micro-batch's bookkeeping): carried to the driver,
    #: never written to a manifest (:meth:`to_dict` leaves it out, :meth:`to_message` keeps it).
    extra: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    def to_message(self) -> dict[str, Any]:
        """The task's result as the driver receives it: :meth:`to_dict` and :attr:`extra`."""
        return {**self.to_dict(), "extra": self.extra} if self.extra else self.to_dict()

    def to_dict(self) -> dict[str, Any]:
        out = {
            "shard": self.shard,
            "attempt": self.attempt,
            "doc_count": self.doc_count,
            "covered_count": self.covered_count,
            "files": [f.to_dict() for f in self.files],
        }
        return {**out, "seconds": self.seconds} if self.seconds else out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ShardCommit:
        return cls(
            shard=int(d["shard"]),
            attempt=int(d["attempt"]),
            doc_count=int(d["doc_count"]),
            covered_count=int(d["covered_count"]),
            files=tuple(ShardFile.from_dict(f) for f in d["files"]),
            seconds={str(k): float(v) for k, v in d.get("seconds", {}).items()},
            extra=dict(d.get("extra", {})),
        )


# --------------------------------------------------------------------------- sharded jobs

#: Writes one shard attempt on an executor: ``(config, shard, attempt, batches) -> commit``. Pickled
#: into the tasks: a module-level function or a closure over plain values.
ShardWriter = Callable[[StoreConfig, int, int, Iterable[pa.RecordBatch]], ShardCommit]


def _shard_result(commit: ShardCommit) -> pa.RecordBatch:
    """The one-row task result (:data:`_SHARD_RESULT_DDL`) carrying ``commit`` to the driver."""
    return pa.RecordBatch.from_arrays(
        [
            pa.array([commit.shard], pa.int32()),
            pa.array([commit.attempt], pa.int32()),
            pa.array([json.dumps(commit.to_message(), sort_keys=True)], pa.string()),
        ],
        schema=_SHARD_RESULT_SCHEMA,
    )


def _collect_commits(df: DataFrame) -> list[ShardCommit]:
    """Run a job of :func:`_shard_result` rows and decode its commits on the driver."""
    return [ShardCommit.from_dict(json.loads(row["commit"])) for row in df.collect()]


def _shard_task(
    store_json: str, num_shards: int, write: ShardWriter
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        shard, attempt = task_ids()
        use_task_cores()
        if not 0 <= shard < num_shards:
            raise RuntimeError(f"task partition {shard} outside 0..{num_shards - 1}: shards must not be re-split")
        yield _shard_result(write(store_from_json(store_json), shard, attempt, batches))

    return run


def _fill_task(store_json: str, write: ShardWriter) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    # Writes empty shards whose numbers come from the data (tasks of this job are not shards).
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        _, attempt = task_ids()
        config = store_from_json(store_json)
        for batch in batches:
            for shard in batch.column("shard").to_pylist():
                yield _shard_result(write(config, int(shard), attempt, []))

    return run


def write_sharded(
    rows: DataFrame, store_config: StoreConfig, num_shards: int, write: ShardWriter, *, what: str
) -> list[ShardCommit]:
    """Run ``write`` in one Spark task per partition of ``rows`` (partition i is shard i); return the
    commits sorted by shard, exactly one per shard ``0..num_shards-1``.

    ``rows`` must already be split into ``num_shards`` partitions (e.g. ``repartition(num_shards,
    F.xxhash64("product_id"))``: a hash expression, not the bare column, because if the input were
    already hash-partitioned by that column into ``num_shards`` partitions Spark would drop the
    repartition and adaptive execution could coalesce the remaining shuffle into fewer tasks; an
    exchange on an expression is always kept and a REPARTITION_BY_NUM shuffle is never coalesced).
    ``what`` names the job in the log.
    """
    commits = _collect_commits(
        rows.mapInArrow(_shard_task(store_to_json(store_config), num_shards, write), _SHARD_RESULT_DDL)
    )
    seen = [c.shard for c in commits]
    if len(seen) != len(set(seen)):
        raise RuntimeError(f"more than one commit for a shard: {sorted(seen)}")
    missing = sorted(set(range(num_shards)) - set(seen))
    if missing:
        # Spark may skip the tasks of an empty shuffle (e.g. adaptive execution propagating an empty
        # relation); those shards have no rows, so write them empty, still from executors.
        log.info("%s: %d shard(s) received no task, writing them empty: %s", what, len(missing), missing)
        commits += write_empty_sharded(rows.sparkSession, store_config, missing, write)
    commits.sort(key=lambda c: c.shard)
    if [c.shard for c in commits] != list(range(num_shards)):
        raise RuntimeError(f"expected shards 0..{num_shards - 1}, got {[c.shard for c in commits]}")
    return commits


def write_empty_sharded(
    spark: SparkSession, store_config: StoreConfig, shards: list[int], write: ShardWriter
) -> list[ShardCommit]:
    """Run ``write`` with no rows for each of ``shards`` from Spark tasks; return the commits by shard."""
    if not shards:
        return []
    fill = spark.createDataFrame([(s,) for s in shards], "shard int").repartition(min(len(shards), 4))
    task = _fill_task(store_to_json(store_config), write)
    return sorted(_collect_commits(fill.mapInArrow(task, _SHARD_RESULT_DDL)), key=lambda c: c.shard)
