"""``delta_index_sensor``: latest-only triggering (DESIGN §7, seed 000).

Every tick: read the delta pointer (= watermark), list partitions newer than it (bounded), and
request ONE run for the newest. Every intermediate partition gets a durable ``superseded by P``
record in the ledger and an observation on ``raw_ad_updates`` that the UI shows. No run is
requested while one for the pipeline is queued or running (overlap policy: wait, then jump to
the newest). Attempts are numbered in the ledger so a failed partition is retried explicitly
(run key ``delta:<P>:aN``) instead of being swallowed by Dagster's run-key deduplication; an
attempt whose run a shutdown interrupted (tag ``freshidx/interrupted``) does not count towards parking.
"""


import datetime as dt
import hashlib
import json

import dagster as dg
from dagster import DagsterRunStatus, RunsFilter

from freshidx import ledger, run_health
from freshidx.defs.assets import (
    TAG_ATTEMPT,
    TAG_PARTITION,
    TAG_PIPELINE,
    TAG_SKIPPED,
    TAG_TRIGGER,
    delta_index,
)
from freshidx.defs.resources import FreshidxSettings, ObjectStoreResource
from freshidx.defs.run_health import failure_reason
from freshidx.listing import partitions_after
from freshidx.partitions import PartitionError, PartitionId
from freshidx.publish import parse_iso, read_pointer, utcnow

PIPELINE = "delta"
IN_FLIGHT = [
    DagsterRunStatus.NOT_STARTED, DagsterRunStatus.QUEUED, DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING,
]
LOST_REQUEST_GRACE = dt.timedelta(seconds=60)
DELTA_KEY = dg.AssetKey("delta_index")


def _observation(partitions_def: dg.PartitionsDefinition, p: PartitionId, metadata: dict) -> dg.AssetObservation:
    key = p.dagster_hour_key
    try:
        valid = partitions_def.has_partition_key(key)
    except Exception:  # a key outside the definition's range must not fail the tick
        valid = False
    return dg.AssetObservation(
        asset_key="raw_ad_updates", partition=key if valid else None,
        metadata={"partition": p.path, **metadata},
    )


def _ended_run(instance: dg.DagsterInstance, run_key: str | None) -> tuple[str, str] | None:
    """``(partition compact id, how its run ended)`` for the last requested run key, if it failed or
    was canceled (e.g. its worker was killed); None otherwise. Two small reads, only when skipping."""
    if not run_key or not run_key.startswith(f"{PIPELINE}:"):
        return None
    runs = instance.get_runs(RunsFilter(tags={"dagster/run_key": run_key}), limit=1)
    if not runs or runs[0].status not in (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED):
        return None
    run = runs[0]
    how = f"its run {run.run_id[:8]} ({run_key}) ended {run.status.value}: {failure_reason(instance, run.run_id, 200)}"
    return run_key.split(":")[1], how


def _run_target(run: dg.DagsterRun) -> str | None:
    """The partition path an in-flight delta run builds: its tag (sensor runs), else a minute chosen in
    its launchpad config; None when it will pick the newest visible partition when it starts."""
    if run.tags.get(TAG_PARTITION):
        return run.tags[TAG_PARTITION]
    config = (((run.run_config or {}).get("ops") or {}).get("delta_index") or {}).get("config") or {}
    value = config.get("source_partition")
    if not value:
        return None
    try:
        selected = ledger.parse_partition(str(value))
    except PartitionError:
        return None  # the run refuses it; nothing of ours to protect
    return None if selected.hour else selected.path


def make_delta_sensor(interval_seconds: int, partitions_def: dg.PartitionsDefinition) -> dg.SensorDefinition:
    # The daemon loop is ~5 s and a tick is due when `now - last >= interval`; asking for one
    # second less keeps a steady cadence instead of alternating 5 s / 10 s gaps.
    minimum = max(1, interval_seconds - 1)

    @dg.sensor(
        name="delta_index_sensor",
        target=[delta_index],
        minimum_interval_seconds=minimum,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Latest-only trigger of delta_index: processes the newest visible partition, "
        "records every skipped one as superseded.",
    )
    def delta_index_sensor(
        context: dg.SensorEvaluationContext, store: ObjectStoreResource, freshidx: FreshidxSettings
    ) -> dg.SensorResult | dg.SkipReason:
        settings = freshidx.settings(store.uri, store.endpoint_url)
        st = store.open()
        pointer, _ = read_pointer(st, PIPELINE)
        watermark = PartitionId.parse(pointer.source_partition) if pointer and pointer.source_partition else None
        found = partitions_after(st, settings.source, watermark, max_scan_hours=settings.scan_hours)
        cursor = json.loads(context.cursor) if context.cursor else {}
        events: list[dg.AssetObservation] = []

        if found.ignored:
            digest = hashlib.sha1("\n".join(sorted(i.key for i in found.ignored)).encode()).hexdigest()
            if cursor.get("ignored") != digest:  # report a changed set once, not every 5 s
                cursor["ignored"] = digest
                for i in found.ignored[:20]:
                    context.log.warning(f"ignored malformed partition key {i.key!r}: {i.reason}")
                events.append(dg.AssetObservation(
                    asset_key="raw_ad_updates",
                    metadata={"ignored_keys": len(found.ignored),
                              "examples": dg.MetadataValue.json([i.__dict__ for i in found.ignored[:20]])},
                ))

        newest = found.newest
        if newest is None:
            return dg.SensorResult(
                skip_reason=f"no partition newer than {watermark.path if watermark else '(none)'}",
                asset_events=events, cursor=json.dumps(cursor),
            )

        # Any in-flight run that builds delta_index counts, including UI "Materialize" runs.
        in_flight = [
            r for r in context.instance.get_runs(RunsFilter(statuses=IN_FLIGHT), limit=50)
            if r.tags.get(TAG_PIPELINE) == PIPELINE or DELTA_KEY in (r.asset_selection or ())
        ]
        # Overlap policy: serialize (wait, then jump to the newest), skip (drop triggers that arrive
        # while a run is in flight, with a durable reason), queue (request now; dagster.yaml's
        # freshidx/pipeline=delta limit runs them one at a time).
        targets = {_run_target(r) for r in in_flight}
        if in_flight and settings.delta_overlap != "queue":
            r = in_flight[0]
            busy_with = _run_target(r)
            unknown = None in targets  # a UI/CLI run that picks the newest partition itself when it starts
            if settings.delta_overlap == "skip" and busy_with != newest.path and not unknown:
                for p in found.partitions:
                    if p.path not in targets and ledger.record_partition(
                        st, PIPELINE, p, ledger.SUPERSEDED,
                        f"skipped: run {r.run_id[:8]} for {busy_with} was in flight (overlap policy skip)",
                        run_id=r.run_id,
                    ):
                        events.append(_observation(partitions_def, p, {"decision": "skipped_overlap"}))
            what = ("will jump to the newest when it ends" if settings.delta_overlap != "skip"
                    else "skipped (overlap policy skip)" if not unknown
                    else "not skipped yet: that run builds the newest partition it sees; decided when it ends")
            return dg.SensorResult(
                skip_reason=f"run {r.run_id[:8]} for {busy_with or 'the newest partition'} is {r.status.value}; "
                f"newest visible is {newest.path}, {what}",
                asset_events=events, cursor=json.dumps(cursor),
            )

        # Durable reasons for everything we skip on purpose (create-once: recorded exactly once). Under
        # overlap "queue" a partition whose run is still in flight is not ours to decide: its run
        # publishes it, or the publication that passes it records why not (ledger.settle_publication).
        skipped = [p for p in found.partitions[:-1] if p.path not in targets]
        why = f"superseded by {newest.path}" if watermark else \
            f"superseded by {newest.path} (no watermark: first start or reset, jumped to the newest)"
        # The partition our last run was for, if that run ended without publishing: say how it ended.
        ended = _ended_run(context.instance, cursor.get("last_requested")) if skipped else None
        for p in skipped:
            if ledger.record_partition(
                st, PIPELINE, p, ledger.SUPERSEDED,
                f"{why}; {ended[1]}" if ended and ended[0] == p.compact else why,
                extra={"superseded_by": newest.path},
            ):
                events.append(_observation(partitions_def, p, {"decision": "superseded",
                                                               "superseded_by": newest.path}))
        if found.unlisted_before is not None:
            ledger.record_gap(st, PIPELINE, found.unlisted_before, watermark,
                              (f"more than {settings.scan_hours} h behind the newest partition {newest.path}"
                               if watermark else "no watermark (first start or reset)")
                              + "; older partitions were not listed (the full rebuild covers them)")

        # Which attempt is this? Explicit attempt numbers make retries visible and idempotent.
        entries = ledger.partition_entries(st, PIPELINE, newest)
        if "" in entries:  # a final decision (e.g. skipped under overlap policy skip) is never revisited
            return dg.SensorResult(
                skip_reason=f"{newest.path} already decided: {entries['']['decision']} ({entries['']['reason']}); "
                "waiting for a newer partition",
                asset_events=events, cursor=json.dumps(cursor),
            )
        previous = sorted((e for k, e in entries.items() if k[:1] == "a" and k[1:].isdigit()),
                          key=lambda e: int(e.get("attempt") or 0))
        allowed = settings.max_attempts + sum(1 for k in entries if k.startswith("grant-"))
        failed = 0  # attempts that count towards parking: not those a shutdown interrupted
        for i, e in enumerate(previous):
            runs = context.instance.get_runs(RunsFilter(tags={"dagster/run_key": e["run_key"]}), limit=1)
            last_one = i == len(previous) - 1
            if last_one and runs and runs[0].status in IN_FLIGHT:  # overlap policy queue: never twice
                return dg.SensorResult(
                    skip_reason=f"attempt {e['attempt']} for {newest.path} is {runs[0].status.value}",
                    asset_events=events, cursor=json.dumps(cursor),
                )
            if last_one and not runs and utcnow() - parse_iso(e["at"]) < LOST_REQUEST_GRACE:
                return dg.SensorResult(
                    skip_reason=f"attempt {e['attempt']} for {newest.path} requested, waiting for its run",
                    asset_events=events, cursor=json.dumps(cursor),
                )
            if not (runs and run_health.is_interrupted(runs[0].tags)):
                failed += 1
        attempt = len(previous) + 1
        if failed >= allowed:
            if ledger.record(st, ledger.partition_key(PIPELINE, newest, f".parked-{attempt - 1}"), ledger.Entry(
                PIPELINE, f"{newest.compact}.parked-{attempt - 1}", ledger.PARKED,
                f"{failed} attempts failed; waiting for a newer partition or `freshidx ledger retry`",
                partition=newest.path,
            )):
                events.append(_observation(partitions_def, newest, {"decision": "parked"}))
            return dg.SensorResult(
                skip_reason=f"{newest.path} parked after {failed} failed attempts",
                asset_events=events, cursor=json.dumps(cursor),
            )

        run_key = f"delta:{newest.compact}:a{attempt}"
        if not ledger.record(
            st, ledger.partition_key(PIPELINE, newest, f".a{attempt}"),
            ledger.Entry(PIPELINE, f"{newest.compact}.a{attempt}", ledger.ACCEPTED,
                         f"newest visible partition (skipped {len(skipped)})", partition=newest.path,
                         run_key=run_key, attempt=attempt, extra={"skipped": [p.path for p in skipped]}),
        ):
            return dg.SensorResult(skip_reason=f"{run_key} already accepted by another evaluation",
                                   asset_events=events, cursor=json.dumps(cursor))
        events.append(_observation(partitions_def, newest, {"decision": "accepted", "attempt": attempt,
                                                            "skipped": len(skipped)}))
        cursor["last_requested"] = run_key
        return dg.SensorResult(
            run_requests=[dg.RunRequest(
                run_key=run_key,
                run_config={"ops": {"delta_index": {"config": {"source_partition": newest.path}}}},
                tags={TAG_PIPELINE: PIPELINE, TAG_PARTITION: newest.path, TAG_ATTEMPT: str(attempt),
                      TAG_TRIGGER: "sensor", TAG_SKIPPED: str(len(skipped)),
                      "dagster/priority": "10"},  # freshness first: dequeued before catch-up and backfills
            )],
            asset_events=events,
            cursor=json.dumps(cursor),
        )

    return delta_index_sensor
