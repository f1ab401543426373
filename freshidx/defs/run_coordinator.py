"""The instance's run coordinator: Dagster's queue with a direct lane (``freshidx.run_lanes`` decides).

dagster.yaml names it (``run_coordinator: module: freshidx.defs.run_coordinator``); the limits stay in
``concurrency.runs``, which it reads like the queue's daemon does. A run tagged for the direct lane that
the queue would launch at once is launched while it is submitted (for the delta sensor's runs: from the
sensor's tick, without the wait for the daemon's next dequeue); every other run is queued. A direct launch
that fails fails the run, as the daemon's dequeue would (``max_user_code_failure_retries`` is 0 here).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import dagster as dg

from freshidx.defs.runs import QUEUED_OR_RUNNING, RUNNING
from freshidx.run_lanes import Lane, choose_lane, wants_direct

log = logging.getLogger(__name__)


class FreshidxRunCoordinator(dg.QueuedRunCoordinator):
    def submit_run(self, context: dg.SubmitRunContext) -> dg.DagsterRun:
        run = context.dagster_run
        if run.status != dg.DagsterRunStatus.NOT_STARTED or not wants_direct(run.tags):
            return super().submit_run(context)
        lane = self.lane_for(run)
        if not lane.direct:
            log.info("run %s queued: %s", run.run_id, lane.reason)
            return super().submit_run(context)
        self._instance.launch_run(run.run_id, context.workspace)
        launched = self._instance.get_run_by_id(run.run_id)
        if launched is None:  # deleted while it was launched
            raise dg.DagsterInvariantViolationError(f"run {run.run_id} vanished while it was launched")
        return launched

    def lane_for(self, run: dg.DagsterRun) -> Lane:
        """Direct or queued, with the limits and run counts the queue's daemon would use now."""
        instance = self._instance
        queue = instance.get_concurrency_config().run_queue_config
        limits = list(queue.tag_concurrency_limits or []) if queue else []
        cap = queue.max_concurrent_runs if queue else -1

        def count_active(tags: Mapping[str, str]) -> int:
            return instance.get_runs_count(dg.RunsFilter(statuses=QUEUED_OR_RUNNING, tags=dict(tags)))

        def count_running() -> int:
            return instance.get_runs_count(dg.RunsFilter(statuses=RUNNING))

        return choose_lane(run.tags, limits, cap, count_active=count_active, count_running=count_running)
