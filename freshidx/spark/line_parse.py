"""The rules of :func:`freshidx.spark.transform.parse_records`, applied in Python inside one task (no JVM).

A micro-batch's task reads its raw lines and needs them parsed and validated before it merges them
(:mod:`freshidx.delta.executor.one_pass`). Spark's parse is the reference: this module answers exactly
as it does, or says it cannot be sure. Python's ``json`` and Spark's JSON reader (Jackson, with Spark's
defaults) agree on well-formed JSON objects whose fields have the types the record schema names; they
differ on some leniencies (Jackson accepts single quotes and more spellings of infinity) and on how a
value of another JSON type is rendered as text (``"ad_id": 1.50`` is a valid id for Spark). So a line is
*uncertain* when Python rejects it but Jackson might accept it, when a text field holds a value other
than a JSON string, when a key is repeated, when a string holds a lone surrogate, when a timestamp is
of a form whose reading this module does not settle (offsets without a colon or beyond ±17:59, year 0,
control characters), or when nesting or a number is deep or long enough to meet Jackson's limits.
:func:`parse_lines` returns ``None`` for a batch holding such a line, and the caller parses it with
Spark. Every other line gets Spark's ``reason`` (the module docstring of ``transform`` lists the
rules) and, when valid, Spark's typed values; ``freshidx_tests/test_line_parse.py`` checks both
against Spark line by line.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from typing import Any

import pyarrow as pa

from freshidx.records import (
    DEFAULT_MAX_FUTURE_SKEW_SECONDS,
    MAX_BID,
    MAX_TITLE_CHARS,
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
    STATUSES,
)
from freshidx.spark.index_format import DOCS_ARROW_SCHEMA

#: The output columns, as :func:`freshidx.spark.transform.parse_records` returns them.
PARSED_SCHEMA = pa.schema([
    pa.field("partition", pa.string()), pa.field("file", pa.string()), pa.field("line", pa.int64()),
    pa.field("raw", pa.string()), *DOCS_ARROW_SCHEMA, pa.field("reason", pa.string()),
    pa.field("original", pa.binary()), pa.field("detail", pa.string()),
])


class Uncertain(Exception):
    """A line Spark may read differently from Python (module docstring)."""


_TEXT_FIELDS = ("ad_id", "campaign_id", "product_id", "title")
_ID_FIELDS = ("ad_id", "campaign_id", "product_id")
_REQUIRED = tuple(name for name, (_, required) in RAW_FIELDS.items() if required)
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_TS = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})[T ]([0-9]{2}):([0-9]{2}):([0-9]{2})"
                 r"(?:\.([0-9]{1,9}))?(Z|[+-][0-9]{2}:?[0-9]{2})?")
_LOOSE_KEY = re.compile(r'"[ \t\r\n]+:')
_PARTITION = re.compile(r"year=([0-9]{4})/month=([0-9]{2})/day=([0-9]{2})/hour=([0-9]{2})/minute=([0-9]{2})")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
#: Longer lines are checked for what Jackson limits (nesting depth, number length) before Python's reading is trusted.
_LONG_LINE = 900


def parse_lines(lines: pa.Table, max_future_skew_seconds: int = DEFAULT_MAX_FUTURE_SKEW_SECONDS) -> pa.Table | None:
    """``lines`` (``freshidx.spark.raw_source.ARROW_SCHEMA`` columns) parsed and validated as
    ``transform.parse_records`` does (:data:`PARSED_SCHEMA`), or ``None`` if a line is uncertain."""
    cols = {name: lines.column(name).to_pylist() for name in lines.column_names}
    n = lines.num_rows
    typed: dict[str, list[Any]] = {f.name: [None] * n for f in DOCS_ARROW_SCHEMA}
    reasons: list[str | None] = [None] * n
    partition_seconds: dict[str, int | None] = {}
    raw, bad_encoding, detail = cols["raw"], cols.get("bad_encoding"), cols.get("object_error")
    try:
        for i in range(n):
            if detail is not None and detail[i] is not None:
                reasons[i] = detail[i].split(":", 1)[0]
                continue
            if bad_encoding is not None and bad_encoding[i]:
                reasons[i] = REASON_BAD_ENCODING
                continue
            partition = cols["partition"][i]
            if partition not in partition_seconds:
                partition_seconds[partition] = _partition_seconds(partition)
            limit = partition_seconds[partition]
            reasons[i] = _record(raw[i], typed, i, None if limit is None else limit + max_future_skew_seconds)
    except Uncertain:
        return None
    arrays = [pa.array(cols[c], PARSED_SCHEMA.field(c).type) for c in ("partition", "file", "line", "raw")]
    arrays += [pa.array(typed[f.name], f.type) for f in DOCS_ARROW_SCHEMA]
    arrays += [pa.array(reasons, pa.string()), pa.array(cols.get("original", [None] * n), pa.binary()),
               pa.array(detail if detail is not None else [None] * n, pa.string())]
    return pa.Table.from_arrays(arrays, schema=PARSED_SCHEMA)


def _record(line: str, typed: dict[str, list[Any]], i: int, latest_second: int | None) -> str | None:
    """The reason of one line (``None``: valid, its values written to ``typed[...][i]``)."""
    obj = _load(line)
    if not isinstance(obj, dict):
        return REASON_MALFORMED_JSON
    keywords = obj.get("keywords")
    if keywords is not None:
        if not isinstance(keywords, list):
            return REASON_MALFORMED_JSON  # typed as array<string>: null, while present as text
        if any(k is not None and not isinstance(k, str) for k in keywords):
            raise Uncertain
    for name in _TEXT_FIELDS:
        value = obj.get(name)
        if value is not None and not isinstance(value, str):
            raise Uncertain  # Spark renders it as text (as Jackson writes it)
    strings = [v for v in (obj.get(n) for n in _TEXT_FIELDS) if isinstance(v, str)]
    strings += [k for k in keywords or () if isinstance(k, str)]
    for s in (*strings, *(v for v in (obj.get("status"), obj.get("updated_at")) if isinstance(v, str))):
        _check_text(s)
    for name in _REQUIRED:
        value = obj.get(name)
        if value is None or (name in _ID_FIELDS and not value.strip(" ")):
            return f"{REASON_MISSING_FIELD}:{name}"
    status, bid, version, title = obj["status"], obj["bid"], obj["version"], obj["title"]
    if not (isinstance(status, str) and status in STATUSES):
        return REASON_BAD_STATUS
    if isinstance(bid, bool) or not isinstance(bid, int | float):
        return REASON_BAD_BID
    bid = _as_double(bid)
    if math.isnan(bid) or not 0.0 <= bid <= MAX_BID:
        return REASON_BAD_BID
    micros = _timestamp_micros(obj["updated_at"])
    if micros is None:
        return REASON_BAD_TIMESTAMP
    if latest_second is not None and micros // 1_000_000 > latest_second:
        return REASON_FUTURE_TIMESTAMP
    if isinstance(version, bool) or not isinstance(version, int) or not _LONG_MIN <= version <= _LONG_MAX \
            or version < 0:
        return REASON_BAD_VERSION
    if len(title) > MAX_TITLE_CHARS:
        return REASON_TOO_LONG
    for name, value in (("ad_id", obj["ad_id"]), ("campaign_id", obj["campaign_id"]),
                        ("product_id", obj["product_id"]), ("title", title), ("keywords", keywords),
                        ("bid", bid), ("status", status), ("updated_at", micros), ("version", version)):
        typed[name][i] = value
    return None


def _load(line: str) -> Any:
    """Python's reading of the line, when Jackson (Spark's defaults) certainly reads it alike."""
    if len(line) >= _LONG_LINE and _near_jackson_limits(line):
        raise Uncertain
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        # Jackson, as Spark configures it, also takes single quotes and INF/+Infinity spellings.
        if "'" in line or "INF" in line or "Infinity" in line:
            raise Uncertain from None
        return None
    if isinstance(obj, dict) and (line.count('":') != len(obj) or _LOOSE_KEY.search(line)):
        pairs = json.loads(line, object_pairs_hook=lambda p: p)
        if len({k for k, _ in pairs}) != len(pairs):
            raise Uncertain  # a repeated key
    if isinstance(obj, dict) and any(k.lower() in RAW_FIELDS and k not in RAW_FIELDS for k in obj):
        raise Uncertain  # a field name in another case
    return obj


def _near_jackson_limits(line: str) -> bool:
    depth = deepest = 0
    for ch in line:
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest >= 500 or re.search(r"[0-9]{500}", line) is not None


def _check_text(s: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise Uncertain from None  # a lone surrogate (a \\ud800 escape)


def _as_double(value: int | float) -> float:
    if isinstance(value, float):
        return value
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _timestamp_micros(text: Any) -> int | None:
    """Spark's reading of ``updated_at`` (regex, then a cast to timestamp; UTC without a zone) in
    microseconds since the epoch; ``None`` where Spark's is null."""
    if not isinstance(text, str):
        return None  # whatever its rendering, a non-string is never a timestamp of this form
    m = _TS.fullmatch(text)
    if m is None:
        if any(not " " <= ch <= "~" for ch in text):
            raise Uncertain  # Java's `$` and Spark's trimming treat line terminators apart
        return None
    year, month, day, hour, minute, second, fraction, zone = m.groups()
    offset = 0
    if zone and zone != "Z":
        if len(zone) != 6 or int(zone[1:3]) > 17 or int(zone[4:6]) > 59:
            raise Uncertain
        offset = (int(zone[1:3]) * 60 + int(zone[4:6])) * (1 if zone[0] == "+" else -1)
    if int(year) < 1:
        raise Uncertain
    try:
        local = dt.datetime(int(year), int(month), int(day), int(hour), int(minute), int(second), tzinfo=dt.UTC)
    except ValueError:
        return None
    micros = int((fraction or "0")[:6].ljust(6, "0"))
    delta = local - _EPOCH - dt.timedelta(minutes=offset)
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + micros


def _partition_seconds(partition: str | None) -> int | None:
    """The epoch second of the minute a partition path names (``None``: not a minute path)."""
    m = _PARTITION.fullmatch(partition or "")
    if m is None:
        return None
    try:
        at = dt.datetime(*(int(g) for g in m.groups()), tzinfo=dt.UTC)  # type: ignore[misc]
    except ValueError:
        return None
    return int((at - _EPOCH).total_seconds())
