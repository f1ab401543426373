"""Pure transforms: parse/validate raw lines, split, latest per ad, documents, kill-list, reason counts."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from freshidx import raw_record as R
from freshidx.spark import transform as T
from freshidx.spark.raw_source import RAW_LINES_SCHEMA

P1 = "year=2026/month=11/day=21/hour=14/minute=05"
P2 = "year=2026/month=11/day=21/hour=14/minute=10"
UTC = dt.UTC


def rec(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "ad_id": "ad-1", "campaign_id": "c-1", "product_id": "p-1", "title": "Red shoes",
        "keywords": ["shoes", "red"], "bid": 1.25, "status": "active",
        "updated_at": "2026-11-21T14:05:07.123Z", "version": 3,
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not _DROP}


_DROP = object()


def line(**overrides: Any) -> str:
    return json.dumps(rec(**overrides))


def lines_df(spark: SparkSession, raws: list[str | tuple[str, bool]], partition: str = P1) -> DataFrame:
    rows = []
    for i, item in enumerate(raws, start=1):
        raw, bad = item if isinstance(item, tuple) else (item, False)
        rows.append((partition, "raw/ads/f.jsonl", i, raw, bad, raw.encode() if bad else None, None))
    return spark.createDataFrame(rows, RAW_LINES_SCHEMA)


# (raw line, expected reason) — each line targets exactly one rule; order matters only for line numbers.
CASES: list[tuple[str | tuple[str, bool], str | None]] = [
    (line(), None),
    ((line(), True), R.REASON_BAD_ENCODING),
    (("not json \ufffd", True), R.REASON_BAD_ENCODING),  # encoding is checked first
    ('{"ad_id": "ad-1",', R.REASON_MALFORMED_JSON),
    ("[1, 2]", R.REASON_MALFORMED_JSON),
    ('"x"', R.REASON_MALFORMED_JSON),
    ("null", R.REASON_MALFORMED_JSON),
    ("42", R.REASON_MALFORMED_JSON),
    (f"[{line()}]", R.REASON_MALFORMED_JSON),
    (line() + " trailing", R.REASON_MALFORMED_JSON),
    ('{"ad_id": "ad-1",}', R.REASON_MALFORMED_JSON),
    (line(keywords="shoes,red"), R.REASON_MALFORMED_JSON),
    (line(ad_id=_DROP), f"{R.REASON_MISSING_FIELD}:ad_id"),
    (line(ad_id="  "), f"{R.REASON_MISSING_FIELD}:ad_id"),
    (line(campaign_id=None), f"{R.REASON_MISSING_FIELD}:campaign_id"),
    (line(product_id=_DROP, title=_DROP), f"{R.REASON_MISSING_FIELD}:product_id"),
    (line(title=None), f"{R.REASON_MISSING_FIELD}:title"),
    (line(bid=_DROP, status="bogus"), f"{R.REASON_MISSING_FIELD}:bid"),
    (line(status=None), f"{R.REASON_MISSING_FIELD}:status"),
    (line(updated_at=_DROP), f"{R.REASON_MISSING_FIELD}:updated_at"),
    (line(version=None), f"{R.REASON_MISSING_FIELD}:version"),
    ("{}", f"{R.REASON_MISSING_FIELD}:ad_id"),
    (line(status="Active"), R.REASON_BAD_STATUS),
    (line(status="archived", bid=-1), R.REASON_BAD_STATUS),
    (line(bid="abc"), R.REASON_BAD_BID),
    (line(bid="1.5"), R.REASON_BAD_BID),
    (line(bid=-0.01), R.REASON_BAD_BID),
    (line(bid=R.MAX_BID + 1), R.REASON_BAD_BID),
    (line(bid=True), R.REASON_BAD_BID),
    (line(bid={"v": 1}), R.REASON_BAD_BID),
    (line().replace('"bid": 1.25', '"bid": NaN'), R.REASON_BAD_BID),
    (line().replace('"bid": 1.25', '"bid": 1e400'), R.REASON_BAD_BID),
    (line(bid="abc", version="x"), R.REASON_BAD_BID),
    (line(updated_at="yesterday"), R.REASON_BAD_TIMESTAMP),
    (line(updated_at="2026"), R.REASON_BAD_TIMESTAMP),
    (line(updated_at="2026-02-30T00:00:00Z"), R.REASON_BAD_TIMESTAMP),
    (line(updated_at=1763733907), R.REASON_BAD_TIMESTAMP),
    (line(updated_at="2026-11-21T14:05Z"), R.REASON_BAD_TIMESTAMP),
    (line(version=-1), R.REASON_BAD_VERSION),
    (line(version=3.5), R.REASON_BAD_VERSION),
    (line(version="3"), R.REASON_BAD_VERSION),
    (line().replace('"version": 3', '"version": 99999999999999999999'), R.REASON_BAD_VERSION),
    (line(title="x" * (R.MAX_TITLE_CHARS + 1)), R.REASON_TOO_LONG),
    (line(title="é" * R.MAX_TITLE_CHARS), None),  # characters, not bytes
    (line(bid=0), None),
    (line(bid=R.MAX_BID), None),
    (line(bid=7), None),  # JSON integer for a double field is fine
    (line(keywords=_DROP), None),
    (line(keywords=None), None),
    (line(keywords=[]), None),
    (line(version=0), None),
    (line(ad_id=123), None),  # string fields accept JSON scalars
    (line(updated_at="2026-11-21T14:05:07"), None),
    (line(updated_at="2026-11-21 16:05:07.5+02:00"), None),
    (line(updated_at="2026-11-21T14:05:07.123456789Z"), None),
    ("  " + line() + "  ", None),
    ("\t " + line() + "\r", None),  # JSON whitespace around the object
    ("x " + line(), R.REASON_MALFORMED_JSON),
    (line() + "}", R.REASON_MALFORMED_JSON),
    (line() + line(ad_id="ad-2"), R.REASON_MALFORMED_JSON),  # a lost newline: never keep only the first
    (line() + " " + line(ad_id="ad-2"), R.REASON_MALFORMED_JSON),
    (line() + ",\t" + line(ad_id="ad-2"), R.REASON_MALFORMED_JSON),
    (line(title="curly } { title }"), None),  # braces inside strings are text
    # updated_at after the partition's minute (P1 = 14:05) by more than the skew (default 1 h)
    (line(updated_at="2026-11-21T15:05:00Z"), None),  # exactly the skew: accepted
    (line(updated_at="2026-11-21T15:05:01Z"), R.REASON_FUTURE_TIMESTAMP),
    (line(updated_at="2026-11-22T14:05:00Z"), R.REASON_FUTURE_TIMESTAMP),  # a day ahead
    (line(updated_at="2036-11-21T14:05:07Z"), R.REASON_FUTURE_TIMESTAMP),  # ten years ahead
    (line(updated_at="2026-11-21 17:05:07+02:00"), R.REASON_FUTURE_TIMESTAMP),  # 15:05:07Z: the zone counts
]


@pytest.fixture(scope="module")
def parsed(spark: SparkSession) -> list[Any]:
    df = T.parse_records(lines_df(spark, [raw for raw, _ in CASES]))
    return sorted(df.collect(), key=lambda r: r["line"])


def test_reason_per_line(parsed: list[Any]) -> None:
    got = {r["line"]: r["reason"] for r in parsed}
    expected = {i: reason for i, (_, reason) in enumerate(CASES, start=1)}
    mismatches = {
        i: (CASES[i - 1][0], expected[i], got.get(i)) for i in expected if got.get(i) != expected[i]
    }
    assert not mismatches, mismatches


def test_columns_and_typed_values(spark: SparkSession, parsed: list[Any]) -> None:
    df = T.parse_records(lines_df(spark, [line()]))
    assert df.columns == ["partition", "file", "line", "raw", *R.RAW_FIELDS, "reason", "original", "detail"]
    types = dict(df.dtypes)
    assert types["updated_at"] == "timestamp" and types["bid"] == "double" and types["version"] == "bigint"
    assert types["keywords"] == "array<string>"
    first = parsed[0]
    assert (first["partition"], first["file"], first["line"], first["raw"]) == (P1, "raw/ads/f.jsonl", 1, line())
    assert first.asDict() | {"partition": None, "file": None, "line": None, "raw": None} == {
        "partition": None, "file": None, "line": None, "raw": None,
        "ad_id": "ad-1", "campaign_id": "c-1", "product_id": "p-1", "title": "Red shoes",
        "keywords": ["shoes", "red"], "bid": 1.25, "status": "active",
        # the session time zone is UTC, so collected timestamps are naive UTC wall-clock times
        "updated_at": dt.datetime(2026, 11, 21, 14, 5, 7, 123000), "version": 3, "reason": None,
        "original": None, "detail": None,
    }
    by_raw = {r["raw"]: r for r in parsed}
    assert by_raw[line(updated_at="2026-11-21 16:05:07.5+02:00")]["updated_at"] == dt.datetime(
        2026, 11, 21, 14, 5, 7, 500000
    )
    assert by_raw[line(ad_id=123)]["ad_id"] == "123"
    assert by_raw[line(bid=7)]["bid"] == 7.0
    assert by_raw[line(keywords=_DROP)]["keywords"] is None


def test_future_skew_is_a_parameter_and_needs_a_minute_partition(spark: SparkSession) -> None:
    ahead = line(updated_at="2026-11-21T14:15:00Z")  # 10 min after P1's minute
    strict = T.parse_records(lines_df(spark, [ahead]), max_future_skew_seconds=60).collect()
    assert [r["reason"] for r in strict] == [R.REASON_FUTURE_TIMESTAMP]
    assert [r["reason"] for r in T.parse_records(lines_df(spark, [ahead])).collect()] == [None]
    # a partition that is not a minute path (a test's or a replay's) is never judged
    loose = T.parse_records(lines_df(spark, [ahead], partition="adhoc"), max_future_skew_seconds=0).collect()
    assert [r["reason"] for r in loose] == [None]


def test_string_bid_is_never_silently_nulled(spark: SparkSession) -> None:
    raws = [line(bid="abc"), line(bid="1.5"), line(bid="NaN"), line(bid="")]
    df = T.parse_records(lines_df(spark, raws))
    valid, invalid = T.split_valid(df)
    assert valid.count() == 0
    assert {r["reason"] for r in invalid.collect()} == {R.REASON_BAD_BID}


def test_local_sessions_record_no_call_site_per_dataframe_call(spark: SparkSession) -> None:
    """PySpark reads this once per process: with it on, every Column call costs ~5 py4j round trips."""
    from pyspark.errors.utils import is_debugging_enabled

    assert spark.conf.get("spark.python.sql.dataFrameDebugging.enabled") == "false"
    assert not is_debugging_enabled()


def test_parse_refuses_without_partial_results(spark: SparkSession) -> None:
    spark.conf.set(T.PARTIAL_RESULTS_CONF, "false")
    try:
        with pytest.raises(ValueError, match="enablePartialResults"):
            T.parse_records(lines_df(spark, [line()]))
    finally:
        spark.conf.set(T.PARTIAL_RESULTS_CONF, "true")


def test_split_valid_and_reason_counts(spark: SparkSession) -> None:
    raws = [line(), line(ad_id="ad-2"), "{", "[", line(status="x"), (line(), True)]
    valid, invalid = T.split_valid(T.parse_records(lines_df(spark, raws)))
    assert valid.columns == [*R.RAW_FIELDS, "partition"]
    assert invalid.columns == ["partition", "file", "line", "raw", "reason", "original", "detail"]
    assert sorted(r["ad_id"] for r in valid.collect()) == ["ad-1", "ad-2"]
    assert sorted((r["line"], r["raw"], r["reason"]) for r in invalid.collect()) == [
        (3, "{", R.REASON_MALFORMED_JSON),
        (4, "[", R.REASON_MALFORMED_JSON),
        (5, line(status="x"), R.REASON_BAD_STATUS),
        (6, line(), R.REASON_BAD_ENCODING),
    ]
    counts = {r["reason"]: r["count"] for r in invalid.groupBy("reason").count().collect()}
    assert counts == {R.REASON_MALFORMED_JSON: 2, R.REASON_BAD_STATUS: 1, R.REASON_BAD_ENCODING: 1}


def valid_df(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    raws = [json.dumps(r) for r in rows]
    valid, _ = T.split_valid(T.parse_records(lines_df(spark, raws)))
    return valid


def test_latest_per_ad(spark: SparkSession) -> None:
    t0 = "2026-11-21T14:00:00Z"
    t1 = "2026-11-21T14:01:00Z"
    rows = [
        rec(ad_id="a", version=1, title="old"),
        rec(ad_id="a", version=3, title="newest", updated_at=t0),
        rec(ad_id="a", version=2, title="middle", updated_at=t1),
        # b: same version, later updated_at wins
        rec(ad_id="b", version=5, title="early", updated_at=t0),
        rec(ad_id="b", version=5, title="late", updated_at=t1),
        # c: exact duplicates collapse
        rec(ad_id="c", title="dup"),
        rec(ad_id="c", title="dup"),
        rec(ad_id="c", title="dup"),
        # d: full tie on version and updated_at: the non-active status wins (deterministically)
        rec(ad_id="d", status="active", updated_at=t0),
        rec(ad_id="d", status="paused", updated_at=t0),
        # e: deleted in its newest version
        rec(ad_id="e", version=1),
        rec(ad_id="e", version=2, status="deleted"),
    ]
    latest = T.latest_per_ad(valid_df(spark, rows))
    assert latest.columns == [*R.RAW_FIELDS, "partition"]
    got = {r["ad_id"]: r for r in latest.collect()}
    assert sorted(got) == ["a", "b", "c", "d", "e"]
    assert (got["a"]["version"], got["a"]["title"]) == (3, "newest")
    assert got["b"]["title"] == "late"
    assert got["c"]["title"] == "dup"
    assert got["d"]["status"] == "paused"
    assert (got["e"]["version"], got["e"]["status"]) == (2, "deleted")

    docs = T.documents(latest)
    assert sorted(r["ad_id"] for r in docs.collect()) == ["a", "b", "c"]
    assert docs.columns == latest.columns
    covered = T.covered_ids(latest)
    assert covered.columns == ["ad_id", "status", "version", "updated_at"]
    assert sorted(tuple(r)[:3] for r in covered.collect()) == [
        ("a", "active", 3), ("b", "active", 5), ("c", "active", 3), ("d", "paused", 3), ("e", "deleted", 2),
    ]


def test_latest_per_ad_order_independent(spark: SparkSession) -> None:
    rows = [rec(ad_id="x", version=1, title=f"t{i}", bid=float(i)) for i in range(6)]
    a = T.latest_per_ad(valid_df(spark, rows)).collect()
    b = T.latest_per_ad(valid_df(spark, list(reversed(rows)))).collect()
    assert a == b and len(a) == 1
