"""Where a run waits: the pools its builds take and the priority of the jobs that launch them.

Both live on the definitions, not in the Dagster instance, so every launch path obeys them: a sensor's
run, a schedule's, the SLA remediation, a UI "Materialize", a backfill.

* **Pools** (``pool=`` on the assets; the instance gives each pool its limit, ``concurrency.pools`` in
  dagster.yaml, ``default_limit: 1`` in the shipped one): one delta build at a time, and one heavy
  Spark build (catch-up, full rebuild, compaction) at a time beside it. On a small machine two heavy
  builds on one Spark server starve each other and the delta.
* **Priorities** (``dagster/priority`` on the asset jobs): the queue dequeues the delta before the
  SLA's and the schedule's full rebuilds, those before catch-up, catch-up before compaction, and all of
  them before UI backfills (priority 0).
"""

from __future__ import annotations

#: One delta build at a time (``delta_index``, whoever launches it).
POOL_DELTA = "freshidx_delta"
#: One heavy Spark build at a time beside the delta.
POOL_HEAVY = "freshidx_heavy"

#: The limits freshidx's tooling sets in the instances it starts (``dagster instance concurrency set``).
#: Dagster creates a pool's limit from ``default_limit`` only when its queue first sees a run of that pool,
#: and does not enforce it in that same pass: runs queued together before it could start together.
POOL_LIMITS = {POOL_DELTA: 1, POOL_HEAVY: 1}

PRIORITY_DELTA = 10
PRIORITY_FULL = 6
PRIORITY_CATCHUP = 5
PRIORITY_COMPACTION = 3


def priority_tag(priority: int) -> dict[str, str]:
    """The run tag Dagster's run queue orders by (higher first)."""
    return {"dagster/priority": str(priority)}
