"""Run one background compaction of the serving delta version (the effects of :mod:`freshidx.delta.compaction_plan`).

1. read ``indexes/delta/CURRENT``, its manifest and the full cutoff; plan (nothing to do: done);
2. build the merged segment M on the executors under a fresh delta version's prefix
   (:mod:`freshidx.delta.executor.compact_shards`);
3. publish the serving segments with the run replaced by M through :func:`freshidx.publish.commit.publish`,
   ``based_on`` = the version it compacted (same position: the publication rule accepts a compaction of
   exactly the serving version). If a micro-batch published meanwhile the base changed: re-read the
   serving version and, if it still holds the run in a row, publish the already-built M over it under a
   new version id (M's files stay under the version that built it, as every segment's do); otherwise
   give up. No rebuild, no lost segment.

What to merge, what to publish over which serving version and what an answer means are decided by pure
functions (:func:`freshidx.delta.compaction_plan.plan_compaction`, :func:`~freshidx.delta.compaction_plan.splice_over`,
:func:`after_publish`); :func:`compact_delta` applies them. The outcome is recorded in the ledger
(``ledger/delta_compaction/<date>/<version>.json``).

The other direction of the race, a micro-batch that loses to a compaction of its base, is the delta's
``rebase`` for publication (:func:`rebase_onto_compaction`).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from pyspark.sql import SparkSession

from freshidx.delta import compaction_plan
from freshidx.delta.executor.compact_shards import merge_inputs, write_merged_segment
from freshidx.delta.executor.state_files import state_writer
from freshidx.delta.segments import Segment
from freshidx.publish.commit import (
    DraftManifest,
    Pointer,
    PublishResult,
    iso,
    new_version,
    parse_iso,
    publish,
    read_manifest,
    read_pointer,
    stale_base,
    utcnow,
)
from freshidx.settings import Settings
from freshidx.spark.index_build import FORMAT
from freshidx.spark.index_shards import StateWritten
from freshidx.store import NotFound, ObjectStore, StoreConfig, layout
from freshidx.store.records import Manifest
from freshidx.trigger import ledger
from freshidx.trigger.lifecycle import Decision

log = logging.getLogger(__name__)
INDEX = "delta"
PIPELINE = "delta_compaction"
#: Publication attempts over a serving version that moved (each re-reads it; no rebuild).
MAX_ATTEMPTS = 4


@dataclass
class CompactionResult:
    """What one compaction run did (the asset's metadata and the ledger entry)."""

    outcome: str  # published | nothing_to_do | gave_up | refused
    reason: str
    based_on: str | None = None  # the serving version it planned from
    version: str | None = None  # the version it published (or last tried)
    merged: list[str] = field(default_factory=list)  # versions of the segments it merged
    segments_before: int = 0
    segments_after: int = 0
    merged_docs: int = 0  # documents of M (those of the run not hidden inside it)
    run_docs: int = 0  # documents of the run before
    attempts: int = 0
    build_seconds: float = 0.0
    publish_seconds: float = 0.0
    published_over: list[str] = field(default_factory=list)  # serving versions it tried, in order

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _full_cutoff(store: ObjectStore) -> dt.datetime | None:
    pointer, _ = read_pointer(store, "full")
    if pointer is None:
        return None
    return parse_iso(pointer.cutoff or pointer.position)


def _serving(store: ObjectStore) -> tuple[Pointer | None, Manifest | None, list[Segment] | None]:
    pointer, _ = read_pointer(store, INDEX)
    if pointer is None:
        return None, None, None
    try:
        manifest = read_manifest(store, INDEX, pointer.version)
    except NotFound:
        return pointer, None, None
    return pointer, manifest, manifest.segment_list()


def needs_compaction(store: ObjectStore, max_segments: int) -> tuple[bool, str, str | None]:
    """The sensor's cheap check (one pointer, one manifest, the full pointer): (needed, why, serving)."""
    pointer, _, segs = _serving(store)
    if pointer is None or segs is None:
        return False, "no segmented delta version serving", None
    cutoff = _full_cutoff(store)
    eligible = len(segs) - compaction_plan.first_eligible(segs, cutoff)
    if not compaction_plan.needs_compaction(segs, max_segments, cutoff):
        return False, f"{eligible} segments after the full cutoff (limit {max_segments})", pointer.version
    return True, f"{eligible} segments after the full cutoff > limit {max_segments}", pointer.version


def compaction_draft(pointer: Pointer, manifest: Manifest, segs: list[Segment], merged: Segment, *,
                     version: str, run_id: str, run_info: dict[str, Any], plan: compaction_plan.CompactionPlan,
                     build_seconds: float) -> DraftManifest:
    """The delta version that serves ``segs`` (the serving ones with the run replaced by ``merged``)."""
    return DraftManifest(
        index=INDEX, version=version, position=pointer.position, run_id=run_id,
        shards=merged.shards, doc_count=sum(s.doc_count for s in segs), num_shards=len(merged.shards),
        source_partition=pointer.source_partition, window_start=pointer.window_start,
        window_end=pointer.window_end, covered_count=sum(s.covered_count for s in segs),
        segments=[s.to_dict() for s in segs],
        inputs={
            "source": manifest.source, "build": compaction_plan.COMPACTION, "based_on": pointer.version,
            "compacted": plan.versions, "merged_segment": merged.version, "partitions": [], "files": [],
            "full_version": manifest.full_version, "full_cutoff": manifest.full_cutoff,
            "segments_kept": len(segs), "segments_dropped": 0, "format": FORMAT,
            "kill_list": "covered.parquet of every shard of every segment; a newer segment's hides older "
                         "segments and the full version",
        },
        stats={"build_seconds": build_seconds, "total_build_seconds": build_seconds, "segments": len(segs),
               "segments_before": plan.segments_before, "merged_segments": len(plan.run)},
        # A compaction drops the documents hidden inside the run: the drop guard does not apply.
        run={**run_info, "max_drop_fraction": None},
    )


def rebase_onto_compaction(store: ObjectStore, current: Pointer, draft: DraftManifest) -> DraftManifest | None:
    """The delta's ``rebase`` for :func:`freshidx.publish.commit.publish`: a micro-batch whose base changed,
    moved onto ``current`` when that is a compaction of its base (:func:`compaction_plan.rebased_draft`); None
    otherwise (a compaction's own draft is never rebased). Reads the serving manifest only then."""
    if draft.build == compaction_plan.COMPACTION or not stale_base(draft, current):
        return None
    try:
        serving = read_manifest(store, draft.index, current.version)
    except NotFound:
        return None
    return compaction_plan.rebased_draft(draft, current.version, serving)


def after_publish(published: PublishResult, planned_over: str, plan: compaction_plan.CompactionPlan) -> tuple[str, str]:
    """What one publication attempt's answer means: ``published``, ``refused`` (the version it was planned
    over still serves: nothing to retry), or ``retry`` over the version that serves now; and why."""
    if published.outcome == "published":
        return "published", f"{plan.describe()}; {published.reason}"
    moved = published.pointer is not None and published.pointer.version != planned_over
    return ("retry" if moved else "refused"), published.reason


def compact_delta(
    spark: SparkSession, store: ObjectStore, store_config: StoreConfig, settings: Settings, *,
    run_id: str, run_info: dict[str, Any] | None = None,
    before_publish: Callable[[int], None] | None = None,
) -> CompactionResult:
    """Plan, build, publish (with the retry above the attempt), record. ``before_publish(attempt)`` is
    called right before each publication (tests publish a micro-batch there)."""
    pointer, manifest, segs = _serving(store)
    if pointer is None or manifest is None or segs is None:
        return _record(store, CompactionResult("nothing_to_do", "no segmented delta version serving"), run_id)
    plan = compaction_plan.plan_compaction(segs, max_segments=settings.delta_compact_segments,
                                      full_cutoff=_full_cutoff(store))
    result = CompactionResult("nothing_to_do", "", based_on=pointer.version, segments_before=len(segs))
    if plan is None:
        result.reason = f"{len(segs)} segments: within the limit of {settings.delta_compact_segments}"
        return _record(store, result, run_id)
    log.info("compaction of delta %s: %s", pointer.version, plan.describe())
    result.merged, result.run_docs = plan.versions, plan.doc_count
    merged = _build_merged(spark, store_config, plan, pointer, result,
                           state_writer(settings.delta_state_disk_bytes))
    t1 = time.monotonic()
    _publish_merged(store, (pointer, manifest, segs), plan, merged, result, run_id=run_id,
                    run_info=run_info or {}, before_publish=before_publish)
    result.publish_seconds = round(time.monotonic() - t1, 3)
    return _record(store, result, run_id)


def _build_merged(spark: SparkSession, store_config: StoreConfig, plan: compaction_plan.CompactionPlan,
                  pointer: Pointer, result: CompactionResult, written: StateWritten | None) -> Segment:
    """Build M on the executors under a fresh delta version's prefix."""
    t0 = time.monotonic()
    version = new_version(parse_iso(pointer.position))
    # As many shards as the run's largest segment: never more searchers than its segments had.
    commits = write_merged_segment(spark, store_config, merge_inputs(plan.run), index=INDEX, version=version,
                                   num_shards=max(len(s.shards) for s in plan.run),
                                   written=written)
    result.build_seconds = round(time.monotonic() - t0, 3)
    merged = compaction_plan.merged_segment(
        plan.run, version=version, shards=[c.to_dict() for c in commits], doc_count=sum(c.doc_count for c in commits),
        covered_count=sum(c.covered_count for c in commits), compacted_at=iso(utcnow()))
    result.merged_docs = merged.doc_count
    return merged


def _publish_merged(store: ObjectStore, serving: tuple[Pointer, dict[str, Any], list[Segment]],
                    plan: compaction_plan.CompactionPlan, merged: Segment, result: CompactionResult, *, run_id: str,
                    run_info: dict[str, Any], before_publish: Callable[[int], None] | None) -> None:
    """Publish M over the serving version; over the one serving then if another publisher won meanwhile."""
    pointer, manifest, segs = serving
    draft_version = merged.version
    for attempt in range(1, MAX_ATTEMPTS + 1):
        result.attempts = attempt
        result.published_over.append(pointer.version)
        over = compaction_plan.splice_over(pointer.version, segs, plan, merged, _full_cutoff(store))
        if over.segments is None:
            result.outcome, result.reason = "gave_up", over.why
            return
        draft = compaction_draft(pointer, manifest, over.segments, merged, version=draft_version, run_id=run_id,
                                 run_info=run_info, plan=plan, build_seconds=result.build_seconds)
        result.version, result.segments_after = draft.version, len(over.segments)
        if before_publish is not None:
            before_publish(attempt)
        step, why = after_publish(publish(store, draft), pointer.version, plan)
        if step != "retry":
            result.outcome, result.reason = step, why
            return
        log.info("compaction: %s; re-reading the serving version", why)
        now, now_manifest, now_segs = _serving(store)
        if now is None or now_manifest is None or now_segs is None:
            result.outcome, result.reason = "gave_up", "the serving delta version is no longer segmented"
            return
        pointer, manifest, segs = now, now_manifest, now_segs
        # The manifest of the refused version is written (create-once): the next one gets a new id. M's
        # files stay under its own version (its segment says so), which garbage collection keeps while served.
        draft_version = new_version(parse_iso(pointer.position))
    result.outcome = "gave_up"
    result.reason = f"the serving version kept moving: {MAX_ATTEMPTS} attempts"


def _record(store: ObjectStore, result: CompactionResult, run_id: str) -> CompactionResult:
    """One create-once ledger entry per run (a compaction has no partition of its own)."""
    decision = {"published": Decision.PUBLISHED, "nothing_to_do": Decision.SUPERSEDED}.get(
        result.outcome, Decision.REFUSED)
    now = utcnow()
    trigger = f"{now.strftime('%Y%m%dT%H%M%S')}-{run_id[:8]}"
    ledger.record(store, layout.ledger_key(PIPELINE, now.strftime("%Y-%m-%d"), trigger), ledger.Entry(
        PIPELINE, trigger, decision, result.reason, scope=f"delta {result.based_on or '-'}", run_id=run_id,
        extra=result.to_dict()))
    log.info("compaction %s: %s", result.outcome, result.reason)
    return result
