"""An incremental micro-batch's rows, computed in Arrow inside one executor task (docs/architecture.md#state-as-built).

The rules are :mod:`freshidx.record_rules`' (the newest record per ad,
:func:`freshidx.record_rules.latest_per_ad`; every ad of every product the batch touches,
:func:`freshidx.record_rules.touched_products`), as Spark renders them in
:func:`freshidx.delta.product_expansion.expand_to_products`. It runs here, in the task that has just read the state
rows the batch needs (:mod:`freshidx.delta.executor.state_lookup`) and then writes the segment, because as a
chain of Spark joins it cost ~15 small Spark jobs per micro-batch (each broadcast and shuffle stage its own
job): seconds on a Spark Connect server, for a few thousand rows. Everything here is the size of the change.

Pure: Arrow tables in, an Arrow table out; tested against the Spark rendering of the same rules.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from freshidx.record_rules import (
    TYPED_FIELDS,
    ProductFeatures,
    equal_or_null,
    id_codes,
    is_active,
    is_in,
    latest_of_two,
    latest_rows,
    touched_products,
)


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
    every ad of a product whose features (``record_rules.ProductFeatures``) the batch changes; the other ads of a
    touched product keep the document an older layer serves (a product's ads are re-indexed only
    where its features change: at a million documents about half of a busy micro-batch's touched products keep their
    features). That holds only where the older layers serve what ``state`` says: ``distrusted`` are ads
    whose rows came from a layer that may not (a segment built over an earlier full version, which a
    newer full version may contradict with late records); their ads and products are replaced whole,
    as every touched product was before.
    """
    batch = batch.select(list(TYPED_FIELDS))
    state = state.select(list(TYPED_FIELDS)).combine_chunks()  # one chunk: many takes and filters follow
    # Each ad as one integer over the state and the batch: one hash of the ids, not one per set below.
    codes, distinct = id_codes(pa.chunked_array([*state.column("ad_id").chunks, *batch.column("ad_id").chunks],
                                                pa.string()))
    state_ads, batch_ads = codes[:state.num_rows], codes[state.num_rows:]
    latest = latest_rows(state, state_ads)
    in_batch = np.zeros(distinct, bool)
    in_batch[batch_ads] = True
    of_batch = in_batch[state_ads[latest]]
    prior_batch = state.take(pa.array(latest[of_batch]))
    touched = touched_products(batch, prior_batch)
    # The other ads of the touched products, at their latest row: an ad whose latest row is elsewhere
    # neither is a document of these products nor counts in their features.
    rest = state.take(pa.array(latest[~of_batch]))
    prior_others = rest.filter(is_in(rest.column("product_id"), touched))
    # The latest row is a maximum per ad: the batch competes only with its own ads' prior rows. Every
    # row of prior_others is in a touched product and every row of latest_batch is a batch ad's.
    latest_batch = latest_of_two(prior_batch, batch)
    rows = pa.concat_tables([prior_others, latest_batch])
    changed = _features_changed(prior_others, prior_batch, latest_batch)
    replace_others = is_in(prior_others.column("product_id"), changed)
    if distrusted is not None and len(distrusted):
        distrusted = distrusted.cast(pa.string())
        mixed = pa.concat_tables([prior_others, prior_batch, latest_batch])
        changed = pc.unique(pa.concat_arrays([
            changed, mixed.filter(is_in(mixed.column("ad_id"), distrusted)).column("product_id").combine_chunks()
        ]).drop_null())
        replace_others = pc.or_(is_in(prior_others.column("ad_id"), distrusted),
                                is_in(prior_others.column("product_id"), changed))
    replace = pa.concat_arrays([replace_others.combine_chunks(), pa.array(np.ones(latest_batch.num_rows, bool))])
    return SegmentUpdate(rows=rows, replace=replace)


def _features_changed(others: pa.Table, old_batch: pa.Table, new_batch: pa.Table) -> pa.Array:
    """The products whose features over the active ads of ``others`` and ``old_batch`` differ from those over
    ``others`` and ``new_batch`` (the batch ads' rows before and after; ``others``: the other ads of the
    products the batch touches, the only products an active row of either batch side can be in).

    Settled from the batch's side: a product's count changes exactly when its batch ads' count does, and
    its best bid can change only where its batch ads' best bid does; only for those products are the other
    ads' bids aggregated (a product's other ads are most of the rows)."""
    old, new = _features(old_batch), _features(new_batch)
    joined = old.join(new, "product_id", join_type="full outer", left_suffix="_old", right_suffix="_new",
                      use_threads=False)
    counts_same = pc.equal(joined.column("n_old").fill_null(0), joined.column("n_new").fill_null(0))
    bests_same = equal_or_null(joined.column("best_old"), joined.column("best_new"))
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
    moved = unsettled.filter(pc.invert(equal_or_null(before, after))).column("product_id").combine_chunks()
    return pa.concat_arrays([changed, moved])


def _features(rows: pa.Table, products: pa.Array | None = None) -> pa.Table:
    """``ProductFeatures`` (``product_id, n, best``) of the active ``rows`` (of ``products``, when given)."""
    features = ProductFeatures()
    columns = rows.select(["product_id", "bid", "status"])  # filtering texts and keywords too costs more
    wanted = is_active(columns)
    if products is not None:
        wanted = pc.and_(wanted, is_in(columns.column("product_id"), products))
    features.add(columns.filter(wanted))
    return features.table()
