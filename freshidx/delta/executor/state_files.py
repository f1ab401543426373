"""A state file as the micro-batch's lookup reads it, in one of two forms (docs/architecture.md#state-as-built).

* :class:`MappedState`: the executor's local copy (:mod:`freshidx.delta.executor.file_cache`), uncompressed
  Arrow IPC memory-mapped, one record batch per Parquet row group of the stored file. Reading rows is a
  ``take`` from the page cache: nothing is decoded, so a worker keeps nothing of it and the lookup's cost
  follows the rows it takes, not the row groups they are spread over. At ten million documents a
  micro-batch's ~135k needed rows touch every row group of the full version's state (~1.4 GiB decoded,
  more than a worker's decoded cache holds), so decoding them cost seconds each micro-batch.
* :class:`ParquetState`: the stored Parquet file itself (no local copy: ``delta_state_disk_cache_mb`` 0, or a
  copy that failed); row groups are decoded, and kept by the worker's decoded cache.

Both number rows and row groups alike, so a file's key index answers for either form.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from freshidx.delta.executor import file_cache, key_index_file
from freshidx.delta.executor.key_index import KeyIndex
from freshidx.store import StoreConfig


class StateReader(Protocol):
    #: Rows cost nothing to read (memory-mapped): nothing to decode, nothing for a worker to keep.
    mapped: bool
    #: Where its key index is kept on local disk (:mod:`freshidx.delta.executor.key_index_file`); None: not kept.
    key_file: Path | None

    @property
    def num_rows(self) -> int: ...

    @property
    def column_names(self) -> list[str]: ...

    @property
    def row_group_sizes(self) -> list[int]: ...

    def row_group_bytes(self, group: int) -> int:
        """What row group ``group`` weighs decoded, at least (0 when mapped)."""

    def read_columns(self, columns: Sequence[str]) -> pa.Table: ...

    def read_row_group(self, group: int) -> pa.Table: ...

    def read_ahead(self) -> None:
        """Ask the kernel to bring what the lookup reads into the page cache (mapped only; returns at once)."""

    def close(self) -> None: ...


class ParquetState:
    """The stored Parquet file."""

    mapped = False
    key_file = None

    def __init__(self, file: pq.ParquetFile) -> None:
        self._file = file

    @property
    def num_rows(self) -> int:
        return int(self._file.metadata.num_rows)

    @property
    def column_names(self) -> list[str]:
        return list(self._file.schema_arrow.names)

    @property
    def row_group_sizes(self) -> list[int]:
        meta = self._file.metadata
        return [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]

    def row_group_bytes(self, group: int) -> int:
        return int(self._file.metadata.row_group(group).total_byte_size)  # Parquet's encoded size: a floor

    def read_columns(self, columns: Sequence[str]) -> pa.Table:
        return self._file.read(columns=list(columns))

    def read_row_group(self, group: int) -> pa.Table:
        return self._file.read_row_group(group)

    def read_ahead(self) -> None:
        pass  # its row groups are decoded and kept by the worker instead

    def close(self) -> None:
        self._file.close()


class MappedState:
    """A local uncompressed Arrow IPC copy, memory-mapped (what is read stays valid after :meth:`close`)."""

    mapped = True

    def __init__(self, path: Path) -> None:
        self.path = path
        self.key_file: Path | None = key_index_file.key_file(path)
        self._source = pa.memory_map(str(path))
        try:
            self._reader = pa.ipc.open_file(self._source)
            self._sizes = [self._reader.get_batch(g).num_rows for g in range(self._reader.num_record_batches)]
        except BaseException:
            self._source.close()
            raise

    @property
    def num_rows(self) -> int:
        return sum(self._sizes)

    @property
    def column_names(self) -> list[str]:
        return list(self._reader.schema.names)

    @property
    def row_group_sizes(self) -> list[int]:
        return list(self._sizes)

    def row_group_bytes(self, group: int) -> int:
        return 0

    def read_columns(self, columns: Sequence[str]) -> pa.Table:
        names = list(columns)
        return pa.Table.from_batches([self._reader.get_batch(g).select(names) for g in range(len(self._sizes))],
                                     pa.schema([self._reader.schema.field(c) for c in names]))

    def read_row_group(self, group: int) -> pa.Table:
        return pa.Table.from_batches([self._reader.get_batch(group)])

    def read_ahead(self) -> None:
        file_cache.read_ahead(self.path)
        if self.key_file is not None:
            file_cache.read_ahead(self.key_file)

    def close(self) -> None:
        self._source.close()


def open_state(fs: Any, path: str, name: str, disk_bytes: int) -> StateReader:
    """The immutable state file ``path`` of ``fs`` (named ``name``): its local mapped copy when ``disk_bytes``
    allows one, the stored file when not, or should the copy fail (a full disk costs decoding, nothing else)."""
    if disk_bytes > 0:
        try:
            return MappedState(file_cache.local_copy(name, lambda: fs.open_input_stream(path), disk_bytes))
        except (OSError, pa.ArrowException):
            pass
    return ParquetState(pq.ParquetFile(fs.open_input_file(path)))


def count_rows(fs: Any, path: str, name: str, disk_bytes: int) -> int:
    """``open_state(...).num_rows`` without making a copy: the copy's when there is one, else the stored footer's."""
    copy = file_cache.existing_copy(name) if disk_bytes > 0 else None
    if copy is not None:
        try:
            reader: StateReader = MappedState(copy)
            try:
                return reader.num_rows
            finally:
                reader.close()
        except (OSError, pa.ArrowException):
            pass  # evicted meanwhile
    with fs.open_input_file(path) as f:
        return int(pq.ParquetFile(f).metadata.num_rows)


KEY_COLUMNS = ("ad_id", "product_id")

#: A file's keys as :func:`read_keys` returns them when its ids cannot be indexed: (key columns, row group sizes).
KeyColumns = tuple[pa.Table, list[int]]


def read_keys(f: StateReader) -> KeyIndex | KeyColumns:
    """The file's key index, or (for ids the index cannot hold) its key columns (a covered file, the
    kill-list, has no product) and, either way, the row group sizes. A mapped file's index is built once per
    machine and mapped from local disk (``key_index_file``)."""
    if f.key_file is not None:
        try:
            return key_index_file.load(f.key_file)
        except (OSError, ValueError):
            pass  # not built yet (or cut short): built below
    keys = f.read_columns([c for c in KEY_COLUMNS if c in f.column_names])
    sizes = f.row_group_sizes
    index = KeyIndex.build(keys, sizes)
    if index is None:
        return keys, sizes
    if f.key_file is not None:
        try:
            key_index_file.save(index, f.key_file)
            return key_index_file.load(f.key_file)  # what this worker keeps is then only mapped
        except (OSError, ValueError):
            pass  # a full disk: kept decoded
    return index


@dataclass
class StateFile:
    """One state file: ``name`` (its store path: state files are immutable, so the name is a cache key),
    ``kind`` (``docs.parquet`` or ``covered.parquet``) and how to open it (on first use only).

    ``layer``: 0 for the full version's files, 1, 2, ... for the kept segments' (oldest first).
    ``over_full``: the segment was built over the serving full version.
    ``rows``: how many rows it holds, without opening it (opening may copy it); None: opened to count.

    Why layers: every segment's row for an ad is the latest that its micro-batch knew, over the full
    version and every segment before it (:func:`freshidx.delta.segment_merge.segment_rows` never lets a row
    beat a higher known one, and segments are published in build order: a micro-batch that lost its
    base is rebuilt, or rebased only onto a compaction of the very segments it read). So a newer
    segment's row for an ad is at least any older segment's, and at least the full version's when it
    was built over it. A full version published after a segment may know more (late partitions), so
    for such a segment the full's row is read too. Kept segments re-emit every ad of the products they
    touched, so without layers the rows read grew with the segments kept (~2.5 rows per needed ad at
    1M documents and five segments).
    """

    name: str
    kind: str
    opener: Callable[[], StateReader]
    layer: int = 0
    over_full: bool = False
    rows: Callable[[], int] | None = None
    _reader: StateReader | None = None

    @property
    def trusted(self) -> bool:
        """What the readers serve from this file's layer agrees with what it says: the full version, or
        a segment built over it (``segment_merge.segment_update`` keeps older documents only there)."""
        return self.layer == 0 or self.over_full

    def reader(self) -> StateReader:
        if self._reader is None:
            self._reader = self.opener()
        return self._reader

    def num_rows(self) -> int:
        """The rows it holds: from the open file, or counted without opening it when it can be."""
        if self._reader is None and self.rows is not None:
            return self.rows()
        return self.reader().num_rows

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None


#: A state file as a task receives it: (store key, kind, layer, over_full).
FileRef = tuple[str, str, int, bool]


def state_file_name(config: StoreConfig, key: str) -> str:
    """A state file's name on executors (its cache key): endpoint and path, as two S3 servers may hold a bucket
    of the same name."""
    return f"{config.endpoint_url or ''}|{config.arrow_path(key)}"


def open_state_files(config: StoreConfig, files: Sequence[FileRef], disk_bytes: int = 0) -> list[StateFile]:
    """``files`` as :class:`StateFile`, opened on first use (with ``disk_bytes``, as a local mapped copy; the
    caller closes them)."""
    fs = config.arrow_fs()
    return [StateFile(name := state_file_name(config, k), kind,
                      partial(open_state, fs, path := config.arrow_path(k), name, disk_bytes), layer, over,
                      partial(count_rows, fs, path, name, disk_bytes))
            for k, kind, layer, over in files]


def state_writer(disk_bytes: int) -> Callable[[StoreConfig, str, str], None] | None:
    """What a build's shard tasks call with each state file they wrote (``index_shards.StateWritten``):
    :func:`keep_written`, when this deployment keeps local copies."""
    return partial(keep_written, disk_bytes) if disk_bytes > 0 else None


def keep_written(disk_bytes: int, config: StoreConfig, key: str, local_path: str) -> None:
    """Keep the state file a task just wrote and uploaded (``local_path``, stored at ``key``) as this machine's
    mapped copy, with its key index: the version it belongs to is warm here the moment it is published (else
    the first micro-batch after it downloads, decodes and indexes every file of it, seconds per million rows).
    Best effort: a copy that fails costs only that."""
    if disk_bytes <= 0:
        return
    try:
        reader = MappedState(file_cache.adopt(state_file_name(config, key), Path(local_path), disk_bytes))
        try:
            read_keys(reader)  # built and saved beside the copy
        finally:
            reader.close()
    except (OSError, ValueError, pa.ArrowException):
        pass
