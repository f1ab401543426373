"""Plain lines read in Arrow: :mod:`freshidx.spark.line_parse`'s answer for the usual line, vectorized.

Upstream writers emit one shape of line: the record's fields in their documented order (``RAW_FIELDS``),
texts without escapes, numbers in their short forms, ``updated_at`` as ``YYYY-MM-DD[T ]HH:MM:SS[.f]``
with ``Z`` or no zone. For a line of that shape (:data:`PLAIN_LINE`, one RE2 pass over the batch) every
question ``line_parse`` asks has an answer Arrow computes for the whole batch at once: the JSON is well
formed, no key repeats, no text needs decoding, the types are those of the record, and only the values'
checks remain (blank ids, status, bid range, a real date, future skew, version sign, title length).
Every other line (another field order, an escape, a number in exponent form beyond two digits, a zone
offset, a real date this path does not settle, a bad encoding) is read by ``line_parse``'s per-line rules,
so the answer is the same either way; only the cost differs (one pass of compiled code over the batch
here, a Python loop there). ``freshidx_tests/test_line_parse.py`` compares both paths with Spark line by line.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from freshidx.records import (
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

_SPACE = r"[ \t\r]*"
_TEXT = r'[^"\\\x00-\x1f]*'  # a JSON string's content without an escape or a control character
_NUMBER = r"-?(?:0|[1-9][0-9]{0,15})(?:\.[0-9]{1,17})?(?:[eE][+-]?[0-9]{1,2})?"  # finite as a double
_LONG = r"-?(?:0|[1-9][0-9]{0,17})"  # within a long either way
_KEYWORDS = rf'\[{_SPACE}(?:"{_TEXT}"(?:{_SPACE},{_SPACE}"{_TEXT}")*)?{_SPACE}\]|null'


def _field(name: str, value: str) -> str:
    return f'{_SPACE}"{name}"{_SPACE}:{_SPACE}(?P<{name}>{value}){_SPACE}'


_VALUES = {"ad_id": f'"{_TEXT}"', "campaign_id": f'"{_TEXT}"', "product_id": f'"{_TEXT}"', "title": f'"{_TEXT}"',
           "keywords": _KEYWORDS, "bid": _NUMBER, "status": f'"{_TEXT}"', "updated_at": f'"{_TEXT}"',
           "version": _LONG}
assert tuple(_VALUES) == tuple(RAW_FIELDS)
#: A plain line: every field in ``RAW_FIELDS`` order, ``keywords`` (the one optional field) present or not.
PLAIN_LINE = f"^{_SPACE}{{" + "".join(
    f"(?:{_field(n, v)},)?" if n == "keywords" else _field(n, v) + ("" if n == "version" else ",")
    for n, v in _VALUES.items()) + f"}}{_SPACE}$"
#: An ``updated_at`` this path reads: a year from 1000, ``Z`` or no zone (UTC, as Spark's cast reads it).
PLAIN_TIMESTAMP = r'^"[1-9][0-9]{3}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?Z?"$'


def read_plain(raw: pa.Array, limits: np.ndarray) -> tuple[np.ndarray, pa.Array, list[pa.Array]]:
    """Which of ``raw`` (valid UTF-8 lines) are plain, and for those (in order) the reason (``None``: valid)
    and the typed values of the valid ones (``DOCS_ARROW_SCHEMA``'s columns, null where invalid).
    ``limits``: per line, the latest epoch second ``updated_at`` may hold (``-1``: no limit)."""
    fields = pc.extract_regex(raw, PLAIN_LINE)
    matched = np.asarray(fields.is_valid().to_numpy(zero_copy_only=False), bool)
    if matched.any():
        stamp = fields.field("updated_at").filter(pa.array(matched))
        matched[np.flatnonzero(matched)] = pc.match_substring_regex(stamp, PLAIN_TIMESTAMP).to_numpy(
            zero_copy_only=False)
    at = np.flatnonzero(matched)
    cols = {name: fields.field(name).take(pa.array(at)) for name in RAW_FIELDS}
    micros, real = _micros(cols["updated_at"])
    plain = np.zeros(len(raw), bool)
    plain[at[real]] = True  # a date that is not real (Feb 30, hour 24) is left to line_parse's reading
    keep = pa.array(np.flatnonzero(real))
    cols = {name: col.take(keep) for name, col in cols.items()}
    micros, limit = micros[real], limits[at[real]]
    return plain, *_checked(cols, micros, limit)


def _checked(cols: dict[str, pa.Array], micros: np.ndarray, limit: np.ndarray) -> tuple[pa.Array, list[pa.Array]]:
    texts = {n: pc.utf8_slice_codeunits(cols[n], 1, -1) for n in (*ID_FIELDS, "title", "status")}
    # An integer is read as a long, then widened: "-0" is 0.0 (the cast would keep its sign).
    bid = pc.if_else(pc.equal(cols["bid"], "-0"), 0.0, pc.cast(cols["bid"], pa.float64()))
    version = pc.cast(cols["version"], pa.int64())
    # The first failing check names the reason (line_parse's order); checked last to first, earlier wins.
    checks: list[tuple[str, np.ndarray]] = [
        *((f"{REASON_MISSING_FIELD}:{n}", _np(pc.match_substring_regex(texts[n], "^ *$")))
          for n in REQUIRED_FIELDS if n in ID_FIELDS),
        (REASON_BAD_STATUS, ~_np(pc.is_in(texts["status"], value_set=pa.array(STATUSES)))),
        (REASON_BAD_BID, ~_np(pc.and_(pc.greater_equal(bid, 0.0), pc.less_equal(bid, MAX_BID)))),
        (REASON_FUTURE_TIMESTAMP, (limit >= 0) & (micros // 1_000_000 > limit)),
        (REASON_BAD_VERSION, _np(pc.less(version, 0))),
        (REASON_TOO_LONG, _np(pc.greater(pc.utf8_length(texts["title"]), MAX_TITLE_CHARS))),
    ]
    code = np.zeros(len(micros), np.int8)
    for k in range(len(checks), 0, -1):
        code[checks[k - 1][1]] = k
    reasons = pa.array([None, *(r for r, _ in checks)], pa.string()).take(pa.array(code))
    valid = pa.array(code == 0)
    typed = [texts["ad_id"], texts["campaign_id"], texts["product_id"], texts["title"],
             _keywords(cols["keywords"]), bid, texts["status"],
             pa.array(micros, pa.int64()).cast(pa.timestamp("us", tz="UTC")), version]
    return reasons, [pc.if_else(valid, col, pa.scalar(None, col.type)) for col in typed]


def _np(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.asarray(values.to_numpy(zero_copy_only=False), bool)


def _micros(stamps: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Epoch microseconds of quoted :data:`PLAIN_TIMESTAMP` texts, and which are real dates, by the
    proleptic Gregorian calendar as Python's ``datetime`` and Spark count it."""
    def part(start: int, stop: int) -> np.ndarray:
        return pc.cast(pc.utf8_slice_codeunits(stamps, start, stop), pa.int64()).to_numpy(zero_copy_only=False)

    year, month, day = part(1, 5), part(6, 8), part(9, 11)
    hour, minute, second = part(12, 14), part(15, 17), part(18, 20)
    fraction = pc.utf8_slice_codeunits(pc.extract_regex(stamps, r"\.(?P<f>[0-9]+)").field("f"), 0, 6)
    fraction_us = pc.cast(pc.utf8_rpad(pc.fill_null(fraction, "0"), 6, "0"), pa.int64()).to_numpy(
        zero_copy_only=False)
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


def _keywords(texts: pa.Array) -> pa.Array:
    """``list<string>`` of the ``keywords`` group's texts (``[...]`` of plain strings; ``null`` or absent: null).
    Split at the quotes, a list's strings are its odd pieces (no string holds a quote)."""
    listed = pc.starts_with(texts, "[")
    pieces = pc.split_pattern(pc.if_else(listed, texts, pa.scalar(None, pa.string())), '"')
    offsets = pieces.offsets.to_numpy()
    flat = pieces.values
    counts = np.diff(offsets) // 2  # 2k + 1 pieces for k strings
    position = np.arange(len(flat)) - np.repeat(offsets[:-1], np.diff(offsets))
    values = flat.filter(pa.array(position % 2 == 1))
    new_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(new_offsets), values, mask=pc.invert(listed))
