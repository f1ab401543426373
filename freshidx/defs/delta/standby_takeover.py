"""Continuous mode's hot standby, the Dagster side (docs/architecture.md#continuous-mode).

A ``delta_continuous`` run that finds an older live run of the job after its warm-up is the standby: it
tags itself ``freshidx/role=standby`` and, every :data:`~freshidx.trigger.continuous_standby.STANDBY_POLL_SECONDS`,
judges the older runs' workers as the watchdog does (:func:`freshidx.defs.runs.health.end_if_worker_dead`:
a dead one is reported failed) and lists the live runs again. Once no older one remains (its worker died,
it ended its planned restart, it was stopped) it tags itself active, logs why, and its loop ticks at once.
A standby evaluates nothing and writes nothing to the store (no heartbeat, no ledger entry). The decisions
are :mod:`freshidx.trigger.continuous_standby`.
"""

import time
from collections.abc import Callable

import dagster as dg

from freshidx.defs.runs.health import end_if_worker_dead
from freshidx.defs.runs.run_status import IN_FLIGHT, RUNNING
from freshidx.trigger.continuous_rules import JOB_NAME, Stop
from freshidx.trigger.continuous_standby import (
    STANDBY_POLL_SECONDS,
    TAG_ENDED,
    TAG_ROLE,
    LiveRun,
    Role,
    older_than,
    takeover_reason,
)

_MAX_LIVE = 10  # more than the watchdog ever keeps (two), so a UI-launched extra run is still seen


def _records(instance: dg.DagsterInstance) -> list[dg.RunRecord]:
    return list(instance.get_run_records(dg.RunsFilter(job_name=JOB_NAME, statuses=IN_FLIGHT), limit=_MAX_LIVE))


def _live(records: list[dg.RunRecord]) -> list[LiveRun]:
    return [LiveRun(r.dagster_run.run_id, r.create_timestamp.timestamp(), r.dagster_run.status.value,
                    bool(r.dagster_run.tags.get(TAG_ENDED)), r.dagster_run.tags.get(TAG_ROLE)) for r in records]


def live_runs(instance: dg.DagsterInstance) -> list[LiveRun]:
    """The unfinished runs of ``delta_continuous`` with their creation order."""
    return _live(_records(instance))


def set_role(context: dg.OpExecutionContext, role: Role) -> None:
    context.instance.add_run_tags(context.run_id, {TAG_ROLE: role.value})


def _judge_older(instance: dg.DagsterInstance, older: list[LiveRun], why: dict[str, str]) -> None:
    """Report every older run whose worker is gone failed, remembering why."""
    ids = {r.run_id for r in older}
    for rec in _records(instance):
        run = rec.dagster_run
        if run.run_id in ids and run.status in RUNNING and (reason := end_if_worker_dead(instance, run)):
            why[run.run_id] = f"failed: {reason}"


def _how_ended(instance: dg.DagsterInstance, run_id: str) -> str:
    run = instance.get_run_by_id(run_id)
    if run is None:
        return "was deleted"
    ended = run.tags.get(TAG_ENDED)
    return f"ended {run.status.value}" + (f" ({ended})" if ended else "")


def wait_until_active(context: dg.OpExecutionContext, *, stop_check: Callable[[], Stop | None],
                      wait: Callable[[float], None], idle: Callable[[], None]) -> Stop | None:
    """Return once this run is the active one (None), or the stop that ended it while standby.
    ``stop_check`` says whether the run should end (stop request, planned restart), ``wait(s)`` sleeps
    (a SIGTERM cuts it short), ``idle()`` runs on every poll (letting go of a draining server's lease)."""
    instance = context.instance
    older = older_than(context.run_id, live_runs(instance))
    if not older:
        set_role(context, Role.ACTIVE)
        return None
    set_role(context, Role.STANDBY)
    t0 = time.monotonic()
    context.log.info(f"standby: warmed up behind active run {older[0].run_id}; takes over as soon as no older "
                     f"live run remains (checked every {STANDBY_POLL_SECONDS} s)")
    why: dict[str, str] = {}
    while True:
        if (stop := stop_check()) is not None:
            return stop
        _judge_older(instance, older, why)
        remaining = older_than(context.run_id, live_runs(instance))
        if not remaining:
            for r in older:
                why.setdefault(r.run_id, _how_ended(instance, r.run_id))
            set_role(context, Role.ACTIVE)
            context.log.warning(f"standby takes over as the active continuous run after "
                                f"{time.monotonic() - t0:.1f} s as standby: {takeover_reason(older, remaining, why)}")
            return None
        older = remaining
        idle()
        wait(STANDBY_POLL_SECONDS)


__all__ = ["live_runs", "set_role", "wait_until_active"]
