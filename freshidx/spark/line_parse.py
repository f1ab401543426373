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
rules) and, when valid, Spark's typed values; ``freshidx_tests/spark/test_line_parse.py`` checks both
against Spark line by line.
"""

from __future__ import annotations

import datetime as dt
import gc
import json
import math
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from freshidx.raw_record import (
    DEFAULT_MAX_FUTURE_SKEW_SECONDS,
    ID_FIELDS,
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
    REQUIRED_FIELDS,
    STATUSES,
)
from freshidx.spark.index_format import DOCS_ARROW_SCHEMA
from freshidx.spark.plain_lines import read_plain

#: The output columns, as :func:`freshidx.spark.transform.parse_records` returns them.
PARSED_SCHEMA = pa.schema([
    pa.field("partition", pa.string()), pa.field("file", pa.string()), pa.field("line", pa.int64()),
    pa.field("raw", pa.string()), *DOCS_ARROW_SCHEMA, pa.field("reason", pa.string()),
    pa.field("original", pa.binary()), pa.field("detail", pa.string()),
])


class Uncertain(Exception):
    """A line Spark may read differently from Python (module docstring)."""


_TEXT_FIELDS = ("ad_id", "campaign_id", "product_id", "title")
_LONG_MAX = 2**63 - 1
_RAW_KEYS = frozenset(RAW_FIELDS)
_TS = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})[T ]([0-9]{2}):([0-9]{2}):([0-9]{2})"
                 r"(?:\.([0-9]{1,9}))?(Z|[+-][0-9]{2}:?[0-9]{2})?")
_LOOSE_KEY = re.compile(r'"[ \t\r\n]+:')
_PARTITION = re.compile(r"year=([0-9]{4})/month=([0-9]{2})/day=([0-9]{2})/hour=([0-9]{2})/minute=([0-9]{2})")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
#: Longer lines are checked for what Jackson limits (nesting depth, number length) before Python's reading is trusted.
_LONG_LINE = 900


def parse_lines(lines: pa.Table, max_future_skew_seconds: int = DEFAULT_MAX_FUTURE_SKEW_SECONDS, *,
                plain: bool = True) -> pa.Table | None:
    """``lines`` (``freshidx.spark.raw_source.ARROW_SCHEMA`` columns) parsed and validated as
    ``transform.parse_records`` does (:data:`PARSED_SCHEMA`), or ``None`` if a line is uncertain. Plain lines
    (:mod:`freshidx.spark.plain_lines`) are read in Arrow, the others one by one (:func:`_record`);
    ``plain=False`` reads every line one by one (the same answer: the tests compare the two)."""
    lines = lines.combine_chunks()
    n = lines.num_rows
    partitions = lines.column("partition").combine_chunks()
    distinct = pc.unique(partitions)
    seconds = [_partition_seconds(p) for p in distinct.to_pylist()]
    latest = np.array([-1 if s is None else s + max_future_skew_seconds for s in seconds], np.int64)
    limits = latest[pc.index_in(partitions, value_set=distinct).to_numpy(zero_copy_only=False)] if n else latest[:0]
    readable = pc.and_(pc.invert(lines.column("bad_encoding").combine_chunks().fill_null(False)),
                       pc.is_null(lines.column("object_error").combine_chunks()))
    shown = np.flatnonzero(np.asarray(readable.to_numpy(zero_copy_only=False), bool) & plain)
    is_plain, plain_reasons, plain_values = read_plain(
        lines.column("raw").combine_chunks().take(pa.array(shown)), limits[shown])
    done = shown[is_plain]
    rest = np.setdiff1d(np.arange(n), done, assume_unique=True)
    other = _other_lines(lines.take(pa.array(rest)), limits[rest])
    if other is None:
        return None
    other_reasons, other_values = other
    order = np.empty(n, np.int64)  # where each line's answer sits in (plain answers, other answers)
    order[done] = np.arange(len(done))
    order[rest] = np.arange(len(rest)) + len(done)
    at = pa.array(order)

    def merged(a: pa.Array, b: pa.Array) -> pa.ChunkedArray:
        return pa.chunked_array([pa.concat_arrays([a, b.cast(a.type)]).take(at)])

    arrays = [lines.column(c) for c in ("partition", "file", "line", "raw")]
    arrays += [merged(a, b) for a, b in zip(plain_values, other_values, strict=True)]
    arrays += [merged(plain_reasons, other_reasons), lines.column("original"), lines.column("object_error")]
    return pa.Table.from_arrays(arrays, schema=PARSED_SCHEMA)


def _other_lines(lines: pa.Table, limits: np.ndarray) -> tuple[pa.Array, list[pa.Array]] | None:
    """Reasons and typed values of the lines :mod:`~freshidx.spark.plain_lines` leaves, read one by one;
    ``None`` if one is uncertain."""
    n = lines.num_rows
    raw = lines.column("raw").to_pylist()
    bad_encoding = lines.column("bad_encoding").to_pylist()
    detail = lines.column("object_error").to_pylist()
    values: list[tuple[Any, ...] | None] = [None] * n
    reasons: list[str | None] = [None] * n
    reader = _Reader()
    collecting = gc.isenabled()
    gc.disable()  # many short-lived dicts: the collector's passes cost more than they free
    try:
        for i in range(n):
            if detail[i] is not None:
                reasons[i] = detail[i].split(":", 1)[0]
            elif bad_encoding[i]:
                reasons[i] = REASON_BAD_ENCODING
            else:
                limit = int(limits[i])
                reasons[i], values[i] = _record(reader, raw[i], None if limit < 0 else limit)
    except Uncertain:
        return None
    finally:
        if collecting:
            gc.enable()
    columns = [pa.array([v[j] if v is not None else None for v in values], f.type)
               for j, f in enumerate(DOCS_ARROW_SCHEMA)]
    return pa.array(reasons, pa.string()), columns


def _record(reader: _Reader, line: str, latest_second: int | None) -> tuple[str | None, tuple[Any, ...] | None]:
    """The reason of one line and, when valid (reason ``None``), its typed values in ``TYPED_FIELDS`` order.
    The checks run in :data:`freshidx.record_rules.REASON_ORDER`, written out: one line at a time, a loop
    over them would cost more than the checks."""
    obj = _load(reader, line)
    if type(obj) is not dict:
        return REASON_MALFORMED_JSON, None
    keywords = obj.get("keywords")
    if keywords is not None:
        if type(keywords) is not list:
            return REASON_MALFORMED_JSON, None  # typed as array<string>: null, while present as text
        for k in keywords:
            if type(k) is not str and k is not None:
                raise Uncertain  # Spark renders it as text (as Jackson writes it)
    ad_id, campaign_id, product_id, title = obj.get("ad_id"), obj.get("campaign_id"), obj.get("product_id"), \
        obj.get("title")
    for value in (ad_id, campaign_id, product_id, title):
        if type(value) is not str and value is not None:
            raise Uncertain
    if "\\u" in line:  # only an escape can make a lone surrogate
        _check_texts(obj)
    status, bid, updated_at, version = obj.get("status"), obj.get("bid"), obj.get("updated_at"), obj.get("version")
    # An id present and not blank: non-empty and not starting with a space settles it without strip().
    if not (ad_id and ad_id[0] != " " and campaign_id and campaign_id[0] != " " and product_id
            and product_id[0] != " " and title is not None and bid is not None and status is not None
            and updated_at is not None and version is not None):
        for name in REQUIRED_FIELDS:
            value = obj.get(name)
            if value is None or (name in ID_FIELDS and not value.strip(" ")):
                return f"{REASON_MISSING_FIELD}:{name}", None
    if type(status) is not str or status not in STATUSES:
        return REASON_BAD_STATUS, None
    if type(bid) is not float and type(bid) is not int:
        return REASON_BAD_BID, None  # bool is not a number here (a subclass of int in Python)
    bid = _as_double(bid)
    if math.isnan(bid) or not 0.0 <= bid <= MAX_BID:
        return REASON_BAD_BID, None
    micros = _timestamp_micros(reader, updated_at)
    if micros is None:
        return REASON_BAD_TIMESTAMP, None
    if latest_second is not None and micros // 1_000_000 > latest_second:
        return REASON_FUTURE_TIMESTAMP, None
    if type(version) is not int or not 0 <= version <= _LONG_MAX:
        return REASON_BAD_VERSION, None
    if len(title) > MAX_TITLE_CHARS:
        return REASON_TOO_LONG, None
    return None, (ad_id, campaign_id, product_id, title, keywords, bid, status, micros, version)


def _load(reader: _Reader, line: str) -> Any:
    """Python's reading of the line, when Jackson (Spark's defaults) certainly reads it alike."""
    if len(line) >= _LONG_LINE and _near_jackson_limits(line):
        raise Uncertain
    try:
        obj = _value_of(reader, line)
    except (ValueError, RecursionError):
        # Jackson, as Spark configures it, also takes single quotes and INF/+Infinity spellings.
        if "'" in line or "INF" in line or "Infinity" in line:
            raise Uncertain from None
        return None
    if isinstance(obj, dict) and (line.count('":') != len(obj) or _LOOSE_KEY.search(line)):
        pairs = json.loads(line, object_pairs_hook=lambda p: p)
        if len({k for k, _ in pairs}) != len(pairs):
            raise Uncertain  # a repeated key
    if isinstance(obj, dict) and not _RAW_KEYS.issuperset(obj) and any(k.lower() in _RAW_KEYS for k in obj
                                                                    if k not in _RAW_KEYS):
        raise Uncertain  # a field name in another case
    return obj


_JSON_SPACE = " \t\n\r"


class _Reader:
    """Per call of :func:`parse_lines` (never a module global: a Spark Connect client ships this module by
    value, and a JSON decoder's C scanner cannot be pickled): one decoder, and the epoch second of each
    ``YYYY-MM-DD[T ]HH:MM:SS`` + zone seen (a partition's records share a few hundred)."""

    def __init__(self) -> None:
        self.decoder = json.JSONDecoder()
        self.seconds: dict[tuple[str, str], int | None] = {}


def _value_of(reader: _Reader, line: str) -> Any:
    """``json.loads(line)`` without its per-call set-up (a large share of a short line's cost)."""
    start = len(line) - len(line.lstrip(_JSON_SPACE))
    obj, end = reader.decoder.raw_decode(line, start)
    if end != len(line) and line[end:].strip(_JSON_SPACE):
        raise ValueError("extra data")
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


def _check_texts(obj: dict[str, Any]) -> None:
    """Uncertain if a text value holds a lone surrogate (a ``\\ud800`` escape without its pair)."""
    texts = [obj.get(n) for n in (*_TEXT_FIELDS, "status", "updated_at")] + list(obj.get("keywords") or ())
    for s in texts:
        if type(s) is str:
            try:
                s.encode("utf-8")
            except UnicodeEncodeError:
                raise Uncertain from None


def _as_double(value: int | float) -> float:
    if isinstance(value, float):
        return value
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _timestamp_micros(reader: _Reader, text: Any) -> int | None:
    """Spark's reading of ``updated_at`` (regex, then a cast to timestamp; UTC without a zone) in
    microseconds since the epoch; ``None`` where Spark's is null."""
    if type(text) is not str:
        return None  # whatever its rendering, a non-string is never a timestamp of this form
    m = _TS.fullmatch(text)
    if m is None:
        if any(not " " <= ch <= "~" for ch in text):
            raise Uncertain  # Java's `$` and Spark's trimming treat line terminators apart
        return None
    fraction, zone = m.group(7), m.group(8)
    key = (text[:19], zone or "Z")
    if key not in reader.seconds:
        reader.seconds[key] = _whole_seconds(*key)
    seconds = reader.seconds[key]
    if seconds is None:
        return None
    return seconds * 1_000_000 + int((fraction or "0")[:6].ljust(6, "0"))


def _whole_seconds(date_time: str, zone: str) -> int | None:
    """Epoch seconds of ``YYYY-MM-DD[T ]HH:MM:SS`` at ``zone`` (``Z`` or ``±HH:MM``); ``None``: not a real
    instant."""
    offset = 0
    if zone != "Z":
        if len(zone) != 6 or int(zone[1:3]) > 17 or int(zone[4:6]) > 59:
            raise Uncertain
        offset = (int(zone[1:3]) * 60 + int(zone[4:6])) * (1 if zone[0] == "+" else -1)
    year, month, day = int(date_time[0:4]), int(date_time[5:7]), int(date_time[8:10])
    if year < 1:
        raise Uncertain
    try:
        local = dt.datetime(year, month, day, int(date_time[11:13]), int(date_time[14:16]), int(date_time[17:19]),
                            tzinfo=dt.UTC)
    except ValueError:
        return None
    delta = local - _EPOCH - dt.timedelta(minutes=offset)
    return delta.days * 86400 + delta.seconds


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
