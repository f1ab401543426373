"""The IO manager that publishes hourly buckets: one publication (stage → manifest → CAS) per hour.

A catch-up run publishes with create-once semantics (an hour's first version exists exactly once);
corrections and UI backfills compare-and-swap by listing time, so a bucket never goes back to fewer
inputs. Every outcome lands in the ledger next to the claim that caused it.
"""

import dataclasses
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import dagster as dg

from freshidx.catchup import planner
from freshidx.defs.shared.publishing_io_manager import (
    Publication,
    PublishingIOManager,
    PublishPolicy,
    manifest_link,
    running_step,
    serving_pointer,
)
from freshidx.publish.commit import DraftManifest, PublishResult, crash_point, utcnow
from freshidx.store import ObjectStore, layout
from freshidx.trigger.lifecycle import Decision, Mark, TriggerId, decision_for


@dataclass
class HourBucket:
    """What the ``ads_hourly`` body produced for one hour (``draft`` is None when it could not build)."""

    hour_id: str
    kind: str  # catchup | correction | backfill | manual
    claim: str | None  # ledger suffix of the claim this run executes ("a1", "c2.a1"), if any
    draft: DraftManifest | None
    problems: list[str] = field(default_factory=list)

    @property
    def hour(self) -> dt.datetime:
        return planner.parse_hour_id(self.hour_id)

    @property
    def trigger(self) -> TriggerId:
        return TriggerId(self.hour_id)

    @property
    def claim_id(self) -> TriggerId | None:
        return TriggerId.from_suffix(self.hour_id, self.claim) if self.claim else None


HourPublication = Publication[HourBucket]


def _per_partition_metadata(per_hour: dict[str, dict[str, Any]]) -> bool:
    """Attach each hour's metadata to that hour's materialization of the running step.

    ``add_output_metadata`` would put one dict on every partition of a multi-hour run; the step's
    ``AssetExecutionContext`` (still current while its output is handled) scopes it per partition.
    """
    ctx = running_step()
    if ctx is None:
        return False
    for hid, values in per_hour.items():
        ctx.add_asset_metadata(values, partition_key=planner.dagster_key(planner.parse_hour_id(hid)))
    return True


def _hour_metadata(store: ObjectStore, pub: HourPublication, run_id: str) -> dict[str, Any]:
    """What one hour's own materialization shows."""
    hb = pub.subject
    meta: dict[str, Any] = {"hour": hb.hour_id, "kind": hb.kind, "claim": hb.claim or "none",
                            "run": dg.MetadataValue.dagster_run(run_id),
                            "outcome": pub.outcome, "reason": pub.reason}
    if pub.result is None or hb.draft is None:  # settled before publishing
        return meta
    meta.update(
        version=hb.draft.version,
        rows=dg.MetadataValue.int(hb.draft.doc_count),
        invalid_records=dg.MetadataValue.int(hb.draft.invalid_count),
        inputs=dg.MetadataValue.int(hb.draft.input_file_count),
        publish_seconds=dg.MetadataValue.float(round(pub.result.seconds, 3)),
        build_seconds=dg.MetadataValue.float(round(hb.draft.build_seconds, 3)),
        manifest=manifest_link(store, hb.draft),
    )
    if pub.outcome == "published":
        meta["lag_seconds"] = dg.MetadataValue.float(round((utcnow() - (hb.hour + planner.HOUR)).total_seconds(), 3))
    return meta


class BucketIOManager(PublishingIOManager):
    """Publishes each hour's staged bucket and records the outcome; fails the run if an hour failed."""

    #: Not config fields: fixed by the code, and a field would pre-fill the launchpad.
    asset: ClassVar[str] = planner.ASSET
    #: An hour with no valid record is a valid, empty bucket; catch-up hours are created once.
    policy: ClassVar[PublishPolicy] = PublishPolicy(allow_empty=True)

    def publications(self, obj: list[HourBucket]) -> list[HourPublication]:
        return [Publication(hb, hb.draft, dataclasses.replace(self.policy, only_if_absent=hb.kind == "catchup"))
                for hb in obj]

    def settled_before_publish(self, store: ObjectStore, pub: HourPublication, run_id: str) -> bool:
        hb, hour = pub.subject, pub.subject.hour
        if hb.draft is None or hb.problems:
            why = "; ".join(hb.problems) or "no bucket built"
            pub.settle("not_ready", why)
            planner.record(store, self.asset, hour, hb.trigger.by_run(Mark.REFUSED, run_id), Decision.REFUSED, why,
                           run_id=run_id, extra={"kind": hb.kind, "claim": hb.claim})
            return True
        claim = hb.claim_id
        if claim and store.exists(planner.entry_key(self.asset, hour, claim.then(Mark.EXPIRED))):
            reason = f"claim {hb.claim} expired (the sensor handed the hour to another attempt)"
            pub.settle("expired", reason)
            planner.record(store, self.asset, hour, claim.then(Mark.DONE), Decision.REFUSED, reason, run_id=run_id)
            return True
        return False

    def before_publish(self, pub: HourPublication) -> None:
        crash_point("bucket_before_publish")  # tests: the run dies here like a kill -9, buckets staged

    def record(self, store: ObjectStore, pub: HourPublication, result: PublishResult, run_id: str) -> None:
        hb, draft = pub.subject, pub.draft
        assert draft is not None
        hour, trigger, claim = hb.hour, hb.trigger, hb.claim_id
        extra = {"version": draft.version, "kind": hb.kind, "doc_count": draft.doc_count,
                 "inputs": draft.input_file_count}
        published = result.outcome == "published"
        if result.outcome == "invalid":
            planner.record(store, self.asset, hour, trigger.by_run(Mark.INVALID, run_id),
                           decision_for(result.outcome), result.reason, run_id=run_id, extra=extra)
        elif hb.kind == "catchup" and published:
            planner.record(store, self.asset, hour, trigger, Decision.PROCESSED,
                           f"version {draft.version} published (claim {hb.claim})", run_id=run_id,
                           attempt=claim.attempt if claim else None, extra=extra)
        elif hb.kind == "catchup":
            # A catch-up run carries its claim; a hand-tagged one without it gets ``H.done``.
            planner.record(store, self.asset, hour, (claim or trigger).then(Mark.DONE),
                           decision_for(result.outcome), result.reason, run_id=run_id, extra=extra)
        elif hb.kind == "correction" and claim:
            planner.record(store, self.asset, hour, claim.then(Mark.DONE),
                           Decision.CORRECTED if published else decision_for(result.outcome),
                           f"correction version {draft.version}: {result.reason}", run_id=run_id, extra=extra)
        else:
            planner.record(store, self.asset, hour, trigger.by_run(hb.kind, run_id),
                           Decision.REBUILT if published else decision_for(result.outcome),
                           f"{hb.kind} run: {result.reason}", run_id=run_id, extra=extra)

    def metadata(self, store: ObjectStore, publications: Sequence[HourPublication]) -> dict[str, Any]:
        """The run's totals (a one-hour run: that hour's materialization)."""
        attempted = [(p, p.draft, p.result) for p in publications if p.draft is not None and p.result is not None]
        versions = {p.subject.hour_id: d.version for p, d, _ in attempted if p.outcome == "published"}
        meta: dict[str, Any] = {
            "hours": dg.MetadataValue.int(len(publications)),
            "published": dg.MetadataValue.int(sum(1 for p in publications if p.outcome == "published")),
            "rows": dg.MetadataValue.int(sum(d.doc_count for _, d, _ in attempted)),
            "invalid_records": dg.MetadataValue.int(sum(d.invalid_count for _, d, _ in attempted)),
            "outcomes": dg.MetadataValue.json({p.subject.hour_id: p.outcome for p in publications}),
            "versions": dg.MetadataValue.json(versions),
            "kind": publications[0].subject.kind if publications else "none",
            # hours built in one Spark pass share its time: keep the largest, not a sum
            "build_seconds": dg.MetadataValue.float(round(max(
                (d.build_seconds for _, d, _ in attempted), default=0.0), 3)),
            "publish_seconds": dg.MetadataValue.float(round(sum((r.seconds for _, _, r in attempted), 0.0), 3)),
        }
        if versions:  # how long after its hour closed the newest bucket became visible
            newest_end = max(planner.parse_hour_id(h) for h in versions) + planner.HOUR
            meta["lag_seconds"] = dg.MetadataValue.float(round((utcnow() - newest_end).total_seconds(), 3))
        if len(publications) == 1 and publications[0].draft is not None:
            meta["manifest"] = manifest_link(store, publications[0].draft)
        return meta

    def report(self, context: dg.OutputContext, store: ObjectStore, publications: Sequence[HourPublication]) -> None:
        meta = self.metadata(store, publications)
        if len(publications) <= 1:
            context.add_output_metadata(meta)
            return
        per_hour = {p.subject.hour_id: _hour_metadata(store, p, context.run_id) for p in publications}
        if _per_partition_metadata(per_hour):
            # Every hour's materialization gets its own values; the totals say they are the run's.
            context.add_output_metadata({f"run_{k}": v for k, v in meta.items()})
        else:
            # Not inside a run step (a bare OutputContext): only the run's totals can be recorded.
            context.add_output_metadata(meta)

    def describe_failure(self, failed: Sequence[HourPublication]) -> tuple[str, dict[str, Any]]:
        problems = [f"{p.subject.hour_id}: {p.reason}" for p in failed]
        return (f"{len(problems)} hour(s) not published: " + " | ".join(problems),
                {"failed": dg.MetadataValue.json(problems)})

    def load_input(self, context: dg.InputContext) -> list[dict[str, Any]]:
        """Downstream assets get the *published* bucket pointers of the requested hours."""
        store = self.store.open()
        return [serving_pointer(store, layout.bucket_name(self.asset, planner.hour_from_dagster_key(key)),
                                f"{self.asset} {key} has not been published").to_dict()
                for key in context.asset_partition_keys]
