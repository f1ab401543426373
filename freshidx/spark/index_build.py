"""The Spark half of every index build: raw files → validated latest-per-ad → staged shards.

Shared by the delta and the full index: :func:`build_version` indexes the latest row per ad of the records
read; a delta window rebuild reads the same way (:func:`read_records`) and indexes the rows it derives over
the serving full version (:mod:`freshidx.delta.product_expansion`) with :func:`index_records`. The driver
passes the file list and collects task commit messages; reading, validation, quarantine and shard writing
run on executors.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from freshidx.raw_record import DEFAULT_MAX_FUTURE_SKEW_SECONDS
from freshidx.spark import transform
from freshidx.spark.index_format import FORMAT
from freshidx.spark.index_shards import StateWritten, write_index_shards
from freshidx.spark.quarantine_once import ConflictReport, quarantined_files, report_conflicts
from freshidx.spark.quarantine_writer import QuarantineCommit, write_quarantine
from freshidx.spark.raw_source import group_files, read_raw_lines
from freshidx.spark.shards import ShardCommit
from freshidx.store import StoreConfig, open_store

__all__ = ["FORMAT", "BuildResult", "Records", "build_version", "index_records", "read_records"]


@dataclass
class BuildResult:
    commits: list[ShardCommit]
    reasons: dict[str, int]
    quarantined: list[QuarantineCommit] = field(default_factory=list)
    seconds: float = 0.0
    conflicts: ConflictReport = field(default_factory=ConflictReport)
    #: Seconds per step (read_parse, invalid_counts, quarantine, conflicts, index): where a build's time goes.
    stages: dict[str, float] = field(default_factory=dict)

    @property
    def doc_count(self) -> int:
        return sum(c.doc_count for c in self.commits)

    @property
    def covered_count(self) -> int:
        return sum(c.covered_count for c in self.commits)

    def invalid_summary(self) -> dict[str, Any]:
        return {
            "count": sum(self.reasons.values()),
            "reasons": self.reasons,
            "quarantine": [
                {"partition": q.partition, "key": q.key, "records": q.records, "reasons": q.reasons}
                for q in self.quarantined
            ],
            # Valid records, so not in count/reasons: (ad_id, version) read with different contents;
            # "reported" = copies this build wrote to the quarantine per partition (earlier ones are there).
            "conflicts": self.conflicts.summary(),
        }


def build_version(
    spark: SparkSession,
    store_config: StoreConfig,
    *,
    index: str,
    version: str,
    files: list[tuple[str, str]],
    num_shards: int,
    source: str,
    run_id: str,
    quarantine_after: str | bool | None,
    max_read_tasks: int = 0,
    max_future_skew_seconds: int = DEFAULT_MAX_FUTURE_SKEW_SECONDS,
    written: StateWritten | None = None,
) -> BuildResult:
    """Build and stage one version of tantivy shards (``index_format.FORMAT``) of the latest row per ad of
    what ``files`` hold (:func:`read_records`, then :func:`index_records`): a full build. A delta window
    rebuild indexes other rows of the same records (:mod:`freshidx.delta.product_expansion`).

    ``quarantine_after``: partition path after which invalid records are written to quarantine,
    ``None`` for all, ``False`` for none (counted only). Either way a raw file whose invalid records
    an earlier build quarantined is not written again, and each copy of an ``(ad_id, version)`` read
    with different contents is reported once (:mod:`freshidx.spark.quarantine_once`); the conflict's
    winner is what :func:`freshidx.spark.transform.latest_per_ad` keeps.
    """
    with read_records(spark, store_config, files, max_read_tasks=max_read_tasks,
                      max_future_skew_seconds=max_future_skew_seconds) as records:
        return index_records(records, transform.index_rows(records.latest()), store_config, index=index,
                             version=version, num_shards=num_shards, source=source, run_id=run_id,
                             quarantine_after=quarantine_after, written=written)


@dataclass(frozen=True)
class Records:
    """The records of a build's files, read, parsed and validated once (a local checkpoint): every
    build's input, whatever rows it then indexes."""

    parsed: DataFrame  # every line with its ``reason`` (None: valid), :func:`transform.parse_records`
    files: list[tuple[str, str]]
    one_task: bool  # read in one task (a micro-batch of one partition)
    started: float  # time.monotonic() when the read began
    read_seconds: float

    def latest(self) -> DataFrame:
        """One row per ``ad_id`` of the valid records: the newest (:func:`transform.latest_per_ad`)."""
        valid, _ = transform.split_valid(self.parsed)
        return transform.latest_per_ad(valid)


@contextmanager
def read_records(spark: SparkSession, store_config: StoreConfig, files: list[tuple[str, str]], *,
                 max_read_tasks: int = 0,
                 max_future_skew_seconds: int = DEFAULT_MAX_FUTURE_SKEW_SECONDS) -> Iterator[Records]:
    """The files' :class:`Records`, released (the checkpoint's blocks dropped) when the block ends."""
    t0 = time.monotonic()
    parsed = _read_parsed(spark, store_config, files, max_read_tasks, max_future_skew_seconds)
    # One read task (a micro-batch of one partition): its records are in one partition anyway, and a
    # single-partition child lets the bookkeeping aggregations run as one task each, without a shuffle
    # (two stages and 200 planned partitions each) beside the index task on the same cores.
    one_task = len(group_files(files, max_read_tasks)) <= 1
    try:
        yield Records(parsed, files, one_task, t0, round(time.monotonic() - t0, 3))
    finally:
        parsed.unpersist()  # classic mode: drop the checkpoint's blocks now, not at garbage collection


def index_records(records: Records, rows: DataFrame, store_config: StoreConfig, *, index: str, version: str,
                  num_shards: int, source: str, run_id: str, quarantine_after: str | bool | None,
                  written: StateWritten | None = None) -> BuildResult:
    """Stage ``rows`` (typed record columns, every ad of each product they mention: what the caller made of
    ``records``) as one version of ``num_shards`` shards, and do the records' bookkeeping beside it: invalid
    counts, quarantine (``quarantine_after`` as :func:`build_version` has it), the conflict report."""
    stages = {"read_parse": records.read_seconds}
    bookkeeping = records.parsed.coalesce(1) if records.one_task else records.parsed
    _, invalid = transform.split_valid(bookkeeping)
    # The bookkeeping (invalid counts + quarantine, the conflict report) and the index are independent
    # Spark jobs over the same checkpoint: run side by side (Spark schedules concurrent jobs of one
    # session; under Connect each is its own request), so a small build pays the longest of them, not
    # the sum of their job and round-trip overheads. Their step seconds overlap.
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="freshidx-build") as pool:
        quarantine = pool.submit(_quarantine_invalid, stages, invalid, records.files, store_config, source, run_id,
                                 quarantine_after, records.one_task)
        conflicts = pool.submit(_report_conflicts, stages, bookkeeping, store_config, source,
                                quarantine_after is not False)
        t1 = time.monotonic()
        commits = write_index_shards(rows, store_config, index, version, num_shards, written=written)
        stages["index"] = round(time.monotonic() - t1, 3)
        reasons, quarantined = quarantine.result()
        report = conflicts.result()
    return BuildResult(commits, reasons, quarantined, round(time.monotonic() - records.started, 3), report, stages)


def _read_parsed(spark: SparkSession, store_config: StoreConfig, files: list[tuple[str, str]], max_read_tasks: int,
                 max_future_skew_seconds: int) -> DataFrame:
    """The files' lines, parsed and validated (:func:`freshidx.spark.transform.parse_records`), checkpointed."""
    lines = read_raw_lines(spark, store_config, files, max_partitions=max_read_tasks)
    # Read and parsed exactly once, then used three times (counts, quarantine, shards). A local
    # checkpoint rather than persist(): under Spark Connect every plan sent is analysed again (the
    # Python data source the reads used then was re-resolved, so a persisted plan never matched and each
    # action re-read the whole window: 6 read stages per delta build); a checkpoint is referenced by id.
    return transform.parse_records(lines, max_future_skew_seconds).localCheckpoint(eager=True)


def _quarantine_invalid(stages: dict[str, float], invalid: DataFrame, files: list[tuple[str, str]],
                       store_config: StoreConfig, source: str, run_id: str, quarantine_after: str | bool | None,
                       one_task: bool) -> tuple[dict[str, int], list[QuarantineCommit]]:
    """Count the invalid records per reason and quarantine those no earlier build quarantined."""
    t0 = time.monotonic()
    # Counted per file (one small row per file and reason): which files hold invalid records, so
    # only those an earlier build did not quarantine yet are written (no job at all when none).
    reasons: dict[str, int] = {}
    bad_files: set[str] = set()
    for r in invalid.groupBy("file", "reason").agg(F.count(F.lit(1)).alias("n")).collect():
        reasons[r["reason"]] = reasons.get(r["reason"], 0) + int(r["n"])
        bad_files.add(r["file"])
    t1 = time.monotonic()
    stages["invalid_counts"] = round(t1 - t0, 3)
    quarantined: list[QuarantineCommit] = []
    todo: list[str] = []
    if quarantine_after is not False and bad_files:
        todo = sorted(bad_files - quarantined_files(open_store(store_config), source,
                                                    [f for f in files if f[0] in bad_files]))
    if todo:
        quarantined = write_quarantine(invalid.filter(F.col("file").isin(todo)), store_config, source, run_id,
                                       quarantine_after or None, once=True, one_task=one_task)
    stages["quarantine"] = round(time.monotonic() - t1, 3)
    return reasons, quarantined


def _report_conflicts(stages: dict[str, float], parsed: DataFrame, store_config: StoreConfig, source: str,
                      write: bool) -> ConflictReport:
    t0 = time.monotonic()
    report = report_conflicts(parsed, store_config, source, write=write)
    stages["conflicts"] = round(time.monotonic() - t0, 3)
    return report
