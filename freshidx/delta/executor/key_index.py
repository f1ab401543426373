"""Sorted key index of one immutable state file: the rows of given ads and products by their hashes.

The segment task (:mod:`freshidx.delta.executor.state_lookup`) needs, per micro-batch, the state rows of the batch's
ads and of every ad in the products they touch. Filtering the key columns with ``is_in`` scans every state
row each time: cheap per row, but it grows with the window. Built once per file (state files never change:
a reused Python worker keeps the index in :mod:`freshidx.delta.executor.decoded_cache`), this index answers the same
questions in about O(batch) plus the rows returned:

* ad ids as fixed-width UTF-8 bytes in whole 8-byte words, ordered by a 64-bit hash of their bytes
  (:func:`key_hashes`), with the row of each (and each row's place among them);
* products as codes: the distinct products in hash order, a code per row, and the rows grouped by code;
* for each, a :func:`directory` of where the hashes of each value of their top bits begin (about one
  hash per bucket), so a lookup reads a bucket or two instead of bisecting the whole array.

Searching 64-bit integers is cheaper than comparing the ids' bytes; every hit is then compared word for
word, and ids whose hashes collide are settled by their bytes (:func:`_matches`), so answers are exact.
For ids of up to 16 bytes, about 36 bytes per row of a kill-list and 51 of a docs file. Ids that fixed-width
bytes cannot hold exactly (a trailing NUL, or longer than :data:`MAX_KEY_BYTES`) give no index: the caller
falls back to the scan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from freshidx.spark.string_buffers import string_layout

__all__ = ["LAYOUT", "MAX_KEY_BYTES", "KeyIndex", "as_keys", "distinct_keys", "key_hashes", "query_keys",
           "rows_and_hits"]

#: Longest id the index stores (fixed width: every row pays for the longest).
MAX_KEY_BYTES = 64

#: Part of a cached index's key in a worker's decoded cache: bump it when KeyIndex's fields or methods
#: change meaning. A Connect client may ship freshidx by value (``code_shipping.ship_by_value``), so each
#: client process brings its own copy of the class, while a reused worker keeps the instances earlier
#: clients built: an instance is used through its own methods (never checked with ``isinstance``), and
#: only under the same layout.
LAYOUT = 5


def as_keys(values: pa.Array | pa.ChunkedArray) -> np.ndarray | None:
    """Non-null ``values`` as a fixed-width bytes array, or ``None`` if that would not be exact.

    Vectorized over Arrow's offsets and data buffers (one numpy pass per byte column): building the
    index of a 500k-row file must cost about as much as decoding its keys, not a Python loop."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    arr = values.drop_null()
    if arr.type != pa.string():
        arr = arr.cast(pa.string())
    n = len(arr)
    if n == 0:
        return np.zeros(0, "S8")
    offsets32, data = string_layout(arr)
    offsets = offsets32.astype(np.int64)
    lengths = np.diff(offsets)
    longest = int(lengths.max())
    if longest > MAX_KEY_BYTES:
        return None
    if longest == 0:
        return np.zeros(n, "S8")
    width = _word_width(longest)
    nonempty = lengths > 0
    if np.any(data[offsets[1:][nonempty] - 1] == 0):
        return None  # a trailing NUL: fixed-width bytes would drop it
    out = np.zeros((n, width), np.uint8)
    starts = offsets[:-1]
    for j in range(longest):
        rows = lengths > j
        out[rows, j] = data[starts[rows] + j]
    return out.view(f"S{width}").ravel()


def query_keys(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Distinct non-null ``values`` to look up, as bytes. Ids no index can hold are left out: they
    cannot equal an indexed id."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    keys = as_keys(values)  # vectorized when every id fits (the usual case), as the index was built
    if keys is not None:
        return distinct_keys([keys])
    encoded = {v.encode() for v in values.drop_null().to_pylist()}
    kept = sorted(v for v in encoded if len(v) <= MAX_KEY_BYTES and not v.endswith(b"\0"))
    return distinct_keys([np.array(kept, dtype=f"S{_word_width(max((len(v) for v in kept), default=1))}")])


def _word_width(length: int) -> int:
    """Keys are stored in whole 8-byte words (zero-padded), so two keys compare as integers (:func:`_same`)."""
    return max(8, -(-length // 8) * 8)


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a == b`` for fixed-width bytes keys (aligned), compared word by word: several times cheaper than
    numpy's bytes comparison. Zero padding makes equal words equal keys (no id ends in a NUL: :func:`as_keys`)."""
    width = max(a.dtype.itemsize, b.dtype.itemsize)
    if width % 8 or len(a) == 0:
        return np.asarray(a == b, bool)
    a, b = (np.ascontiguousarray(k if k.dtype.itemsize == width else k.astype(f"S{width}")) for k in (a, b))
    wa, wb = a.view("<u8").reshape(len(a), width // 8), b.view("<u8").reshape(len(b), width // 8)
    equal = wa[:, 0] == wb[:, 0]
    for j in range(1, wa.shape[1]):
        equal &= wa[:, j] == wb[:, j]
    return equal


_MIX = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))
_SEEDS = np.array([0x9E3779B97F4A7C15 * (j + 1) % 2**64 for j in range(MAX_KEY_BYTES // 8)], np.uint64)


def key_hashes(keys: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each fixed-width bytes key, the same at any width (trailing padding adds nothing):
    a splitmix64 of each non-zero 8-byte word, summed."""
    n, width = len(keys), keys.dtype.itemsize
    out = np.zeros(n, np.uint64)
    if n == 0:
        return out
    grid = np.zeros((n, -(-width // 8) * 8), np.uint8)
    grid[:, :width] = np.ascontiguousarray(keys).view(np.uint8).reshape(n, width)
    words = grid.view("<u8")
    with np.errstate(over="ignore"):
        for j in range(words.shape[1]):
            z = words[:, j] ^ _SEEDS[j]
            z = (z ^ (z >> np.uint64(30))) * _MIX[0]
            z = (z ^ (z >> np.uint64(27))) * _MIX[1]
            out += np.where(words[:, j] != 0, z ^ (z >> np.uint64(31)), np.uint64(0))
    return out


def _hash_order(keys: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    """The order of ``keys`` by (hash, bytes): by hash alone unless two different keys share one (rare)."""
    order = np.argsort(hashes)  # equal keys are adjacent either way; their order does not matter
    h, k = hashes[order], keys[order]
    if np.any((h[1:] == h[:-1]) & ~_same(k[1:], k[:-1])):
        order = np.lexsort((keys, hashes))
    return order


def distinct_keys(parts: list[np.ndarray]) -> np.ndarray:
    """The distinct keys of ``parts`` (fixed-width bytes arrays) in (hash, bytes) order, as the index
    searches them fastest."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return np.zeros(0, "S8")
    keys = np.concatenate(parts)
    hashes = key_hashes(keys)
    order = _hash_order(keys, hashes)
    k = keys[order]
    first = np.ones(len(k), bool)
    first[1:] = ~_same(k[1:], k[:-1])  # equal keys are adjacent in (hash, bytes) order
    return k[first]


def directory(hashes: np.ndarray) -> np.ndarray:
    """Where each bucket of sorted ``hashes`` begins, a bucket being the hashes that share their top bits
    (about one hash per bucket; the last entry is ``len(hashes)``): :func:`_search` starts there instead of
    bisecting the whole array."""
    bits = max(1, int(len(hashes) - 1).bit_length()) if len(hashes) > 1 else 1
    edges = np.arange(1 << bits, dtype=np.uint64) << np.uint64(64 - bits)
    return np.append(np.searchsorted(hashes, edges, "left"), len(hashes)).astype(np.int32)


#: Steps :func:`_search` walks a bucket before bisecting the rest (a bucket holds ~1 hash, unless hashes repeat).
_WALK = 4


def _search(hashes: np.ndarray, buckets: np.ndarray | None, want: np.ndarray, side: str) -> np.ndarray:
    """``np.searchsorted(hashes, want, side)``, walking each wanted hash's bucket of :func:`directory`
    ``buckets`` (a few random reads instead of a bisection's twenty)."""
    if buckets is None:
        return np.searchsorted(hashes, want, side).astype(np.int64)  # type: ignore[call-overload]
    bits = (len(buckets) - 2).bit_length()
    top = (want >> np.uint64(64 - bits)).astype(np.intp)
    pos, end = buckets[top].astype(np.int64), buckets[top + 1]
    todo = np.flatnonzero(pos < end)
    for _ in range(_WALK):
        if len(todo) == 0:
            return pos
        seen = hashes[pos[todo]]
        todo = todo[seen < want[todo] if side == "left" else seen <= want[todo]]
        pos[todo] += 1
        todo = todo[pos[todo] < end[todo]]
    if len(todo):  # a crowded bucket (repeated hashes): bisect the rest of it
        pos[todo] = np.searchsorted(hashes, want[todo], side)  # type: ignore[call-overload]
    return pos


def _matches(index_hashes: tuple[np.ndarray, np.ndarray | None], keys: np.ndarray, wanted: np.ndarray,
             unique_hashes: bool = False, wanted_hashes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (exclusive) in ``keys`` (ordered by (hash, bytes)) of each wanted key's run of equal keys
    (aligned with ``wanted``: an absent key has an empty run). ``index_hashes``: the hashes of ``keys`` and
    their :func:`directory` (or ``None``). ``unique_hashes``: no hash repeats, so one search per key settles
    it. ``wanted_hashes``: :func:`key_hashes` of ``wanted``, when the caller has them (one set of ids is
    looked up in every state file)."""
    hashes, buckets = index_hashes
    n = len(keys)
    if len(wanted) == 0 or n == 0:
        return np.zeros(len(wanted), np.int64), np.zeros(len(wanted), np.int64)
    want = key_hashes(wanted) if wanted_hashes is None else wanted_hashes
    starts = _search(hashes, buckets, want, "left")
    at = np.minimum(starts, n - 1)
    found = (starts < n) & (hashes[at] == want)
    if unique_hashes:
        hit = np.flatnonzero(found)
        found[hit] = _same(keys[starts[hit]], wanted[hit])
        return starts, starts + found
    hash_ends = _search(hashes, buckets, want, "right")
    # A run of one hash is all the wanted key when its first and last keys are (bytes order within a run).
    hit = np.flatnonzero(found)
    whole = np.zeros(len(wanted), bool)
    whole[hit] = _same(keys[starts[hit]], wanted[hit]) & _same(keys[hash_ends[hit] - 1], wanted[hit])
    ends = np.where(whole, hash_ends, starts)
    for i in np.flatnonzero((hash_ends - starts > 1) & ~whole):  # another key shares the hash: settle by bytes
        s, e = int(starts[i]), int(hash_ends[i])
        starts[i] = s + int(np.searchsorted(keys[s:e], wanted[i], "left"))
        ends[i] = s + int(np.searchsorted(keys[s:e], wanted[i], "right"))
    return starts, ends


def _ranges(starts: np.ndarray, ends: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``values[starts[i]:ends[i]]`` for every i, concatenated (one gather, no Python loop: a
    micro-batch asks for tens of thousands of ranges)."""
    lengths = np.maximum(ends - starts, 0).astype(np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, values.dtype)
    # Position j of the output reads values[starts[i] + (j - where range i begins in the output)].
    begins = np.cumsum(lengths) - lengths
    offsets = np.repeat(starts.astype(np.int64) - begins, lengths)
    return values[offsets + np.arange(total, dtype=np.int64)]


def rows_and_hits(index: KeyIndex, ads: np.ndarray, hashes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``index.rows_of_ads(ads)``, and which of ``ads`` the file holds (a mask aligned with ``ads``), in one
    search. A module function, not a method: a cached index may be an instance of another client's copy
    of the class, built before this function existed (:data:`LAYOUT`); its fields mean the same."""
    starts, ends = _matches((index.ad_hashes, index.ad_buckets), index.ads, ads, index.ads_unique, hashes)
    return np.sort(_ranges(starts, ends, index.ad_rows)).astype(np.int64), ends > starts


def _unique(ordered: np.ndarray) -> bool:
    return bool(len(ordered) < 2 or not np.any(ordered[1:] == ordered[:-1]))


@dataclass(frozen=True)
class KeyIndex:
    """The key index of one file; ``products`` is ``None`` for a file without products (a kill-list)."""

    row_group_sizes: Sequence[int]
    ads: np.ndarray  # ad ids (fixed-width bytes) in (hash, bytes) order
    ad_hashes: np.ndarray  # their hashes (ascending)
    ad_rows: np.ndarray  # the row of each ordered ad id
    ad_place: np.ndarray  # each row's place in ads (ads[ad_place[r]] is row r's ad id)
    products: np.ndarray | None = None  # the distinct products in (hash, bytes) order
    product_hashes: np.ndarray | None = None
    product_of_row: np.ndarray | None = None  # each row's product code (index into products; -1: none)
    rows_by_product: np.ndarray | None = None  # rows ordered by product code
    product_starts: np.ndarray | None = None  # rows of code c: rows_by_product[starts[c]:starts[c + 1]]
    ads_unique: bool = False  # no ad hash repeats (so no ad id: a state file holds one row per ad)
    ad_buckets: np.ndarray | None = None  # directory(ad_hashes)
    product_buckets: np.ndarray | None = None  # directory(product_hashes)
    products_unique: bool = False  # no product hash repeats
    mapped: bool = False  # the arrays are mapped from a file (key_index_file): the page cache holds them

    @classmethod
    def build(cls, keys: pa.Table, row_group_sizes: Sequence[int]) -> KeyIndex | None:
        """From a file's key columns (``ad_id``, optionally ``product_id``); ``None``: ids not indexable."""
        ad_col = keys.column("ad_id").combine_chunks()
        if ad_col.null_count:
            return None
        ads = as_keys(ad_col)
        if ads is None:
            return None
        hashes = key_hashes(ads)
        order = _hash_order(ads, hashes).astype(np.int32)
        place = np.empty(len(order), np.int32)
        place[order] = np.arange(len(order), dtype=np.int32)
        ordered = hashes[order]
        index = cls(list(row_group_sizes), ads[order], ordered, order, place, ads_unique=_unique(ordered),
                    ad_buckets=directory(ordered))
        if "product_id" not in keys.column_names:
            return index
        encoded = keys.column("product_id").combine_chunks().dictionary_encode()
        dictionary = None if encoded.dictionary.null_count else as_keys(encoded.dictionary)
        if dictionary is None:
            return None
        # Dictionary order is first appearance; codes are remapped to the products' (hash, bytes) order.
        product_hashes = key_hashes(dictionary)
        sort = _hash_order(dictionary, product_hashes)
        rank = np.empty(len(sort), np.int64)
        rank[sort] = np.arange(len(sort))
        raw = encoded.indices.to_numpy(zero_copy_only=False)
        valid = ~np.asarray(encoded.indices.is_null().to_numpy(zero_copy_only=False), bool)
        codes = np.full(len(raw), -1, np.int32)
        codes[valid] = rank[raw[valid].astype(np.int64)]
        rows_by_product = np.argsort(codes).astype(np.int32)  # a product's rows are sorted when read
        first_valid = int(np.searchsorted(codes[rows_by_product], 0, "left"))
        rows_by_product = rows_by_product[first_valid:]  # rows without a product belong to none
        starts = np.searchsorted(codes[rows_by_product], np.arange(len(sort) + 1), "left")
        ordered = product_hashes[sort]
        return dataclasses.replace(index, products=dictionary[sort], product_hashes=ordered, product_of_row=codes,
                                   rows_by_product=rows_by_product, product_starts=starts,
                                   product_buckets=directory(ordered), products_unique=_unique(ordered))

    @property
    def nbytes(self) -> int:
        arrays = (self.ads, self.ad_hashes, self.ad_rows, self.ad_place, self.products, self.product_hashes,
                  self.product_of_row, self.rows_by_product, self.product_starts, self.ad_buckets,
                  self.product_buckets)
        return sum(a.nbytes for a in arrays if a is not None)

    @property
    def num_rows(self) -> int:
        return len(self.ads)

    def rows_of_ads(self, ads: np.ndarray, hashes: np.ndarray | None = None) -> np.ndarray:
        """Rows holding any of ``ads`` (distinct keys, as :func:`query_keys` gives), sorted. Distinct keys
        match disjoint runs of rows, so sorting is enough (no ``np.unique``)."""
        starts, ends = _matches((self.ad_hashes, self.ad_buckets), self.ads, ads, self.ads_unique, hashes)
        return np.sort(_ranges(starts, ends, self.ad_rows)).astype(np.int64)

    def ads_of_rows(self, rows: np.ndarray) -> np.ndarray:
        """The ad ids of ``rows``."""
        return self.ads[self.ad_place[rows]]

    def products_of_rows(self, rows: np.ndarray) -> np.ndarray:
        """The products of ``rows`` (rows without one left out)."""
        if self.products is None or self.product_of_row is None or len(rows) == 0:
            return np.zeros(0, "S8")
        codes = self.product_of_row[rows]
        return self.products[codes[codes >= 0]]

    def rows_of_products(self, products: np.ndarray, hashes: np.ndarray | None = None) -> np.ndarray:
        """Rows of any of ``products`` (distinct keys), sorted: a row has one product, so no duplicates."""
        if self.products is None or self.product_hashes is None or self.rows_by_product is None \
                or self.product_starts is None:
            return np.zeros(0, np.int64)
        # Distinct products; their hashes may still collide.
        starts, ends = _matches((self.product_hashes, self.product_buckets), self.products, products,
                                self.products_unique, hashes)
        codes = starts[ends > starts]  # a product present has exactly one code
        return np.sort(_ranges(self.product_starts[codes], self.product_starts[codes + 1],
                               self.rows_by_product)).astype(np.int64)
