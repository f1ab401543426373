"""The IO manager that publishes hourly buckets: one publication (stage → manifest → CAS) per hour.

A catch-up run publishes with create-once semantics (an hour's first version exists exactly once);
corrections and UI backfills compare-and-swap by listing time, so a bucket never goes back to fewer
inputs. Every outcome lands in the ledger next to the claim that caused it.
"""

from dataclasses import dataclass, field
from typing import Any, ClassVar

import dagster as dg

from freshidx import catchup, layout
from freshidx.defs.resources import ObjectStoreResource
from freshidx.lifecycle import Decision, Mark, TriggerId, decision_for
from freshidx.publish import DraftManifest, _crash_point, publish, utcnow


@dataclass
class HourBucket:
    """What the ``ads_hourly`` body produced for one hour (``draft`` is None when it could not build)."""

    hour_id: str
    kind: str  # catchup | correction | backfill | manual
    claim: str | None  # ledger suffix of the claim this run executes ("a1", "c2.a1"), if any
    draft: DraftManifest | None
    problems: list[str] = field(default_factory=list)


def _per_partition_metadata(per_hour: dict[str, dict[str, Any]]) -> bool:
    """Attach each hour's metadata to that hour's materialization of the running step.

    ``add_output_metadata`` would put one dict on every partition of a multi-hour run; the step's
    ``AssetExecutionContext`` (still current while its output is handled) scopes it per partition.
    """
    try:
        ctx = dg.AssetExecutionContext.get()
    except Exception:  # no step is executing (IO manager driven by hand)
        return False
    for hid, values in per_hour.items():
        ctx.add_asset_metadata(values, partition_key=catchup.dagster_key(catchup.parse_hour_id(hid)))
    return True


class BucketIOManager(dg.ConfigurableIOManager):
    """Publishes each hour's staged bucket and records the outcome; fails the run if an hour failed."""

    store: dg.ResourceDependency[ObjectStoreResource]
    #: Not a config field: fixed by the code, and a field would pre-fill the launchpad.
    asset: ClassVar[str] = catchup.ASSET

    def handle_output(self, context: dg.OutputContext, obj: list[HourBucket]) -> None:
        store = self.store.open()
        run_id = context.run_id
        outcomes: dict[str, str] = {}
        failed: list[str] = []
        versions: dict[str, str] = {}
        rows = invalid = 0
        publish_seconds = build_seconds = 0.0
        per_hour: dict[str, dict[str, Any]] = {}  # what each hour's own materialization shows
        for hb in obj:
            hour = catchup.parse_hour_id(hb.hour_id)
            trigger = TriggerId(hb.hour_id)
            claim = TriggerId.from_suffix(hb.hour_id, hb.claim) if hb.claim else None
            per_hour[hb.hour_id] = {"hour": hb.hour_id, "kind": hb.kind, "claim": hb.claim or "none",
                                    "run": dg.MetadataValue.dagster_run(run_id)}
            if hb.draft is None or hb.problems:
                why = "; ".join(hb.problems) or "no bucket built"
                per_hour[hb.hour_id].update(outcome="not_ready", reason=why)
                catchup.record(store, self.asset, hour, trigger.by_run(Mark.REFUSED, run_id), Decision.REFUSED, why,
                               run_id=run_id, extra={"kind": hb.kind, "claim": hb.claim})
                outcomes[hb.hour_id] = "not_ready"
                failed.append(f"{hb.hour_id}: {why}")
                continue
            if claim and store.exists(catchup.entry_key(self.asset, hour, claim.then(Mark.EXPIRED))):
                reason = f"claim {hb.claim} expired (the sensor handed the hour to another attempt)"
                catchup.record(store, self.asset, hour, claim.then(Mark.DONE), Decision.REFUSED, reason, run_id=run_id)
                outcomes[hb.hour_id] = "expired"
                per_hour[hb.hour_id].update(outcome="expired", reason=reason)
                continue
            _crash_point("bucket_before_publish")  # tests: the run dies here like a kill -9, buckets staged
            result = publish(store, hb.draft, allow_empty=True, only_if_absent=hb.kind == "catchup")
            outcomes[hb.hour_id] = result.outcome
            publish_seconds += result.seconds
            # hours built in one Spark pass share its time: keep the largest, not a sum
            build_seconds = max(build_seconds, float(hb.draft.stats.get("build_seconds") or 0.0))
            rows += hb.draft.doc_count
            invalid += int(hb.draft.invalid.get("count", 0))
            extra = {"version": hb.draft.version, "kind": hb.kind, "doc_count": hb.draft.doc_count,
                     "inputs": len(hb.draft.inputs.get("files", []))}
            per_hour[hb.hour_id].update(
                outcome=result.outcome, reason=result.reason, version=hb.draft.version,
                rows=dg.MetadataValue.int(hb.draft.doc_count),
                invalid_records=dg.MetadataValue.int(int(hb.draft.invalid.get("count", 0))),
                inputs=dg.MetadataValue.int(len(hb.draft.inputs.get("files", []))),
                publish_seconds=dg.MetadataValue.float(round(result.seconds, 3)),
                build_seconds=dg.MetadataValue.float(round(float(hb.draft.stats.get("build_seconds") or 0.0), 3)),
                manifest=dg.MetadataValue.path(f"{store.uri}/{layout.manifest_key(hb.draft.index, hb.draft.version)}"),
            )
            if result.outcome == "published":
                per_hour[hb.hour_id]["lag_seconds"] = dg.MetadataValue.float(
                    round((utcnow() - (hour + catchup.HOUR)).total_seconds(), 3))
            if result.outcome == "invalid":
                failed.append(f"{hb.hour_id}: {result.reason}")
                catchup.record(store, self.asset, hour, trigger.by_run(Mark.INVALID, run_id),
                               decision_for(result.outcome), result.reason, run_id=run_id, extra=extra)
                continue
            if result.outcome == "published":
                versions[hb.hour_id] = hb.draft.version
            if hb.kind == "catchup":
                if result.outcome == "published":
                    catchup.record(store, self.asset, hour, trigger, Decision.PROCESSED,
                                   f"version {hb.draft.version} published (claim {hb.claim})", run_id=run_id,
                                   attempt=claim.attempt if claim else None, extra=extra)
                else:
                    # A catch-up run carries its claim; a hand-tagged one without it gets ``H.done``.
                    catchup.record(store, self.asset, hour, (claim or trigger).then(Mark.DONE),
                                   decision_for(result.outcome), result.reason,
                                   run_id=run_id, extra=extra)
            elif hb.kind == "correction" and claim:
                catchup.record(store, self.asset, hour, claim.then(Mark.DONE),
                               Decision.CORRECTED if result.outcome == "published" else decision_for(result.outcome),
                               f"correction version {hb.draft.version}: {result.reason}", run_id=run_id,
                               extra=extra)
            else:
                catchup.record(store, self.asset, hour, trigger.by_run(hb.kind, run_id),
                               Decision.REBUILT if result.outcome == "published" else decision_for(result.outcome),
                               f"{hb.kind} run: {result.reason}", run_id=run_id, extra=extra)
        meta: dict[str, Any] = {
            "hours": dg.MetadataValue.int(len(obj)),
            "published": dg.MetadataValue.int(sum(1 for o in outcomes.values() if o == "published")),
            "rows": dg.MetadataValue.int(rows),
            "invalid_records": dg.MetadataValue.int(invalid),
            "outcomes": dg.MetadataValue.json(outcomes),
            "versions": dg.MetadataValue.json(versions),
            "kind": obj[0].kind if obj else "none",
            "build_seconds": dg.MetadataValue.float(round(build_seconds, 3)),
            "publish_seconds": dg.MetadataValue.float(round(publish_seconds, 3)),
        }
        if versions:  # how long after its hour closed the newest bucket became visible
            newest_end = max(catchup.parse_hour_id(h) for h in versions) + catchup.HOUR
            meta["lag_seconds"] = dg.MetadataValue.float(round((utcnow() - newest_end).total_seconds(), 3))
        if len(obj) == 1 and obj[0].draft is not None:
            meta["manifest"] = dg.MetadataValue.path(
                f"{store.uri}/{layout.manifest_key(obj[0].draft.index, obj[0].draft.version)}")
        if len(obj) > 1 and not _per_partition_metadata(per_hour):
            # Not inside a run step (a bare OutputContext): only the run's totals can be recorded.
            context.add_output_metadata(meta)
        elif len(obj) > 1:
            # Every hour's materialization gets its own values (above); the totals say they are the run's.
            context.add_output_metadata({f"run_{k}": v for k, v in meta.items()})
        else:
            context.add_output_metadata(meta)
        if failed:
            raise dg.Failure(description=f"{len(failed)} hour(s) not published: " + " | ".join(failed),
                             metadata={"failed": dg.MetadataValue.json(failed)}, allow_retries=False)

    def load_input(self, context: dg.InputContext) -> list[dict[str, Any]]:
        """Downstream assets get the *published* bucket pointers of the requested hours."""
        from freshidx.publish import read_pointer

        store = self.store.open()
        out = []
        for key in context.asset_partition_keys:
            hour = catchup.hour_from_dagster_key(key)
            pointer, _ = read_pointer(store, layout.bucket_name(self.asset, hour))
            if pointer is None:
                raise dg.Failure(f"{self.asset} {key} has not been published")
            out.append(pointer.to_dict())
        return out
