"""The Python reading of raw lines (freshidx.spark.line_parse) against Spark's (transform.parse_records),
line by line: the same reason and, for valid records, the same typed values, or "uncertain"."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import SparkSession

from freshidx.spark import transform
from freshidx.spark.line_parse import parse_lines
from freshidx.spark.raw_source import ARROW_SCHEMA, RAW_LINES_SCHEMA
from freshidx.tools.generator import GeneratorConfig, partition_records

PARTITION = "year=2026/month=11/day=21/hour=14/minute=05"
GOOD = {"ad_id": "ad-1", "campaign_id": "c-1", "product_id": "p-1", "title": "red shoes", "keywords": ["a", "b"],
        "bid": 1.25, "status": "active", "updated_at": "2026-11-21T14:05:07.123Z", "version": 3}


def _with(**changes: Any) -> str:
    body = {**GOOD, **changes}
    return json.dumps({k: v for k, v in body.items() if v is not _DROP})


_DROP = object()
CORPUS: list[str] = [
    json.dumps(GOOD), _with(keywords=None), _with(keywords=_DROP), _with(keywords=[]), _with(keywords=["x", None]),
    _with(keywords="flat"), _with(keywords={"a": 1}), _with(keywords=[1, 2]), _with(ad_id=123), _with(ad_id=True),
    _with(ad_id=""), _with(ad_id="  "), _with(ad_id="\t"), _with(ad_id=None), _with(ad_id=_DROP),
    _with(campaign_id=_DROP), _with(product_id=" "), _with(title=_DROP), _with(title=""), _with(title=5),
    _with(title="x" * 1000), _with(title="x" * 1001), _with(title="é" * 1001), _with(title="\U0001F600" * 600),
    _with(status="Active"), _with(status="paused"), _with(status="deleted"), _with(status=""), _with(status=1),
    _with(status=None), _with(bid="1.5"), _with(bid=-0.01), _with(bid=-0.0), _with(bid=0), _with(bid=1000000),
    _with(bid=1000000.0001), _with(bid=True), _with(bid=None), _with(bid={"v": 1}), _with(bid=10**30),
    _with(bid=10**400), _with(version=3.0), _with(version="3"), _with(version=-1), _with(version=2**63 - 1),
    _with(version=2**63), _with(version=True), _with(version=None), _with(updated_at="2026-11-21 14:05:07"),
    _with(updated_at="2026-11-21T14:05:07+01:00"), _with(updated_at="2026-11-21T14:05:07-05:30"),
    _with(updated_at="2026-11-21T14:05:07+0100"), _with(updated_at="2026-11-21T14:05:07.123456789Z"),
    _with(updated_at="2026-11-21T14:05:07.1Z"), _with(updated_at="2026-13-01T00:00:00.000Z"),
    _with(updated_at="2026-11-21T25:61:00.000Z"), _with(updated_at="2026-02-30T10:00:00.000Z"),
    _with(updated_at="2024-02-29T10:00:00Z"), _with(updated_at="2026-11-21T23:59:60Z"),
    _with(updated_at="yesterday"), _with(updated_at="21/11/2026 14:05"), _with(updated_at=1700000000),
    _with(updated_at="2026-11-21T16:05:08Z"), _with(updated_at="2026-11-21T15:05:07Z"),
    _with(updated_at="2026-11-21T15:05:08Z"), _with(updated_at="2026-11-21T14:05:07Z\n"),
    _with(updated_at="0000-01-01T00:00:00Z"), _with(updated_at=""), _with(updated_at=None),
    _with(extra={"deep": [1, {"x": None}]}), _with(AD_ID="x"), "{broken", '{"ad_id": "a"', "[1, 2]", '"x"',
    "null", "42", json.dumps(GOOD) + " ", json.dumps(GOOD) + json.dumps(GOOD), json.dumps(GOOD) + "}",
    "  " + json.dumps(GOOD), json.dumps(GOOD).replace('"', "'"), json.dumps(GOOD).replace("1.25", "NaN"),
    json.dumps(GOOD).replace("1.25", "Infinity"), json.dumps(GOOD).replace("1.25", "+Infinity"),
    json.dumps(GOOD).replace("1.25", "01.25"), json.dumps(GOOD).replace('"version": 3', '"version": 3, "version": 4'),
    json.dumps(GOOD).replace('"version": 3', '"version" : 3'), json.dumps(GOOD).replace('"red shoes"', '"red\\ud800"'),
    json.dumps(GOOD).replace('"red shoes"', '"tab\there"'), json.dumps(GOOD).replace('"red shoes"', '"quote\\"s\\":"'),
    json.dumps(GOOD, indent=None, separators=(",", ":")), "\x0b" + json.dumps(GOOD),
]


def _lines(rows: list[str]) -> pa.Table:
    n = len(rows)
    return pa.Table.from_pydict({
        "partition": [PARTITION] * n, "file": ["raw/f.jsonl"] * n, "line": list(range(1, n + 1)), "raw": rows,
        "bad_encoding": [False] * n, "original": [None] * n, "object_error": [None] * n}, schema=ARROW_SCHEMA)


def _normal(t: pa.Table) -> list[dict[str, Any]]:
    t = t.select(["line", *transform.TYPED_FIELDS, "reason"])
    t = t.set_column(t.schema.get_field_index("updated_at"), "updated_at", pc.cast(t.column("updated_at"), pa.int64()))
    return t.to_pylist()


def _compare(spark: SparkSession, rows: list[str]) -> int:
    """Compares every line (by itself: one uncertain line makes a batch uncertain); returns how many were sure."""
    df = spark.createDataFrame(_lines(rows).to_pylist(), RAW_LINES_SCHEMA)
    want = {r["line"]: r for r in _normal(transform.parse_records(df).toArrow())}
    sure = 0
    for i, row in enumerate(rows, start=1):
        got = parse_lines(_lines([row]))
        if got is None:
            continue
        sure += 1
        (mine,) = _normal(got)
        expected = {**want[i], "line": 1}
        if expected["reason"] is not None:  # an invalid record's typed values are not used
            mine = {k: mine[k] for k in ("line", "reason")}
            expected = {k: expected[k] for k in ("line", "reason")}
        assert mine == expected, row
    return sure


def test_every_sure_reading_is_sparks(spark: SparkSession) -> None:
    sure = _compare(spark, CORPUS)
    assert sure >= len(CORPUS) * 2 // 3, f"only {sure} of {len(CORPUS)} lines read without Spark"


@pytest.mark.parametrize("seed", [1, 2])
def test_the_generators_lines_good_and_bad_are_all_read_without_spark(spark: SparkSession, seed: int) -> None:
    from freshidx.store.partitions import PartitionId

    cfg = GeneratorConfig(seed=seed, ads=300, changes_per_partition=400, malformed_rate=0.2)
    lines, _ = partition_records(cfg, PartitionId.parse(PARTITION))
    assert _compare(spark, lines) == len(lines)


def test_plain_lines_near_every_edge_are_read_as_spark_reads_them(spark: SparkSession) -> None:
    from freshidx_tests.spark.test_plain_lines import plain_variations

    rows = plain_variations(400, seed=5)
    assert _compare(spark, rows) >= len(rows) * 2 // 3
