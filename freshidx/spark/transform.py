"""Pure transforms (DataFrame in, DataFrame out): parse, validate, deduplicate raw ad changes.

The rules are :mod:`freshidx.record_rules`' (the record's fields, the order of its checks, which version
wins): this module renders what every build uses of them as Spark expressions (which products a change
touches, the delta's alone, is rendered in :mod:`freshidx.delta.product_expansion`). No I/O here and no
Python UDFs: everything is a Spark SQL expression and runs in the JVM, so these functions can be tested with
a local SparkSession alone and behave the same under Spark Connect.

Validation (:func:`parse_records`) gives each line a ``reason``: ``None`` for a valid record, else
the first failing rule, in this order:

0. ``unsupported_format`` / ``unreadable_object``: the row stands for a whole object that is not
   readable JSON lines (``freshidx.spark.raw_source``; ``detail`` says why);
1. ``bad_encoding``: the line was not valid UTF-8 (``original`` keeps its exact bytes);
2. ``malformed_json``: not parseable JSON, not a JSON *object* (``[1,2]``, ``"x"``, ``null``), text
   after the closing brace, or ``keywords`` present but not an array (the only optional field, which
   has no rule of its own);
3. ``missing_field:<field>``: a required field is absent or JSON ``null`` (ids: also blank), first in
   :data:`~freshidx.raw_record.RAW_FIELDS` order;
4. ``bad_status``: not one of :data:`~freshidx.raw_record.STATUSES` (case-sensitive);
5. ``bad_bid``: not a JSON number, NaN/±Infinity, or outside ``[0, MAX_BID]``. A string bid (even
   ``"1.5"``) is rejected: the record schema says double;
6. ``bad_updated_at``: not ``YYYY-MM-DD[T ]HH:MM:SS[.f{1,9}][Z|±HH:MM|±HHMM]`` or not a real instant.
   Without a zone the time is taken as UTC (whatever the session time zone);
7. ``future_timestamp``: ``updated_at`` lies more than ``max_future_skew_seconds`` after the minute
   of the partition that holds the record (deterministic: every build of the same input agrees,
   whenever it runs);
8. ``bad_version``: not a JSON integer (``3.0``, ``"3"``, > 2^63-1 are rejected) or negative;
9. ``title_too_long``: more than ``MAX_TITLE_CHARS`` characters (code points).

String fields accept any JSON scalar (``"ad_id": 123`` reads as ``"123"``), like Spark's JSON reader.
Duplicate keys in one object: the last one wins (Spark's JSON parser).

Detecting wrong JSON types relies on Spark's partial results for ``from_json``
(``spark.sql.json.enablePartialResults``, default true since Spark 3.4): the typed parse keeps the
good fields of a record with one badly typed field. :func:`parse_records` refuses to run without it.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from freshidx.raw_record import (
    ACTIVE,
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
    raw_ddl,
)
from freshidx.record_rules import CONFLICT_RULE, REASON_ORDER, TYPED_FIELDS, tie_break_order

LINE_COLUMNS = ("partition", "file", "line", "raw")
INVALID_COLUMNS = ("partition", "file", "line", "raw", "reason")
#: What the quarantine keeps beside :data:`INVALID_COLUMNS`: the exact bytes of a line that was not
#: UTF-8 (null otherwise: ``raw`` is then the line) and the detail of an object-level reason.
QUARANTINE_EXTRA_COLUMNS = ("original", "detail")
#: The kill-list columns. ``updated_at`` settles a version tie exactly as :func:`latest_per_ad` does, when a
#: delta compares the window with the full version's inactive ads (older files lack it: read as null).
COVERED_COLUMNS = ("ad_id", "status", "version", "updated_at")

PARTIAL_RESULTS_CONF = "spark.sql.json.enablePartialResults"
_CORRUPT = "_corrupt_record"
_JSON_OPTIONS = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT}
_TS_RE = r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:?\d{2})?$"
_TS_ZONE_RE = r"(Z|[+-]\d{2}:?\d{2})$"


def _typed_schema() -> str:
    return f"{raw_ddl()}, {_CORRUPT} string"


def _text_schema() -> str:
    # Every field as text: tells "absent or null" apart from "present but of the wrong JSON type".
    return ", ".join(f"{name} string" for name in RAW_FIELDS) + f", {_CORRUPT} string"


def _several_values(raw: Column) -> Column:
    """True for a line holding more than one JSON value, e.g. ``{..}{..}`` (a newline lost between two
    records) or ``{..}}``: Spark's JSON reader stops after the first value and ignores the rest, so
    without this the second record would be dropped silently. The precise check, a parse of
    ``[<line>]`` that must hold exactly one value, runs only where a regex says it may matter: a ``}``
    followed by more than whitespace (rare, as our records are flat: a ``}`` in a text, or indeed a
    second value)."""
    one_value = F.size(F.from_json(F.concat(F.lit("["), raw, F.lit("]")), "array<string>", _JSON_OPTIONS)) == F.lit(1)
    more_after_a_brace = raw.rlike(r"\}\s*\S")
    return F.when(more_after_a_brace, ~F.coalesce(one_value, F.lit(False))).otherwise(F.lit(False))


def _parse_updated_at(text: Column) -> Column:
    with_zone = F.when(text.rlike(_TS_ZONE_RE), text).otherwise(F.concat(text, F.lit("Z")))
    return F.when(text.rlike(_TS_RE), with_zone.try_cast("timestamp"))


def _check_partial_results(df: DataFrame) -> None:
    value = df.sparkSession.conf.get(PARTIAL_RESULTS_CONF)
    if str(value).lower() != "true":
        raise ValueError(
            f"parse_records needs {PARTIAL_RESULTS_CONF}=true to tell bad field types apart (got {value!r})"
        )


_PARTITION_RE = r"^year=(\d{4})/month=(\d{2})/day=(\d{2})/hour=(\d{2})/minute=(\d{2})$"


def _partition_time(partition: Column) -> Column:
    """The UTC minute a partition path names (null for anything that is not a minute path)."""
    iso = F.regexp_replace(partition, _PARTITION_RE, "$1-$2-$3T$4:$5:00Z")
    return F.when(partition.rlike(_PARTITION_RE), iso.try_cast("timestamp"))


def parse_records(lines: DataFrame, max_future_skew_seconds: int = DEFAULT_MAX_FUTURE_SKEW_SECONDS) -> DataFrame:
    """Parse and validate raw lines (``partition, file, line, raw[, bad_encoding, original, object_error]``).

    Returns ``partition, file, line, raw``, one typed column per :data:`RAW_FIELDS` field
    (``updated_at`` as a timestamp), ``reason`` (null when the record is valid), and
    :data:`QUARANTINE_EXTRA_COLUMNS`.
    """
    _check_partial_results(lines)
    df = _parse_twice(lines)
    t, s = F.col("_t"), F.col("_s")
    updated_at = _parse_updated_at(t["updated_at"])
    reason = _reason(F.col("raw"), t, s, updated_at, max_future_skew_seconds)
    typed = [
        (updated_at if name == "updated_at" else t[name]).alias(name) for name in TYPED_FIELDS
    ]
    return df.select(*LINE_COLUMNS, *typed, reason.alias("reason"), *QUARANTINE_EXTRA_COLUMNS)


def _parse_twice(lines: DataFrame) -> DataFrame:
    """``lines`` with the object-level columns (``_bad_encoding``, ``original``, ``detail``), the typed
    parse ``_t`` and the all-text parse ``_s``."""
    raw = F.col("raw")
    bad_encoding = (
        F.coalesce(F.col("bad_encoding"), F.lit(False)) if "bad_encoding" in lines.columns else F.lit(False)
    )
    original = F.col("original") if "original" in lines.columns else F.lit(None).cast("binary")
    object_error = F.col("object_error") if "object_error" in lines.columns else F.lit(None).cast("string")
    with_typed = lines.select(
        *LINE_COLUMNS,
        bad_encoding.alias("_bad_encoding"),
        original.alias("original"),
        object_error.alias("detail"),
        F.from_json(raw, _typed_schema(), _JSON_OPTIONS).alias("_t"),
    )
    t = F.col("_t")
    # The text parse tells "absent or null" apart from "present but of the wrong JSON type". When the
    # typed parse succeeded there is no wrong type, and its values say the same: the second parse (a
    # third of the parse cost, on the ~99% of records that are fine) runs only for the others.
    typed_ok = t.isNotNull() & t[_CORRUPT].isNull()
    as_text = F.struct(
        *[(t[name] if kind == "string" else t[name].cast("string")).alias(name)
          for name, (kind, _) in RAW_FIELDS.items()],
        F.lit(None).cast("string").alias(_CORRUPT),
    )
    return with_typed.select(
        "*", F.when(typed_ok, as_text).otherwise(F.from_json(raw, _text_schema(), _JSON_OPTIONS)).alias("_s")
    )


def _malformed(raw: Column, t: Column, s: Column) -> Column:
    """Rule 2 of the module docstring: not one JSON object, or ``keywords`` not an array."""
    return (
        s.isNull()
        | s[_CORRUPT].isNotNull()
        # An object must start and end the line (bar whitespace). The plain comparison settles almost
        # every line; the regex (a find over every position) runs only for the rest.
        | ~(raw.startswith("{") | raw.rlike(r"^\s*\{"))
        | ~(raw.endswith("}") | raw.rlike(r"\}\s*$"))
        | _several_values(raw)
        | (s["keywords"].isNotNull() & t["keywords"].isNull())
    )


def _reason(raw: Column, t: Column, s: Column, updated_at: Column, max_future_skew_seconds: int) -> Column:
    """The first check of :data:`freshidx.record_rules.REASON_ORDER` a line fails (null: valid), after an
    object-level reason (the module docstring's list)."""
    bid = t["bid"]
    version = t["version"]
    fails = {
        REASON_BAD_ENCODING: F.col("_bad_encoding"),
        REASON_MALFORMED_JSON: _malformed(raw, t, s),
        REASON_BAD_STATUS: ~s["status"].isin(*STATUSES),
        REASON_BAD_BID: bid.isNull() | F.isnan(bid) | (bid < F.lit(0.0)) | (bid > F.lit(float(MAX_BID))),
        REASON_BAD_TIMESTAMP: updated_at.isNull(),
        REASON_FUTURE_TIMESTAMP: updated_at.cast("long") > _partition_time(F.col("partition")).cast("long")
        + F.lit(int(max_future_skew_seconds)),
        REASON_BAD_VERSION: version.isNull() | (version < F.lit(0)),
        REASON_TOO_LONG: F.length(t["title"]) > F.lit(MAX_TITLE_CHARS),
    }
    reason = F.when(F.col("detail").isNotNull(), F.substring_index(F.col("detail"), ":", 1))
    for check in REASON_ORDER:
        if check != REASON_MISSING_FIELD:
            reason = reason.when(fails[check], F.lit(check))
            continue
        for name in REQUIRED_FIELDS:
            missing = s[name].isNull()
            if name in ID_FIELDS:
                missing = missing | (F.trim(s[name]) == F.lit(""))
            reason = reason.when(missing, F.lit(f"{REASON_MISSING_FIELD}:{name}"))
    return reason


def split_valid(parsed: DataFrame) -> tuple[DataFrame, DataFrame]:
    """``(valid, invalid)``: valid = typed fields + ``partition``; invalid = :data:`INVALID_COLUMNS` and
    whichever of :data:`QUARANTINE_EXTRA_COLUMNS` ``parsed`` has."""
    valid = parsed.filter(F.col("reason").isNull()).select(*TYPED_FIELDS, "partition")
    extra = [c for c in QUARANTINE_EXTRA_COLUMNS if c in parsed.columns]
    invalid = parsed.filter(F.col("reason").isNotNull()).select(*INVALID_COLUMNS, *extra)
    return valid, invalid


#: Reason of a (reported, not rejected) copy of an ``(ad_id, version)`` read with more than one content.
REASON_VERSION_CONFLICT = "version_conflict"
#: Columns of :func:`version_conflicts` (quarantine columns first, then the conflicting key).
CONFLICT_COLUMNS = (*INVALID_COLUMNS, *QUARANTINE_EXTRA_COLUMNS, "ad_id", "version")


def content_hash() -> Column:
    """sha256 of a valid record's typed content (not its text): identical duplicates, however they are
    spelled (key order, spaces, ``Z`` vs ``+00:00``), hash alike. ``updated_at`` enters as microseconds,
    so the session time zone cannot change the hash."""
    fields = [(F.unix_micros(F.col(c)) if c == "updated_at" else F.col(c)).alias(c) for c in TYPED_FIELDS]
    return F.sha2(F.to_json(F.struct(*fields)), 256)


def version_conflicts(parsed: DataFrame, group_keys: tuple[str, ...] = ()) -> DataFrame:
    """Every copy of an ``(ad_id, version)`` that was read with more than one content (within each
    group of ``group_keys``, e.g. an hourly bucket): the copies to report, both winner and losers.

    ``parsed`` is :func:`parse_records` output (plus ``group_keys``); only valid rows take part.
    Identical duplicates are not conflicts. The winner is the row :func:`latest_per_ad` and
    ``hourly_build.dedupe_versions`` keep (:data:`freshidx.record_rules.CONFLICT_RULE`: a ``max`` over the same struct,
    so it depends on the set of copies only, never on input order or partitioning); ``detail`` says
    for each copy whether it won, how many contents there were, and both content hashes. Columns:
    :data:`CONFLICT_COLUMNS` plus ``group_keys``. Runs on executors (one aggregation, one join);
    usually empty.
    """
    order = [c for c in tie_break_order(list(TYPED_FIELDS)) if c not in ("ad_id", "version")]
    keys = [*group_keys, "ad_id", "version"]
    valid = (
        parsed.filter(F.col("reason").isNull())
        .select(*group_keys, *LINE_COLUMNS, "original", *TYPED_FIELDS)
        .withColumn("_h", content_hash())
    )
    stats = (
        valid.groupBy(*keys)
        .agg(F.min("_h").alias("_lo"), F.max("_h").alias("_hi"), F.size(F.collect_set("_h")).alias("_n"),
             F.max(F.struct(*[F.col(c) for c in order], F.col("_h"))).alias("_w"))
        .filter(F.col("_lo") != F.col("_hi"))
        .select(*keys, "_n", F.col("_w")["_h"].alias("_win"))
    )
    copies = valid.join(stats, keys, "inner")
    won = F.col("_h") == F.col("_win")
    detail = F.concat(
        F.lit(f"{REASON_VERSION_CONFLICT}: ad_id "), F.col("ad_id"),
        F.lit(" version "), F.col("version").cast("string"),
        F.lit(" was read with "), F.col("_n").cast("string"), F.lit(" different contents; this copy "),
        # "kept" = this build used this content for the (ad_id, version); a higher version may still win.
        F.when(won, F.lit("won (kept)")).otherwise(F.lit("lost (dropped)")),
        F.lit(f"; {CONFLICT_RULE}; content sha256 "), F.substring("_h", 1, 16),
        F.lit(", winner sha256 "), F.substring("_win", 1, 16),
    )
    return copies.select(
        *LINE_COLUMNS, F.lit(REASON_VERSION_CONFLICT).alias("reason"), "original", detail.alias("detail"),
        "ad_id", "version", *group_keys,
    )


def may_have_version_conflicts(parsed: DataFrame, group_keys: tuple[str, ...] = ()) -> bool:
    """False when no ``(ad_id, version)`` (per group) was read with more than one content: the usual
    case, settled by one aggregation over a 64-bit hash of the typed content (no sha256, no join, no
    Python worker). True means "maybe": :func:`version_conflicts` then finds the copies exactly. False
    is wrong only if two contents of one key collide in 64 bits, which would leave that conflict
    unreported (the winner is chosen without it)."""
    def part(c: str) -> list[Column]:
        if c == "updated_at":
            return [F.unix_micros(F.col(c))]  # not the session time zone's rendering
        if c == "keywords":
            # Spark's hash skips nulls (also inside arrays): null, [] and the order of null elements
            # would hash alike, so the (short, optional) array goes in as JSON, with its null flag.
            return [F.to_json(F.col(c)), F.col(c).isNull()]
        return [F.col(c)]  # required: never null in a valid record

    keys = [*group_keys, "ad_id", "version"]
    h = F.xxhash64(*[x for c in TYPED_FIELDS for x in part(c)])
    differing = (
        parsed.filter(F.col("reason").isNull())
        .groupBy(*keys)
        .agg(F.min(h).alias("_lo"), F.max(h).alias("_hi"))
        .filter(F.col("_lo") != F.col("_hi"))
    )
    return differing.count() > 0


def latest_per_ad(valid: DataFrame) -> DataFrame:
    """One row per ``ad_id``: the newest record (:func:`freshidx.record_rules.tie_break_order`, the struct's
    fields in that order, so Spark's ``max`` picks it). No global sort."""
    order = tie_break_order(valid.columns)
    winner = F.max(F.struct(*[F.col(c) for c in order])).alias("_w")
    out_columns = [*TYPED_FIELDS, *[c for c in order if c not in TYPED_FIELDS]]
    return (
        valid.groupBy("ad_id")
        .agg(winner)
        .select("ad_id", *[F.col("_w")[c].alias(c) for c in order])
        .select(*out_columns)
    )


def documents(latest: DataFrame) -> DataFrame:
    """The ads to index: active ones only."""
    return latest.filter(_is_active())


def covered_ids(latest: DataFrame) -> DataFrame:
    """The kill-list: every ad of ``latest`` (active, paused or deleted) with its status and version.

    A delta covering an ad hides the stale copy in the full index, whatever the new status.
    """
    return latest.select(*COVERED_COLUMNS)


def _is_active() -> Column:
    return F.col("status") == F.lit(ACTIVE)


def index_rows(latest: DataFrame) -> DataFrame:
    """Rows for an index build of the whole state ``latest`` (:data:`TYPED_FIELDS`): a full build. A delta
    window rebuild indexes every ad of each product its window touched instead
    (:func:`freshidx.delta.product_expansion.expand_to_products`). The product-level features are added by the
    shard tasks (:class:`freshidx.record_rules.ProductFeatures`), not here: a product never spans shards, so
    that costs no shuffle.
    """
    return latest.select(*TYPED_FIELDS)
