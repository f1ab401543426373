"""One pass per incremental micro-batch (docs/architecture.md#one-pass-micro-batch).

A micro-batch is one Spark job of one stage: ``num_shards`` Python tasks, no shuffle, no JVM-side
operator between them and the data. Each task

* reads the micro-batch's raw files and parses them (:mod:`freshidx.spark.line_parse`: the rules of
  :func:`freshidx.spark.transform.parse_records`, answered exactly as Spark does);
* task 0 only: counts the invalid records per reason, quarantines those of files no earlier build
  quarantined (:func:`freshidx.spark.quarantine_writer.quarantine_in_task`, byte-exact, once per file) and checks
  whether an ``(ad_id, version)`` was read with more than one content (:func:`may_conflict`);
* keeps the latest valid record per ad, reads the state rows its products need, merges the part of the
  batch that bears on them and writes its shard (:func:`freshidx.delta.executor.state_lookup.merged_rows`,
  :func:`freshidx.spark.index_shards.write_one_index_shard`), task i owning the touched products of part i;

and hands back its shard's commit, the seconds of its steps (:data:`STEPS`) and, for task 0, the
bookkeeping. Every task reads the whole batch because which products a batch touches depends on all of
it: reading and parsing a partition on both cores at once costs less than a shuffle and a second job.

Two rare cases cost a second job: a line whose reading only Spark can settle
(:mod:`freshidx.spark.line_parse` says which) makes the tasks commit nothing, and the same job runs again
on the lines Spark parsed; a possible version conflict makes the driver run Spark's exact report
(:func:`freshidx.spark.quarantine_once.report_conflicts`: the copies' content hashes) over the same files.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from freshidx.delta.executor.state_files import FileRef
from freshidx.delta.executor.state_lookup import Parts, StateLayer, merged_rows, state_file_refs
from freshidx.record_rules import list_fingerprint
from freshidx.spark import transform
from freshidx.spark.index_build import BuildResult
from freshidx.spark.index_shards import write_one_index_shard
from freshidx.spark.line_parse import PARSED_SCHEMA as LINE_PARSED_SCHEMA
from freshidx.spark.line_parse import parse_lines
from freshidx.spark.quarantine_once import ConflictReport, report_conflicts
from freshidx.spark.quarantine_writer import QuarantineCommit, quarantine_in_task
from freshidx.spark.raw_source import ARROW_SCHEMA as RAW_ARROW_SCHEMA
from freshidx.spark.raw_source import read_files, read_in_every_task, read_raw_lines, store_to_json
from freshidx.spark.shards import DOCS_ARROW_SCHEMA, ShardCommit, ShardWriter, check_name, conform, write_sharded
from freshidx.spark.transform import INVALID_COLUMNS, QUARANTINE_EXTRA_COLUMNS, TYPED_FIELDS
from freshidx.store import StoreConfig

#: What the job's tasks receive: the parsed lines (valid or not) with their typed fields.
PARSED_COLUMNS: tuple[str, ...] = (*transform.LINE_COLUMNS, *TYPED_FIELDS, "reason", *QUARANTINE_EXTRA_COLUMNS)
#: The steps of a micro-batch, in order, and the task's timer of each (``batch``: until the parsed batch was in,
#: which is the read and the parse, pipelined): the manifest's stats and the materialization metadata.
STEPS: dict[str, str] = {"parse": "batch", "state": "state", "merge": "merge", "index": "index", "upload": "upload"}


@dataclasses.dataclass(frozen=True)
class MicroBatchJob:
    """What the tasks of one micro-batch need to know (pickled into them: plain values only)."""

    store_json: str
    raw_files: list[tuple[str, str]]  # (key, partition path) of the raw files the batch reads
    state_files: list[FileRef]
    cache_bytes: int
    disk_bytes: int
    index: str
    version: str
    num_shards: int
    source: str
    run_id: str
    max_future_skew_seconds: int


def build_segment(spark: SparkSession, store_config: StoreConfig, layers: Sequence[StateLayer],
                  files: list[tuple[str, str]], *, index: str, version: str, num_shards: int, source: str,
                  run_id: str, cache_bytes: int, max_future_skew_seconds: int, disk_bytes: int = 0) -> BuildResult:
    """Stage an incremental micro-batch's segment of ``files`` (``(key, partition path)``) over the state
    ``layers`` in one Spark job (module docstring); the result has the commits, invalid counts, quarantine
    commits, conflicts and the job's seconds (``stages``: ``job``; ``spark_parse`` and ``conflicts`` when
    those were needed)."""
    check_name("source", source)
    check_name("run_id", run_id)
    t0 = time.monotonic()
    job = MicroBatchJob(store_to_json(store_config), list(files), state_file_refs(layers), cache_bytes, disk_bytes,
                        index, version, num_shards, source, run_id, max_future_skew_seconds)
    tasks = spark.range(0, num_shards, 1, num_shards)
    commits = write_sharded(tasks, store_config, num_shards, _task(job, None), what="micro_batch")
    stages = {"job": round(time.monotonic() - t0, 3)}
    if any(c.extra.get("uncertain") for c in commits):  # a line only Spark reads for sure: the job again, on its parse
        t1 = time.monotonic()
        lines = read_in_every_task(spark, store_config, files, num_shards)
        parsed = transform.parse_records(lines, max_future_skew_seconds).select(*PARSED_COLUMNS)
        commits = write_sharded(parsed, store_config, num_shards, _task(job, "spark"), what="micro_batch")
        stages["spark_parse"] = round(time.monotonic() - t1, 3)
    book = next((c.extra for c in commits if "reasons" in c.extra), None)
    if book is None:
        raise RuntimeError("micro-batch: no task reported the batch's bookkeeping (task 0 did not commit)")
    conflicts = ConflictReport()
    if book["may_conflict"]:
        t1 = time.monotonic()
        again = transform.parse_records(read_raw_lines(spark, store_config, files), max_future_skew_seconds)
        conflicts = report_conflicts(again, store_config, source, write=True)
        stages["conflicts"] = round(time.monotonic() - t1, 3)
    return BuildResult(commits=[dataclasses.replace(c, extra={}) for c in commits],
                       reasons={str(k): int(v) for k, v in book["reasons"].items()},
                       quarantined=[QuarantineCommit.from_dict(q) for q in book["quarantined"]],
                       seconds=round(time.monotonic() - t0, 3), conflicts=conflicts, stages=stages)


def _task(job: MicroBatchJob, parsed_by: str | None) -> ShardWriter:
    """The micro-batch task. ``parsed_by`` ``None``: it reads and parses the raw files itself
    (:mod:`freshidx.spark.line_parse`) and, should a line be uncertain, commits nothing but that;
    ``"spark"``: it receives the lines Spark parsed."""
    def write(config: StoreConfig, shard: int, attempt: int, batches: Iterable[pa.RecordBatch]) -> ShardCommit:
        t0 = time.monotonic()
        parsed = _spark_parsed(batches) if parsed_by == "spark" else _parse_here(config, job, batches)
        if parsed is None:
            return ShardCommit(shard, attempt, 0, 0, (), extra={"uncertain": True})
        seconds: dict[str, float] = {"batch": round(time.monotonic() - t0, 3)}
        valid_mask = pc.is_null(parsed.column("reason"))
        valid = pa.Table.from_batches([conform(b, DOCS_ARROW_SCHEMA) for b in parsed.filter(valid_mask).to_batches()],
                                      schema=DOCS_ARROW_SCHEMA)
        extra: dict[str, Any] = {}
        if shard == 0:
            extra = _bookkeeping(job, parsed.filter(pc.invert(valid_mask)), valid)
        owned = Parts(job.num_shards, frozenset({shard})) if job.num_shards > 1 else None
        rows = merged_rows(config, job.state_files, job.cache_bytes, valid, owned, seconds, job.disk_bytes)
        # One batch: the merge leaves many small pieces, and the index step does its per-batch work on each.
        commit = write_one_index_shard(config, job.index, job.version, shard, attempt,
                                       rows.combine_chunks().to_batches())
        written = {k: v for k, v in commit.seconds.items() if k != "rows"}  # rows: merged already
        return dataclasses.replace(commit, seconds={**seconds, **written}, extra=extra)

    return write


def _parse_here(config: StoreConfig, job: MicroBatchJob, batches: Iterable[pa.RecordBatch]) -> pa.Table | None:
    for _ in batches:  # the task's one row: it says only that this task exists
        pass
    lines = pa.Table.from_batches(list(read_files(config, job.raw_files)), schema=RAW_ARROW_SCHEMA)
    return parse_lines(lines, job.max_future_skew_seconds)


def _spark_parsed(batches: Iterable[pa.RecordBatch]) -> pa.Table:
    received = [b for b in batches if b.num_rows]
    if not received:
        return LINE_PARSED_SCHEMA.empty_table()
    return pa.Table.from_batches(received)


def _bookkeeping(job: MicroBatchJob, invalid: pa.Table, valid: pa.Table) -> dict[str, Any]:
    """Task 0's part: invalid counts per reason, the quarantine, whether a version conflict is possible."""
    reasons: dict[str, int] = {}
    quarantined: list[QuarantineCommit] = []
    if invalid.num_rows:
        counts = pc.value_counts(invalid.column("reason").combine_chunks())
        reasons = dict(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True))
        quarantined = quarantine_in_task(job.store_json, job.source, job.run_id,
                                         invalid.select([*INVALID_COLUMNS, *QUARANTINE_EXTRA_COLUMNS]))
    return {"reasons": reasons, "quarantined": [q.to_dict() for q in quarantined],
            "may_conflict": may_conflict(valid)}


def may_conflict(valid: pa.Table) -> bool:
    """False when no ``(ad_id, version)`` of ``valid`` (``DOCS_ARROW_SCHEMA`` records) was read with more
    than one content. Exact in that direction (contents compared whole, never by a hash); True may also
    mean two spellings of one value (``-0.0`` and ``0.0``), which the exact report then clears."""
    if valid.num_rows < 2:
        return False
    # Only rows whose version repeats can share an (ad_id, version): usually a handful of the batch.
    versions = valid.column("version").to_numpy(zero_copy_only=False)
    seen, times = np.unique(versions, return_counts=True)
    repeated = seen[times > 1]
    if len(repeated) == 0:
        return False
    valid = valid.filter(pa.array(np.isin(versions, repeated)))
    keys = pa.table({"a": valid.column("ad_id"), "v": valid.column("version")})
    counts = keys.group_by(["a", "v"], use_threads=False).aggregate([([], "count_all")])
    if pc.max(counts.column("count_all")).as_py() < 2:
        return False
    content = pa.table({"a": valid.column("ad_id"), "v": valid.column("version"), "c": _content(valid)})
    distinct = content.group_by(["a", "v"], use_threads=False).aggregate([("c", "count_distinct")])
    return bool(pc.max(distinct.column("c_count_distinct")).as_py() > 1)


def _content(valid: pa.Table) -> pa.ChunkedArray:
    """One string per record equal exactly when the typed contents are: each field written with its
    length (so no value can imitate a separator), null as ``n``."""
    parts: list[Any] = []
    for name in TYPED_FIELDS:
        col = valid.column(name)
        if name == "keywords":
            col = list_fingerprint(col)  # equal exactly when the lists are (null elements and lists too)
        elif name == "updated_at":
            col = pc.cast(pc.cast(col, pa.int64()), pa.string())
        elif not pa.types.is_string(col.type):
            col = pc.cast(col, pa.string())
        text = pc.binary_join_element_wise(pc.cast(pc.utf8_length(col), pa.string()), col, ":")
        parts.append(pc.fill_null(text, "n"))
    return pc.binary_join_element_wise(*parts, "|")
