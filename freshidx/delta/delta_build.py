"""Build one delta version for trigger partition P (docs/architecture.md#incremental-delta).

Incremental (the usual case): read only the files no kept segment consumed and the full index does not
hold (every partition in (watermark, P], and late files), merge them with what the serving full version
and the kept segments know, and index the touched products as one new segment with its kill-list. The
new version lists the kept segments (their files stay where they are) and the new one.

Window rebuild (the fallback, :class:`freshidx.delta.segments.RebuildReason` says why): read the whole window
(P − window, P] and index it as a single segment: every ad of each product it touches, over the full
version's state (:mod:`freshidx.delta.product_expansion`), with the engine's read and index steps
(:mod:`freshidx.spark.index_build`).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession

from freshidx.delta import product_expansion, segments, serving_state, window_files
from freshidx.delta.executor import one_pass
from freshidx.delta.executor.state_files import state_writer
from freshidx.delta.executor.state_lookup import StateLayer
from freshidx.delta.segments import BuildKind, FullBase, Segment
from freshidx.publish.commit import (
    DraftManifest,
    crash_point,
    iso,
    new_version,
    utcnow,
)
from freshidx.settings import Settings
from freshidx.spark import index_build
from freshidx.spark.index_build import FORMAT, BuildResult
from freshidx.spark.session import task_slots
from freshidx.spark.shards import ShardCommit
from freshidx.store import ObjectInfo, ObjectStore, StoreConfig
from freshidx.store.partitions import PartitionId
from freshidx.store.records import Manifest

log = logging.getLogger(__name__)
INDEX = "delta"
READ_TASKS = 4


@dataclass(frozen=True)
class DeltaPlan:
    partition: PartitionId
    watermark: PartitionId | None  # the serving delta's partition when the run started
    run_id: str
    run_info: dict[str, Any]
    force_rebuild: bool = False


def build_delta(
    spark: SparkSession,
    store: ObjectStore,
    store_config: StoreConfig,
    settings: Settings,
    plan: DeltaPlan,
    *,
    on_stage: Callable[[str, float], None] | None = None,
) -> DraftManifest:
    """Stage one delta version for ``plan.partition``: a new segment over the kept ones (or a window
    rebuild) and the draft manifest that lists them, ready for publication.

    This package decides (the micro-batch's plan, the files it reads, its manifest but for the build's
    output), then the build runs below it (:func:`freshidx.delta.executor.one_pass.build_segment`, or for a
    rebuild the engine's read and index steps, :mod:`freshidx.spark.index_build`, over this package's
    product expansion) and hands back what it staged."""
    batch = _list_batch(store, settings, plan)
    if on_stage:
        on_stage("list_seconds", batch.list_seconds)
    crash_point("delta_listed")  # tests: a kill -9 here (nothing written yet)

    version = new_version(plan.partition.at)
    draft = _decide(settings, plan, batch, version)
    result = _build(spark, store_config, settings, plan.run_id, batch, version)
    # A rebuild reads the state before the build (stage ``state``); an incremental micro-batch reads it
    # inside its one pass (the same task merges and writes).
    state_seconds = result.stages.get("state", 0.0)
    build_seconds = round(result.seconds + state_seconds, 3)
    if on_stage:
        on_stage("build_seconds", build_seconds)
    crash_point("delta_staged")  # tests: a kill -9 here (segment shards staged, no manifest)
    return draft.manifest(result, build_seconds, state_seconds)


@dataclass(frozen=True)
class _Batch:
    """What one micro-batch reads: its plan, the serving state it rests on and the files listed."""

    mb: segments.MicroBatchPlan
    full: FullBase | None
    full_manifest: Manifest | None
    serving: str | None  # the serving delta version
    listed: int  # partitions listed in the window
    to_read: dict[PartitionId, list[ObjectInfo]]
    ignored: list[Any]
    listed_at: dt.datetime
    list_seconds: float

    @property
    def file_list(self) -> list[tuple[str, str]]:
        return [(o.key, pid.path) for pid, objs in self.to_read.items() for o in objs]

    @property
    def input_bytes(self) -> int:
        return sum(o.size for objs in self.to_read.values() for o in objs)


def _list_batch(store: ObjectStore, settings: Settings, plan: DeltaPlan) -> _Batch:
    """Plan the micro-batch over the serving state (:func:`freshidx.delta.segments.plan`) and list what it
    reads: the window's files, less what the full version and the kept segments hold (incremental)."""
    p = plan.partition
    full, full_manifest = serving_state.full_base(store)
    delta_pointer, previous = serving_state.delta_segments(store, "delta: window rebuild")
    serving = delta_pointer.version if delta_pointer is not None else None
    mb = segments.plan(p, settings.window, full, previous, has_previous_delta=serving is not None,
                       max_segments=settings.delta_max_segments,
                       force_rebuild=plan.force_rebuild or settings.delta_build == "window")
    t0 = time.monotonic()
    listed_at = utcnow()  # before listing: whatever is visible now is in the listing
    files, ignored = window_files.files_in_window(store, settings.source, mb.window_start, p)
    if mb.kind is BuildKind.INCREMENTAL:
        assert full is not None
        to_read = segments.files_to_read(files, full, mb.kept)
    else:
        to_read = files
    batch = _Batch(mb, full, full_manifest, serving, len(files), to_read, ignored, listed_at,
                   list_seconds=round(time.monotonic() - t0, 3))
    log.info("delta %s (%s%s): %d of %d partitions, %d files to read, %d segments kept", p.path, mb.kind,
             f": {mb.reason}" if mb.reason else "", len(to_read), len(files), len(batch.file_list), len(mb.kept))
    return batch


@dataclass(frozen=True)
class _Draft:
    """The new version's manifest as far as it is decided before the build (:func:`_decide`): what the
    version is, what it reads and rests on, which segments it keeps. :meth:`manifest` adds what the build
    made: the new segment's shards and documents, the invalid records, the seconds."""

    head: dict[str, Any]  # the DraftManifest fields known before the build
    segment: dict[str, Any]  # the new Segment's fields known before the build
    kept: tuple[Segment, ...]
    list_seconds: float
    files_read: int
    bytes_read: int

    def manifest(self, result: BuildResult, build_seconds: float, state_seconds: float) -> DraftManifest:
        """The draft manifest: the kept segments and the new one, with what was read and what it cost."""
        shards = [c.to_dict() for c in result.commits]
        new_segment = Segment(**self.segment, shards=shards, doc_count=result.doc_count,
                              covered_count=result.covered_count)
        all_segments = [*self.kept, new_segment]
        return DraftManifest(
            **self.head,
            shards=shards,
            doc_count=sum(s.doc_count for s in all_segments),
            num_shards=len(shards),
            covered_count=sum(s.covered_count for s in all_segments),
            segments=[s.to_dict() for s in all_segments],
            invalid=result.invalid_summary(),
            stats={"list_seconds": self.list_seconds, "build_seconds": build_seconds, "state_seconds": state_seconds,
                   "total_build_seconds": round(self.list_seconds + build_seconds, 3),
                   "files_read": self.files_read, "bytes_read": self.bytes_read, "segments": len(all_segments),
                   **{f"{k}_seconds": v for k, v in result.stages.items()},
                   **_step_seconds(_slowest_task(result.commits))},
        )


def _decide(settings: Settings, plan: DeltaPlan, batch: _Batch, version: str) -> _Draft:
    """What the new version is, reads, keeps and rests on: everything of its manifest but the build's output."""
    p, mb, full = plan.partition, batch.mb, batch.full
    file_list = batch.file_list
    segment = {
        "version": version, "position": iso(p.at), "kind": str(mb.kind), "files": [k for k, _ in file_list],
        "listed_at": iso(batch.listed_at), "extra": {"partitions": len(batch.to_read), "reason": mb.reason},
        # Both kinds read the serving full version's state and never let a row beat a higher one it holds.
        "full_version": full.version if full is not None else None,
    }
    head = {
        "index": INDEX, "version": version, "position": iso(p.at), "run_id": plan.run_id,
        "source_partition": p.path, "window_start": iso(mb.window_start), "window_end": iso(p.at),
        "inputs": _inputs(settings.source, mb, batch.serving, full, batch.to_read, batch.listed, batch.ignored),
        "run": _run_record(plan.run_info, mb.kind),
    }
    return _Draft(head, segment, mb.kept, batch.list_seconds, len(file_list), batch.input_bytes)


def _inputs(source: str, mb: segments.MicroBatchPlan, serving: str | None, full: FullBase | None,
            to_read: dict[PartitionId, list[ObjectInfo]], listed: int, ignored: list[Any]) -> dict[str, Any]:
    """The manifest's ``inputs``: what the micro-batch read, how it was built, what it rests on."""
    return {
        "source": source,
        "build": str(mb.kind),
        "rebuild_reason": mb.reason or None,
        # Publication requires this version to still serve (publish.stale_base): None for a rebuild.
        "based_on": serving if mb.kind is BuildKind.INCREMENTAL else None,
        "partitions": [pid.path for pid in to_read],
        "files": [_file_entry(o) for objs in to_read.values() for o in objs],
        "listed_partitions": listed,
        "ignored": [{"key": i.key, "reason": i.reason} for i in ignored],
        "full_version": full.version if full else None,
        "full_cutoff": iso(full.cutoff) if full else None,
        "segments_kept": len(mb.kept),
        "segments_dropped": mb.dropped,
        "format": FORMAT,
        "kill_list": "covered.parquet of every shard of every segment; a newer segment's hides older "
                     "segments and the full version",
    }


def _build(spark: SparkSession, store_config: StoreConfig, settings: Settings, run_id: str, batch: _Batch,
           version: str) -> BuildResult:
    """Build and stage the new segment over what is known before this micro-batch: the full version, then
    the kept segments (none for a rebuild; nothing at all without a full version). An incremental
    micro-batch is one pass of Python tasks (:func:`freshidx.delta.executor.one_pass.build_segment`). A
    window rebuild reads the full version's state whole first (stage ``state``, not in ``seconds``), then the
    window's records (:func:`freshidx.spark.index_build.read_records`), and indexes every ad of each product
    they touch at its latest state over both (:func:`freshidx.delta.product_expansion.expand_to_products`:
    a product's features are never half-updated, a higher version already known never overridden); without
    a full version the window's rows are all there is, as a full build of them."""
    mb, full, full_manifest = batch.mb, batch.full, batch.full_manifest
    known: list[StateLayer] | None = None
    if full is not None and full_manifest is not None:
        known = serving_state.known_layers(full, full_manifest, mb.kept)
    num_shards = _shard_count(spark, settings, mb.kind, batch.input_bytes)
    if mb.kind is BuildKind.INCREMENTAL and known is not None:
        return one_pass.build_segment(
            spark, store_config, known, batch.file_list, index=INDEX, version=version, num_shards=num_shards,
            source=settings.source, run_id=run_id, cache_bytes=settings.delta_state_cache_bytes,
            disk_bytes=settings.delta_state_disk_bytes,
            max_future_skew_seconds=settings.max_future_skew_seconds)
    # Every file read not quarantined yet, late ones included (files an earlier build quarantined have a
    # done marker: freshidx.spark.quarantine_once).
    write = {"index": INDEX, "version": version, "num_shards": num_shards, "source": settings.source,
             "run_id": run_id, "quarantine_after": None,
             "written": state_writer(settings.delta_state_disk_bytes)}
    # A few files per task: one Python task per 5-minute file costs more in task start-up than in reading
    # (60 files in a 5 h window).
    read = {"max_read_tasks": READ_TASKS, "max_future_skew_seconds": settings.max_future_skew_seconds}
    if known is None:
        return index_build.build_version(spark, store_config, files=batch.file_list, **read, **write)
    t0 = time.monotonic()
    state = product_expansion.read_version_state(spark, store_config, known)
    state_seconds = round(time.monotonic() - t0, 3)
    try:
        with index_build.read_records(spark, store_config, batch.file_list, **read) as records:
            rows = product_expansion.expand_to_products(records.latest(), state)
            result = index_build.index_records(records, rows, store_config, **write)
    finally:
        state.unpersist()  # classic mode: drop the checkpoint's blocks now
    result.stages["state"] = state_seconds
    return result


def _shard_count(spark: SparkSession, settings: Settings, kind: BuildKind, input_bytes: int) -> int:
    """A rebuild writes ``FRESHIDX_DELTA_SHARDS`` shards; a micro-batch's segment as many as the bytes it reads
    need (:func:`freshidx.delta.segments.segment_shard_count`), and no more than Spark runs at once where it
    says how many (:func:`freshidx.spark.session.task_slots`): every task of a micro-batch reads and parses
    the whole batch, so a second wave of tasks would parse it again."""
    if kind is BuildKind.REBUILD:
        return settings.delta_shards
    wanted = segments.segment_shard_count(input_bytes, max_shards=settings.delta_segment_shards,
                                          shard_mb=settings.delta_segment_shard_mb)
    return min(wanted, task_slots(spark) or wanted) if wanted > 1 else wanted


def _run_record(run_info: dict[str, Any], kind: BuildKind) -> dict[str, Any]:
    # The drop guard compares a version's documents with the serving one's. A window rebuild stands
    # alone, so a collapse means a broken build; an incremental version shrinks legitimately when a
    # full index takes over its oldest segments.
    return run_info if kind is BuildKind.REBUILD else {**run_info, "max_drop_fraction": None}


def _slowest_task(commits: list[ShardCommit]) -> dict[str, float]:
    """Per step of the shard tasks (``state``, ``merge``, ``index``, ``upload``, …), the slowest shard's."""
    out: dict[str, float] = {}
    for c in commits:
        for k, v in c.seconds.items():
            out[k] = max(out.get(k, 0.0), v)
    return out


def _step_seconds(slowest: dict[str, float]) -> dict[str, float]:
    """The manifest's seconds per step: each task timer's slowest (``task_<timer>_seconds``) and, for a
    one-pass micro-batch, the named steps (``parse_seconds`` … ``upload_seconds``, :data:`one_pass.STEPS`)."""
    out = {f"task_{k}_seconds": v for k, v in slowest.items()}
    if "batch" in slowest and "state" in slowest:
        out |= {f"{step}_seconds": slowest.get(timer, 0.0) for step, timer in one_pass.STEPS.items()}
    return out


def _file_entry(o: ObjectInfo) -> dict[str, Any]:
    return {"key": o.key, "etag": o.etag, "size": o.size}
