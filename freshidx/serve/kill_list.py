"""One delta shard's kill-list in a reader's memory (docs/architecture.md#index-format-and-serving).

Ad ids are usually all of one length. Those are kept as one sorted array of fixed-width byte strings
(``numpy.searchsorted`` answers ``in``), viewed in place from the column's buffers (a delta shard's writer
puts its ids in order, so a reader only checks it; ids out of order are sorted by Arrow here),
without a Python object per id: taking in a segment's kill-list then runs almost entirely without the
interpreter lock, beside the rest of the download, where a set of strings costs one object per id and
holds the lock throughout. Ids of mixed lengths fall back to a ``frozenset``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


class SortedIds:
    """Ids of one length in bytes, sorted: a read-only set of ``str`` for ``in``, ``len`` and iteration."""

    __slots__ = ("_ids", "_width")

    def __init__(self, ids: np.ndarray[Any, Any]) -> None:
        self._ids = ids
        self._width = ids.dtype.itemsize

    def __contains__(self, ad_id: object) -> bool:
        if not isinstance(ad_id, str):
            return False
        key = ad_id.encode()
        if len(key) != self._width:
            return False
        i = int(np.searchsorted(self._ids, key))
        return i < len(self._ids) and bytes(self._ids[i]) == key

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[str]:
        return (bytes(b).decode() for b in self._ids)

    def __repr__(self) -> str:
        return f"SortedIds({len(self)} ids of {self._width} bytes)"


@dataclass(frozen=True)
class KillLists:
    """Kill-lists kept apart and asked in turn: what hides a part's hits (every newer applied segment's list,
    :attr:`freshidx.serve.versions.VersionSet.searched`) and one part's shards' lists. A union would cost the
    reader every id again: at each swap for what hides a part (quadratic in the segments), on its critical
    path for a part's shards (one more sort of the segment's ids). A hit asks each list in turn, a few
    lookups for the few hits a search takes."""

    lists: tuple[KillList, ...] = ()

    def __contains__(self, ad_id: object) -> bool:
        return any(ad_id in kill for kill in self.lists)

    def __bool__(self) -> bool:
        return any(self.lists)

    def __iter__(self) -> Iterator[str]:
        for kill in self.lists:
            yield from kill

    def with_list(self, kill: KillList) -> KillLists:
        return KillLists((*self.lists, kill)) if kill else self


KillList = frozenset[str] | SortedIds | KillLists
EMPTY: KillList = frozenset()


def of_shards(lists: list[KillList]) -> KillList:
    """One part's kill-list from its shards' lists."""
    kept = tuple(k for k in lists if k)
    if not kept:
        return EMPTY
    if len(kept) == 1:
        return kept[0]
    flat = tuple(x for k in kept for x in (k.lists if isinstance(k, KillLists) else (k,)))
    return KillLists(flat)


def kill_list_of(ids: pa.Array | pa.ChunkedArray) -> KillList:
    """The non-null ids of a string column as a :data:`KillList`."""
    arr = pc.drop_null(ids)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if len(arr) == 0:
        return EMPTY
    if arr.type != pa.string():
        return frozenset(arr.cast(pa.string()).to_pylist())
    width = _fixed_width(arr)
    if width is None:
        return frozenset(arr.to_pylist())
    ordered = arr if _in_order(arr) else pc.take(arr, pc.sort_indices(arr))
    if isinstance(ordered, pa.ChunkedArray):
        ordered = ordered.combine_chunks()
    start = int(np.frombuffer(ordered.buffers()[1], dtype=np.int32)[ordered.offset])
    data = np.frombuffer(ordered.buffers()[2], dtype=np.uint8)[start:start + width * len(ordered)]
    return SortedIds(data.view(f"S{width}"))


def _in_order(arr: pa.StringArray) -> bool:
    """Whether ``arr`` is in byte order already (a delta shard's writer sorts its ids): checking costs a
    fraction of Arrow's sort, which holds no interpreter lock either, unlike numpy's of bytes."""
    return len(arr) < 2 or bool(pc.all(pc.less_equal(arr.slice(0, len(arr) - 1), arr.slice(1))).as_py())


def _fixed_width(arr: pa.StringArray) -> int | None:
    """The byte length every id has, or None if they differ (or one ends in a NUL, which numpy's
    fixed-width bytes would drop)."""
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset:arr.offset + len(arr) + 1]
    widths = np.diff(offsets)
    width = int(widths[0])
    if width == 0 or not (widths == width).all():
        return None
    data = np.frombuffer(arr.buffers()[2], dtype=np.uint8)[offsets[0]:offsets[-1]]
    return None if (data[width - 1::width] == 0).any() else width


def read_kill_list(source: Path | bytes) -> KillList:
    """The kill-list of one ``covered.parquet`` (a path in the cache, or its verified bytes)."""
    # ParquetFile, not read_table: read_table's first call imports pyarrow.dataset
    src = pa.BufferReader(source) if isinstance(source, bytes) else source
    # one column of one file, decoded on the calling thread (the fetching threads are already many)
    return kill_list_of(pq.ParquetFile(src).read(columns=["ad_id"], use_threads=False).column(0))
