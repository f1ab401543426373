"""The Spark half of ``ads_hourly``: all raw files of one closed UTC hour → one immutable bucket.

:func:`build_bucket` reads the hour's files on executors (``freshidx_raw``), validates them
(:func:`freshidx.transform.parse_records`), quarantines and counts invalid records (never failing the
hour), keeps one row per ``(ad_id, version)`` (:func:`dedupe_versions`) and writes ``parts`` Parquet
files from Spark tasks (:func:`freshidx.spark.bucket_writer.write_bucket_parts`). It returns a
:class:`~freshidx.publish.DraftManifest` built from the task commit messages, ready for
:func:`freshidx.publish.publish` (``allow_empty=True``: an hour with no valid record is a valid, empty
bucket). The driver handles only the file list, one count row per (file, reason) and the commits.

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

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from freshidx import layout, transform
from freshidx.partitions import PartitionError, PartitionId
from freshidx.publish import DraftManifest, iso, new_version
from freshidx.spark.bucket_writer import write_bucket_parts
from freshidx.spark.raw_source import read_raw_lines
from freshidx.spark.shards import QuarantineCommit, write_quarantine
from freshidx.store import ObjectInfo, StoreConfig

__all__ = ["BucketBuild", "build_bucket", "compare_rows", "dedupe_versions", "hour_file_list"]

_DEDUPE_KEY = ("ad_id", "version")


# --------------------------------------------------------------------------------- pure transform


def dedupe_versions(valid: DataFrame) -> DataFrame:
    """One row per ``(ad_id, version)``; columns :data:`~freshidx.transform.TYPED_FIELDS`.

    Exact duplicates collapse. When one ``(ad_id, version)`` comes with different content, the winner
    follows the project's tie-break (:func:`freshidx.transform._tie_break_order` minus the key): latest
    ``updated_at``, then ``status`` (``paused``/``deleted`` beat ``active``: when in doubt, hide), then
    every other field. It is a ``max`` over a struct, so it does not depend on input order or
    partitioning. Other input columns (``partition``, …) take no part and are dropped.
    """
    order = [c for c in transform._tie_break_order(list(transform.TYPED_FIELDS)) if c not in _DEDUPE_KEY]
    winner = F.max(F.struct(*[F.col(c) for c in order])).alias("_w")
    return (
        valid.select(*transform.TYPED_FIELDS)
        .groupBy(*_DEDUPE_KEY)
        .agg(winner)
        .select(*_DEDUPE_KEY, *[F.col("_w")[c].alias(c) for c in order])
        .select(*transform.TYPED_FIELDS)
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
    """What :func:`build_bucket` produced."""

    draft: DraftManifest
    rows_by_file: dict[str, int]  # raw (non-blank) lines read per input file key, valid + invalid
    row_mismatches: list[str] = field(default_factory=list)  # when expected_rows was given

    @property
    def ok(self) -> bool:
        return not self.row_mismatches


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
    """
    t0 = time.monotonic()
    hour = _utc("hour", hour)
    if (hour.minute, hour.second, hour.microsecond) != (0, 0, 0):
        raise ValueError(f"hour must be a whole hour, got {hour.isoformat()}")
    listed_at = _utc("listed_at", listed_at)
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    file_list = hour_file_list(source, hour, files)
    index = layout.bucket_name(asset, hour)
    version = new_version(hour)

    lines = read_raw_lines(spark, store_config, file_list)
    # Parsed once, used three times (counts, quarantine, bucket parts).
    parsed = transform.parse_records(lines).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        # One small aggregation gives both the lines per file and the invalid reasons.
        counts = parsed.groupBy("file", "reason").agg(F.count(F.lit(1)).alias("n")).collect()
        rows_by_file = {key: 0 for key, _ in file_list}
        reasons: dict[str, int] = {}
        valid_rows = 0
        for row in counts:
            n = int(row["n"])
            rows_by_file[row["file"]] = rows_by_file.get(row["file"], 0) + n
            if row["reason"] is None:
                valid_rows += n
            else:
                reasons[row["reason"]] = reasons.get(row["reason"], 0) + n
        valid, invalid = transform.split_valid(parsed)
        quarantined: list[QuarantineCommit] = []
        if quarantine and reasons:
            quarantined = write_quarantine(invalid, store_config, source, run_id, None)
        commits = write_bucket_parts(dedupe_versions(valid), store_config, asset, hour, version, parts)
    finally:
        parsed.unpersist()

    doc_count = sum(c.doc_count for c in commits)
    read_rows = sum(rows_by_file.values())
    mismatches = compare_rows(rows_by_file, expected_rows) if expected_rows is not None else []
    draft = DraftManifest(
        index=index,
        version=version,
        position=iso(listed_at),
        run_id=run_id,
        shards=[c.to_dict() for c in commits],
        doc_count=doc_count,
        num_shards=parts,
        inputs={
            "hour": iso(hour),
            "source": source,
            "files": [{"key": o.key, "etag": o.etag, "size": o.size} for o in sorted(files, key=lambda o: o.key)],
            "listed_at": iso(listed_at),
            "rows_by_file": dict(sorted(rows_by_file.items())),
            **({"expected_rows": dict(sorted(expected_rows.items()))} if expected_rows is not None else {}),
        },
        invalid={
            "count": sum(reasons.values()),
            "reasons": dict(sorted(reasons.items())),
            "quarantine": [
                {"partition": q.partition, "key": q.key, "records": q.records, "reasons": q.reasons}
                for q in quarantined
            ],
        },
        stats={
            "read_rows": read_rows,
            "valid_rows": valid_rows,
            "duplicates_dropped": valid_rows - doc_count,
            "build_seconds": round(time.monotonic() - t0, 3),
            "kind": kind,
        },
        run=dict(run_info or {}),
    )
    return BucketBuild(draft=draft, rows_by_file=dict(sorted(rows_by_file.items())), row_mismatches=mismatches)
