"""The record rules in Arrow (freshidx.record_rules) and the micro-batch merge (freshidx.delta.segment_merge)
answer exactly as the Spark rendering they stand in for: ``latest_per_ad`` as Spark's ``max(struct(...))``
(ties on version, time and status settled by the other columns, nulls first, arrays element by element) and
``segment_rows`` as ``product_expansion.expand_to_products`` over a state of one row per ad."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

import pyarrow as pa

from freshidx import record_rules
from freshidx.delta import product_expansion, segment_merge
from freshidx.spark import transform
from freshidx.spark.index_format import DOCS_ARROW_SCHEMA
from freshidx.spark.index_shards import DOCS_DDL

T0 = dt.datetime(2026, 11, 25, 12, 0, tzinfo=dt.UTC)


def _row(rng: random.Random, ad: str, *, inactive_bare: float = 0.5, products: int = 3) -> dict[str, Any]:
    status = rng.choice(["active", "active", "paused", "deleted"])
    bare = status != "active" and rng.random() < inactive_bare  # a kill-list row: key columns only
    keywords: list[str | None] | None = rng.choice(
        [None, [], ["a"], ["a", "b"], ["b"], ["a", None], [None], ["a", "b", "c"]])
    return {
        "ad_id": ad,
        "campaign_id": None if bare else rng.choice(["c1", "c2"]),
        "product_id": None if bare else f"p{rng.randrange(products)}",
        "title": None if bare else rng.choice(["x", "y", "é", "z"]),
        "keywords": None if bare else keywords,
        "bid": None if bare else rng.choice([1.0, 2.0, 2.5]),
        "status": status,
        # Few versions and times: most ads have ties that only the later columns settle.
        "updated_at": rng.choice([T0, T0 + dt.timedelta(seconds=1), None]) if bare else
        rng.choice([T0, T0 + dt.timedelta(seconds=1)]),
        "version": rng.randint(1, 2),
    }


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=DOCS_ARROW_SCHEMA)


def _spark_frame(spark: Any, rows: list[dict[str, Any]]) -> Any:
    return spark.createDataFrame([tuple(r[c] for c in transform.TYPED_FIELDS) for r in rows], DOCS_DDL)


def _by_ad(rows: list[dict[str, Any]]) -> dict[str, tuple[Any, ...]]:
    return {r["ad_id"]: tuple(r[c] for c in transform.TYPED_FIELDS) for r in rows}


def test_latest_per_ad_picks_what_spark_picks(spark: Any) -> None:
    rng = random.Random(7)
    # Ads with many rows, and ads with one (those skip the sort), shuffled together.
    rows = [_row(rng, f"ad-{rng.randrange(150)}") for _ in range(1500)] + [_row(rng, f"one-{i}") for i in range(60)]
    rng.shuffle(rows)
    latest = record_rules.latest_per_ad(_table(rows))
    got = _by_ad(latest.to_pylist())
    spark_rows = [r.asDict() for r in transform.latest_per_ad(_spark_frame(spark, rows)).collect()]
    want = _by_ad([{**r, "updated_at": r["updated_at"] and r["updated_at"].astimezone(dt.UTC)}
                   for r in spark_rows])
    assert len(want) == 210 == latest.num_rows
    differing = [a for a in want if got.get(a) != want[a]]
    assert not differing, [(got.get(a), want[a]) for a in differing[:3]]


def test_segment_rows_equal_expand_to_products_over_one_row_per_ad(spark: Any) -> None:
    rng = random.Random(11)
    for _ in range(4):
        # As published: active ads whole (docs.parquet), inactive ones from the kill-list (covered.parquet).
        # Many products, a small batch: most products untouched, so an ad that moves matters.
        state = [_row(rng, f"ad-{i}", inactive_bare=1.0, products=15) for i in range(60)]
        batch_rows = [_row(rng, f"ad-{rng.randrange(80)}", inactive_bare=0.0, products=15) for _ in range(6)]
        batch = record_rules.latest_per_ad(_table(batch_rows))
        got = _by_ad(segment_merge.segment_rows(batch, _table(state)).to_pylist())
        spark_batch = _spark_frame(spark, batch.to_pylist())
        out = product_expansion.expand_to_products(spark_batch, _spark_frame(spark, state)).collect()
        want = _by_ad([{**r.asDict(), "updated_at": r["updated_at"] and r["updated_at"].astimezone(dt.UTC)}
                       for r in out])
        assert got == want
        assert set(batch.column("ad_id").to_pylist()) <= set(got)  # every batch ad, whatever its status


def test_keyword_fingerprints_are_equal_exactly_when_the_lists_are() -> None:
    lists = [None, [], [None], [None, None], [""], ["a"], ["a", None], [None, "a"], ["a", "b"], ["a,vb"],
             ["1:a"], ["v1:a"], ["a", ""], ["", "a"], ["é"], ["e"]]
    arr = pa.array([["pad"], *lists * 2], pa.list_(pa.string())).slice(1)  # a slice: offsets not from 0
    prints = record_rules.list_fingerprint(pa.chunked_array([arr])).to_pylist()
    for i, a in enumerate(lists * 2):
        for j, b in enumerate(lists * 2):
            assert (prints[i] == prints[j]) == (a == b), (a, b, prints[i], prints[j])


def _documents(rows: list[dict[str, Any]]) -> dict[str, tuple[Any, ...]]:
    """The served document of every active ad of ``rows`` (one row per ad): its row and its product's
    features over ``rows`` (``record_rules.ProductFeatures``: count of active ads, best bid, 0.0 when none)."""
    active = [r for r in rows if r["status"] == "active"]
    count: dict[Any, int] = {}
    best: dict[Any, float] = {}
    for r in active:
        count[r["product_id"]] = count.get(r["product_id"], 0) + 1
        if r["bid"] is not None:
            best[r["product_id"]] = max(best.get(r["product_id"], r["bid"]), r["bid"])
    return {r["ad_id"]: (*(r[c] for c in transform.TYPED_FIELDS), count[r["product_id"]],
                         best.get(r["product_id"], 0.0)) for r in active}


def _apply(served: dict[str, tuple[Any, ...]], update: segment_merge.SegmentUpdate) -> dict[str, tuple[Any, ...]]:
    """What a reader serves after the segment: older documents minus its kill-list (the replaced rows),
    plus the replaced active rows indexed with features over the segment's whole products."""
    replaced = update.replaced().to_pylist()
    killed = {r["ad_id"] for r in replaced}
    new = _documents(update.rows.to_pylist())
    out = {a: d for a, d in served.items() if a not in killed}
    out.update({r["ad_id"]: new[r["ad_id"]] for r in replaced if r["status"] == "active"})
    return out


def test_segment_update_replaces_exactly_the_documents_that_change() -> None:
    """Over random states and batches (moves, pauses, deletes, re-deliveries, lower versions, ties), what a
    reader serves after the segment (older documents minus the kill-list, plus the segment's documents)
    equals the documents of the new latest state, while the segment replaces fewer documents than the
    rows it holds (products whose features stay keep their documents)."""
    kept_total = 0
    for seed in range(40):
        rng = random.Random(seed)
        state_rows = [_row(rng, f"ad-{a}", inactive_bare=0.0, products=6) for a in range(40)]
        state = record_rules.latest_per_ad(_table(state_rows))
        batch = record_rules.latest_per_ad(_table(
            [_row(rng, f"ad-{rng.randrange(50)}", inactive_bare=0.0, products=6)
             for _ in range(rng.randint(1, 6))]))
        update = segment_merge.segment_update(batch, state)
        truth = record_rules.latest_per_ad(pa.concat_tables([state, batch])).to_pylist()
        assert _apply(_documents(state.to_pylist()), update) == _documents(truth), f"seed {seed}"
        kept_total += update.rows.num_rows - update.replaced().num_rows
    assert kept_total > 0, "some touched products kept their documents"


def test_segment_update_replaces_whole_products_of_distrusted_rows() -> None:
    """A layer that may serve something else than its rows say (a segment over an older full version) is
    healed: its ads' products are replaced whole, as a rebuild would serve them."""
    def ad(a: str, bid: float) -> dict[str, Any]:
        return {"ad_id": a, "campaign_id": "c", "product_id": "p", "title": "t", "keywords": ["k"], "bid": bid,
                "status": "active", "updated_at": T0, "version": 1}

    state = _table([ad("a1", 1.0), ad("a2", 2.0)])
    batch = _table([ad("a1", 1.0)])  # a re-delivery: product p's features do not change
    # Served before: a1 and a2 carry features of p without a2 (a newer full version knew a2 late).
    served = {"a1": (*ad("a1", 1.0).values(), 1, 1.0), "a2": (*ad("a2", 2.0).values(), 1, 2.0)}
    truth = _documents(state.to_pylist())
    assert _apply(served, segment_merge.segment_update(batch, state)) != truth  # trusting them keeps a2 stale
    healed = segment_merge.segment_update(batch, state, pa.array(["a2"]))
    assert {r["ad_id"] for r in healed.replaced().to_pylist()} == {"a1", "a2"}
    assert _apply(served, healed) == truth


def test_the_newer_of_two_rows_per_ad_is_what_the_sort_picks() -> None:
    # segment_update settles a batch ad against its prior row column by column: the same winner as
    # latest_per_ad's sort, ties on every sorted column (rows equal but for keywords or bid) included.
    rng = random.Random(3)
    for _ in range(20):
        prior = record_rules.latest_per_ad(_table([_row(rng, f"ad-{rng.randrange(80)}") for _ in range(120)]))
        batch = record_rules.latest_per_ad(_table([_row(rng, f"ad-{rng.randrange(120)}") for _ in range(90)]))
        rows = record_rules.latest_of_two(prior, batch).to_pylist()
        want = _by_ad(record_rules.latest_per_ad(pa.concat_tables([prior, batch])).to_pylist())
        assert _by_ad(rows) == want and len(rows) == len(want)
