"""The limits hold for every launch path, on a stock instance (the shipped dagster.yaml).

Through `dagster dev`, as a user does it: an ``ads_hourly`` backfill from the partition dialog (two runs),
a run of ``full_index_job`` as the schedule launches it, then ``full_index`` from the UI's Materialize
button (GraphQL ``launchRun`` of the asset job, without any tag of ours) and two UI materializations of
``delta_index`` beside the delta sensor's own runs. From the runs' start and end events: no two heavy
builds (full index, catch-up, compaction) ever overlap, and never two delta builds; the live jobs carry
their priority, and every run waited in Dagster's own queue.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from freshidx.catchup import planner as catchup
from freshidx.store import StoreConfig, open_store
from freshidx.store.partitions import PartitionId
from freshidx.tools.devserver import RUN_TERMINAL_STATUSES, DagsterDev, prepare_home
from freshidx.tools.generate import GeneratorConfig, write_partition
from freshidx_tests.support.polling import poll_until
from freshidx_tests.trigger.test_daemon_e2e import REPO, SLA_OFF, enqueued, env_for

GEN = GeneratorConfig(seed=11, ads=200, products=40, changes_per_partition=20)
H0 = catchup.floor_hour(dt.datetime.now(dt.UTC)) - dt.timedelta(hours=3)
HEAVY_ASSETS = {dg.AssetKey("full_index"), dg.AssetKey("ads_hourly"), dg.AssetKey("delta_compaction")}
HEAVY_JOBS = {"full_index_job", "ads_hourly_job", "delta_compaction_job"}
DELTA_ASSET = dg.AssetKey("delta_index")
END_EVENTS = (dg.DagsterEventType.RUN_SUCCESS, dg.DagsterEventType.RUN_FAILURE, dg.DagsterEventType.RUN_CANCELED)


@pytest.fixture
def dev(tmp_path: Path, local_store_config: StoreConfig,
        shared_spark_connect: dict[str, str]) -> Iterator[DagsterDev]:
    home = prepare_home(tmp_path / "dagster_home", REPO / "dagster.yaml")
    env = {**env_for(local_store_config, shared_spark_connect), **SLA_OFF, "FRESHIDX_HOURLY_MAX_HOURS_PER_RUN": "1"}
    d = DagsterDev(home=home, module="freshidx.definitions", env=env, cwd=REPO)
    d.start()
    try:
        d.wait_ready(timeout=300)
        yield d
    finally:
        d.stop()


def _interval(instance: dg.DagsterInstance, run_id: str) -> tuple[float, float]:
    """When the run's worker started and when the run ended (its RUN_START and end events)."""
    (start,) = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.RUN_START).records
    ends = [r for t in END_EVENTS for r in instance.get_records_for_run(run_id, of_type=t).records]
    assert len(ends) == 1, f"run {run_id} has {len(ends)} end events"
    return start.timestamp, ends[0].timestamp


def _overlaps(intervals: dict[str, tuple[float, float]]) -> list[tuple[str, str]]:
    ordered = sorted(intervals.items(), key=lambda kv: kv[1][0])
    return [(a, b) for (a, (_, a_end)), (b, (b_start, _)) in itertools.pairwise(ordered)
            if b_start < a_end]


def _builds(run: dg.DagsterRun) -> set[str]:
    """What a run builds: by its assets (UI launches of the asset job) or its job (the triggers' runs)."""
    assets = set(run.asset_selection or ())
    heavy = bool(HEAVY_ASSETS & assets) or run.job_name in HEAVY_JOBS
    delta = DELTA_ASSET in assets or run.job_name == "delta_index_job"
    return {name for name, yes in (("heavy", heavy), ("delta", delta)) if yes}


def _all_ended(instance: dg.DagsterInstance, run_ids: list[str]) -> bool:
    runs = [instance.get_run_by_id(r) for r in run_ids]
    return all(r is not None and r.status.value in RUN_TERMINAL_STATUSES for r in runs)


@pytest.mark.daemon
@pytest.mark.timeout(2400)  # generous: every heavy build waits for the one before it on a loaded box
def test_no_two_heavy_or_delta_builds_overlap_whoever_launches_them(
        dev: DagsterDev, local_store_config: StoreConfig) -> None:
    store = open_store(local_store_config)
    for h in range(3):  # two closed hours to backfill, and the hour after them
        for m in (0, 20, 40):
            write_partition(store, GEN, PartitionId(H0 + dt.timedelta(hours=h, minutes=m)))

    keys = [catchup.dagster_key(H0), catchup.dagster_key(H0 + catchup.HOUR)]
    backfill = dev.launch_partition_backfill("ads_hourly", partition_keys=keys, title="limits e2e")
    scheduled = dev.launch_job("full_index_job", tags={"dagster/schedule_name": "full_index_schedule",
                                                       "freshidx/trigger": "schedule"})
    from_ui = dev.materialize(["full_index"])  # the Materialize button: no tag of ours
    deltas = [dev.materialize(["delta_index"]), dev.materialize(["delta_index"])]

    instance = dg.DagsterInstance.from_config(str(dev.home))
    try:
        def backfill_runs() -> list[str] | None:
            st = dev.backfill_status(backfill)
            ids = [r["runId"] for r in st["runs"]]
            return ids if st["status"] != "REQUESTED" and len(ids) == 2 else None

        backfilled = poll_until(backfill_runs, timeout=1200, interval=1, what="the backfill's two runs")
        launched = [*backfilled, scheduled, from_ui, *deltas]
        poll_until(lambda: _all_ended(instance, launched), timeout=1800, interval=2, what="every run to end")
        # Sensor runs of delta_index_job count as delta builds too.
        every = [r for r in instance.get_runs(dg.RunsFilter(statuses=[
            dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]))]
        failed = {r.run_id: dev.run_errors(r.run_id)[:3] for r in every if r.status != dg.DagsterRunStatus.SUCCESS}
        assert not failed, failed

        heavy = {r.run_id: _interval(instance, r.run_id) for r in every if "heavy" in _builds(r)}
        delta = {r.run_id: _interval(instance, r.run_id) for r in every if "delta" in _builds(r)}
        assert set(launched) - set(deltas) <= set(heavy) and len(heavy) >= 4
        assert set(deltas) <= set(delta)
        assert not _overlaps(heavy), "two heavy builds ran at once"
        assert not _overlaps(delta), "two delta builds ran at once"
        assert all(enqueued(instance, run_id) for run_id in launched)  # Dagster's own queue, every path
        by_id: dict[str, Any] = {r.run_id: r for r in every}
        assert by_id[scheduled].tags["dagster/priority"] == "6" and by_id[scheduled].job_name == "full_index_job"
        assert "freshidx/pipeline" not in by_id[from_ui].tags  # the UI's run: the pool alone held it back
    finally:
        instance.dispose()
