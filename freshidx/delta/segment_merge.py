"""An incremental micro-batch's rows, computed in Arrow inside one executor task (docs/architecture.md#state-as-built).

The rule is ``transform``'s: the newest record per ad by :func:`freshidx.spark.transform.tie_break_order`
(Spark's ``max(struct(...))``, :func:`freshidx.spark.transform.latest_per_ad`), and every ad of every product
the batch touches. It runs here, in the task that has just read the state rows the batch needs
(:mod:`freshidx.delta.executor.state_lookup`) and then writes the segment, because as a chain of Spark joins it
cost ~15 small Spark jobs per micro-batch (each broadcast and shuffle stage its own job): seconds on a
Spark Connect server, for a few thousand rows. Everything here is the size of the change.

Pure: Arrow tables in, an Arrow table out; tested against the Spark implementation of the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from freshidx.raw_record import ACTIVE
from freshidx.spark.product_features import ProductFeatures
from freshidx.spark.transform import TYPED_FIELDS, tie_break_order

#: The winner's columns, most significant first (``version``, ``updated_at``, ``status``, then the rest).
ORDER: tuple[str, ...] = tuple(tie_break_order(list(TYPED_FIELDS)))
#: Compared by Arrow's sort: every column before the first list column (Arrow does not sort lists). A
#: tie on all of them (rare but for exact duplicates, which the state holds many of: a segment re-emits
#: its touched products' untouched ads) is settled in Python.
_SORTED = ORDER[:ORDER.index("keywords")]


def _spark_key(value: Any) -> tuple[Any, ...]:
    """Spark's ascending order for one value: null first, arrays element by element then by length
    (Python compares tuples the same way), strings by code point (= UTF-8 bytes)."""
    if value is None:
        return (0,)
    if isinstance(value, list):
        return (1, tuple(_spark_key(v) for v in value))
    return (1, value)


def list_fingerprint(lists: pa.ChunkedArray) -> pa.Array:
    """One string per list that is equal exactly when the lists are (null list: null). Each element is
    written with its length, so no element's content can imitate a separator."""
    arr = lists.combine_chunks()
    # The whole child array with the list's own offsets: right for slices and for null lists whose
    # slot spans child values (``flatten()`` would skip those and misalign the offsets).
    flat = arr.values
    marked = pc.if_else(pc.is_null(flat), pa.scalar("n"), pc.binary_join_element_wise(
        "v", pc.cast(pc.utf8_length(flat), pa.string()), ":", flat, ""))
    rebuilt = pa.ListArray.from_arrays(arr.offsets, marked, mask=arr.is_null())
    return pc.binary_join(rebuilt, ",")


def _same_as_previous(table: pa.Table, columns: list[str]) -> pa.Array:
    """Row i+1 equals row i (nulls equal) in ``columns``; length ``num_rows - 1``."""
    same = pa.array([True] * (table.num_rows - 1), pa.bool_())
    for col in (table.column(c).combine_chunks() for c in columns):
        same = pc.and_(same, _equal(col.slice(1), col.slice(0, len(col) - 1)))
    return same


def latest_per_ad(table: pa.Table) -> pa.Table:
    """One row per ``ad_id``: the one Spark's ``max(struct(ORDER))`` picks (exact duplicates: any). Rows
    are not returned in any particular order."""
    if table.num_rows == 0:
        return table
    # Most ads of a micro-batch's state have one row (of the newest layer holding them): only the ads
    # with several rows go through the sort below.
    counts = pc.value_counts(table.column("ad_id"))
    several = counts.field("values").filter(pc.greater(counts.field("counts"), 1))
    if len(several) == 0:
        return table
    if len(several) < len(counts):
        repeated = _in(table.column("ad_id"), several)
        return pa.concat_tables([table.filter(pc.invert(repeated)), _latest_of_repeated(table.filter(repeated))])
    return _latest_of_repeated(table)


def _latest_of_repeated(table: pa.Table) -> pa.Table:
    # Exact duplicates are common (a segment re-emits its touched products' untouched ads, so one row
    # sits in several state files): sorted next to each other and dropped first, vectorized.
    keywords = list_fingerprint(table.column("keywords"))
    table = table.append_column("_kw", keywords)
    # Descending with nulls last: null is the smallest value, as in Spark.
    keys = [("ad_id", "ascending", "at_end"), *((c, "descending", "at_end") for c in _SORTED),
            ("_kw", "ascending", "at_end"), ("bid", "ascending", "at_end")]
    table = table.take(pc.sort_indices(table, sort_keys=keys))
    duplicate = _same_as_previous(table, ["ad_id", *_SORTED, "_kw", "bid"])
    table = table.filter(pa.concat_arrays([pa.array([True]), pc.invert(duplicate)])).drop_columns(["_kw"])
    ids = table.column("ad_id").combine_chunks()
    first = pc.not_equal(ids.slice(1), ids.slice(0, len(ids) - 1))  # row i+1 starts a new ad
    starts = pa.concat_arrays([pa.array([True]), first.fill_null(True)])
    # Rows i+1 whose ad and sorted keys equal row i's: a tie the sort did not settle (differing keywords
    # or bid: two contents of one version, rare).
    same = _same_as_previous(table, ["ad_id", *_SORTED])
    if not pc.any(same).as_py():
        return table.filter(starts)
    keep = starts.to_pylist()
    tied = same.to_pylist()
    ordered = table.select(list(ORDER))
    i = 0
    while i < len(tied):
        if not tied[i]:
            i += 1
            continue
        j = i
        while j < len(tied) and tied[j]:
            j += 1
        if keep[i]:  # rows i..j tie on the sorted keys; only a tie for first place matters
            rows = ordered.slice(i, j + 1 - i).to_pylist()
            best = max(range(len(rows)), key=lambda r: tuple(_spark_key(rows[r][c]) for c in ORDER))
            for r in range(len(rows)):
                keep[i + r] = r == best
        i = j + 1
    return table.filter(pa.array(keep))


def _latest_of_two(prior: pa.Table, batch: pa.Table) -> pa.Table:
    """``latest_per_ad(concat([prior, batch]))`` of two tables of one row per ad each: an ad in both is
    settled by comparing its two rows column by column (``_SORTED``), the few that tie on all of them as
    :func:`latest_per_ad` settles them."""
    at = pc.index_in(batch.column("ad_id"), value_set=prior.column("ad_id"))
    paired = np.asarray(at.is_valid().to_numpy(zero_copy_only=False), bool)
    if not paired.any():
        return pa.concat_tables([prior, batch])
    mine = pa.array(np.flatnonzero(paired))
    theirs = at.drop_null()
    old, new = prior.take(theirs), batch.take(mine)
    decided = np.zeros(len(new), bool)
    newer = np.zeros(len(new), bool)
    for name in _SORTED:  # most significant first; null is the smallest value, as in Spark
        a, b = new.column(name), old.column(name)
        greater = pc.or_(pc.fill_null(pc.greater(a, b), False), pc.and_(pc.is_valid(a), pc.is_null(b)))
        less = pc.or_(pc.fill_null(pc.less(a, b), False), pc.and_(pc.is_null(a), pc.is_valid(b)))
        gt, lt = _bools(greater), _bools(less)
        newer |= ~decided & gt
        decided |= gt | lt
    in_batch = np.zeros(prior.num_rows, bool)
    in_batch[theirs.to_numpy(zero_copy_only=False)] = True
    tied = pa.concat_tables([old.filter(pa.array(~decided)), new.filter(pa.array(~decided))])
    return pa.concat_tables([
        prior.filter(pa.array(~in_batch)), batch.filter(pa.array(~paired)),
        new.filter(pa.array(decided & newer)), old.filter(pa.array(decided & ~newer)),
        _latest_of_repeated(tied) if tied.num_rows else tied,
    ])


def _bools(values: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(values.to_numpy(zero_copy_only=False), bool)


def _in(column: pa.ChunkedArray | pa.Array, values: pa.Array) -> pa.Array:
    return pc.is_in(column, value_set=values).fill_null(False)


def segment_rows(batch: pa.Table, state: pa.Table) -> pa.Table:
    """Every ad of every product ``batch`` touched, at its latest state over ``state`` and ``batch``,
    plus each batch ad's latest row whatever its status (``TYPED_FIELDS`` columns).

    * ``batch``: the new records, one row per ad (Spark's ``transform.latest_per_ad`` of what was read);
    * ``state``: what is known before it, several rows per ad allowed (at least every row of a batch ad
      and of every ad with a row in a product the batch touches: ``state_lookup.select_rows``).

    Both in one schema (``index_format.DOCS_ARROW_SCHEMA``).

    A product is touched when a batch ad belongs to it now or belonged to it (active) before: an ad that
    moved leaves its old product, whose features change too. A batch row never beats a higher version
    already known: a deleted or paused v10 keeps a late active v5 hidden (kill-list only).
    """
    return segment_update(batch, state).rows


@dataclass(frozen=True)
class SegmentUpdate:
    """A micro-batch's segment: ``rows`` (:func:`segment_rows`: the state it publishes, whole touched
    products) and ``replace``, one flag per row: the ad's served document changes, so the segment's
    kill-list holds it and, when active, the segment indexes it again. Unflagged active rows are state
    only: their served document (in an older layer) is already what a rebuild would serve."""

    rows: pa.Table
    replace: pa.Array

    def replaced(self) -> pa.Table:
        return self.rows.filter(self.replace)


def segment_update(batch: pa.Table, state: pa.Table, distrusted: pa.Array | None = None) -> SegmentUpdate:
    """:func:`segment_rows` and which of its ads' served documents change (:class:`SegmentUpdate`).

    A served document is the ad's row plus its product's features, so it changes for a batch ad and for
    every ad of a product whose features (``product_features``) the batch changes; the other ads of a
    touched product keep the document an older layer serves (a product's ads are re-indexed only
    where its features change: at a million documents about half of a busy micro-batch's touched products keep their
    features). That holds only where the older layers serve what ``state`` says: ``distrusted`` are ads
    whose rows came from a layer that may not (a segment built over an earlier full version, which a
    newer full version may contradict with late records); their ads and products are replaced whole,
    as every touched product was before.
    """
    batch = batch.select(list(TYPED_FIELDS))
    state = state.select(list(TYPED_FIELDS))
    batch_ids = pc.unique(batch.column("ad_id").combine_chunks())
    prior_batch = latest_per_ad(state.filter(_in(state.column("ad_id"), batch_ids)))
    prior_active = prior_batch.filter(_active(prior_batch))
    touched = pc.unique(pa.concat_arrays([batch.column("product_id").combine_chunks(),
                                          prior_active.column("product_id").combine_chunks()]).drop_null())
    in_touched = pc.unique(state.column("ad_id").filter(_in(state.column("product_id"), touched)).combine_chunks())
    others = in_touched.filter(pc.invert(_in(in_touched, batch_ids)))
    prior_others = latest_per_ad(state.filter(_in(state.column("ad_id"), others)))
    # The latest row is a maximum per ad: the batch competes only with its own ads' prior rows.
    latest_batch = _latest_of_two(prior_batch, batch)
    resolved = pa.concat_tables([prior_others, latest_batch])
    rows = resolved.filter(pc.or_(_in(resolved.column("product_id"), touched),
                                  _in(resolved.column("ad_id"), batch_ids)))
    changed = _features_changed(prior_others, prior_batch, latest_batch, touched)
    replaced_ads = batch_ids
    if distrusted is not None and len(distrusted):
        replaced_ads = pc.unique(pa.concat_arrays([batch_ids, distrusted.cast(pa.string())]))
        mixed = pa.concat_tables([prior_others, prior_batch, rows])
        changed = pc.unique(pa.concat_arrays([
            changed, mixed.filter(_in(mixed.column("ad_id"), distrusted)).column("product_id").combine_chunks()
        ]).drop_null())
    replace = pc.or_(_in(rows.column("ad_id"), replaced_ads), _in(rows.column("product_id"), changed))
    return SegmentUpdate(rows=rows, replace=replace)


def _features_changed(others: pa.Table, old_batch: pa.Table, new_batch: pa.Table, touched: pa.Array) -> pa.Array:
    """The products of ``touched`` whose features over the active ads of ``others`` and ``old_batch`` differ from
    those over ``others`` and ``new_batch`` (the batch ads' rows before and after; ``others``: the other ads).

    Settled from the batch's side: a product's count changes exactly when its batch ads' count does, and
    its best bid can change only where its batch ads' best bid does; only for those products are the other
    ads' bids aggregated (a product's other ads are most of the rows)."""
    old, new = _features(old_batch, touched), _features(new_batch, touched)
    joined = old.join(new, "product_id", join_type="full outer", left_suffix="_old", right_suffix="_new",
                      use_threads=False)
    counts_same = pc.equal(joined.column("n_old").fill_null(0), joined.column("n_new").fill_null(0))
    bests_same = _equal(joined.column("best_old"), joined.column("best_new"))
    changed = joined.filter(pc.invert(counts_same)).column("product_id").combine_chunks()
    unsettled = joined.filter(pc.and_(counts_same, pc.invert(bests_same)))
    if unsettled.num_rows == 0:
        return changed
    products = unsettled.column("product_id").combine_chunks()
    rest = _features(others, products)
    unsettled = unsettled.join(rest.select(["product_id", "best"]), "product_id", join_type="left outer",
                               use_threads=False)
    best = unsettled.column("best")
    before = pc.max_element_wise(best, unsettled.column("best_old"), skip_nulls=True)
    after = pc.max_element_wise(best, unsettled.column("best_new"), skip_nulls=True)
    moved = unsettled.filter(pc.invert(_equal(before, after))).column("product_id").combine_chunks()
    return pa.concat_arrays([changed, moved])


def _features(rows: pa.Table, products: pa.Array) -> pa.Table:
    """``ProductFeatures`` (``product_id, n, best``) of the active ``rows`` of ``products``."""
    features = ProductFeatures()
    columns = rows.select(["product_id", "bid", "status"])  # filtering texts and keywords too costs more
    features.add(columns.filter(pc.and_(_active(columns), _in(columns.column("product_id"), products))))
    return features.table()


def _equal(a: pa.Array | pa.ChunkedArray, b: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Equal, nulls equal to nulls (e.g. a product without a bid, or missing on one side)."""
    return pc.or_(pc.equal(a, b).fill_null(False), pc.and_(pc.is_null(a), pc.is_null(b)))


def _active(rows: pa.Table) -> pa.ChunkedArray:
    return pc.equal(rows.column("status"), ACTIVE).fill_null(False)
