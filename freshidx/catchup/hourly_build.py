"""The Spark half of ``ads_hourly``: all raw files of one closed UTC hour → one immutable bucket.

:func:`build_bucket` reads the hour's files on executors (``freshidx_raw``), validates them
(:func:`freshidx.spark.transform.parse_records`), quarantines and counts invalid records (never failing the
hour), keeps one row per ``(ad_id, version)`` (:func:`dedupe_versions`) and writes ``parts`` Parquet
files from Spark tasks (:func:`freshidx.catchup.bucket_writer.write_buckets_parts`). It returns a
:class:`~freshidx.publish.commit.DraftManifest` built from the task commit messages, ready for
:func:`freshidx.publish.commit.publish` (``allow_empty=True``: an hour with no valid record is a valid, empty
bucket). The driver handles only the file list, one count row per (file, reason) and the commits.

:func:`build_buckets` does the same for several hours in one Spark pass (one read, one parse, one
count, one quarantine write, one write job of ``hours × parts`` tasks), so a catch-up run of N hours
pays the per-job overhead once instead of N times; each hour's result is what :func:`build_bucket`
would give for it alone (:func:`build_bucket` is its one-hour case).

Publication order of a bucket is by ``position`` = when the hour was listed: the source is
append-only, so a later listing covers a superset of the inputs, and a correction built from it is
"newer" than the version it replaces.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from freshidx.catchup.bucket_writer import write_buckets_parts
from freshidx.publish.commit import DraftManifest, iso, new_version
from freshidx.raw_record import DEFAULT_MAX_FUTURE_SKEW_SECONDS
from freshidx.record_rules import TYPED_FIELDS, tie_break_order
from freshidx.spark import transform
from freshidx.spark.quarantine_once import ConflictReport, quarantined_files, report_conflicts
from freshidx.spark.raw_source import read_raw_lines
from freshidx.spark.session import task_slots
from freshidx.spark.shards import QuarantineCommit, ShardCommit, write_quarantine
from freshidx.store import ObjectInfo, StoreConfig, layout, open_store
from freshidx.store.partitions import PartitionError, PartitionId

__all__ = ["BucketBuild", "HourInput", "build_bucket", "build_buckets", "compare_rows", "dedupe_versions",
           "hour_file_list"]

_DEDUPE_KEY = ("ad_id", "version")
_BUCKET = "_bucket"  # index of a row's hour in a multi-hour build


# --------------------------------------------------------------------------------- pure transform


def dedupe_versions(valid: DataFrame) -> DataFrame:
    """One row per ``(ad_id, version)``; columns :data:`~freshidx.record_rules.TYPED_FIELDS`.

    Exact duplicates collapse. When one ``(ad_id, version)`` comes with different content, the winner
    follows the project's tie-break (:func:`freshidx.record_rules.tie_break_order` minus the key): latest
    ``updated_at``, then ``status`` (``paused``/``deleted`` beat ``active``: when in doubt, hide), then
    every other field. It is a ``max`` over a struct, so it does not depend on input order or
    partitioning. Other input columns (``partition``, …) take no part and are dropped.
    """
    return _dedupe(valid, ())


def _dedupe(valid: DataFrame, extra_keys: tuple[str, ...]) -> DataFrame:
    # dedupe_versions within each group of extra_keys (kept as leading columns).
    key = (*extra_keys, *_DEDUPE_KEY)
    order = [c for c in tie_break_order(list(TYPED_FIELDS)) if c not in _DEDUPE_KEY]
    winner = F.max(F.struct(*[F.col(c) for c in order])).alias("_w")
    return (
        valid.select(*extra_keys, *TYPED_FIELDS)
        .groupBy(*key)
        .agg(winner)
        .select(*key, *[F.col("_w")[c].alias(c) for c in order])
        .select(*extra_keys, *TYPED_FIELDS)
    )


# --------------------------------------------------------------------------------- driver helpers


def hour_file_list(source: str, hour: dt.datetime, files: list[ObjectInfo]) -> list[tuple[str, str]]:
    """``(key, partition_path)`` pairs for ``read_raw_lines``, sorted by key.

    Every file must be a data file of a minute partition of ``hour`` under ``raw/<source>/``; anything
    else is a caller bug (the listing of the hour filters markers and foreign paths) and raises.
    """
    root = layout.raw_root(source)
    out: dict[str, str] = {}
    for obj in files:
        if not obj.key.startswith(root):
            raise ValueError(f"{obj.key!r} is not under {root!r}")
        part_path, _, name = obj.key[len(root):].rpartition("/")
        try:
            pid = PartitionId.parse(part_path)
        except PartitionError as exc:
            raise ValueError(f"{obj.key!r}: not in a partition path ({exc})") from exc
        if pid.hour_start != hour:
            raise ValueError(f"{obj.key!r} belongs to hour {pid.hour_start.isoformat()}, not {hour.isoformat()}")
        if not name or name.startswith((".", "_")):
            raise ValueError(f"{obj.key!r} is not a data file")
        if obj.key in out:
            raise ValueError(f"{obj.key!r} listed twice")
        out[obj.key] = pid.path
    return sorted(out.items())


def compare_rows(rows_by_file: Mapping[str, int], expected_rows: Mapping[str, int]) -> list[str]:
    """Human-readable differences between the lines read per file and the rows promised per file.

    A promised file that was not read and a read file that was not promised are both mismatches.
    """
    problems: list[str] = []
    for key in sorted(set(rows_by_file) | set(expected_rows)):
        if key not in expected_rows:
            problems.append(f"{key}: read {rows_by_file[key]} rows but not listed in the expected rows")
        elif key not in rows_by_file:
            problems.append(f"{key}: {expected_rows[key]} rows expected but the file is not in the input")
        elif int(rows_by_file[key]) != int(expected_rows[key]):
            problems.append(f"{key}: read {rows_by_file[key]} rows, expected {expected_rows[key]}")
    return problems


def _utc(name: str, value: dt.datetime) -> dt.datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware (UTC), got {value!r}")
    return value.astimezone(dt.UTC)


# --------------------------------------------------------------------------------- the build


@dataclass
class BucketBuild:
    """What :func:`build_bucket` produced (one per hour of :func:`build_buckets`)."""

    draft: DraftManifest
    rows_by_file: dict[str, int]  # raw (non-blank) lines read per input file key, valid + invalid
    row_mismatches: list[str] = field(default_factory=list)  # when expected_rows was given

    @property
    def ok(self) -> bool:
        return not self.row_mismatches


@dataclass(frozen=True)
class HourInput:
    """One hour to build: its data files as listed at ``listed_at``, and optionally the rows promised."""

    hour: dt.datetime
    files: list[ObjectInfo]
    listed_at: dt.datetime
    expected_rows: dict[str, int] | None = None


@dataclass
class _Hour:
    hour: dt.datetime
    listed_at: dt.datetime
    files: list[ObjectInfo]
    file_list: list[tuple[str, str]]
    expected_rows: dict[str, int] | None
    version: str
    rows_by_file: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, int] = field(default_factory=dict)
    bad_files: dict[str, int] = field(default_factory=dict)  # file → invalid records read
    valid_rows: int = 0


def _read_task_limit(spark: SparkSession) -> int:
    """At most two file groups per core (read in up to one task per core: ``raw_source.read_raw_lines``;
    0 = one group per file when the core count is unknown).

    Raw files are small (a few per minute partition) and every Python read task costs a worker
    round trip: with one task per file, a 4-hour build spent ~70% of its time starting
    read tasks. Files are grouped contiguously in key order (:func:`~freshidx.spark.raw_source.group_files`).
    """
    cores = task_slots(spark) or 0
    return 2 * cores if cores > 0 else 0


def _check_hour_input(source: str, h: HourInput) -> _Hour:
    hour = _utc("hour", h.hour)
    if (hour.minute, hour.second, hour.microsecond) != (0, 0, 0):
        raise ValueError(f"hour must be a whole hour, got {hour.isoformat()}")
    listed_at = _utc("listed_at", h.listed_at)
    file_list = hour_file_list(source, hour, h.files)
    return _Hour(hour=hour, listed_at=listed_at, files=list(h.files), file_list=file_list,
                 expected_rows=None if h.expected_rows is None else dict(h.expected_rows),
                 version="", rows_by_file={key: 0 for key, _ in file_list})


def build_bucket(
    spark: SparkSession,
    store_config: StoreConfig,
    *,
    asset: str,
    source: str,
    hour: dt.datetime,
    files: list[ObjectInfo],
    listed_at: dt.datetime,
    run_id: str,
    parts: int = 1,
    run_info: dict[str, Any] | None = None,
    expected_rows: dict[str, int] | None = None,
    quarantine: bool = True,
    kind: str = "initial",
) -> BucketBuild:
    """Build and stage one version of the bucket of ``hour`` from ``files`` (the hour's data files).

    ``listed_at`` (when the listing of ``files`` was taken) becomes the draft's position.
    ``expected_rows`` (manifest readiness: key → rows promised) is compared per file with the lines
    read; differences land in :attr:`BucketBuild.row_mismatches` and the caller must not publish.
    Invalid records are counted per reason and, with ``quarantine``, written to
    ``quarantine/<source>/<partition>/<run_id>/``; they never fail the build.
    The one-hour case of :func:`build_buckets`.
    """
    (built,) = build_buckets(
        spark, store_config, asset=asset, source=source,
        hours=[HourInput(hour=hour, files=files, listed_at=listed_at, expected_rows=expected_rows)],
        run_id=run_id, parts=parts, run_info=run_info, quarantine=quarantine, kind=kind,
    )
    return built


def build_buckets(
    spark: SparkSession,
    store_config: StoreConfig,
    *,
    asset: str,
    source: str,
    hours: list[HourInput],
    run_id: str,
    parts: int = 1,
    run_info: dict[str, Any] | None = None,
    quarantine: bool = True,
    kind: str = "initial",
    max_future_skew_seconds: int = DEFAULT_MAX_FUTURE_SKEW_SECONDS,
    quarantine_once: bool = False,
) -> list[BucketBuild]:
    """Build and stage one version of the bucket of every hour of ``hours`` in one Spark pass.

    Returns one :class:`BucketBuild` per input hour, in the same order, each exactly what
    :func:`build_bucket` would return for that hour alone (its own version, position = its
    ``listed_at``, inputs, counts, reasons, quarantine files and row mismatches; the rows of a bucket
    and their split into parts do not depend on the other hours). ``stats.build_seconds`` is the time
    of the whole pass. The work is one read of all files, one parse (checkpointed), one
    ``groupBy(file, reason)`` count, at most one quarantine write and one write job of
    ``len(hours) * parts`` tasks (:func:`~freshidx.catchup.bucket_writer.write_buckets_parts`). Hours
    without files give empty buckets. The hours must be distinct.

    ``quarantine_once`` (what the ``ads_hourly`` asset uses): files an earlier build (a delta, the
    full index, another bucket build) quarantined are not written again, so each bad record is
    quarantined by the first build that reads it (:mod:`freshidx.spark.quarantine_once`); without it
    every invalid record read is written (and marked only then). Version conflicts (the same
    ``(ad_id, version)`` with different contents in one hour) are reported per copy, once, with
    ``quarantine``, and counted in each hour's ``invalid.conflicts``; the winner is the row
    :func:`dedupe_versions` keeps.
    """
    t0 = time.monotonic()
    todo = _hours_to_build(source, hours, parts)
    if not todo:
        return []
    quarantined, conflicts, commits = _spark_pass(spark, store_config, todo, asset, source, run_id, parts, quarantine,
                                                  quarantine_once, max_future_skew_seconds)
    build_seconds = round(time.monotonic() - t0, 3)
    hour_of_quarantine = [(PartitionId.parse(q.partition).hour_start, q) for q in quarantined]
    return [
        _result(h, c, [q for qh, q in hour_of_quarantine if qh == h.hour], asset=asset, source=source,
                run_id=run_id, parts=parts, run_info=run_info, kind=kind, build_seconds=build_seconds,
                conflicts=conflicts, group=str(i))
        for i, (h, c) in enumerate(zip(todo, commits, strict=True))
    ]


def _hours_to_build(source: str, hours: list[HourInput], parts: int) -> list[_Hour]:
    """The input hours checked (whole, distinct hours; ``parts`` >= 1), each with a new version."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    todo = [_check_hour_input(source, h) for h in hours]
    if len({h.hour for h in todo}) != len(todo):
        raise ValueError(f"an hour is listed twice: {sorted(iso(h.hour) for h in todo)}")
    for h in todo:
        h.version = new_version(h.hour)
    return todo


def _spark_pass(spark: SparkSession, store_config: StoreConfig, todo: list[_Hour], asset: str, source: str,
                run_id: str, parts: int, quarantine: bool, quarantine_once: bool, max_future_skew_seconds: int,
                ) -> tuple[list[QuarantineCommit], ConflictReport, list[list[ShardCommit]]]:
    """One read and parse of every hour's files: the lines counted per hour (into ``todo``), the invalid
    records quarantined, the version conflicts reported, and each hour's bucket parts written."""
    file_list = sorted(pair for h in todo for pair in h.file_list)
    lines = read_raw_lines(spark, store_config, file_list, max_partitions=_read_task_limit(spark))
    # Parsed once, used three times (counts, quarantine, bucket parts). A checkpoint, not persist():
    # under Spark Connect a persisted plan never matches and every action re-read (see build.py).
    parsed = transform.parse_records(lines, max_future_skew_seconds).localCheckpoint(eager=True)
    try:
        _count_lines(parsed, todo)
        valid, invalid = transform.split_valid(parsed)
        quarantined: list[QuarantineCommit] = []
        if quarantine and any(h.reasons for h in todo):
            quarantined = _quarantine(invalid, todo, file_list, store_config, source, run_id, once=quarantine_once)
        bucket = _bucket_column(todo)
        conflicts = report_conflicts(parsed.withColumn(_BUCKET, bucket),
                                     store_config, source, write=quarantine, group_col=_BUCKET)
        rows = _dedupe(valid.withColumn(_BUCKET, bucket), (_BUCKET,))
        commits = write_buckets_parts(rows, store_config, asset, [(h.hour, h.version) for h in todo], parts,
                                      bucket_col=_BUCKET)
    finally:
        parsed.unpersist()
    return quarantined, conflicts, commits


def _count_lines(parsed: DataFrame, todo: list[_Hour]) -> None:
    """One small aggregation gives the lines per file and the invalid reasons of every hour."""
    hour_of_file = {key: i for i, h in enumerate(todo) for key, _ in h.file_list}
    for row in parsed.groupBy("file", "reason").agg(F.count(F.lit(1)).alias("n")).collect():
        h = todo[hour_of_file[row["file"]]]
        n = int(row["n"])
        h.rows_by_file[row["file"]] = h.rows_by_file.get(row["file"], 0) + n
        if row["reason"] is None:
            h.valid_rows += n
        else:
            h.reasons[row["reason"]] = h.reasons.get(row["reason"], 0) + n
            h.bad_files[row["file"]] = h.bad_files.get(row["file"], 0) + n


def _quarantine(invalid: DataFrame, todo: list[_Hour], file_list: list[tuple[str, str]], store_config: StoreConfig,
                source: str, run_id: str, *, once: bool) -> list[QuarantineCommit]:
    """Write the invalid records; with ``once``, only those of files no earlier build quarantined."""
    if not once:
        return write_quarantine(invalid, store_config, source, run_id, None)
    bad = {h_file for h in todo for h_file, _ in h.file_list if h.bad_files.get(h_file)}
    done = quarantined_files(open_store(store_config), source, [p for p in file_list if p[0] in bad])
    left = sorted(bad - done)
    if not left:
        return []
    return write_quarantine(invalid.filter(F.col("file").isin(left)), store_config, source, run_id, None, once=True)


def _bucket_column(todo: list[_Hour]) -> Column:
    """The bucket of a row (index of its hour in ``todo``), from its partition path (validated to lie
    in one of the hours)."""
    index_of_hour = F.create_map(
        *[x for i, h in enumerate(todo) for x in (F.lit(PartitionId(h.hour).hour_path), F.lit(i))]
    )
    return index_of_hour[F.substring_index(F.col("partition"), "/minute=", 1)]


def _result(
    h: _Hour, commits: list[ShardCommit], quarantined: list[QuarantineCommit], *, asset: str, source: str,
    run_id: str, parts: int, run_info: dict[str, Any] | None, kind: str, build_seconds: float,
    conflicts: ConflictReport, group: str,
) -> BucketBuild:
    doc_count = sum(c.doc_count for c in commits)
    rows_by_file = dict(sorted(h.rows_by_file.items()))
    expected_rows = h.expected_rows
    mismatches = compare_rows(rows_by_file, expected_rows) if expected_rows is not None else []
    draft = DraftManifest(
        index=layout.bucket_name(asset, h.hour),
        version=h.version,
        position=iso(h.listed_at),
        run_id=run_id,
        shards=[c.to_dict() for c in commits],
        doc_count=doc_count,
        num_shards=parts,
        inputs={
            "hour": iso(h.hour),
            "source": source,
            "files": [{"key": o.key, "etag": o.etag, "size": o.size} for o in sorted(h.files, key=lambda o: o.key)],
            "listed_at": iso(h.listed_at),
            "rows_by_file": rows_by_file,
            **({"expected_rows": dict(sorted(expected_rows.items()))} if expected_rows is not None else {}),
        },
        invalid={
            "count": sum(h.reasons.values()),
            "reasons": dict(sorted(h.reasons.items())),
            "quarantine": [
                {"partition": q.partition, "key": q.key, "records": q.records, "reasons": q.reasons}
                for q in quarantined
            ],
            # Valid records, so not in count/reasons: (ad_id, version) read with different contents;
            # "reported" = copies this build wrote to the quarantine per partition (earlier ones are there).
            "conflicts": conflicts.summary(group),
        },
        stats={
            "read_rows": sum(rows_by_file.values()),
            "valid_rows": h.valid_rows,
            "duplicates_dropped": h.valid_rows - doc_count,
            "build_seconds": build_seconds,
            "kind": kind,
        },
        run=dict(run_info or {}),
    )
    return BucketBuild(draft=draft, rows_by_file=dict(rows_by_file), row_mismatches=mismatches)
