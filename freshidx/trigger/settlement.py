"""The ledger entries of an index publication attempt, and what a publication settles.

Whatever ran the attempt (an asset run's IO manager, the continuous loop's micro-batch), its ledger entries
follow the same rules: a delta draft writes its partition's decision (an ``invalid`` one is not final: the
partition is retried), a full draft its cutoff's entry; when the attempt moved the pointer, the partitions the
sensor can no longer see get their decision from it (:func:`settle_after_publication`,
docs/architecture.md#nothing-visible-is-lost). The caller is :mod:`freshidx.delta.after_build`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from freshidx.publish.commit import DraftManifest, Pointer, PublishResult, parse_iso, read_pointer
from freshidx.settings import PipelineSettings
from freshidx.store import NotFound, ObjectStore, layout
from freshidx.store.partitions import PartitionId
from freshidx.trigger import ledger
from freshidx.trigger.lifecycle import Decision, Mark, TriggerId, decision_for, full_trigger_id

log = logging.getLogger(__name__)


def published_draft(obj: DraftManifest, result: PublishResult) -> DraftManifest:
    """The draft :func:`~freshidx.publish.commit.publish` actually validated and wrote (a micro-batch rebased
    onto a compaction serves other segments and counts than the one built), else ``obj``."""
    return result.draft if result.draft is not None else obj


def draft_settings(obj: DraftManifest) -> PipelineSettings:
    """The settings settling reads, as the draft was built with them: its window (the default when its
    manifest does not say) and the sensor's automatic listing depth (``FRESHIDX_MAX_SCAN_HOURS`` unset)."""
    if obj.window_minutes:
        return PipelineSettings.model_construct(window_minutes=obj.window_minutes)
    return PipelineSettings.model_construct()


def record_publication(store: ObjectStore, obj: DraftManifest, result: PublishResult, run_id: str, *,
                       seconds: Mapping[str, float]) -> None:
    """The ledger entries of one publication attempt (create-once; a lost response to our own write counts
    as written, see ``ObjectStore.create_or_same``), then, when this run moved the pointer, the decisions of
    the partitions it settled. ``obj`` is the draft as built (the entries name what was published,
    :func:`published_draft`); ``seconds`` is where a micro-batch's time went, for its partition's entry."""
    obj = published_draft(obj, result)
    if obj.source_partition:
        _record_partition(store, obj, result, run_id, PartitionId.parse(obj.source_partition), seconds)
    if obj.cutoff:
        cut = parse_iso(obj.cutoff)
        trigger_id = full_trigger_id(cut, obj.version)
        ledger.record(
            store, layout.ledger_key(obj.index, cut.strftime("%Y-%m-%d"), trigger_id),
            ledger.Entry(obj.index, trigger_id, decision_for(result.outcome), result.reason,
                         scope=f"cutoff {obj.cutoff}", run_id=run_id,
                         extra={"version": obj.version, "outcome": result.outcome}),
        )
    if result.outcome == "published" and result.pointer is not None and result.pointer.version == obj.version:
        try:
            settle_after_publication(store, obj, result.pointer, run_id)
        except Exception as exc:  # the version is published; a later publication settles the rest
            log.warning("%s %s published, but settling the ledger failed: %s", obj.index, obj.version, exc)


def _record_partition(store: ObjectStore, obj: DraftManifest, result: PublishResult, run_id: str,
                      partition: PartitionId, seconds: Mapping[str, float]) -> None:
    """A delta draft's partition decision."""
    pipeline, trigger = obj.index, TriggerId(partition.compact)
    if result.outcome == "invalid":  # not final: the partition is retried
        ledger.record_partition(store, pipeline, partition, decision_for(result.outcome), result.reason,
                                tid=trigger.by_run(Mark.INVALID, run_id), run_id=run_id,
                                extra={"version": obj.version})
    elif not ledger.record_partition(store, pipeline, partition, decision_for(result.outcome), result.reason,
                                     run_id=run_id, extra={"version": obj.version, "seconds": dict(seconds)}) \
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


def settle_after_publication(store: ObjectStore, obj: DraftManifest, pointer: Pointer, run_id: str) -> list[str]:
    """Partitions the sensor can no longer see get their decision from the run that hid them
    (whatever triggered the run, every visible partition is explained: docs/architecture.md#nothing-visible-is-lost)."""
    source = obj.source or ""
    if not source:
        return []
    settings = draft_settings(obj)
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
                                         scan_hours=settings.scan_hours, version=obj.version, run_id=run_id)
    if obj.index == "full" and obj.cutoff and obj.listed_at:
        delta, _ = read_pointer(store, "delta")
        watermark = PartitionId.parse(delta.source_partition) if delta and delta.source_partition else None
        cutoff = PartitionId(parse_iso(obj.cutoff))
        return ledger.settle_full(store, source, cutoff=cutoff, delta_watermark=watermark, window=settings.window,
                                  listed_at=parse_iso(obj.listed_at), version=obj.version, run_id=run_id)
    return []
