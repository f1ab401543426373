"""Executor-side file helpers every Spark writer shares (the shard jobs of :mod:`freshidx.spark.shards`,
the quarantine of :mod:`freshidx.spark.quarantine_writer`, :mod:`freshidx.catchup.bucket_writer`): the task's
ids, key-segment names, zstd Parquet written in row groups, and uploads hashed on the way
(:class:`ShardFile`, the description a commit message lists) and downloads checked against it."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from freshidx.store import StoreConfig
from freshidx.store.object_store import check_key

ROW_GROUP_ROWS = 128 * 1024
COPY_CHUNK_BYTES = 8 * 1024 * 1024
#: At most this many rows of a file written in order are held in memory (a few columns: ~100 MB).
SORTED_ROWS_MAX = 2 * 1024 * 1024
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=-]{0,199}$")


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


def use_task_cores() -> int:
    """Size Arrow's CPU thread pool in this Python worker to the cores Spark gave the running task
    (``spark.task.cpus``, usually one): Spark runs a task per core, so a pool of every core in each of
    them (Arrow's default) has the tasks' compute, Parquet and decoding threads compete for the same cores
    (a micro-batch's two tasks finish later: docs/benchmarks.md). Returns the pool's size."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    cores = max(1, int(ctx.cpus())) if ctx is not None else os.cpu_count() or 1
    if pa.cpu_count() != cores:
        pa.set_cpu_count(cores)
    return cores


def ensure_parent(fs: Any, config: StoreConfig, path: str) -> None:
    # Only local directories need creating; on S3 a "directory" would be a stray marker object.
    if not config.is_s3:
        fs.create_dir(os.path.dirname(path), recursive=True)


def upload_file(fs: Any, config: StoreConfig, local_path: str, key: str, rows: int) -> ShardFile:
    """Copy a local file to ``key`` in the store, hashing it on the way. Returns its description."""
    check_key(key)
    path = config.arrow_path(key)
    ensure_parent(fs, config, path)
    with open(local_path, "rb") as src, fs.open_output_stream(path) as dst:
        size, sha256 = _copy_hashing(src, dst)
    if size != os.path.getsize(local_path):  # pragma: no cover - defensive
        raise OSError(f"short copy of {local_path} to {key}")
    return ShardFile(key=key, bytes=size, sha256=sha256, rows=rows)


def download_file(fs: Any, config: StoreConfig, file: ShardFile, local_path: str) -> None:
    """Copy ``file`` from the store to ``local_path``, checking its size and sha256 on the way."""
    with fs.open_input_stream(config.arrow_path(check_key(file.key)), compression=None) as src, \
            open(local_path, "wb") as dst:
        size, sha256 = _copy_hashing(src, dst)
    if size != file.bytes or sha256 != file.sha256:
        raise OSError(f"{file.key}: {size} bytes, sha256 {sha256}; the manifest says {file.bytes} "
                      f"bytes, sha256 {file.sha256}")


def _copy_hashing(src: Any, dst: Any) -> tuple[int, str]:
    """Copy ``src`` to ``dst`` in chunks; the bytes copied and their sha256."""
    digest = hashlib.sha256()
    size = 0
    while chunk := src.read(COPY_CHUNK_BYTES):
        digest.update(chunk)
        dst.write(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


#: Columns of few distinct values (groups, statuses, keyword words): dictionary-encoded where a schema has them.
#: The others (ad ids, titles, numbers) are not: their dictionaries never pay for the time spent building
#: them. Column statistics are not written either: every reader of these files reads whole row groups,
#: none filters by them.
DICTIONARY_COLUMNS = ("campaign_id", "product_id", "status", "keywords")


class BufferedParquet:
    """A zstd Parquet file written in row groups of about :data:`ROW_GROUP_ROWS` rows.

    With ``sort_by``, the rows are held until :meth:`close` and written in that column's byte order (nulls
    last), as long as there are at most ``sorted_rows_max`` of them: past that the file is written as the rows
    came (:attr:`ordered` False), so a task's memory never grows with a large file (a window rebuild's shard)."""

    def __init__(self, path: str, schema: pa.Schema, *, sort_by: str | None = None,
                 sorted_rows_max: int = SORTED_ROWS_MAX) -> None:
        self.path = path
        self.schema = schema
        self.sort_by = sort_by
        self.sorted_rows_max = sorted_rows_max
        dictionary = [f"{c}.list.element" if pa.types.is_list(schema.field(c).type) else c
                      for c in DICTIONARY_COLUMNS if c in schema.names]
        self.writer = pq.ParquetWriter(path, schema, compression="zstd", use_dictionary=dictionary,
                                       write_statistics=False)
        self.pending: list[pa.RecordBatch] = []
        self.pending_rows = 0
        self.rows = 0

    @property
    def ordered(self) -> bool:
        """Whether the file is (so far) in ``sort_by`` order."""
        return self.sort_by is not None and self.rows <= self.sorted_rows_max

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        self.pending.append(batch)
        self.pending_rows += batch.num_rows
        self.rows += batch.num_rows
        if self.pending_rows >= ROW_GROUP_ROWS and not self.ordered:
            self._flush()

    def _flush(self) -> None:
        if self.pending:
            table = pa.Table.from_batches(self.pending, schema=self.schema)
            if self.ordered:
                table = table.take(pc.sort_indices(table.column(self.sort_by)))  # one column: Arrow's fast path
            self.writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
            self.pending, self.pending_rows = [], 0

    def close(self) -> None:
        self._flush()
        self.writer.close()


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """Select and cast the columns of ``schema`` (Spark may hand us other list/timestamp flavours)."""
    arrays = [batch.column(f.name).cast(f.type) for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
