"""Continuous mode's watchdog (docs/architecture.md#continuous-mode): ``delta_continuous_watchdog`` keeps the
live ``delta_continuous`` runs the mode wants: the active one and, with ``FRESHIDX_CONTINUOUS_STANDBY`` (the
default), a warmed-up standby that takes over the moment the active run's worker dies or the run ends. It
starts a run whenever fewer are queued, starting or started (none at start-up, one ended its planned
restart, crashed or was killed), never more: one successor per run by a deterministic run key
(:func:`freshidx.trigger.continuous_standby.watchdog_decision`). A run whose worker died is reported failed
first (:func:`freshidx.defs.runs.health.end_if_worker_dead`), so a ``kill -9`` is noticed in one tick.
"""
# No `from __future__ import annotations`: Dagster inspects the sensor's annotations.

import dagster as dg

from freshidx.defs.delta.continuous_job import make_delta_continuous
from freshidx.defs.delta.standby_takeover import live_runs
from freshidx.defs.runs.health import end_if_worker_dead
from freshidx.defs.runs.run_status import RUNNING
from freshidx.defs.shared.resources import FreshidxSettings
from freshidx.settings import Settings
from freshidx.trigger import continuous_rules
from freshidx.trigger.continuous_rules import JOB_NAME, TAG_MODE, TAG_WHY
from freshidx.trigger.continuous_standby import TAG_ENDED, Newest, Request, watchdog_decision


def _newest(instance: dg.DagsterInstance) -> Newest | None:
    previous = list(instance.get_runs(dg.RunsFilter(job_name=JOB_NAME), limit=1))
    if not previous:
        return None
    prev = instance.get_run_by_id(previous[0].run_id) or previous[0]
    return Newest(prev.run_id, prev.status.value, prev.tags.get(TAG_ENDED))


def make_continuous_watchdog(settings: Settings) -> dg.SensorDefinition:
    continuous_mode = settings.delta_mode == "continuous"
    runtime_tags = continuous_rules.max_runtime_tags(settings.continuous_max_runtime)

    @dg.sensor(
        name="delta_continuous_watchdog",
        job=make_delta_continuous(settings),
        minimum_interval_seconds=max(1, settings.sensor_interval_seconds - 1),
        default_status=dg.DefaultSensorStatus.RUNNING if continuous_mode else dg.DefaultSensorStatus.STOPPED,
        description="Continuous mode's watchdog: keeps a delta_continuous run live (and a warmed-up standby, "
        "FRESHIDX_CONTINUOUS_STANDBY), starting one when fewer are queued or running; never more.",
    )
    def delta_continuous_watchdog(context: dg.SensorEvaluationContext,
                                  freshidx: FreshidxSettings) -> dg.RunRequest | dg.SkipReason:
        if freshidx.delta_mode != "continuous":
            return dg.SkipReason(f"FRESHIDX_DELTA_MODE={freshidx.delta_mode}: delta_index_sensor triggers the "
                                 "delta; no continuous run is started")
        instance = context.instance
        for run in instance.get_runs(dg.RunsFilter(job_name=JOB_NAME, statuses=RUNNING), limit=5):
            why = end_if_worker_dead(instance, run)
            if why:
                context.log.warning(f"continuous run {run.run_id}: {why}")
        decision = watchdog_decision(live_runs(instance), _newest(instance), freshidx.continuous_standby)
        if not isinstance(decision, Request):
            return dg.SkipReason(decision)
        context.log.info(f"starting a continuous run ({decision.role.value}): {decision.why}")
        # The job's run monitoring limit again: a request's tags are the run's, whatever the job says. No role
        # tag yet: the run tags its role itself once warmed up (a standby without it is still warming up).
        return dg.RunRequest(run_key=decision.run_key,
                             tags={TAG_WHY: decision.why, TAG_MODE: "continuous", **runtime_tags})

    return delta_continuous_watchdog


__all__ = ["make_continuous_watchdog"]
