"""Continuous mode's watchdog (docs/architecture.md#continuous-mode): ``delta_continuous_watchdog`` starts a
``delta_continuous`` run whenever none is queued, starting or started (none at start-up, the previous one
ended its planned restart, crashed or was killed), never two: one successor per run by a deterministic run key.
A run whose worker died is reported failed first (:mod:`freshidx.trigger.run_health`), so a ``kill -9`` is
noticed in one tick.
"""
# No `from __future__ import annotations`: Dagster inspects the sensor's annotations.

import dagster as dg

from freshidx.defs.delta.continuous_job import make_delta_continuous
from freshidx.defs.runs.health import run_facts
from freshidx.defs.runs.run_status import IN_FLIGHT, RUNNING
from freshidx.defs.shared.resources import FreshidxSettings
from freshidx.settings import Settings
from freshidx.trigger import continuous_rules, run_health
from freshidx.trigger.continuous_rules import JOB_NAME, TAG_MODE, TAG_WHY


def _dead_worker(instance: dg.DagsterInstance, run: dg.DagsterRun) -> str | None:
    """Why ``run``'s worker is gone (reported failed here), else None."""
    if run.status not in RUNNING:
        return None
    verdicts = run_health.judge([run_facts(instance, run)], run_health.pid_alive)
    if not verdicts:
        return None
    fresh = instance.get_run_by_id(run.run_id)  # a worker writes its outcome before it exits
    if fresh is None or fresh.status not in RUNNING:
        return None
    instance.report_run_failed(fresh, message=verdicts[0].reason)
    return verdicts[0].reason


def make_continuous_watchdog(settings: Settings) -> dg.SensorDefinition:
    continuous_mode = settings.delta_mode == "continuous"
    runtime_tags = continuous_rules.max_runtime_tags(settings.continuous_max_runtime)

    @dg.sensor(
        name="delta_continuous_watchdog",
        job=make_delta_continuous(settings),
        minimum_interval_seconds=max(1, settings.sensor_interval_seconds - 1),
        default_status=dg.DefaultSensorStatus.RUNNING if continuous_mode else dg.DefaultSensorStatus.STOPPED,
        description="Continuous mode's watchdog: starts a delta_continuous run when none is queued or running "
        "(none at start-up, the previous one ended, crashed or was killed); never two.",
    )
    def delta_continuous_watchdog(context: dg.SensorEvaluationContext,
                                  freshidx: FreshidxSettings) -> dg.RunRequest | dg.SkipReason:
        if freshidx.delta_mode != "continuous":
            return dg.SkipReason(f"FRESHIDX_DELTA_MODE={freshidx.delta_mode}: delta_index_sensor triggers the "
                                 "delta; no continuous run is started")
        instance = context.instance
        in_flight = list(instance.get_runs(dg.RunsFilter(job_name=JOB_NAME, statuses=IN_FLIGHT), limit=5))
        dead: list[str] = []
        for run in in_flight:
            why = _dead_worker(instance, run)
            if why:
                context.log.warning(f"continuous run {run.run_id}: {why}")
                dead.append(run.run_id)
        live = [r for r in in_flight if r.run_id not in dead]
        if live:
            r = live[0]
            return dg.SkipReason(f"continuous run {r.run_id[:8]} is {r.status.value}")
        previous = list(instance.get_runs(dg.RunsFilter(job_name=JOB_NAME), limit=1))
        if not previous:
            why, key = "none at start-up", f"{JOB_NAME}:first"
        else:
            prev = instance.get_run_by_id(previous[0].run_id) or previous[0]
            ended = prev.tags.get("freshidx/ended")
            why = f"previous ended: {prev.status.value}" + (f" ({ended})" if ended else "")
            key = f"{JOB_NAME}:after:{prev.run_id}"  # one successor per run: never two
        context.log.info(f"starting a continuous run: {why}")
        # The job's run monitoring limit again: a request's tags are the run's, whatever the job says.
        return dg.RunRequest(run_key=key, tags={TAG_WHY: why, TAG_MODE: "continuous", **runtime_tags})

    return delta_continuous_watchdog


__all__ = ["make_continuous_watchdog"]
