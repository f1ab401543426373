"""Run-status vocabulary shared by the sensors and run health (public Dagster APIs only).

One definition of what "in flight" and "ended" mean, so the delta sensor, the catch-up sensor, the
SLA sensor and the run-health reaper agree on which runs block a trigger and which are settled. The
grace after which an accepted trigger without a run counts as lost is part of the trigger lifecycle
(:data:`freshidx.trigger.lifecycle.LOST_REQUEST_GRACE`): the Dagster-free planners need it too.
"""

from collections.abc import Mapping

import dagster as dg

#: Runs whose worker exists or should (the reaper probes these for a dead worker).
RUNNING = [dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]
#: Runs that hold a place under a run-queue tag limit: waiting in the queue or holding a worker.
QUEUED_OR_RUNNING = [dg.DagsterRunStatus.QUEUED, *RUNNING]
#: Runs that are not finished: they hold a trigger (no second run for it) and count for overlap policies.
IN_FLIGHT = [dg.DagsterRunStatus.NOT_STARTED, *QUEUED_OR_RUNNING]
#: Runs that reached a final status.
ENDED = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]
#: A run ended without success (its attempt failed, unless a shutdown interrupted it).
UNSUCCESSFUL = (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)


def in_flight_runs(instance: dg.DagsterInstance, limit: int,
                   tags: Mapping[str, str] | None = None) -> list[dg.DagsterRun]:
    """Unfinished runs, newest first (bounded), optionally only those carrying ``tags``."""
    return list(instance.get_runs(dg.RunsFilter(statuses=IN_FLIGHT, tags=tags), limit=limit))


def run_for_key(instance: dg.DagsterInstance, run_key: str) -> dg.DagsterRun | None:
    """The run a sensor's run key created, if any (run keys are unique per sensor)."""
    runs = instance.get_runs(dg.RunsFilter(tags={"dagster/run_key": run_key}), limit=1)
    return runs[0] if runs else None
