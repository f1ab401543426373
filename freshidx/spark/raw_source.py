"""PySpark Python Data Source ``freshidx_raw``: raw JSON-lines objects read on the executors.

The driver lists the store and passes the file list (small); each Spark task opens the objects it
was given with ``pyarrow.fs`` (:meth:`StoreConfig.arrow_fs`) and yields Arrow record batches, so the
data never passes through the driver.

Options:

* ``files``: JSON list of ``[key, partition_path]`` pairs (keys relative to the store root);
* ``store``: JSON object of the :class:`~freshidx.store.StoreConfig` fields;
* ``max_partitions`` (optional): group the files into at most this many Spark tasks
  (contiguous groups, so files of one upstream partition stay together). Default: one task per file.

Output schema: ``partition string, file string, line long, raw string, bad_encoding boolean``.
``line`` is the 1-based physical line number in the object (blank lines are skipped but counted).
A trailing ``\\r`` is dropped (CRLF files read like LF files), and so is a UTF-8 byte-order mark at
the start of an object. A line that is not valid UTF-8 is decoded with ``errors="replace"`` and
flagged ``bad_encoding``. An object that disappeared between listing and reading is skipped with a
warning; the job goes on.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

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
    ]
)

# Exactly what Spark expects back from read() (string, not large_string; nullable fields).
ARROW_SCHEMA = pa.schema(
    [
        pa.field("partition", pa.string()),
        pa.field("file", pa.string()),
        pa.field("line", pa.int64()),
        pa.field("raw", pa.string()),
        pa.field("bad_encoding", pa.bool_()),
    ]
)

BATCH_ROWS = 8192
READ_CHUNK_BYTES = 4 * 1024 * 1024
_BOM = b"\xef\xbb\xbf"


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
        return fs.open_input_stream(path)
    except FileNotFoundError:  # pyarrow raises it for local files and for a missing S3 key alike
        log.warning("freshidx_raw: %s disappeared between listing and reading; skipped", key)
        return None


def read_object_lines(
    fs: Any, path: str, key: str, partition_path: str, batch_rows: int = BATCH_ROWS
) -> Iterator[pa.RecordBatch]:
    """Yield the non-blank lines of one object as record batches of :data:`ARROW_SCHEMA`."""
    stream = _open_or_none(fs, path, key)
    if stream is None:
        return
    lines: list[int] = []
    raws: list[str] = []
    bad: list[bool] = []

    def flush() -> pa.RecordBatch:
        n = len(lines)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array([partition_path] * n, pa.string()),
                pa.array([key] * n, pa.string()),
                pa.array(lines, pa.int64()),
                pa.array(raws, pa.string()),
                pa.array(bad, pa.bool_()),
            ],
            schema=ARROW_SCHEMA,
        )
        lines.clear()
        raws.clear()
        bad.clear()
        return batch

    with stream:
        for number, data in _iter_lines(stream):
            if number == 1 and data.startswith(_BOM):
                data = data[len(_BOM) :]
            if data.endswith(b"\r"):
                data = data[:-1]
            if not data.strip():
                continue
            try:
                text, is_bad = data.decode("utf-8"), False
            except UnicodeDecodeError:
                text, is_bad = data.decode("utf-8", errors="replace"), True
            lines.append(number)
            raws.append(text)
            bad.append(is_bad)
            if len(lines) >= batch_rows:
                yield flush()
    if lines:
        yield flush()


def _iter_lines(stream: Any) -> Iterator[tuple[int, bytes]]:
    """``(1-based line number, line bytes without the newline)`` over a binary stream, chunk by chunk."""
    number = 0
    rest = b""
    while True:
        chunk = stream.read(READ_CHUNK_BYTES)
        if not chunk:
            break
        parts = (rest + chunk).split(b"\n")
        rest = parts.pop()
        for part in parts:
            number += 1
            yield number, part
    if rest:
        yield number + 1, rest


def read_raw_lines(
    spark: SparkSession,
    store_config: StoreConfig,
    files: list[tuple[str, str]],
    *,
    max_partitions: int = 0,
) -> DataFrame:
    """Raw lines of ``files`` (``(key, partition_path)`` pairs) as a DataFrame of :data:`RAW_LINES_SCHEMA`.

    The objects are read by Spark tasks. An empty ``files`` list gives an empty DataFrame of the same
    schema without launching a read. ``max_partitions`` > 0 groups files into at most that many tasks.
    """
    if not files:
        return spark.createDataFrame([], RAW_LINES_SCHEMA)
    from freshidx.spark.session import register_sources

    register_sources(spark)
    return (
        spark.read.format(SOURCE_NAME)
        .option("files", json.dumps([[k, p] for k, p in files]))
        .option("store", store_to_json(store_config))
        .option("max_partitions", str(max_partitions))
        .load()
    )
