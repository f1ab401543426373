"""The record rules on plain data (freshidx.record_rules): which version wins, which products a change
touches, a product's features, and the order of a record's checks as both Arrow readings of a line
(freshidx.spark.plain_lines, freshidx.spark.line_parse) follow it. No JVM: test_segment_merge.py and
test_line_parse.py hold the Arrow code to Spark's rendering of the same rules."""

from __future__ import annotations

import datetime as dt
import json
import random
from typing import Any

import pyarrow as pa
import pytest

from freshidx import record_rules as rules
from freshidx.raw_record import (
    REASON_BAD_BID,
    REASON_BAD_STATUS,
    REASON_BAD_TIMESTAMP,
    REASON_BAD_VERSION,
    REASON_FUTURE_TIMESTAMP,
    REASON_MISSING_FIELD,
    REASON_TOO_LONG,
)
from freshidx.spark.index_format import DOCS_ARROW_SCHEMA
from freshidx.spark.line_parse import parse_lines
from freshidx.spark.raw_source import ARROW_SCHEMA

T0 = dt.datetime(2026, 11, 21, 14, 0, tzinfo=dt.UTC)
PARTITION = "year=2026/month=11/day=21/hour=14/minute=05"


def row(ad: str, version: int = 1, *, at: dt.datetime = T0, status: str = "active", product: str = "p1",
        bid: float | None = 1.0, keywords: list[str | None] | None = None, title: str = "t") -> dict[str, Any]:
    return {"ad_id": ad, "campaign_id": "c1", "product_id": product, "title": title, "keywords": keywords,
            "bid": bid, "status": status, "updated_at": at, "version": version}


def table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=DOCS_ARROW_SCHEMA)


def winners(t: pa.Table) -> dict[str, dict[str, Any]]:
    return {r["ad_id"]: r for r in rules.latest_per_ad(t).to_pylist()}


def test_the_tie_break_order_is_version_then_time_then_status_then_the_rest() -> None:
    assert rules.ORDER == ("version", "updated_at", "status", "campaign_id", "product_id", "title", "keywords",
                           "bid")
    assert set(rules.ORDER) == set(rules.TYPED_FIELDS) - {"ad_id"}
    # Columns that are not record columns come last, sorted: deterministic whatever else a frame carries.
    assert rules.tie_break_order([*rules.TYPED_FIELDS, "zz", "partition"]) == [*rules.ORDER, "partition", "zz"]
    assert rules.CONFLICT_RULE == ("winner: greatest updated_at, then status (paused > deleted > active), then "
                                   "campaign_id, product_id, title, keywords, bid")


def test_the_highest_version_wins_then_the_latest_time_then_hiding() -> None:
    later = T0 + dt.timedelta(seconds=1)
    got = winners(table([
        row("a", 2, at=T0), row("a", 1, at=later),  # a higher version beats a later time
        row("b", 1, at=T0), row("b", 1, at=later, status="paused"), row("b", 1, at=T0, status="deleted"),
        row("c", 1, status="active"), row("c", 1, status="deleted"),  # an exact tie hides the ad
        row("d", 1, status="deleted"), row("d", 1, status="paused"),
        row("e", 3),
    ]))
    assert (got["a"]["version"], got["a"]["updated_at"]) == (2, T0)
    assert (got["b"]["updated_at"], got["b"]["status"]) == (later, "paused")
    assert got["c"]["status"] == "deleted"
    assert got["d"]["status"] == "paused"
    assert got["e"]["version"] == 3
    assert sorted(got) == ["a", "b", "c", "d", "e"]


def test_the_rest_of_a_tie_is_settled_as_spark_compares_structs() -> None:
    # Null is the smallest value; lists compare element by element, then by length.
    got = winners(table([
        row("k", keywords=["a", "z"]), row("k", keywords=["b"]), row("k", keywords=None),
        row("l", keywords=["a"]), row("l", keywords=["a", None]),
        row("m", bid=None), row("m", bid=0.5),
        row("n", title="b"), row("n", title="é"), row("n", title="a"),
    ]))
    assert got["k"]["keywords"] == ["b"]
    assert got["l"]["keywords"] == ["a", None]
    assert got["m"]["bid"] == 0.5
    assert got["n"]["title"] == "é"  # by code point


def _reference(rows: list[dict[str, Any]]) -> dict[str, tuple[Any, ...]]:
    """The rule written out in plain Python: per ad, the greatest row by ``ORDER`` with nulls smallest."""
    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(rules.spark_key(r[c]) for c in rules.ORDER)

    best: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["ad_id"] not in best or key(r) > key(best[r["ad_id"]]):
            best[r["ad_id"]] = r
    return {a: tuple(r[c] for c in rules.TYPED_FIELDS) for a, r in best.items()}


def _random_rows(rng: random.Random, n: int) -> list[dict[str, Any]]:
    return [row(f"ad-{rng.randrange(40)}", rng.randint(1, 2), at=T0 + dt.timedelta(seconds=rng.randint(0, 1)),
                status=rng.choice(["active", "paused", "deleted"]), product=f"p{rng.randrange(4)}",
                bid=rng.choice([None, 1.0, 2.0]), keywords=rng.choice([None, [], ["a"], ["a", "b"], ["b"]]))
            for _ in range(n)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_latest_per_ad_and_latest_of_two_follow_the_written_out_rule(seed: int) -> None:
    rng = random.Random(seed)
    rows = _random_rows(rng, 400)
    rows = [*rows, *rng.sample(rows, 120)]  # exact duplicates, as one row sits in several state files
    rng.shuffle(rows)
    want = _reference(rows)
    got = {r["ad_id"]: tuple(r[c] for c in rules.TYPED_FIELDS) for r in rules.latest_per_ad(table(rows)).to_pylist()}
    assert got == want
    prior, batch = rows[:260], rows[260:]
    two = rules.latest_of_two(rules.latest_per_ad(table(prior)), rules.latest_per_ad(table(batch)))
    assert {r["ad_id"]: tuple(r[c] for c in rules.TYPED_FIELDS) for r in two.to_pylist()} == want
    assert two.num_rows == len(want)


def test_a_change_touches_the_products_its_ads_belong_to_now_and_belonged_to_while_active() -> None:
    batch = table([row("a", 2, product="p-new"), row("b", 2, product="p2", status="deleted")])
    # ``prior``: the batch ads' rows before it (an ad moved from p-old; a paused ad's product is not touched).
    prior = table([row("a", 1, product="p-old"), row("b", 1, product="p-paused", status="paused")])
    assert sorted(rules.touched_products(batch, prior).to_pylist()) == ["p-new", "p-old", "p2"]


def test_a_products_features_are_its_active_ads_count_and_best_bid() -> None:
    rows = table([row("a", product="p1", bid=2.0), row("b", product="p1", bid=None),
                  row("c", product="p1", bid=9.0, status="paused"), row("d", product="p2", status="deleted")])
    features = rules.ProductFeatures()
    features.add(rows.filter(rules.is_active(rows)))
    out = features.attach(rows)
    assert out.schema.names[-2:] == list(rules.FEATURE_COLUMNS)
    got = {r["ad_id"]: (r["product_active_ads"], r["product_best_bid"]) for r in out.to_pylist()}
    assert got == {"a": (2, 2.0), "b": (2, 2.0), "c": (2, 2.0), "d": (0, 0.0)}


# ---------------------------------------------------------------------------------- the order of the checks

GOOD = {"ad_id": "a1", "campaign_id": "c1", "product_id": "p1", "title": "t", "bid": 1.5, "status": "active",
        "updated_at": "2026-11-21T14:05:00Z", "version": 3}
#: One way to fail each check that a JSON object of the record's fields can fail, in REASON_ORDER.
BREAK = {
    f"{REASON_MISSING_FIELD}:ad_id": {"ad_id": " "},
    REASON_BAD_STATUS: {"status": "ACTIVE"},
    REASON_BAD_BID: {"bid": -1},
    REASON_BAD_TIMESTAMP: {"updated_at": "2026-11-21"},
    REASON_FUTURE_TIMESTAMP: {"updated_at": "2026-11-21T16:05:00Z"},
    REASON_BAD_VERSION: {"version": -3},
    REASON_TOO_LONG: {"title": "x" * 1001},
}


def _lines(rows: list[str]) -> pa.Table:
    n = len(rows)
    return pa.Table.from_pydict({
        "partition": [PARTITION] * n, "file": ["raw/f.jsonl"] * n, "line": list(range(1, n + 1)), "raw": rows,
        "bad_encoding": [False] * n, "original": [None] * n, "object_error": [None] * n}, schema=ARROW_SCHEMA)


def test_the_breaks_cover_the_checks_in_order() -> None:
    order = [r.split(":")[0] for r in BREAK]
    assert order == [r for r in rules.REASON_ORDER if r in order]
    assert [r for r in rules.REASON_ORDER if r not in order] == ["bad_encoding", "malformed_json"]


@pytest.mark.parametrize("plain", [True, False])
def test_a_line_failing_several_checks_gets_the_first_in_reason_order(plain: bool) -> None:
    names = list(BREAK)
    cases: list[tuple[str, str]] = [(json.dumps(GOOD), "")]
    for i, first in enumerate(names):
        for later in names[i + 1:]:
            broken = {**GOOD, **BREAK[later], **BREAK[first]}
            if BREAK[first].keys() & BREAK[later].keys():
                continue  # the same field: only the first break shows
            cases.append((json.dumps(broken), first))
    parsed = parse_lines(_lines([line for line, _ in cases]), plain=plain)
    assert parsed is not None
    got = [r or "" for r in parsed.column("reason").to_pylist()]
    assert got == [want for _, want in cases]
    assert len(cases) > 15
