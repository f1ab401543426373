"""Raw JSON-lines objects read on the executors: :func:`read_raw_lines` (what every build uses) and the
PySpark Python Data Source ``freshidx_raw`` (for ad-hoc reads); both read with :func:`read_object_lines`.

The driver lists the store and passes the file list (small); each Spark task opens the objects it
was given with ``pyarrow.fs`` (:meth:`StoreConfig.arrow_fs`) and yields Arrow record batches, so the
data never passes through the driver.

Options of ``freshidx_raw``:

* ``files``: JSON list of ``[key, partition_path]`` pairs (keys relative to the store root);
* ``store``: JSON object of the :class:`~freshidx.store.StoreConfig` fields;
* ``max_partitions`` (optional): group the files into at most this many Spark tasks
  (contiguous groups, so files of one upstream partition stay together). Default: one task per file.

Output schema: ``partition string, file string, line long, raw string, bad_encoding boolean,
original binary, object_error string``.
``line`` is the 1-based physical line number in the object (blank lines are skipped but counted).
A trailing ``\\r`` is dropped (CRLF files read like LF files), and so is a UTF-8 byte-order mark at
the start of an object. A line that is not valid UTF-8 is decoded with ``errors="replace"`` for
display, flagged ``bad_encoding``, and its exact bytes kept in ``original`` (null for every other
line, whose ``raw`` is its UTF-8 text) so the quarantine can hand them back byte for byte.

**Input contract** (docs/operations.md): JSON lines, optionally gzip-compressed. The encoding is
told from the object's first bytes, never from its name: a gzip stream is decompressed whatever the
object is called, plain text is read as it is (a plain file named ``.gz`` reads fine). An object
that is not JSON lines (Parquet, zstd, bzip2, xz, zip, Avro or ORC magic) or cannot be decoded (a
truncated or corrupt gzip stream) yields ONE row for the whole object: ``line`` 0, ``raw`` null,
``object_error`` = ``"<reason>: <detail>"`` with reason ``unsupported_format`` or
``unreadable_object``. It is quarantined with its key and never fails the run; nothing of a
compressed object is yielded unless the whole stream decoded (it is spooled to local disk first).
An object that disappeared between listing and reading is skipped with a warning; the job goes on.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import logging
import shutil
import tempfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import BinaryType, BooleanType, LongType, StringType, StructField, StructType

from freshidx.spark.object_lines import ARROW_SCHEMA, BATCH_ROWS, READ_CHUNK_BYTES, line_batches
from freshidx.store import StoreConfig

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

SOURCE_NAME = "freshidx_raw"

RAW_LINES_SCHEMA = StructType(
    [
        StructField("partition", StringType(), True),
        StructField("file", StringType(), True),
        StructField("line", LongType(), True),
        StructField("raw", StringType(), True),
        StructField("bad_encoding", BooleanType(), True),
        StructField("original", BinaryType(), True),
        StructField("object_error", StringType(), True),
    ]
)

_GZIP = b"\x1f\x8b"

#: Object-level reasons (``object_error``); stable strings, counted like record reasons.
UNSUPPORTED_FORMAT = "unsupported_format"
UNREADABLE_OBJECT = "unreadable_object"
#: Leading bytes of formats that are not JSON lines: quarantined whole, with this name in the detail.
FOREIGN_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"PAR1", "Parquet"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"),
    (b"PK\x03\x04", "zip"), (b"Obj\x01", "Avro"), (b"ORC", "ORC"),
)
CONTRACT = "supported: JSON lines, optionally gzip-compressed"


def store_to_json(config: StoreConfig) -> str:
    return json.dumps(dataclasses.asdict(config), sort_keys=True)


def store_from_json(text: str) -> StoreConfig:
    return StoreConfig(**json.loads(text))


class FilesPartition(InputPartition):
    """One Spark task's share of the files: ``[(key, partition_path), ...]``."""

    def __init__(self, files: list[tuple[str, str]]) -> None:
        super().__init__(files)
        self.files = files


def group_files(files: Sequence[tuple[str, str]], max_partitions: int) -> list[list[tuple[str, str]]]:
    """Split ``files`` into at most ``max_partitions`` contiguous, near-equal groups (0 = one per file)."""
    items = list(files)
    if not items:
        return []
    n = len(items) if max_partitions <= 0 else min(max_partitions, len(items))
    size, extra = divmod(len(items), n)
    groups: list[list[tuple[str, str]]] = []
    start = 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        groups.append(items[start:end])
        start = end
    return groups


class RawLinesSource(DataSource):
    """``spark.read.format("freshidx_raw").option("files", ...).option("store", ...).load()``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return RAW_LINES_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return RawLinesReader(dict(self.options))


class RawLinesReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        if "files" not in options or "store" not in options:
            raise ValueError(f"{SOURCE_NAME} needs the options 'files' and 'store'")
        self.files = [(str(k), str(p)) for k, p in json.loads(options["files"])]
        self.store_json = options["store"]
        store_from_json(self.store_json)  # fail on the driver, not in every task
        self.max_partitions = int(options.get("max_partitions", "0") or 0)

    def partitions(self) -> Sequence[InputPartition]:
        return [FilesPartition(g) for g in group_files(self.files, self.max_partitions)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FilesPartition)
        config = store_from_json(self.store_json)
        fs = config.arrow_fs()
        for key, partition_path in partition.files:
            yield from read_object_lines(fs, config.arrow_path(key), key, partition_path)


def _open_or_none(fs: Any, path: str, key: str) -> Any:
    try:
        # compression=None: the encoding is told from the content (see the module docstring)
        return fs.open_input_stream(path, compression=None)
    except FileNotFoundError:  # pyarrow raises it for local files and for a missing S3 key alike
        log.warning("freshidx_raw: %s disappeared between listing and reading; skipped", key)
        return None


def _object_row(partition_path: str, key: str, reason: str, detail: str) -> pa.RecordBatch:
    """The one row that stands for a whole object that is not readable JSON lines."""
    return pa.RecordBatch.from_pylist(
        [{"partition": partition_path, "file": key, "line": 0, "raw": None, "bad_encoding": False,
          "original": None, "object_error": f"{reason}: {detail}"}],
        schema=ARROW_SCHEMA,
    )


def foreign_format(head: bytes) -> str | None:
    """The name of a known non-JSON-lines format whose magic ``head`` starts with, else None."""
    return next((name for magic, name in FOREIGN_MAGIC if head.startswith(magic)), None)


def read_object_lines(
    fs: Any, path: str, key: str, partition_path: str, batch_rows: int = BATCH_ROWS
) -> Iterator[pa.RecordBatch]:
    """Yield the non-blank lines of one object as record batches of :data:`ARROW_SCHEMA` (or the one
    object row of an object that is not readable JSON lines)."""
    stream = _open_or_none(fs, path, key)
    if stream is None:
        return
    with stream:
        head = stream.read(READ_CHUNK_BYTES)
        fmt = foreign_format(head)
        if fmt is not None:
            yield _object_row(partition_path, key, UNSUPPORTED_FORMAT, f"{fmt} object; {CONTRACT}")
            return
        if not head.startswith(_GZIP):
            yield from line_batches(stream, head, key, partition_path, batch_rows)
            return
        with tempfile.TemporaryFile(prefix="freshidx-gunzip-") as spool:
            try:
                # All or nothing: a truncated stream is only noticed at its end, after good lines.
                with gzip.GzipFile(fileobj=_Prefixed(head, stream), mode="rb") as gz:
                    shutil.copyfileobj(gz, spool, READ_CHUNK_BYTES)
            except (EOFError, OSError, zlib.error) as exc:
                log.warning("freshidx_raw: %s is not a readable gzip stream: %s", key, exc)
                yield _object_row(partition_path, key, UNREADABLE_OBJECT, f"gzip: {exc}; {CONTRACT}")
                return
            spool.seek(0)
            inner = spool.read(READ_CHUNK_BYTES)
            fmt = foreign_format(inner)
            if fmt is not None:
                yield _object_row(partition_path, key, UNSUPPORTED_FORMAT, f"gzip-compressed {fmt}; {CONTRACT}")
                return
            yield from line_batches(spool, inner, key, partition_path, batch_rows)


class _Prefixed:
    """A read-only file over ``head`` followed by the rest of ``stream`` (gzip needs a file object)."""

    def __init__(self, head: bytes, stream: Any) -> None:
        self.head, self.stream = head, stream

    def read(self, size: int = -1) -> bytes:
        if self.head:
            if size is None or size < 0 or size >= len(self.head):
                out, self.head = self.head, b""
                rest = self.stream.read() if size is None or size < 0 else self.stream.read(size - len(out))
                return out + rest
            out, self.head = self.head[:size], self.head[size:]
            return out
        return self.stream.read() if size is None or size < 0 else self.stream.read(size)


def read_raw_lines(
    spark: SparkSession,
    store_config: StoreConfig,
    files: list[tuple[str, str]],
    *,
    max_partitions: int = 0,
) -> DataFrame:
    """Raw lines of ``files`` (``(key, partition_path)`` pairs) as a DataFrame of :data:`RAW_LINES_SCHEMA`.

    The objects are read by Spark tasks (``mapInArrow`` over a small local relation of file groups, at
    most ``max_partitions`` groups when > 0; Spark runs them in up to ``spark.default.parallelism``
    tasks). Not through the ``freshidx_raw`` data source: a Python data source is registered and
    planned in a Python process per session, which cost every sensor-triggered run's new Connect
    session ~4 s (and a warm session ~0.8 s) per read on this box. An empty ``files`` list gives an
    empty DataFrame of the same schema without launching a read.
    """
    if not files:
        return spark.createDataFrame([], RAW_LINES_SCHEMA)
    groups = group_files(files, max_partitions)
    table = spark.createDataFrame([(json.dumps(g),) for g in groups], "files string")
    return table.mapInArrow(_read_groups_task(store_to_json(store_config)), RAW_LINES_SCHEMA)


def _read_groups_task(store_json: str) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        config = store_from_json(store_json)
        for batch in batches:
            for group in batch.column("files").to_pylist():
                yield from read_files(config, [(k, p) for k, p in json.loads(group)])

    return run


def read_in_every_task(spark: SparkSession, store_config: StoreConfig, files: list[tuple[str, str]],
                       tasks: int) -> DataFrame:
    """Raw lines of *all* ``files`` in each of ``tasks`` tasks (partition i of the result is task i's
    copy): for a job whose every task needs the whole input and that must not shuffle it. The tasks
    come from ``spark.range`` with one row per partition, so no exchange separates the read from what
    follows it: read, parse and whatever consumes them run as one stage."""
    tasks_df = spark.range(0, tasks, 1, tasks)
    return tasks_df.mapInArrow(_read_all_task(store_to_json(store_config), json.dumps(files)), RAW_LINES_SCHEMA)


def _read_all_task(store_json: str, files_json: str) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:  # the task's one row: it says only that this task exists
            pass
        yield from read_files(store_from_json(store_json), json.loads(files_json))

    return run


def read_files(config: StoreConfig, files: Sequence[tuple[str, str]]) -> Iterator[pa.RecordBatch]:
    """The lines of ``files`` (``(key, partition path)`` pairs), object after object
    (:func:`read_object_lines`), on the executor that calls it."""
    fs = config.arrow_fs()
    for key, partition_path in files:
        yield from read_object_lines(fs, config.arrow_path(key), key, partition_path)
