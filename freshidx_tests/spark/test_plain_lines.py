"""Plain lines read in Arrow (freshidx.spark.plain_lines) answer as the one-by-one reading does
(freshidx.spark.line_parse), line for line; test_line_parse.py compares both with Spark."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from freshidx.spark.line_parse import parse_lines
from freshidx.spark.plain_lines import read_plain
from freshidx.spark.raw_source import ARROW_SCHEMA
from freshidx.store.partitions import PartitionId
from freshidx.tools.generator import GeneratorConfig, partition_records

PARTITION = "year=2026/month=11/day=21/hour=14/minute=05"
FIELDS = ("ad_id", "campaign_id", "product_id", "title", "keywords", "bid", "status", "updated_at", "version")


def lines_table(rows: list[str], partition: str = PARTITION) -> pa.Table:
    n = len(rows)
    return pa.Table.from_pydict({
        "partition": [partition] * n, "file": ["raw/f.jsonl"] * n, "line": list(range(1, n + 1)), "raw": rows,
        "bad_encoding": [False] * n, "original": [None] * n, "object_error": [None] * n}, schema=ARROW_SCHEMA)


def _text(rng: random.Random) -> str:
    return rng.choice(["ad-1", "", " ", "  x", "x ", "\t", "é", "\U0001F600", "a b", "'q'", "k\x7f", "ID-0099", "/"])


def _number(rng: random.Random) -> str:
    sign = rng.choice(["", "", "-"])
    whole = rng.choice(["0", "1", "7", "999999", "1000000", "1000001", "12345678901234567",
                        str(rng.randrange(10**rng.randrange(1, 17)))])
    frac = rng.choice(["", "", ".0", ".5", ".0001", "." + "9" * rng.randrange(1, 18)])
    exp = rng.choice(["", "", "e2", "E-3", "e+1", "e99", "e-99", "e100", "e5"])
    return sign + whole + frac + exp


def _stamp(rng: random.Random) -> str:
    year = rng.choice(["2026", "2024", "2000", "1900", "1000", "0999", "9999", "1970", "1969", "2100"])
    month = rng.choice(["01", "02", "12", "13", "00", "11"])
    day = rng.choice(["01", "28", "29", "30", "31", "32", "00", "21"])
    clock = rng.choice(["14:05:07", "00:00:00", "23:59:59", "24:00:00", "23:60:00", "23:59:60", "15:05:08",
                        "15:05:07", "16:05:07"])
    frac = rng.choice(["", ".1", ".123", ".123456", ".1234567", ".123456789", ".0000001"])
    zone = rng.choice(["Z", "Z", "", "+00:00", "-05:30", "+0100"])
    return f"{year}-{month}-{day}{rng.choice('TT ')}{clock}{frac}{zone}"


def plain_variations(count: int, seed: int) -> list[str]:
    """Lines in the plain shape (and some just outside it) with values around every check's edges."""
    rng = random.Random(seed)
    out: list[str] = []
    for _ in range(count):
        edge = {
            "ad_id": f'"{_text(rng)}"', "campaign_id": f'"{_text(rng)}"', "product_id": f'"{_text(rng)}"',
            "title": '"' + rng.choice(["", "x" * 1000, "x" * 1001, "é" * 1001, "\U0001F600" * 999, "a\\u00e9"]) + '"',
            "keywords": rng.choice(["[]", '[""]', "null", '[ "a" , "b" ]', '["a",null]', "[1]", None]),
            "bid": _number(rng),
            "status": rng.choice(['"paused"', '"deleted"', '"Active"', '""', "1"]),
            "updated_at": f'"{_stamp(rng)}"',
            "version": rng.choice(["0", "-0", "-1", "999999999999999999", "9223372036854775807", "1.0", "1e3",
                                   str(rng.randrange(10**16))]),
        }
        good = {"ad_id": f'"ad-{rng.randrange(1000)}"', "campaign_id": '"c-1"', "product_id": '"p-1"',
                "title": '"red shoes"', "keywords": '["a","b"]', "bid": "1.25", "status": '"active"',
                "updated_at": '"2026-11-21T14:05:07.123Z"', "version": str(rng.randrange(10**16))}
        values = {k: edge[k] if rng.random() < 0.15 else good[k] for k in FIELDS}
        colon, comma = rng.choice([(":", ","), (": ", ", "), (" : ", " , "), (":\t", ",\r")])
        body = comma.join(f'"{k}"{colon}{v}' for k, v in values.items() if v is not None)
        out.append(rng.choice(["", " ", "\t"]) + "{" + body + "}" + rng.choice(["", " ", "\r"]))
    return out


def _rows(t: pa.Table) -> list[dict[str, Any]]:
    t = t.select(["line", *FIELDS, "reason"])
    rows = t.set_column(t.schema.get_field_index("updated_at"), "updated_at",
                        pc.cast(t.column("updated_at"), pa.int64())).to_pylist()
    for r in rows:  # -0.0 == 0.0 in Python: compare the bid with its sign
        r["bid"] = None if r["bid"] is None else repr(r["bid"])
    return rows


def _both(rows: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The reading of ``rows`` with plain lines in Arrow and one by one (no line is uncertain)."""
    fast, slow = parse_lines(lines_table(rows)), parse_lines(lines_table(rows), plain=False)
    assert fast is not None and slow is not None
    return _rows(fast), _rows(slow)


def _plain_share(rows: list[str]) -> float:
    plain, _, _ = read_plain(pa.array(rows, pa.string()), np.full(len(rows), -1, np.int64))
    return float(plain.mean())


def test_plain_lines_answer_as_one_by_one_around_every_edge() -> None:
    rows = [r for r in plain_variations(4000, seed=7) if parse_lines(lines_table([r]), plain=False) is not None]
    fast, slow = _both(rows)
    for line, a, b in zip(rows, fast, slow, strict=True):
        assert a == b, line
    reasons = {r["reason"] for r in fast}
    # The edges were reached: every check fails somewhere, and many lines are valid.
    assert {None, "missing_field:ad_id", "bad_status", "bad_bid", "bad_updated_at", "future_timestamp",
            "bad_version", "title_too_long", "malformed_json"} <= reasons
    assert sum(r["reason"] is None for r in fast) > 100
    assert 0.2 < _plain_share(rows) < 1.0  # both paths ran


def test_the_generators_lines_are_plain_and_read_alike() -> None:
    cfg = GeneratorConfig(seed=3, ads=500, changes_per_partition=3000, malformed_rate=0.05)
    rows, _ = partition_records(cfg, PartitionId.parse(PARTITION))
    fast, slow = _both(rows)
    assert fast == slow
    assert _plain_share(rows) > 0.9


def test_a_lines_answer_does_not_depend_on_its_neighbours() -> None:
    rows = plain_variations(300, seed=11)
    rows = [r for r in rows if parse_lines(lines_table([r])) is not None]
    together = _rows(parse_lines(lines_table(rows)))  # type: ignore[arg-type]
    alone = [_rows(parse_lines(lines_table([r])))[0] for r in rows]  # type: ignore[arg-type]
    assert [{**r, "line": 0} for r in together] == [{**r, "line": 0} for r in alone]


def test_no_line_or_only_other_lines() -> None:
    assert parse_lines(lines_table([])).num_rows == 0  # type: ignore[union-attr]
    got = parse_lines(lines_table(["{broken", "[1]"]))
    assert got is not None and got.column("reason").to_pylist() == ["malformed_json", "malformed_json"]


def test_negative_zero_bids_read_as_spark_reads_them() -> None:
    """``-0`` is a long to Spark (0, widened to 0.0): left to the one-by-one reading; ``-0.0`` and ``-0e1``
    are doubles (-0.0) and stay plain."""
    line = ('{{"ad_id":"a","campaign_id":"c","product_id":"p","title":"t","bid":{},"status":"active",'
            '"updated_at":"2026-11-21T14:05:07Z","version":1}}')
    rows = [line.format(b) for b in ("-0", "-0.0", "0", "-0e1", "-0.0E-1", "0.0")]
    fast, slow = _both(rows)
    assert fast == slow
    assert [r["bid"] for r in fast] == ["0.0", "-0.0", "0.0", "-0.0", "-0.0", "0.0"]
    plain, _, _ = read_plain(pa.array(rows, pa.string()), np.full(len(rows), -1, np.int64))
    assert plain.tolist() == [False, True, True, True, True, True]
