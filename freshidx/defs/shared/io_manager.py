"""The IO manager that publishes the delta and full indexes: one draft, one publication per run.

The asset body stages shards (from executors) and returns a :class:`DraftManifest`; the shared
flow (gate → manifest → compare-and-swap of ``CURRENT``) is :class:`PublishingIOManager`'s. What
is this manager's: the ledger entries of an index publication (:func:`record_outcome`), its
metadata (:func:`outcome_metadata`) and the run tags (:func:`outcome_tags`).

A publication outside a Dagster output (the continuous loop's micro-batch) takes the same two steps
as an asset run with this manager: :func:`refusal_unless_newer` (what the asset body decides before
yielding its draft) and :func:`publish_index_draft` (what this manager does with it).
"""


import datetime as dt
import logging
from collections.abc import Sequence
from typing import Any, ClassVar

import dagster as dg

from freshidx.defs.shared.publishing_io_manager import (
    Publication,
    PublishingIOManager,
    PublishPolicy,
    running_step,
    serving_pointer,
)
from freshidx.delta.compact import rebase_onto_compaction
from freshidx.delta.executor.one_pass import STEPS as MICRO_BATCH_STEPS
from freshidx.publish.commit import (
    DraftManifest,
    Pointer,
    PublishResult,
    compare_to_serving,
    parse_iso,
    read_manifest,
    read_pointer,
    record_refusal,
    utcnow,
)
from freshidx.store import NotFound, ObjectStore, layout
from freshidx.store.partitions import PartitionId
from freshidx.trigger import ledger
from freshidx.trigger.lifecycle import Decision, Mark, TriggerId, decision_for, full_trigger_id

log = logging.getLogger(__name__)
TAG_OUTCOME = "freshidx/outcome"
TAG_SKIPPED = "freshidx/skipped_count"


class IndexIOManager(PublishingIOManager):
    """Stages are already written; this publishes them atomically and records the outcome."""

    #: The fixed part of the gate; force and the drop guard come with the draft's run record.
    #: Not a config field: nobody sets it per run, and a field would pre-fill the launchpad. A delta
    #: micro-batch whose base a compaction replaced is moved onto it (nothing else is ever rebased).
    policy: ClassVar[PublishPolicy] = PublishPolicy(allow_empty=False, rebase=rebase_onto_compaction)

    def publications(self, obj: DraftManifest) -> list[Publication[DraftManifest]]:
        if not isinstance(obj, DraftManifest):
            raise dg.Failure(f"index assets must return a DraftManifest, got {type(obj).__name__}")
        return [Publication(obj, obj, self.policy.with_run_record(obj))]

    def record(self, store: ObjectStore, pub: Publication[DraftManifest], result: PublishResult,
               run_id: str) -> None:
        record_outcome(store, pub.subject, result, run_id)

    def metadata(self, store: ObjectStore, publications: Sequence[Publication[DraftManifest]]) -> dict[str, Any]:
        draft, result = _single(publications)
        step = running_step()
        skipped = step.run.tags.get(TAG_SKIPPED) if step is not None else None  # set by the sensor
        return outcome_metadata(store, draft, result, skipped=skipped, manifest_written=result.outcome != "invalid")

    def run_tags(self, publications: Sequence[Publication[DraftManifest]]) -> dict[str, str]:
        return outcome_tags(*_single(publications))

    def report(self, context: dg.OutputContext, store: ObjectStore,
               publications: Sequence[Publication[DraftManifest]]) -> None:
        super().report(context, store, publications)
        draft, result = _single(publications)
        if result.outcome in ("superseded", "unchanged"):
            # Only reachable when another publisher won between the asset's compare and this CAS (the
            # asset does not yield a draft it already knows is not newer). The materialization cannot
            # be suppressed from here (Dagster records it once handle_output returns) and failing
            # would count as a failed attempt for the sensor, so the outcome metadata says it.
            context.log.warning(f"nothing new: {draft.index} {draft.version} not published ({result.reason})")

    def describe_failure(self, failed: Sequence[Publication[DraftManifest]]) -> tuple[str, dict[str, Any]]:
        draft, result = _single(failed)
        return f"{draft.index} {draft.version} not published: {result.reason}", {"reason": result.reason}

    def load_input(self, context: dg.InputContext) -> dict[str, Any]:
        """Downstream assets get the *published* version (pointer + manifest), never a staged one."""
        index = context.upstream_output.asset_key.path[-1].removesuffix("_index") if context.upstream_output \
            and context.upstream_output.asset_key else "delta"
        store = self.store.open()
        pointer = serving_pointer(store, index, f"no published {index} index yet")
        return {"pointer": pointer.to_dict(), "manifest": read_manifest(store, index, pointer.version).to_dict()}


def refusal_unless_newer(store: ObjectStore, draft: DraftManifest, run_id: str) -> PublishResult | None:
    """The one rule before any publication attempt (:func:`~freshidx.publish.commit.compare_to_serving`):
    None when ``draft`` is newer than what is serving (publish it); otherwise the refusal, recorded in
    the store and the ledger, with no publication attempt. The compare-and-swap compares again (a
    publisher may win meanwhile); this early compare decides whether there is anything to publish."""
    current, _ = read_pointer(store, draft.index)
    verdict, why = compare_to_serving(store, draft, current)
    if verdict == "newer":
        return None
    result = PublishResult(verdict, draft.version, why, current)
    record_refusal(store, draft, verdict, why, current)
    record_outcome(store, draft, result, run_id)
    return result


def publish_index_draft(store: ObjectStore, draft: DraftManifest, run_id: str) -> PublishResult:
    """What :class:`IndexIOManager` does with a draft: the gate → manifest → compare-and-swap of
    ``CURRENT`` under its policy and the draft's run record, then the ledger (:func:`record_outcome`)."""
    result = IndexIOManager.policy.with_run_record(draft).publish(store, draft)
    record_outcome(store, draft, result, run_id)
    return result


def _single(publications: Sequence[Publication[DraftManifest]]) -> tuple[DraftManifest, PublishResult]:
    """An index output is one draft, always sent to :func:`publish` (nothing settles it before)."""
    (pub,) = publications
    assert pub.result is not None
    return pub.subject, pub.result


def published_draft(obj: DraftManifest, result: PublishResult) -> DraftManifest:
    """The draft :func:`~freshidx.publish.commit.publish` actually validated and wrote (a micro-batch rebased
    onto a compaction serves other segments and counts than the asset's ``obj``), else ``obj``."""
    return result.draft if result.draft is not None else obj


def outcome_metadata(store: ObjectStore, obj: DraftManifest, result: PublishResult, *,
                     skipped: str | None = None, manifest_written: bool = True) -> dict[str, Any]:
    """What the UI shows about one publication attempt (materialization or observation metadata);
    ``outcome`` and ``reason`` first, so they head the metadata table."""
    obj = published_draft(obj, result)
    meta: dict[str, Any] = {
        "outcome": result.outcome,
        "reason": result.reason,
        "version": obj.version,
        "doc_count": dg.MetadataValue.int(obj.doc_count),
        "covered_ids": dg.MetadataValue.int(obj.covered_count),
        "shards": dg.MetadataValue.int(len(obj.shards)),
        "invalid_records": dg.MetadataValue.int(obj.invalid_count),
        "invalid_reasons": dg.MetadataValue.json(obj.invalid_reasons),
        # (ad_id, version) read with different contents: valid records, reported in the quarantine.
        "version_conflicts": dg.MetadataValue.int(obj.conflicting_ads),
        "input_partitions": dg.MetadataValue.int(obj.input_partition_count),
        "input_files": dg.MetadataValue.int(obj.input_file_count),
        "ignored_keys": dg.MetadataValue.int(obj.ignored_count),
        "build_seconds": dg.MetadataValue.float(obj.total_build_seconds),
        "publish_seconds": dg.MetadataValue.float(round(result.seconds, 3)),
        "cas_attempts": dg.MetadataValue.int(result.cas_attempts),
    }
    meta.update(_delta_metadata(obj))
    meta.update(_full_metadata(obj))
    if result.pointer is not None:
        meta["serving_version"] = result.pointer.version
    # The run manifest: what this run owned and why it exists.
    meta["trigger"] = obj.trigger or "manual"
    if obj.run_key:
        meta["trigger_id"] = obj.run_key
    if manifest_written:
        meta["manifest"] = dg.MetadataValue.path(f"{store.uri}/{layout.manifest_key(obj.index, obj.version)}")
    meta["code_version"] = obj.code_version
    if skipped is not None:
        meta["skipped_partitions"] = dg.MetadataValue.int(int(skipped))
    return meta


def step_seconds(obj: DraftManifest, result: PublishResult) -> dict[str, float]:
    """Where a micro-batch's time went, for its ledger entry: the build's steps its manifest has (``parse``,
    ``state``, ``merge``, ``index``, ``upload``) and ``publish`` (known only once the pointer moved)."""
    steps = {k: float(obj.stats[f"{k}_seconds"]) for k in MICRO_BATCH_STEPS if f"{k}_seconds" in obj.stats}
    return {**steps, "publish": round(result.seconds, 3)}


def _delta_metadata(obj: DraftManifest) -> dict[str, Any]:
    """A delta version's own entries: its partition, window and lag, and how its segment was built."""
    meta: dict[str, Any] = {}
    if obj.source_partition:
        meta["source_partition"] = obj.source_partition
        meta["window"] = f"({obj.window_start}, {obj.window_end}]"
        meta["lag_seconds"] = dg.MetadataValue.float(
            round((utcnow() - parse_iso(obj.position)).total_seconds(), 3)
        )
    if obj.segments:  # a segment-built delta: how it was built and what each step cost (plottable)
        meta["build"] = obj.build or ""
        if obj.rebuild_reason:
            meta["rebuild_reason"] = obj.rebuild_reason
        meta["segments"] = dg.MetadataValue.int(len(obj.segments))
        # Partitions this micro-batch read besides its own: bursts folded into it and late arrivals.
        meta["folded_partitions"] = dg.MetadataValue.int(max(0, obj.input_partition_count - 1))
        meta.update({f"step_{k}": dg.MetadataValue.float(round(float(v), 3)) for k, v in obj.stats.items()
                     if k.endswith("_seconds") and k not in ("build_seconds", "total_build_seconds")
                     and isinstance(v, int | float)})
    return meta


def _full_metadata(obj: DraftManifest) -> dict[str, Any]:
    """A full version's own entries: its cutoff and that cutoff's age, and how it was built."""
    meta: dict[str, Any] = {}
    if obj.cutoff:
        meta["cutoff"] = obj.cutoff
        if obj.build:  # a full version: from state (segments over the serving full) or raw
            meta["build"] = obj.build
            if obj.raw_reason:
                meta["raw_reason"] = obj.raw_reason
            meta["segments_used"] = dg.MetadataValue.int(len(obj.segments_used))
        meta["cutoff_age_seconds"] = dg.MetadataValue.float(
            round((utcnow() - parse_iso(obj.cutoff)).total_seconds(), 3)
        )
    return meta


def outcome_tags(obj: DraftManifest, result: PublishResult) -> dict[str, str]:
    """Run tags: the outcome is the first thing the run list and run page show."""
    obj = published_draft(obj, result)
    return {
        TAG_OUTCOME: result.outcome, "freshidx/version": obj.version,
        **({"freshidx/source_partition": obj.source_partition} if obj.source_partition else {}),
        **({"freshidx/cutoff": obj.cutoff} if obj.cutoff else {}),
    }


def record_outcome(store: ObjectStore, obj: DraftManifest, result: PublishResult, run_id: str) -> None:
    """The ledger entries of one publication (create-once; a lost response to our own write counts
    as written, see ``ObjectStore.create_or_same``), then, when this run moved the pointer, the
    decisions of the partitions it settled (:func:`settle_after_publication`)."""
    obj = published_draft(obj, result)
    partition = PartitionId.parse(obj.source_partition) if obj.source_partition else None
    pipeline = obj.index
    if partition is not None:
        trigger = TriggerId(partition.compact)
        if result.outcome == "invalid":  # not final: the partition is retried
            ledger.record_partition(store, pipeline, partition, decision_for(result.outcome), result.reason,
                                    tid=trigger.by_run(Mark.INVALID, run_id), run_id=run_id,
                                    extra={"version": obj.version})
        elif not ledger.record_partition(store, pipeline, partition, decision_for(result.outcome), result.reason,
                                         run_id=run_id, extra={"version": obj.version,
                                                               "seconds": step_seconds(obj, result)}) \
                and result.outcome == "published":
            # A decision was taken before this run published the partition (e.g. the sensor skipped it
            # while this UI run was in flight): the final entry cannot change, so say what happened.
            earlier = ledger.decision(store, pipeline, partition)
            earlier_decision = earlier.decision if earlier is not None else None
            if earlier_decision != Decision.PUBLISHED:
                ledger.record_partition(
                    store, pipeline, partition, Decision.PUBLISHED,
                    f"{result.reason} (after the decision {earlier_decision!r} was recorded)",
                    tid=trigger.by_run(Mark.PUBLISHED, run_id), run_id=run_id, extra={"version": obj.version})
    if obj.cutoff:
        cut = parse_iso(obj.cutoff)
        trigger_id = full_trigger_id(cut, obj.version)
        ledger.record(
            store, layout.ledger_key(pipeline, cut.strftime("%Y-%m-%d"), trigger_id),
            ledger.Entry(pipeline, trigger_id, decision_for(result.outcome), result.reason,
                         scope=f"cutoff {obj.cutoff}", run_id=run_id,
                         extra={"version": obj.version, "outcome": result.outcome}),
        )
    if result.outcome == "published" and result.pointer is not None and result.pointer.version == obj.version:
        try:
            settle_after_publication(store, obj, result.pointer, run_id)
        except Exception as exc:  # the version is published; a later publication settles the rest
            log.warning("%s %s published, but settling the ledger failed: %s", obj.index, obj.version, exc)


def _scan_hours(obj: DraftManifest) -> int:
    # The sensor's default (FRESHIDX_MAX_SCAN_HOURS unset): the window plus one hour.
    window = obj.window_minutes or 300
    return (window + 59) // 60 + 1


def settle_after_publication(store: ObjectStore, obj: DraftManifest, pointer: Pointer, run_id: str) -> list[str]:
    """Partitions the sensor can no longer see get their decision from the run that hid them
    (whatever triggered the run, every visible partition is explained: docs/architecture.md#nothing-visible-is-lost)."""
    source = obj.source or ""
    if not source:
        return []
    if obj.index == "delta" and obj.source_partition:
        published = PartitionId.parse(obj.source_partition)
        window_start = parse_iso(obj.window_start) if obj.window_start else None
        previous: PartitionId | None = None
        if pointer.seq > 1:
            try:
                before = Pointer.history(store, obj.index, pointer.seq - 1)
                previous = PartitionId.parse(before.source_partition) if before.source_partition else None
            except NotFound:
                # No history entry (a crash lost it): settle the window only, never claim a first start.
                previous = PartitionId(window_start) if window_start else published
        return ledger.settle_publication(store, "delta", source, published, previous, window_start,
                                         scan_hours=_scan_hours(obj), version=obj.version, run_id=run_id)
    if obj.index == "full" and obj.cutoff and obj.listed_at:
        delta, _ = read_pointer(store, "delta")
        watermark = PartitionId.parse(delta.source_partition) if delta and delta.source_partition else None
        window = dt.timedelta(minutes=obj.window_minutes or 300)
        cutoff = PartitionId(parse_iso(obj.cutoff))
        return ledger.settle_full(store, source, cutoff=cutoff, delta_watermark=watermark, window=window,
                                  listed_at=parse_iso(obj.listed_at), version=obj.version,
                                  run_id=run_id)
    return []
