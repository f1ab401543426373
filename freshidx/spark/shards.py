"""Executor-side writing: the sharded-job machinery, quarantine files, each returning small commit messages.

Spark tasks write the files straight to the store (``pyarrow.fs``) and yield one row of metadata per
file set; the driver collects only those rows. A version's manifest is built from these commit
messages, never from listing a prefix, so uploads of failed or retried task attempts (which carry the
attempt number in their keys) are never published.

:func:`write_sharded` runs one writer per shard (the tantivy shards of
:mod:`freshidx.spark.index_shards`); :mod:`freshidx.catchup.bucket_writer` reuses the file helpers.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from freshidx.spark import quarantine_once as once_mod

# Re-exported: what a shard writes is part of this module's interface (defined Spark-free for serving).
from freshidx.spark.index_format import COVERED_FILE as COVERED_FILE
from freshidx.spark.index_format import DOCS_ARROW_SCHEMA as DOCS_ARROW_SCHEMA
from freshidx.spark.index_format import DOCS_FILE as DOCS_FILE
from freshidx.spark.raw_source import store_from_json, store_to_json
from freshidx.spark.transform import COVERED_COLUMNS, INVALID_COLUMNS, QUARANTINE_EXTRA_COLUMNS, TYPED_FIELDS
from freshidx.store import StoreConfig, layout
from freshidx.store.base import check_key
from freshidx.store.partitions import PartitionId

log = logging.getLogger(__name__)

ROW_GROUP_ROWS = 128 * 1024
COPY_CHUNK_BYTES = 8 * 1024 * 1024

#: Arrow schema of ``covered.parquet`` (the shard's part of the kill-list).
COVERED_ARROW_SCHEMA = pa.schema([DOCS_ARROW_SCHEMA.field(c) for c in COVERED_COLUMNS])
assert tuple(DOCS_ARROW_SCHEMA.names) == TYPED_FIELDS

_SHARD_RESULT_DDL = "shard int, attempt int, commit string"
_SHARD_RESULT_SCHEMA = pa.schema(
    [pa.field("shard", pa.int32()), pa.field("attempt", pa.int32()), pa.field("commit", pa.string())]
)
_QUARANTINE_RESULT_DDL = "commit string"
_QUARANTINE_RESULT_SCHEMA = pa.schema([pa.field("commit", pa.string())])
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=-]{0,199}$")


# --------------------------------------------------------------------------- commit messages


@dataclass(frozen=True)
class ShardFile:
    key: str  # relative to the store root
    bytes: int
    sha256: str
    rows: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ShardFile:
        return cls(key=str(d["key"]), bytes=int(d["bytes"]), sha256=str(d["sha256"]), rows=int(d["rows"]))


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
        )


@dataclass(frozen=True)
class QuarantineCommit:
    partition: str
    key: str
    records: int
    reasons: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {"partition": self.partition, "key": self.key, "records": self.records,
                "reasons": dict(sorted(self.reasons.items()))}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QuarantineCommit:
        return cls(
            partition=str(d["partition"]),
            key=str(d["key"]),
            records=int(d["records"]),
            reasons={str(k): int(v) for k, v in d["reasons"].items()},
        )


# --------------------------------------------------------------------------- shared helpers


def check_name(what: str, value: str) -> str:
    if not _NAME_RE.match(value) or ".." in value:
        raise ValueError(f"{what} must match {_NAME_RE.pattern} (one key segment), got {value!r}")
    return value


def task_ids() -> tuple[int, int]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:  # pragma: no cover - only outside Spark
        raise RuntimeError("not running inside a Spark task")
    return int(ctx.partitionId()), int(ctx.attemptNumber())


def _ensure_parent(fs: Any, config: StoreConfig, path: str) -> None:
    # Only local directories need creating; on S3 a "directory" would be a stray marker object.
    if not config.is_s3:
        fs.create_dir(os.path.dirname(path), recursive=True)


def upload_file(fs: Any, config: StoreConfig, local_path: str, key: str, rows: int) -> ShardFile:
    """Copy a local file to ``key`` in the store, hashing it on the way. Returns its description."""
    check_key(key)
    path = config.arrow_path(key)
    _ensure_parent(fs, config, path)
    digest = hashlib.sha256()
    size = 0
    with open(local_path, "rb") as src, fs.open_output_stream(path) as dst:
        while chunk := src.read(COPY_CHUNK_BYTES):
            digest.update(chunk)
            dst.write(chunk)
            size += len(chunk)
    if size != os.path.getsize(local_path):  # pragma: no cover - defensive
        raise OSError(f"short copy of {local_path} to {key}")
    return ShardFile(key=key, bytes=size, sha256=digest.hexdigest(), rows=rows)


class BufferedParquet:
    """A zstd Parquet file written in row groups of about :data:`ROW_GROUP_ROWS` rows."""

    def __init__(self, path: str, schema: pa.Schema) -> None:
        self.path = path
        self.schema = schema
        self.writer = pq.ParquetWriter(path, schema, compression="zstd")
        self.pending: list[pa.RecordBatch] = []
        self.pending_rows = 0
        self.rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        self.pending.append(batch)
        self.pending_rows += batch.num_rows
        self.rows += batch.num_rows
        if self.pending_rows >= ROW_GROUP_ROWS:
            self._flush()

    def _flush(self) -> None:
        if self.pending:
            table = pa.Table.from_batches(self.pending, schema=self.schema)
            self.writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
            self.pending, self.pending_rows = [], 0

    def close(self) -> None:
        self._flush()
        self.writer.close()


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """Select and cast the columns of ``schema`` (Spark may hand us other list/timestamp flavours)."""
    arrays = [batch.column(f.name).cast(f.type) for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


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
            pa.array([json.dumps(commit.to_dict(), sort_keys=True)], pa.string()),
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


# --------------------------------------------------------------------------- quarantine


def quarantine_key(source: str, partition: str, run_id: str, task: int, attempt: int) -> str:
    prefix = layout.quarantine_prefix(source, PartitionId.parse(partition), run_id)
    return prefix + f"part-{task:05d}-a{attempt}.jsonl"


class _QuarantineFile:
    def __init__(self, fs: Any, config: StoreConfig, key: str) -> None:
        path = config.arrow_path(check_key(key))
        _ensure_parent(fs, config, path)
        self.key = key
        self.stream = fs.open_output_stream(path)
        self.records = 0
        self.reasons: Counter[str] = Counter()

    def write(self, file: str, line: int, raw: str | None, reason: str,
              original: bytes | None = None, detail: str | None = None) -> None:
        record: dict[str, Any] = {"file": file, "line": line, "raw": raw, "reason": reason}
        if original is not None:  # the line was not UTF-8: `raw` is for reading, these are the bytes
            record["raw_base64"] = base64.b64encode(original).decode("ascii")
        if detail is not None:
            record["detail"] = detail
        self.stream.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
        self.records += 1
        self.reasons[reason] += 1


def _copy_object(fs: Any, config: StoreConfig, key: str, to_prefix: str) -> None:
    """Copy a raw object into the quarantine (streamed; the raw object itself is left alone)."""
    dst = config.arrow_path(check_key(to_prefix + key.rsplit("/", 1)[-1]))
    _ensure_parent(fs, config, dst)
    try:
        with fs.open_input_stream(config.arrow_path(check_key(key)), compression=None) as src, \
                fs.open_output_stream(dst, compression=None) as out:
            while chunk := src.read(COPY_CHUNK_BYTES):
                out.write(chunk)
    except FileNotFoundError:
        log.warning("quarantine: %s disappeared before it could be copied", key)


def _quarantine_task(
    store_json: str, source: str, run_id: str, once: bool = False
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task, attempt = task_ids()
        config = store_from_json(store_json)
        fs = config.arrow_fs()
        open_files: dict[str, _QuarantineFile] = {}
        done: dict[str, bool] = {}  # once: raw file → already quarantined by an earlier build
        written: dict[str, set[str]] = {}  # once: partition → raw files written here
        try:
            for batch in batches:
                names = [*INVALID_COLUMNS, *(c for c in QUARANTINE_EXTRA_COLUMNS if c in batch.schema.names)]
                cols = {name: batch.column(name).to_pylist() for name in names}
                for i in range(batch.num_rows):
                    partition = cols["partition"][i]
                    if once:
                        file_key = cols["file"][i]
                        if file_key not in done:  # checked again here: another build may have won meanwhile
                            done[file_key] = once_mod.exists(
                                fs, config, once_mod.done_marker_key(source, partition, file_key))
                        if done[file_key]:
                            continue
                        written.setdefault(partition, set()).add(file_key)
                    out = open_files.get(partition)
                    if out is None:
                        out = _QuarantineFile(fs, config, quarantine_key(source, partition, run_id, task, attempt))
                        open_files[partition] = out
                    out.write(cols["file"][i], cols["line"][i], cols["raw"][i], cols["reason"][i],
                              *(cols[c][i] if c in cols else None for c in QUARANTINE_EXTRA_COLUMNS))
                    if cols["line"][i] == 0 and cols["file"][i]:  # a whole object: keep a copy of it
                        _copy_object(fs, config, cols["file"][i], out.key.rsplit("/", 1)[0] + "/objects/")
        finally:
            for out in open_files.values():
                out.stream.close()
        for partition, files in written.items():  # only after the files are closed: a marker means complete
            once_mod.write_done_markers(fs, config, source, partition, files, run_id, open_files[partition].key)
        commits = [
            QuarantineCommit(partition=p, key=f.key, records=f.records, reasons=dict(f.reasons))
            for p, f in sorted(open_files.items())
        ]
        if commits:
            yield pa.RecordBatch.from_arrays(
                [pa.array([json.dumps(c.to_dict(), sort_keys=True) for c in commits], pa.string())],
                schema=_QUARANTINE_RESULT_SCHEMA,
            )

    return run


def write_quarantine(
    invalid: DataFrame,
    store_config: StoreConfig,
    source: str,
    run_id: str,
    after_partition: str | None,
    *,
    once: bool = False,
    one_task: bool = False,
) -> list[QuarantineCommit]:
    """Write invalid records of partitions strictly after ``after_partition`` (None: all) as JSON lines.

    One object per (partition, task): ``quarantine/<source>/<partition>/<run_id>/part-TTTTT-aA.jsonl``
    holding ``{"file", "line", "raw", "reason"}`` per line, in file/line order, plus ``raw_base64``
    (the exact bytes of a line that was not UTF-8; ``raw`` is then only for reading) and ``detail``
    where ``invalid`` has them (:data:`~freshidx.spark.transform.QUARANTINE_EXTRA_COLUMNS`). A row for a
    whole unreadable object (``line`` 0) also copies the object to ``…/<run_id>/objects/<name>``.
    Written by Spark tasks; returns their commits sorted by partition and key (empty list when
    nothing was written). ``once``: skip raw files whose done marker exists and write the marker of
    every file written (:mod:`freshidx.spark.quarantine_once`: each bad record quarantined once).
    ``one_task``: ``invalid`` is in one partition already (a build that read one file group): written by
    that one task, without a shuffle by partition.
    """
    check_name("source", source)
    check_name("run_id", run_id)
    if after_partition is not None:
        PartitionId.parse(after_partition)  # a typo here would silently select everything
    df = invalid.select(*INVALID_COLUMNS, *(c for c in QUARANTINE_EXTRA_COLUMNS if c in invalid.columns))
    if after_partition is not None:
        df = df.filter(F.col("partition") > F.lit(after_partition))
    df = (df if one_task else df.repartition("partition")).sortWithinPartitions("partition", "file", "line")
    rows = df.mapInArrow(
        _quarantine_task(store_to_json(store_config), source, run_id, once), _QUARANTINE_RESULT_DDL
    ).collect()
    commits = [QuarantineCommit.from_dict(json.loads(r["commit"])) for r in rows]
    return sorted(commits, key=lambda c: (c.partition, c.key))
