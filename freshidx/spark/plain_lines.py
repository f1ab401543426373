"""Plain lines read in Arrow: :mod:`freshidx.spark.line_parse`'s answer for the usual line, vectorized.

Upstream writers emit one shape of line: the record's fields in their documented order (``RAW_FIELDS``),
texts without escapes, numbers in their short forms, ``updated_at`` as ``YYYY-MM-DD[T ]HH:MM:SS[.f]``
with ``Z`` or no zone. For a line of that shape (:data:`PLAIN_LINE`, one RE2 pass over the batch) every
question ``line_parse`` asks has an answer Arrow computes for the whole batch at once: the JSON is well
formed, no key repeats, no text needs decoding, the types are those of the record (so Arrow's JSON reader
reads the values as Spark does), and only the values' checks remain (blank ids, status, bid range, a real
date, future skew, version sign, title length).
Every other line (another field order, an escape, a number in exponent form beyond two digits, a zone
offset, a real date this path does not settle, a bad encoding) is read by ``line_parse``'s per-line rules,
so the answer is the same either way; only the cost differs (one pass of compiled code over the batch
here, a Python loop there). ``freshidx_tests/spark/test_line_parse.py`` compares both paths with Spark line by line.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from freshidx.raw_record import (
    ID_FIELDS,
    MAX_BID,
    MAX_TITLE_CHARS,
    RAW_FIELDS,
    REASON_BAD_BID,
    REASON_BAD_STATUS,
    REASON_BAD_VERSION,
    REASON_FUTURE_TIMESTAMP,
    REASON_MISSING_FIELD,
    REASON_TOO_LONG,
    REQUIRED_FIELDS,
    STATUSES,
)
from freshidx.record_rules import REASON_ORDER
from freshidx.spark.index_format import DOCS_ARROW_SCHEMA
from freshidx.spark.string_buffers import string_layout

_SPACE = r"[ \t\r]*"
_TEXT = r'[^"\\\x00-\x1f]*'  # a JSON string's content without an escape or a control character
_FRACTION, _EXPONENT = r"\.[0-9]{1,17}", r"[eE][+-]?[0-9]{1,2}"
# Finite as a double; not "-0", which Spark reads as a long (0, widened to 0.0) and Arrow as the double -0.0.
_NUMBER = (rf"-?[1-9][0-9]{{0,15}}(?:{_FRACTION})?(?:{_EXPONENT})?|0(?:{_FRACTION})?(?:{_EXPONENT})?"
           rf"|-0(?:{_FRACTION}(?:{_EXPONENT})?|{_EXPONENT})")
_LONG = r"-?(?:0|[1-9][0-9]{0,17})"  # within a long either way
_KEYWORDS = rf'\[{_SPACE}(?:"{_TEXT}"(?:{_SPACE},{_SPACE}"{_TEXT}")*)?{_SPACE}\]|null'


def _field(name: str, value: str) -> str:
    return f'{_SPACE}"{name}"{_SPACE}:{_SPACE}(?:{value}){_SPACE}'


_VALUES = {"ad_id": f'"{_TEXT}"', "campaign_id": f'"{_TEXT}"', "product_id": f'"{_TEXT}"', "title": f'"{_TEXT}"',
           "keywords": _KEYWORDS, "bid": _NUMBER, "status": f'"{_TEXT}"', "updated_at": f'"{_TEXT}"',
           "version": _LONG}
assert tuple(_VALUES) == tuple(RAW_FIELDS)
#: A plain line: every field in ``RAW_FIELDS`` order, ``keywords`` (the one optional field) present or not.
PLAIN_LINE = f"^{_SPACE}{{" + "".join(
    f"(?:{_field(n, v)},)?" if n == "keywords" else _field(n, v) + ("" if n == "version" else ",")
    for n, v in _VALUES.items()) + f"}}{_SPACE}$"
#: An ``updated_at`` this path reads: a year from 1000, ``Z`` or no zone (UTC, as Spark's cast reads it).
PLAIN_TIMESTAMP = r"^[1-9][0-9]{3}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?Z?$"
#: The values of plain lines as Arrow's JSON reader types them (``updated_at`` read by :func:`_micros`).
_JSON_SCHEMA = pa.schema([f if f.name != "updated_at" else pa.field("updated_at", pa.string())
                          for f in DOCS_ARROW_SCHEMA])


def read_plain(raw: pa.Array, limits: np.ndarray) -> tuple[np.ndarray, pa.Array, list[pa.Array]]:
    """Which of ``raw`` (valid UTF-8 lines) are plain, and for those (in order) the reason (``None``: valid)
    and the typed values of the valid ones (``DOCS_ARROW_SCHEMA``'s columns, null where invalid).
    ``limits``: per line, the latest epoch second ``updated_at`` may hold (``-1``: no limit).

    The shape is checked by one regular expression without captures (a DFA pass); the values of the lines
    that have it are read by Arrow's JSON reader, which, for that shape, reads what ``line_parse`` reads."""
    matched = _np(pc.match_substring_regex(raw, PLAIN_LINE))
    values = _json_values(raw.filter(pa.array(matched)))
    at = np.flatnonzero(matched)
    shaped = _np(pc.match_substring_regex(values.column("updated_at"), PLAIN_TIMESTAMP))
    values, at = values.filter(pa.array(shaped)), at[shaped]
    micros, real = _micros(values.column("updated_at").combine_chunks())
    plain = np.zeros(len(raw), bool)
    plain[at[real]] = True  # a date that is not real (Feb 30, hour 24) is left to line_parse's reading
    values = values.filter(pa.array(real))
    return plain, *_checked(values, micros[real], limits[at[real]])


def _json_values(lines: pa.Array) -> pa.Table:
    """Plain ``lines`` read by Arrow's JSON reader (one line, one row, in order)."""
    if len(lines) == 0:
        return _JSON_SCHEMA.empty_table()
    text = pc.binary_join_element_wise(lines, pa.scalar(""), "\n")  # each line and its newline, back to back
    _, offsets, data = text.buffers()
    end = int(np.frombuffer(offsets, np.int32, count=len(text) + 1, offset=text.offset * 4)[-1])
    begin = int(np.frombuffer(offsets, np.int32, count=1, offset=text.offset * 4)[0])
    table = pajson.read_json(pa.BufferReader(data.slice(begin, end - begin)),
                             read_options=pajson.ReadOptions(use_threads=False, block_size=max(1 << 20, end - begin)),
                             parse_options=pajson.ParseOptions(explicit_schema=_JSON_SCHEMA,
                                                               unexpected_field_behavior="error"))
    if table.num_rows != len(lines):
        raise RuntimeError(f"plain lines: {len(lines)} lines read as {table.num_rows} records")
    return table.combine_chunks()


def _checked(values: pa.Table, micros: np.ndarray, limit: np.ndarray) -> tuple[pa.Array, list[pa.Array]]:
    texts = {n: values.column(n).combine_chunks() for n in (*ID_FIELDS, "title", "status")}
    bid, version = values.column("bid").combine_chunks(), values.column("version").combine_chunks()
    # A plain line is valid UTF-8, one JSON object of the record's types with every required field and a
    # real timestamp: of the checks, these can fail (an id can be blank).
    fails: dict[str, np.ndarray] = {
        REASON_BAD_STATUS: ~_np(pc.is_in(texts["status"], value_set=pa.array(STATUSES))),
        REASON_BAD_BID: ~_np(pc.and_(pc.greater_equal(bid, 0.0), pc.less_equal(bid, MAX_BID))),
        REASON_FUTURE_TIMESTAMP: (limit >= 0) & (micros // 1_000_000 > limit),
        REASON_BAD_VERSION: _np(pc.less(version, 0)),
        REASON_TOO_LONG: _np(pc.greater(pc.utf8_length(texts["title"]), MAX_TITLE_CHARS)),
    }
    # The first failing check names the reason (record_rules.REASON_ORDER); checked last to first, earlier wins.
    checks: list[tuple[str, np.ndarray]] = []
    for check in REASON_ORDER:
        if check == REASON_MISSING_FIELD:
            checks += [(f"{REASON_MISSING_FIELD}:{n}", _np(pc.match_substring_regex(texts[n], "^ *$")))
                       for n in REQUIRED_FIELDS if n in ID_FIELDS]
        elif check in fails:
            checks.append((check, fails[check]))
    code = np.zeros(len(micros), np.int8)
    for k in range(len(checks), 0, -1):
        code[checks[k - 1][1]] = k
    reasons = pa.array([None, *(r for r, _ in checks)], pa.string()).take(pa.array(code))
    valid = pa.array(code == 0)
    typed = [texts["ad_id"], texts["campaign_id"], texts["product_id"], texts["title"],
             values.column("keywords").combine_chunks(), bid, texts["status"],
             pa.array(micros, pa.int64()).cast(pa.timestamp("us", tz="UTC")), version]
    return reasons, [pc.if_else(valid, col, pa.scalar(None, col.type)) for col in typed]


def _np(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.asarray(values.to_numpy(zero_copy_only=False), bool)


def _micros(stamps: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Epoch microseconds of :data:`PLAIN_TIMESTAMP` texts, and which are real dates, by the
    proleptic Gregorian calendar as Python's ``datetime`` and Spark count it. The shape fixes where
    each digit is, so the digits are read straight from the UTF-8 bytes (ASCII here)."""
    n = len(stamps)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, bool)
    offsets32, data = string_layout(stamps)
    offsets = offsets32.astype(np.int64)
    starts, lengths = offsets[:-1], np.diff(offsets)

    def digits(first: int, count: int) -> np.ndarray:
        value = np.zeros(n, np.int64)
        for k in range(first, first + count):
            value = value * 10 + (data[starts + k] - ord("0"))
        return value

    year, month, day = digits(0, 4), digits(5, 2), digits(8, 2)
    hour, minute, second = digits(11, 2), digits(14, 2), digits(17, 2)
    # ".f" with 1 to 9 digits, then "Z" or nothing: microseconds are its first six digits (truncated).
    end = lengths - (data[offsets[1:] - 1] == ord("Z"))
    fraction_us = np.zeros(n, np.int64)
    for k in range(6):
        present = np.flatnonzero(end > 20 + k)
        fraction_us *= 10
        fraction_us[present] += data[starts[present] + 20 + k] - ord("0")
    leap = (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))
    month_days = np.array([0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])[np.clip(month, 0, 12)] + \
        (leap & (month == 2))
    real = (month >= 1) & (month <= 12) & (day >= 1) & (day <= month_days) & (hour <= 23) & (minute <= 59) & \
        (second <= 59)
    y = year - (month <= 2)  # days from the civil date (H. Hinnant's algorithm; y >= 999 here, so no negative era)
    era, yoe = y // 400, y % 400
    doy = (153 * (month + np.where(month > 2, -3, 9)) + 2) // 5 + day - 1
    days = era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468
    seconds = days * 86400 + hour * 3600 + minute * 60 + second
    return seconds * 1_000_000 + fraction_us, real
