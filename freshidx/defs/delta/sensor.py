"""``delta_index_sensor``: latest-only triggering (docs/architecture.md, "Progress policies").

The rule itself is :mod:`freshidx.trigger.latest_only` (tested without Dagster); this module observes runs
from the instance and turns the plan into a ``SensorResult``. Every tick: read the delta pointer
(= watermark), list partitions newer than it (bounded), and request ONE run for the newest. Every
intermediate partition gets a durable ``folded into the micro-batch for P`` record in the ledger and an observation
on ``raw_ad_updates`` that the UI shows. No run is requested while one for the pipeline is queued
or running (overlap policy: wait, then jump to the newest). Attempts are numbered in the ledger so
a failed partition is retried explicitly (run key ``delta:<P>:aN``) instead of being swallowed by
Dagster's run-key deduplication; an attempt whose run a shutdown interrupted (tag
``freshidx/interrupted``) does not count towards parking.
"""


import json

import dagster as dg

from freshidx.defs.delta.assets import delta_index_job
from freshidx.defs.runs.health import end_if_worker_dead, failure_reason
from freshidx.defs.runs.run_status import IN_FLIGHT, UNSUCCESSFUL, in_flight_runs, run_for_key
from freshidx.defs.shared.assets import (
    TAG_ATTEMPT,
    TAG_NOTICED,
    TAG_PARTITION,
    TAG_PIPELINE,
    TAG_SKIPPED,
    TAG_TRIGGER,
)
from freshidx.defs.shared.resources import FreshidxSettings, ObjectStoreResource
from freshidx.publish.commit import utcnow
from freshidx.store import ObjectStore
from freshidx.store.partitions import PartitionError, PartitionId
from freshidx.trigger import ledger, run_health
from freshidx.trigger.latest_only import PIPELINE, DeltaRun, apply, plan_tick

DELTA_KEY = dg.AssetKey("delta_index")


def partition_observation(partitions_def: dg.PartitionsDefinition, p: PartitionId,
                          metadata: dict) -> dg.AssetObservation:
    """A decision about raw partition ``p``, shown on ``raw_ad_updates`` (its hour when in range)."""
    key = p.dagster_hour_key
    try:
        valid = partitions_def.has_partition_key(key)
    except Exception:  # a key outside the definition's range must not fail the tick
        valid = False
    return dg.AssetObservation(
        asset_key="raw_ad_updates", partition=key if valid else None,
        metadata={"partition": p.path, **metadata},
    )


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


class DagsterDeltaRuns:
    """:class:`freshidx.trigger.latest_only.DeltaRunIndex` answered from the Dagster instance (bounded queries).

    For the continuous loop (``loop_job``, docs/architecture.md#continuous-mode): runs of that job are not
    delta runs it waits for (only the active one of them publishes; a standby never plans), and a started
    delta run whose worker is gone is reported failed here at once (with its ledger entry in ``store``), not
    when the run-health sensor ticks, so the loop goes on at its next tick instead of waiting for it.
    """

    def __init__(self, instance: dg.DagsterInstance, *, loop_job: str | None = None,
                 store: ObjectStore | None = None) -> None:
        self.instance = instance
        self.loop_job = loop_job
        self.store = store

    @staticmethod
    def _view(run: dg.DagsterRun) -> DeltaRun:
        return DeltaRun(run.run_id, run.status.value, run.status in IN_FLIGHT, _run_target(run),
                       run_health.is_interrupted(run.tags))

    def _holds_back(self, run: dg.DagsterRun) -> bool:
        if not (run.tags.get(TAG_PIPELINE) == PIPELINE or DELTA_KEY in (run.asset_selection or ())):
            return False
        if self.loop_job is None:
            return True
        return run.job_name != self.loop_job and end_if_worker_dead(self.instance, run, self.store) is None

    def in_flight(self) -> list[DeltaRun]:
        # Any in-flight run that builds delta_index counts, including UI "Materialize" runs.
        return [self._view(r) for r in in_flight_runs(self.instance, 50) if self._holds_back(r)]

    def by_run_key(self, run_key: str) -> DeltaRun | None:
        run = run_for_key(self.instance, run_key)
        return None if run is None else self._view(run)

    def ended_how(self, run_key: str) -> str | None:
        run = run_for_key(self.instance, run_key)
        if run is None or run.status not in UNSUCCESSFUL:
            return None
        return (f"its run {run.run_id[:8]} ({run_key}) ended {run.status.value}: "
                f"{failure_reason(self.instance, run.run_id, 200)}")

    def last_requested(self) -> str | None:
        # The newest sensor run, not the cursor: the daemon saves a tick's cursor only when the tick ends,
        # and a daemon killed after the run was created but before that never saves it.
        runs = self.instance.get_runs(dg.RunsFilter(tags={TAG_PIPELINE: PIPELINE, TAG_TRIGGER: "sensor"}), limit=1)
        return runs[0].tags.get("dagster/run_key") if runs else None


def make_delta_sensor(interval_seconds: int, partitions_def: dg.PartitionsDefinition) -> dg.SensorDefinition:
    # The daemon loop is ~5 s and a tick is due when `now - last >= interval`; asking for one
    # second less keeps a steady cadence instead of alternating 5 s / 10 s gaps.
    minimum = max(1, interval_seconds - 1)

    @dg.sensor(
        name="delta_index_sensor",
        job=delta_index_job,
        minimum_interval_seconds=minimum,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Latest-only trigger of delta_index: processes the newest visible partition, "
        "records every partition in between as folded into it.",
    )
    def delta_index_sensor(
        context: dg.SensorEvaluationContext, store: ObjectStoreResource, freshidx: FreshidxSettings
    ) -> dg.SensorResult | dg.SkipReason:
        # observe → plan (freshidx.trigger.latest_only, no Dagster) → act
        settings = freshidx.settings(store.uri, store.endpoint_url)
        if settings.delta_mode == "continuous":
            # Continuous mode (freshidx.defs.delta.continuous_job): the long-lived run evaluates this same rule.
            return dg.SkipReason("FRESHIDX_DELTA_MODE=continuous: the delta_continuous run (started by "
                                 "delta_continuous_watchdog) triggers the delta; this sensor requests no runs")
        st = store.open()
        runs = DagsterDeltaRuns(context.instance)
        noticed = utcnow()
        plan = plan_tick(st, settings, runs, noticed,
                         json.loads(context.cursor) if context.cursor else {})
        events: list[dg.AssetObservation] = []
        if plan.ignored:
            for i in plan.ignored[:20]:
                context.log.warning(f"ignored malformed partition key {i.key!r}: {i.reason}")
            events.append(dg.AssetObservation(
                asset_key="raw_ad_updates",
                metadata={"ignored_keys": len(plan.ignored),
                          "examples": dg.MetadataValue.json([i.__dict__ for i in plan.ignored[:20]])},
            ))
        applied = apply(st, plan)
        events += [partition_observation(partitions_def, p, meta) for p, meta in applied.observations]
        req = applied.request
        if req is None:
            return dg.SensorResult(skip_reason=applied.skip_reason, asset_events=events,
                                   cursor=json.dumps(plan.cursor))
        return dg.SensorResult(
            run_requests=[dg.RunRequest(
                run_key=req.run_key,
                run_config={"ops": {"delta_index": {"config": {"source_partition": req.partition.path}}}},
                tags={TAG_PIPELINE: PIPELINE, TAG_PARTITION: req.partition.path, TAG_ATTEMPT: str(req.attempt),
                      TAG_TRIGGER: "sensor", TAG_SKIPPED: str(req.skipped),
                      TAG_NOTICED: noticed.isoformat(timespec="milliseconds")},
            )],
            asset_events=events,
            cursor=json.dumps(plan.cursor),
        )

    return delta_index_sensor
