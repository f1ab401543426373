"""The direct lane past the run queue: the pure decision (freshidx.run_lanes) and the coordinator's queued
branch on a real instance configured by the repository's dagster.yaml. The direct launch itself needs a
code server: test_daemon_e2e checks the sensor's runs skip the queue and a UI launch does not."""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

import dagster as dg
import pytest

from freshidx.defs.run_coordinator import FreshidxRunCoordinator
from freshidx.run_lanes import DIRECT, TAG_LAUNCH, choose_lane, limit_checks

REPO = Path(__file__).resolve().parents[1]
DELTA = {"freshidx/pipeline": "delta", TAG_LAUNCH: DIRECT}
LIMITS = [
    {"key": "freshidx/pipeline", "value": "delta", "limit": 1},
    {"key": "freshidx/pipeline", "value": "ads_hourly", "limit": 1},
    {"key": "dagster/backfill", "limit": 1},
]


def lane(tags: Mapping[str, str], active: dict[str, int] | None = None, running: int = 0, cap: int = 4,
         limits: list | None = None) -> tuple[bool, str, list[dict[str, str]]]:
    asked: list[dict[str, str]] = []

    def count_active(t: Mapping[str, str]) -> int:
        asked.append(dict(t))
        return (active or {}).get(",".join(f"{k}={v}" for k, v in t.items()), 0)

    chosen = choose_lane(tags, LIMITS if limits is None else limits, cap, count_active=count_active,
                         count_running=lambda: running)
    return chosen.direct, chosen.reason, asked


def test_a_tagged_run_whose_limits_have_room_goes_direct() -> None:
    direct, _, asked = lane(DELTA)
    assert direct
    assert asked == [{"freshidx/pipeline": "delta"}]  # only the limit it falls under is counted


def test_a_run_of_the_same_lane_queued_or_running_sends_it_to_the_queue() -> None:
    direct, reason, _ = lane(DELTA, active={"freshidx/pipeline=delta": 1})
    assert not direct and "freshidx/pipeline=delta (limit 1)" in reason


def test_the_instance_run_cap_is_respected_unless_unlimited() -> None:
    assert not lane(DELTA, running=4)[0]
    assert lane(DELTA, running=40, cap=-1)[0]


def test_untagged_runs_are_always_queued() -> None:
    direct, reason, asked = lane({"freshidx/pipeline": "delta"})
    assert not direct and "not tagged" in reason and asked == []


def test_a_limit_on_a_tag_key_of_any_value_leaves_the_run_to_the_queue() -> None:
    # The runs under such a limit cannot be counted by an exact tag filter; the queue can count them.
    assert limit_checks({**DELTA, "dagster/backfill": "b1"}, LIMITS) is None
    assert not lane({**DELTA, "dagster/backfill": "b1"})[0]


def test_a_per_value_limit_counts_the_runs_with_the_same_value() -> None:
    limits = [{"key": "team", "value": {"applyLimitPerUniqueValue": True}, "limit": 2}]
    direct, _, asked = lane({**DELTA, "team": "ads"}, limits=limits)
    assert direct and asked == [{"team": "ads"}]
    assert not lane({**DELTA, "team": "ads"}, active={"team=ads": 2}, limits=limits)[0]


@pytest.fixture
def instance(tmp_path: Path) -> Iterator[dg.DagsterInstance]:
    shutil.copy(REPO / "dagster.yaml", tmp_path / "dagster.yaml")
    inst = dg.DagsterInstance.from_config(str(tmp_path))
    try:
        yield inst
    finally:
        inst.dispose()


def _run(instance: dg.DagsterInstance, tags: dict[str, str],
         status: dg.DagsterRunStatus = dg.DagsterRunStatus.NOT_STARTED) -> dg.DagsterRun:
    return instance.create_run_for_job(dg.GraphDefinition(name="noop").to_job(), tags=tags, status=status)


def test_the_repository_dagster_yaml_installs_the_coordinator_with_the_queue_settings(
        instance: dg.DagsterInstance) -> None:
    assert isinstance(instance.run_coordinator, FreshidxRunCoordinator)
    assert instance.run_coordinator.dequeue_interval_seconds == 1
    queue = instance.get_concurrency_config().run_queue_config
    assert queue is not None and queue.max_concurrent_runs == 4
    assert {"key": "freshidx/pipeline", "value": "delta", "limit": 1} in queue.tag_concurrency_limits


def test_the_coordinator_counts_queued_and_running_runs_of_the_lane_not_ended_ones(
        instance: dg.DagsterInstance) -> None:
    coordinator = instance.run_coordinator
    assert isinstance(coordinator, FreshidxRunCoordinator)
    run = _run(instance, DELTA)
    _run(instance, {"freshidx/pipeline": "delta"}, dg.DagsterRunStatus.SUCCESS)
    _run(instance, {"freshidx/pipeline": "ads_hourly"}, dg.DagsterRunStatus.STARTED)
    assert coordinator.lane_for(run).direct  # an ended delta run and another lane's run do not count
    # A run of the lane holding a worker (a queued one counts the same way; making one needs a code
    # location's origin, which the daemon e2e test has).
    other = _run(instance, {"freshidx/pipeline": "delta"}, dg.DagsterRunStatus.STARTED)
    assert "freshidx/pipeline=delta (limit 1)" in coordinator.lane_for(run).reason
    instance.report_run_canceled(other)
    assert coordinator.lane_for(run).direct
    for _ in range(4):  # the instance's cap: four runs hold a worker
        _run(instance, {"freshidx/pipeline": "other"}, dg.DagsterRunStatus.STARTED)
    assert "runs already running" in coordinator.lane_for(run).reason
