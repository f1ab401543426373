"""The record rules, engine-free (plain Python and Arrow): what a record is, which version of an ad wins,
and how a product's features are derived (docs/architecture.md#incremental-delta).

Every build follows these rules: Spark renders them as expressions (:mod:`freshidx.spark.transform` builds
its ``max(struct(...))`` from :data:`ORDER`), the executor tasks apply them here in Arrow
(:mod:`freshidx.delta.segment_merge`, :mod:`freshidx.spark.index_shards`).

* **A record** is a raw ad change (:mod:`freshidx.raw_record`: fields, types, allowed values) typed as
  :data:`TYPED_FIELDS`; an invalid one gets the reason of the first check it fails, in
  :data:`REASON_ORDER`.
* **Which version wins**: per ``ad_id``, the greatest record in :func:`tie_break_order`, compared as
  Spark compares structs (null smallest, arrays element by element, then by length; strings by code
  point). :func:`latest_per_ad` picks it from an Arrow table.
* **A product's features** are computed over its active ads (:class:`ProductFeatures`), so a change to
  one ad changes the documents of its whole product: a build's rows hold every ad of each product they
  mention. A batch of changes touches the products its ads belong to now and those they belonged to,
  active, before (:func:`touched_products`): an ad that moved changes both.
"""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from freshidx.raw_record import (
    ACTIVE,
    RAW_FIELDS,
    REASON_BAD_BID,
    REASON_BAD_ENCODING,
    REASON_BAD_STATUS,
    REASON_BAD_TIMESTAMP,
    REASON_BAD_VERSION,
    REASON_FUTURE_TIMESTAMP,
    REASON_MALFORMED_JSON,
    REASON_MISSING_FIELD,
    REASON_TOO_LONG,
)

#: Typed record columns, in :data:`~freshidx.raw_record.RAW_FIELDS` order (``updated_at`` a UTC timestamp).
TYPED_FIELDS: tuple[str, ...] = tuple(RAW_FIELDS)
#: The checks of a line, in the order that names an invalid record's reason: the first that fails (after an
#: object-level reason of the whole file, which comes first). ``missing_field`` is one check per required
#: field, in ``RAW_FIELDS`` order, reported as ``missing_field:<field>``. What each check means: the module
#: docstring of :mod:`freshidx.spark.transform`.
REASON_ORDER: tuple[str, ...] = (
    REASON_BAD_ENCODING, REASON_MALFORMED_JSON, REASON_MISSING_FIELD, REASON_BAD_STATUS, REASON_BAD_BID,
    REASON_BAD_TIMESTAMP, REASON_FUTURE_TIMESTAMP, REASON_BAD_VERSION, REASON_TOO_LONG,
)
#: The most significant columns of the tie-break: the highest version wins, then the latest ``updated_at``,
#: then the greatest status (on an exact tie "paused"/"deleted" beat "active": when in doubt, hide).
WINNER_FIRST: tuple[str, ...] = ("version", "updated_at", "status")


def tie_break_order(columns: list[str]) -> list[str]:
    """The columns, most significant first, whose max picks the winning record of an ad:
    :data:`WINNER_FIRST`, then every other record column (deterministic, and exact duplicates collapse),
    then the columns of ``columns`` that are not record columns, sorted."""
    rest = [c for c in TYPED_FIELDS if c not in WINNER_FIRST and c != "ad_id"]
    extra = sorted(c for c in columns if c not in TYPED_FIELDS)
    return [*WINNER_FIRST, *rest, *extra]


#: The winner's columns, most significant first (``version``, ``updated_at``, ``status``, then the rest).
ORDER: tuple[str, ...] = tuple(tie_break_order(list(TYPED_FIELDS)))
#: The rule that settles a version conflict (copies of one ``(ad_id, version)`` with different contents), as
#: the quarantine's ``detail`` and the docs state it: :data:`ORDER` after the version.
CONFLICT_RULE = (f"winner: greatest {ORDER[1]}, then {ORDER[2]} (paused > deleted > active), then "
                 + ", ".join(ORDER[3:]))
#: Compared by Arrow's sort: every column before the first list column (Arrow does not sort lists). A
#: tie on all of them (rare but for exact duplicates, which the state holds many of: a segment re-emits
#: its touched products' untouched ads) is settled in Python.
_SORTED = ORDER[:ORDER.index("keywords")]


def spark_key(value: Any) -> tuple[Any, ...]:
    """Spark's ascending order for one value: null first, arrays element by element then by length
    (Python compares tuples the same way), strings by code point (= UTF-8 bytes)."""
    if value is None:
        return (0,)
    if isinstance(value, list):
        return (1, tuple(spark_key(v) for v in value))
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


def latest_per_ad(table: pa.Table) -> pa.Table:
    """One row per ``ad_id``: the one Spark's ``max(struct(ORDER))`` picks (exact duplicates: any). Rows
    are not returned in any particular order."""
    if table.num_rows == 0:
        return table
    codes, distinct = id_codes(table.column("ad_id"))
    # Most ads of a micro-batch's state have one row (of the newest layer holding them).
    if distinct == len(codes):
        return table
    return table.take(pa.array(latest_rows(table, codes)))


def latest_rows(table: pa.Table, codes: np.ndarray) -> np.ndarray:
    """The position in ``table`` of each ad's row that :func:`latest_per_ad` keeps, in no particular order
    (``codes``: :func:`id_codes` of its ``ad_id``)."""
    if table.num_rows == 0:
        return np.zeros(0, np.int64)
    # The two most significant columns are integers: a sort of integers ranks every ad's rows, and only
    # the rows tied with an ad's first on both (mostly exact duplicates: a segment re-emits its touched
    # products' untouched ads, so one row sits in several state files) need the other columns.
    version = _sortable(table.column("version"))
    updated = _sortable(table.column("updated_at"))
    order = np.lexsort((~updated, ~version, codes))  # by ad, then descending (``~``: nulls last)
    codes, version, updated = codes[order], version[order], updated[order]
    same_ad = codes[1:] == codes[:-1]
    tied = same_ad & (version[1:] == version[:-1]) & (updated[1:] == updated[:-1])
    run_start = np.concatenate([[True], ~tied])  # runs of rows tied on the ad and both columns
    runs = np.flatnonzero(run_start)
    lengths = np.diff(np.append(runs, len(order)))
    leading = np.concatenate([[True], ~same_ad])[runs]  # the run holding its ad's greatest of both
    alone = order[runs[leading & (lengths == 1)]]
    contested = order[np.flatnonzero((leading & (lengths > 1))[np.cumsum(run_start) - 1])]
    if len(contested) == 0:
        return alone
    tied_rows = table.take(pa.array(contested)).append_column(_ROW, pa.array(contested))
    settled = _latest_of_tied(tied_rows).column(_ROW).to_numpy()
    return np.concatenate([alone, settled])


#: The column that carries a row's position through :func:`_latest_of_tied`.
_ROW = "_row"


def _latest_of_tied(table: pa.Table) -> pa.Table:
    """The winner of each ad of ``table``, whose rows come in runs of one ad tied on version and
    ``updated_at``: the run's first row when every row of it equals the one before; else the full
    comparison (:func:`_latest_of_repeated`: two contents of one version, rare)."""
    ids = table.column("ad_id").combine_chunks()
    first = pc.not_equal(ids.slice(1), ids.slice(0, len(ids) - 1)).fill_null(True)  # row i+1 starts a new ad
    starts = _bools(pa.concat_arrays([pa.array([True]), first]))
    fingerprinted = table.append_column("_kw", list_fingerprint(table.column("keywords")))
    compared = [c for c in fingerprinted.column_names if c not in ("keywords", _ROW)]
    differs = np.concatenate([[False], ~_bools(_same_as_previous(fingerprinted, compared))]) & ~starts
    run_of = np.cumsum(starts) - 1
    unsettled = np.zeros(int(run_of[-1]) + 1, bool)
    unsettled[run_of[differs]] = True
    unsettled_rows = unsettled[run_of]
    settled = table.filter(pa.array(starts & ~unsettled_rows))
    if not unsettled_rows.any():
        return settled
    return pa.concat_tables([settled, _latest_of_repeated(table.filter(pa.array(unsettled_rows)))])


def id_codes(ids: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, int]:
    """One integer per row, equal exactly when the rows' ids are (null: one code of its own), and how
    many distinct ids there are."""
    if isinstance(ids, pa.ChunkedArray):  # one dictionary: per-chunk dictionaries would need unifying
        ids = ids.combine_chunks()
    encoded = pc.dictionary_encode(ids, null_encoding="encode")
    return np.asarray(encoded.indices.to_numpy(zero_copy_only=False), np.int64), len(encoded.dictionary)


def _sortable(column: pa.ChunkedArray) -> np.ndarray:
    """Integers (or timestamps) as int64 in Spark's ascending order: null the smallest."""
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.int64())
    values = pc.fill_null(column, np.iinfo(np.int64).min)
    return np.asarray(values.to_numpy(), np.int64)


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
            best = max(range(len(rows)), key=lambda r: tuple(spark_key(rows[r][c]) for c in ORDER))
            for r in range(len(rows)):
                keep[i + r] = r == best
        i = j + 1
    return table.filter(pa.array(keep))


def latest_of_two(prior: pa.Table, batch: pa.Table) -> pa.Table:
    """``latest_per_ad(concat([prior, batch]))`` of two tables of one row per ad each: an ad in both is
    settled by comparing its two rows column by column (``_SORTED``), the few that tie on all of them as
    :func:`latest_per_ad` settles them."""
    at = pc.index_in(batch.column("ad_id"), value_set=prior.column("ad_id"))
    paired = _bools(at.is_valid())
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


def _same_as_previous(table: pa.Table, columns: list[str]) -> pa.Array:
    """Row i+1 equals row i (nulls equal) in ``columns``; length ``num_rows - 1``."""
    same = pa.array([True] * (table.num_rows - 1), pa.bool_())
    for col in (table.column(c).combine_chunks() for c in columns):
        same = pc.and_(same, equal_or_null(col.slice(1), col.slice(0, len(col) - 1)))
    return same


# -------------------------------------------------------------------------------------- products

RowsT = TypeVar("RowsT", pa.RecordBatch, pa.Table)

#: Feature columns :meth:`ProductFeatures.attach` appends, in this order: how many ads of the product are
#: ``active`` (int64), and the highest bid among them (float64; ``0.0`` when none has a bid).
FEATURE_COLUMNS: tuple[str, ...] = ("product_active_ads", "product_best_bid")

_KEYS = pa.schema([pa.field("product_id", pa.string()), pa.field("n", pa.int64()), pa.field("best", pa.float64())])


def is_active(rows: pa.Table | pa.RecordBatch) -> pa.Array | pa.ChunkedArray:
    """Which rows are of active ads (a null status is not)."""
    return pc.equal(rows.column("status"), ACTIVE).fill_null(False)


def touched_products(batch: pa.Table, prior: pa.Table) -> pa.Array:
    """The products a batch of changes touches: those its ads (``batch``) belong to now, and those they
    belonged to while active (``prior``: the same ads' rows before the batch)."""
    return pc.unique(pa.concat_arrays([batch.column("product_id").combine_chunks(),
                                       prior.filter(is_active(prior)).column("product_id").combine_chunks()
                                       ]).drop_null())


class ProductFeatures:
    """Accumulates per-product aggregates over batches of active ads; attaches them to rows.

    :meth:`add` each batch of *active* ads (any number, any order), then :meth:`attach` the features to
    those same rows. The rows must hold every ad of each product they mention (module docstring). A shard
    task computes them from its own rows (one product's ads sit in one shard): in Spark they would cost a
    window over ``product_id``, a shuffle and sort of every row on top of the shard split."""

    def __init__(self) -> None:
        self._partials: list[pa.Table] = []
        self._final: pa.Table | None = None

    def add(self, active: pa.RecordBatch | pa.Table) -> None:
        """Count ``active`` (rows of active ads: ``product_id``, ``bid``) into the aggregates."""
        if self._final is not None:
            raise RuntimeError("ProductFeatures.add() after attach()")
        if active.num_rows == 0:
            return
        table = pa.table({"product_id": active.column("product_id"), "bid": active.column("bid")})
        grouped = table.group_by("product_id", use_threads=False).aggregate(
            [("bid", "count", pc.CountOptions(mode="all")), ("bid", "max")]
        )
        self._partials.append(
            pa.table([grouped["product_id"], grouped["bid_count"], grouped["bid_max"]], schema=_KEYS)
        )

    def table(self) -> pa.Table:
        """``product_id, n, best`` (one row per product seen; ``best`` null when no bid)."""
        if self._final is None:
            if len(self._partials) == 1:
                self._final = self._partials[0]
            elif not self._partials:
                self._final = _KEYS.empty_table()
            else:  # partial aggregates of several batches: combine them (sum of counts, max of maxima)
                grouped = pa.concat_tables(self._partials).group_by("product_id", use_threads=False).aggregate(
                    [("n", "sum"), ("best", "max")]
                )
                self._final = pa.table([grouped["product_id"], grouped["n_sum"], grouped["best_max"]], schema=_KEYS)
            self._final = self._final.combine_chunks()  # one chunk per column: a value set for index_in
            self._partials = []
        return self._final

    def attach(self, rows: RowsT) -> RowsT:
        """``rows`` with :data:`FEATURE_COLUMNS` appended (a product without active ads: 0 and 0.0).

        Pass a whole table rather than batch by batch where possible: each call hashes every product
        of the shard once (``index_in`` builds its lookup table per call)."""
        final = self.table()
        products, counts, bests = (_array(final.column(c)) for c in ("product_id", "n", "best"))
        at = pc.index_in(rows.column("product_id"), value_set=products)
        n = pc.fill_null(pc.take(counts, at), 0)
        best = pc.fill_null(pc.take(bests, at), 0.0)
        names = [*rows.schema.names, *FEATURE_COLUMNS]
        if isinstance(rows, pa.Table):
            return pa.Table.from_arrays([*rows.columns, n, best], names=names)
        return pa.RecordBatch.from_arrays([*rows.columns, n, best], names=names)


# -------------------------------------------------------------------------------------- Arrow helpers

def is_in(column: pa.ChunkedArray | pa.Array, values: pa.Array) -> pa.Array:
    """Membership with nulls as "not in"."""
    return pc.is_in(column, value_set=values).fill_null(False)


def equal_or_null(a: pa.Array | pa.ChunkedArray, b: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Equal, nulls equal to nulls (e.g. a product without a bid, or missing on one side)."""
    return pc.or_(pc.equal(a, b).fill_null(False), pc.and_(pc.is_null(a), pc.is_null(b)))


def _bools(values: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(values.to_numpy(zero_copy_only=False), bool)


def _array(column: pa.ChunkedArray) -> pa.Array:
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
