"""The IO manager that publishes the delta and full indexes: one draft, one publication per run.

The asset body stages shards (from executors) and yields a :class:`DraftManifest` only when it is newer
than what serves; this manager hands it to the Dagster-free step after a build
(:func:`freshidx.delta.after_build.after_build`: gate → manifest → compare-and-swap of ``CURRENT`` → ledger
and settlement, the continuous loop's micro-batch takes the same step) and translates its result into
Dagster: the metadata (:func:`outcome_metadata`), the run tags (:func:`outcome_tags`) and a failed run
when the draft was invalid.
"""


from collections.abc import Sequence
from typing import Any

import dagster as dg

from freshidx.defs.shared.publishing_io_manager import (
    Publication,
    PublishingIOManager,
    running_step,
    serving_pointer,
)
from freshidx.delta.after_build import after_build
from freshidx.publish.commit import DraftManifest, PublishResult, parse_iso, read_manifest, utcnow
from freshidx.store import ObjectStore, layout
from freshidx.trigger.settlement import published_draft

TAG_OUTCOME = "freshidx/outcome"
TAG_SKIPPED = "freshidx/skipped_count"


class IndexIOManager(PublishingIOManager):
    """Stages are already written; this publishes them atomically and records the outcome."""

    def publications(self, obj: DraftManifest) -> list[Publication[DraftManifest]]:
        if not isinstance(obj, DraftManifest):
            raise dg.Failure(f"index assets must return a DraftManifest, got {type(obj).__name__}")
        # No policy here: the gate's is the step after the build's (force and the drop guard come with
        # the draft's run record; a micro-batch whose base a compaction replaced is moved onto it).
        return [Publication(obj, obj)]

    def publish_one(self, store: ObjectStore, pub: Publication[DraftManifest], run_id: str) -> None:
        # The asset body yielded the draft only because it was newer (its early compare); the step after
        # the build publishes, records and settles it, as the continuous loop's micro-batch does.
        done = after_build(store, pub.subject, run_id, compared=True, before_publish=lambda: self.before_publish(pub))
        pub.outcome, pub.reason, pub.result = done.result.outcome, done.result.reason, done.result

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


def _single(publications: Sequence[Publication[DraftManifest]]) -> tuple[DraftManifest, PublishResult]:
    """An index output is one draft, always sent to :func:`publish` (nothing settles it before)."""
    (pub,) = publications
    assert pub.result is not None
    return pub.subject, pub.result


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
