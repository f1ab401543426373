"""A segment built by several Spark tasks at once: which task owns which products
(docs/architecture.md#one-pass-micro-batch).

A micro-batch's segment is every ad of every product the batch touched. With ``delta_segment_shards``
N > 1 the segment is built by N tasks, each owning the touched products whose :func:`part_of` is its
part (so a product never spans shards, as in every build). Which products a batch touches depends on
the whole batch (an ad that moved leaves a product another task may own), so every task reads the
whole batch (:mod:`freshidx.delta.executor.one_pass`), then reads and merges the state rows of its own
products only, and indexes them: the touched products' reads, merges and indexing run on N cores.
:func:`label_of_part` says which ``int`` values Spark's hash partitioning sends to which partition (the
full build from state routes its buckets with it).

Pure (numpy): tested against Spark's own partitioning.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pyarrow as pa

from freshidx.delta.executor.key_index import as_keys

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_MASK32 = 0xFFFFFFFF


def part_of_keys(keys: np.ndarray, parts: int) -> np.ndarray:
    """The part (``0..parts-1``) of each fixed-width bytes key (:func:`freshidx.delta.executor.key_index.as_keys`):
    FNV-1a over its non-zero bytes, so the padding of a wider array never changes a key's part. Stable
    across processes and machines (never Python's salted ``hash``)."""
    if len(keys) == 0:
        return np.zeros(0, np.int64)
    width = keys.dtype.itemsize
    grid = np.frombuffer(np.ascontiguousarray(keys).tobytes(), np.uint8).reshape(len(keys), width)
    used = np.flatnonzero(grid.any(axis=0))  # keys are zero-padded to whole words: skip the padding columns
    h = np.full(len(keys), _FNV_OFFSET, np.uint64)
    with np.errstate(over="ignore"):
        for j in range(int(used[-1]) + 1 if len(used) else 0):
            b = grid[:, j].astype(np.uint64)
            h = np.where(b != 0, (h ^ b) * _FNV_PRIME, h)
    return (h % np.uint64(parts)).astype(np.int64)


def part_of_bytes(key: bytes, parts: int) -> int:
    """:func:`part_of_keys` of one key (for ids no fixed-width array holds exactly)."""
    h = int(_FNV_OFFSET)
    for b in key:
        if b:
            h = ((h ^ b) * int(_FNV_PRIME)) & 0xFFFFFFFFFFFFFFFF
    return h % parts


def part_of(values: pa.Array | pa.ChunkedArray, parts: int) -> np.ndarray:
    """The part of each non-null string of ``values`` (nulls: -1). Each distinct value is hashed once: a
    segment's rows name each product once per ad."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    encoded = values.dictionary_encode()
    distinct = encoded.dictionary
    keys = as_keys(distinct)
    if keys is not None:
        of_distinct = part_of_keys(keys, parts)
    else:
        of_distinct = np.array([part_of_bytes(v.encode(), parts) for v in distinct.to_pylist()], np.int64)
    codes = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False)
    return np.where(codes >= 0, of_distinct[np.maximum(codes, 0)] if len(of_distinct) else -1, -1).astype(np.int64)


# ------------------------------------------------------------------------- Spark's hash partitioning


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK32


def _murmur3_int(value: int, seed: int = 42) -> int:
    """Spark's ``Murmur3_x86_32.hashInt`` (the hash ``repartition(n, col)`` uses for an ``int`` column),
    as a signed 32-bit value."""
    k1 = (value & _MASK32) * 0xCC9E2D51 & _MASK32
    k1 = _rotl(k1, 15) * 0x1B873593 & _MASK32
    h1 = _rotl(seed ^ k1, 13) * 5 + 0xE6546B64 & _MASK32
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK32
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK32
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def spark_partition_of_int(value: int, partitions: int) -> int:
    """The partition ``repartition(partitions, <int column>)`` sends ``value`` to: ``pmod(hash, n)``."""
    return _murmur3_int(value) % partitions


@cache
def label_of_part(parts: int) -> tuple[int, ...]:
    """For each part p, the smallest ``int`` label that Spark's hash partitioning into ``parts``
    partitions sends to partition p. A task still takes its part from the copy's :data:`PART_COLUMN`,
    never from its partition number, so a different hash would cost parallelism, never rows."""
    labels: dict[int, int] = {}
    value = 0
    while len(labels) < parts:
        labels.setdefault(spark_partition_of_int(value, parts), value)
        value += 1
    return tuple(labels[p] for p in range(parts))
