"""An incremental micro-batch's segment in one executor task: read what the batch needs from the published
state, merge, write the shard (docs/architecture.md#state-as-built).

Of everything the serving full version and the kept segments know, a micro-batch
(``segment_merge.segment_rows``) needs only the rows of

* the batch's ads (their highest known version, and the product an ad that moved leaves), and
* every ad that has a row in a product the batch touches (its product's features are computed over all of them;
  the segment holds them all as state and re-indexes those whose document changes).

Reading every state row into Spark and joining there costs the window on every micro-batch (measured:
the state step doubled from 100k to 400k documents), and merging with Spark joins cost ~15 small jobs
(seconds through Spark Connect). Here the micro-batch's task (:mod:`freshidx.delta.executor.one_pass`),
holding the batch it parsed, keeps its latest record per ad (``record_rules.latest_per_ad``, so no
aggregation job runs before it), reads the state files in two passes (the key columns of every file first, to find
those rows, then whole records of the row groups that hold them only), merges in Arrow and writes the
segment's shard. The key pass is the only part that still scans the state, at a few bytes per row;
everything downstream of it is the size of the change. Of each needed ad only the newest segment's row is
read (and the full version's, unless that segment rests on it: :class:`StateFile`). With more than one
segment shard, one task per part does all of this for the touched products of its part
(:mod:`freshidx.delta.executor.segment_parts`).

The selection is a superset of what ``segment_rows`` uses (it also keeps the rows of the products of
a batch ad's inactive or older rows), so ``segment_rows`` over it answers exactly as over the whole
state: it computes the exact touched set itself.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from freshidx.delta import segment_merge
from freshidx.delta.executor import segment_parts
from freshidx.delta.executor.decoded_cache import DecodedCache, resolve_worker_cache
from freshidx.delta.executor.key_index import (
    LAYOUT,
    KeyIndex,
    distinct_keys,
    key_hashes,
    query_keys,
    rows_and_hits,
)
from freshidx.delta.executor.state_files import FileRef, KeyColumns, StateFile, open_state_files, read_keys
from freshidx.raw_record import ACTIVE
from freshidx.record_rules import latest_per_ad
from freshidx.spark.index_shards import REPLACE_COLUMN, version_files, widen
from freshidx.spark.shards import (
    COVERED_FILE,
    DOCS_ARROW_SCHEMA,
    DOCS_FILE,
    conform,
)
from freshidx.store import StoreConfig


@dataclass(frozen=True)
class StateLayer:
    """The shards (ShardCommit dicts) of one published piece of state: the full version (the first
    layer) or a kept segment (then oldest first); ``over_full``: a segment built over that full version
    (:class:`StateFile` says what that allows)."""

    shards: list[dict[str, Any]]
    over_full: bool = False


def state_file_refs(layers: Sequence[StateLayer]) -> list[FileRef]:
    """Every ``docs`` and ``covered`` file of ``layers`` (the full version's, then the kept segments')."""
    return [(k, kind, n, layer.over_full) for n, layer in enumerate(layers)
            for kind in (DOCS_FILE, COVERED_FILE)
            for k in version_files({"shards": layer.shards}, kind)]


def merged_rows(config: StoreConfig, files: list[FileRef], cache_bytes: int, records: pa.Table,
                owned: Parts | None = None, seconds: dict[str, float] | None = None, disk_bytes: int = 0) -> pa.Table:
    """The segment's rows with their :data:`REPLACE_COLUMN` flags (``segment_merge.segment_update``) of
    ``records`` (the micro-batch's valid records, ``DOCS_ARROW_SCHEMA``, several per ad possible) over the
    state ``files`` know; of the products of ``owned``'s parts only, when given. ``seconds`` receives the
    time spent reading the state rows and merging. ``cache_bytes``: what each Python worker may keep
    decoded between tasks (``decoded_cache.resolve_worker_cache``); ``disk_bytes``: :func:`open_state_files`."""
    t1 = time.monotonic()
    batch = latest_per_ad(records)
    if batch.num_rows == 0:
        return records.slice(0, 0).append_column(REPLACE_COLUMN, pa.array([], pa.bool_()))
    cache = resolve_worker_cache(cache_bytes)
    state_files = open_state_files(config, files, disk_bytes)
    forget_other_state(cache, state_files)
    distrusted: list[pa.Array] = []
    try:
        state = pa.Table.from_batches(list(select_rows(batch, state_files, cache, owned, distrusted)),
                                      schema=DOCS_ARROW_SCHEMA)
    finally:
        for f in state_files:
            f.close()
    t2 = time.monotonic()
    rows = segment_of(batch, state, owned, pa.concat_arrays(distrusted) if distrusted else None)
    if seconds is not None:
        seconds.update(state=round(t2 - t1, 3), merge=round(time.monotonic() - t2, 3))
    return rows


def segment_of(batch: pa.Table, state: pa.Table, owned: Parts | None = None,
               distrusted: pa.Array | None = None) -> pa.Table:
    """``segment_merge.segment_update`` of ``batch`` (one row per ad) over ``state`` as rows with their
    :data:`REPLACE_COLUMN` flags; with ``owned``, the rows of those parts only, computed from the part of
    the batch that bears on them (``state`` as :func:`select_rows` reads it for those parts)."""
    mine = batch if owned is None else owned.batch_part(batch, state)
    update = segment_merge.segment_update(mine, state, distrusted)
    rows = update.rows.append_column(REPLACE_COLUMN, update.replace)
    return rows if owned is None else rows.filter(pa.array(owned.owns_rows(rows, batch)))


def forget_other_state(cache: DecodedCache, files: Sequence[StateFile]) -> None:
    """Drop from ``cache`` what it keeps of files other than ``files`` (the whole state a micro-batch or a
    warm-up reads): superseded full versions and compacted segments are never read again, and a mapped one
    would hold its deleted file's disk space."""
    names = {f.name for f in files}
    cache.retain(lambda key: isinstance(key, tuple) and key[0] in names)


def _key_index_key(f: StateFile) -> tuple[str, str, int]:
    """Where ``f``'s key index lives in a worker's cache (the lookup's first pass and the warm-up alike)."""
    return f.name, "key-index", LAYOUT


def load_key_index(f: StateFile, cache: DecodedCache, on_read: Callable[[], None] | None = None) -> Any:
    """``f``'s key index (:func:`select_rows`' first pass), from ``cache`` or read (``on_read()``) and kept."""
    def read() -> KeyIndex | KeyColumns:
        if on_read is not None:
            on_read()
        return read_keys(f.reader())
    return cache.get(_key_index_key(f), read, _weight, lasting=True)


def read_ahead(f: StateFile, cache: DecodedCache) -> None:
    """Ask the kernel to bring ``f``'s mapped copy and key index into the page cache, once per worker and file
    (recorded in ``cache``, weightless, forgotten with the file's other entries)."""
    cache.get(_read_ahead_key(f), lambda: f.reader().read_ahead(), lambda _: 0, lasting=True)


def is_read_ahead(f: StateFile, cache: DecodedCache) -> bool:
    return _read_ahead_key(f) in cache


def _read_ahead_key(f: StateFile) -> tuple[str, str]:
    return f.name, "read-ahead"


def is_cached(f: StateFile, cache: DecodedCache, group: int | None = None) -> bool:
    """Whether ``cache`` holds ``f``'s key index (``group`` None) or its row group ``group``."""
    return (_key_index_key(f) if group is None else (f.name, group)) in cache


def load_row_group(f: StateFile, group: int, cache: DecodedCache, on_read: Callable[[], None] | None = None) -> Any:
    """Row group ``group`` of ``f`` (what the second pass reads), from ``cache`` or read (``on_read()``) and kept."""
    def read() -> pa.Table:
        if on_read is not None:
            on_read()
        return f.reader().read_row_group(group)
    if (f.name, group) not in cache and f.reader().mapped:  # nothing to decode: from the page cache, never kept
        return f.reader().read_row_group(group)
    return cache.get((f.name, group), read, lambda v: v.nbytes)


@dataclass(frozen=True)
class Parts:
    """The parts (of ``count``) a segment task owns: the touched products whose part is one of ``mine``,
    and the rows without a product (a batch ad whose newest known row is a kill-list entry) whose ad's
    record in the batch names a product of those parts.

    Of the batch, a task needs only the ads that bear on its products (:meth:`batch_part`): an ad touches
    the product its batch record names and the one its newest known row is in, and a product's features
    are computed over the ads it holds."""

    count: int
    mine: frozenset[int]

    def owns_keys(self, keys: np.ndarray) -> np.ndarray:
        return np.isin(segment_parts.part_of_keys(keys, self.count), list(self.mine))

    def owns_products(self, products: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Whether each of ``products`` (strings; null: no product, owned by none) is of these parts."""
        return np.isin(segment_parts.part_of(products, self.count), list(self.mine))

    def batch_part(self, batch: pa.Table, state: pa.Table) -> pa.Table:
        """The rows of ``batch`` (one per ad) that can change this task's rows: those naming a product of
        these parts and those of an ad with a row in ``state`` (:func:`select_rows` with these parts
        reads the rows of exactly the ads of these parts' products and of those batch ads)."""
        # The batch's ads seen in the state: hashing the batch's ids costs less than hashing the state's.
        ids = batch.column("ad_id").combine_chunks()
        seen = state.column("ad_id").filter(pc.is_in(state.column("ad_id"), value_set=ids)).combine_chunks()
        known = pc.is_in(ids, value_set=pc.unique(seen))
        keep = self.owns_products(batch.column("product_id")) | np.asarray(known.to_numpy(zero_copy_only=False), bool)
        return batch if keep.all() else batch.filter(pa.array(keep))

    def owns_rows(self, rows: pa.Table, batch: pa.Table) -> np.ndarray:
        """Which segment ``rows`` these parts write: by product; a row without one (always a batch ad's: every
        other row is in a touched product) by the product its record in ``batch`` names."""
        part = segment_parts.part_of(rows.column("product_id"), self.count)
        bare = np.flatnonzero(part < 0)  # rare
        if len(bare):
            at = pc.index_in(rows.column("ad_id").take(pa.array(bare)), value_set=batch.column("ad_id"))
            named = batch.column("product_id").take(at)  # null where the ad is not in the batch: owned by none
            part[bare] = segment_parts.part_of(named, self.count)
        return np.isin(part, list(self.mine))


#: What a mapped key index weighs in a worker's cache: its pages belong to the page cache, not the worker.
MAPPED_WEIGHT = 1 << 16


# Below, "isinstance(info, tuple)" tells the key columns from an index, never isinstance(info, KeyIndex):
# a cached index may have been built by another client's copy of the class (LAYOUT).
def _weight(keys: KeyIndex | KeyColumns) -> int:
    if isinstance(keys, tuple):
        return keys[0].nbytes
    return MAPPED_WEIGHT if keys.mapped else keys.nbytes


@dataclass
class _Ids:
    """A set of ids from two sources: Arrow strings (the batch, scanned key columns) and fixed-width bytes
    (key indexes). Indexes are queried in bytes, scans in Arrow; each form is built once, when asked
    for, so a state whose files all have an index never turns its ids into Python strings and back.
    (No functools.cached_property: its lock cannot be pickled when a client ships freshidx by value.)"""

    strings: list[pa.Array]
    keys: list[np.ndarray] = dataclasses.field(default_factory=list)
    _wanted: np.ndarray | None = None
    _hashes: np.ndarray | None = None
    _arrow: pa.Array | None = None

    def wanted(self) -> np.ndarray:
        """For key indexes (ids no index can hold are left out: they match none)."""
        if self._wanted is None:
            self._wanted = distinct_keys([query_keys(pa.concat_arrays(self.strings)), *self.keys])
        return self._wanted

    def hashes(self) -> np.ndarray:
        """:func:`~freshidx.delta.executor.key_index.key_hashes` of :meth:`wanted`, computed once for every file."""
        if self._hashes is None:
            self._hashes = key_hashes(self.wanted())
        return self._hashes

    def arrow(self) -> pa.Array:
        """For key columns (every id)."""
        if self._arrow is None:
            decoded = [pa.array([v.decode() for v in k.tolist()], pa.string()) for k in self.keys]
            self._arrow = pc.unique(pa.concat_arrays([*self.strings, *decoded]))
        return self._arrow


def select_rows(keys: pa.Table, files: list[StateFile], cache: DecodedCache,
                parts: Parts | None = None, distrusted: list[pa.Array] | None = None) -> Iterator[pa.RecordBatch]:
    """The two passes over the state files (pure Arrow and numpy; tested without Spark). What is decoded
    goes through ``cache`` (a reused worker's next micro-batch decodes only files it has not seen), and
    a file's keys are looked up in its :class:`~freshidx.delta.executor.key_index.KeyIndex` (hash lookups: the
    cost follows the batch, not the state). ``distrusted`` receives the ad ids of the rows read from
    segments not built over the serving full version (:meth:`StateFile.trusted`)."""
    batch_ads = _Ids([pc.unique(keys.column("ad_id").combine_chunks())])
    # Pass 1: key columns only.
    key_info = cache.get_many([(_key_index_key(f), lambda f=f: read_keys(f.reader())) for f in files],
                              _weight, lasting=True)
    # The batch's products and the products its ads were in ...
    strings: list[pa.Array] = [keys.column("product_id").combine_chunks().drop_null()]
    indexed: list[np.ndarray] = []
    for info in key_info:
        if not isinstance(info, tuple):
            if info.products is not None:  # a kill-list names no product
                indexed.append(info.products_of_rows(info.rows_of_ads(batch_ads.wanted(), batch_ads.hashes())))
        elif "product_id" in info[0].column_names:
            prior = info[0].filter(pc.is_in(info[0].column("ad_id"), value_set=batch_ads.arrow()))
            strings.append(prior.column("product_id").combine_chunks().drop_null())
    products = _Ids(strings, indexed)
    # ... and every ad of those products (of the task's own parts: the products it writes), with the batch's
    # ads that name one of them (an ad that leaves one of them has a row in it: it is among its ads).
    own_products, own_hashes = products.wanted(), products.hashes()
    indexed = []
    if parts is None:
        strings = [*batch_ads.strings]
    else:
        owned = parts.owns_keys(own_products)
        own_products, own_hashes = own_products[owned], own_hashes[owned]
        named = keys.filter(pa.array(parts.owns_products(keys.column("product_id"))))
        strings = [pc.unique(named.column("ad_id").combine_chunks())]
    for info in key_info:
        if not isinstance(info, tuple):
            indexed.append(info.ads_of_rows(info.rows_of_products(own_products, own_hashes)))
        elif "product_id" in info[0].column_names:
            t = info[0]
            strings.append(t.filter(pc.is_in(t.column("product_id"), value_set=products.arrow()))
                           .column("ad_id").combine_chunks())
    candidates = _Ids(strings, indexed)
    # Pass 2: whole records of the row groups holding a candidate's row, then just those rows.
    if any(f.layer for f in files) and not any(isinstance(info, tuple) for info in key_info):
        yield from _newest_rows(files, key_info, candidates.wanted(), candidates.hashes(), cache, distrusted)
        return
    for f, info in zip(files, key_info, strict=True):
        if isinstance(info, tuple):
            rows = np.flatnonzero(pc.is_in(info[0].column("ad_id"), value_set=candidates.arrow())
                                  .to_numpy(zero_copy_only=False))
            yield from _read_rows(f, rows, info[1], cache, distrusted)
        else:
            yield from _read_rows(f, info.rows_of_ads(candidates.wanted(), candidates.hashes()), info.row_group_sizes,
                                  cache, distrusted)


def _newest_rows(files: list[StateFile], key_info: list[KeyIndex | KeyColumns], wanted: np.ndarray,
                 hashes: np.ndarray, cache: DecodedCache,
                 distrusted: list[pa.Array] | None) -> Iterator[pa.RecordBatch]:
    """Pass 2 over layered state: each candidate's row from the newest segment that holds it and, unless
    that segment was built over the serving full version, from the full version too (module docstring of
    :class:`StateFile`). Rows read: at most two per candidate, however many segments are kept."""
    by_layer: dict[int, list[tuple[StateFile, KeyIndex]]] = {}
    for f, info in zip(files, key_info, strict=True):
        assert not isinstance(info, tuple)
        by_layer.setdefault(f.layer, []).append((f, info))
    # Which of ``wanted`` the older segments and the full version are still asked for (positions, not keys).
    for_segments, for_full = np.arange(len(wanted)), np.ones(len(wanted), bool)
    for layer in sorted(by_layer, reverse=True):
        asked = np.flatnonzero(for_full) if layer == 0 else for_segments
        held = np.zeros(len(asked), bool)
        for f, info in by_layer[layer]:
            rows, hits = rows_and_hits(info, wanted[asked], hashes[asked])
            held |= hits
            yield from _read_rows(f, rows, info.row_group_sizes, cache, distrusted)
        if layer == 0:
            continue
        if all(f.over_full for f, _ in by_layer[layer]):
            for_full[asked[held]] = False
        for_segments = asked[~held]


def _read_rows(f: StateFile, rows: np.ndarray, sizes: Sequence[int], cache: DecodedCache,
               distrusted: list[pa.Array] | None = None) -> Iterator[pa.RecordBatch]:
    """Rows ``rows`` (sorted) of ``f``, from the row groups holding them (decoded through ``cache``); their
    ad ids also go to ``distrusted`` when ``f`` is not :meth:`StateFile.trusted`."""
    if len(rows) == 0:
        return
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    for g, n in enumerate(sizes):
        lo, hi = np.searchsorted(rows, [bounds[g], bounds[g] + n], "left")
        if lo == hi:
            continue
        group = load_row_group(f, g, cache)
        picked = group.take(pa.array(rows[lo:hi] - bounds[g]))
        if f.kind != DOCS_FILE:  # the kill-list's active ads are whole records in docs.parquet
            picked = picked.filter(pc.not_equal(picked.column("status"), ACTIVE))
        if distrusted is not None and not f.trusted:
            distrusted.append(picked.column("ad_id").combine_chunks())
        for b in picked.to_batches():
            yield conform(b, DOCS_ARROW_SCHEMA) if f.kind == DOCS_FILE else widen(b, DOCS_ARROW_SCHEMA)
