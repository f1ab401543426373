"""Overlap policies (serialize / skip / queue) of the delta sensor and of the ads_hourly catch-up sensor.

The in-flight run is a real run record in the instance (as the daemon would have launched it); the
sensor is evaluated for real. No Spark: only the triggering decision is under test here.
"""

from __future__ import annotations

import json
from typing import Any

import dagster as dg
import pytest

from freshidx.catchup import planner as catchup
from freshidx.settings import Settings, SettingsError
from freshidx.store import layout
from freshidx.trigger import ledger
from freshidx_tests.catchup.test_catchup import hour, write_hours
from freshidx_tests.support.harness import Harness, at


def _started_run(h: Harness, tags: dict[str, str], asset: str) -> Any:
    """A run record STARTED, as the daemon leaves it after launching the run."""
    return h.instance.create_run_for_job(job_def=h.defs.resolve_implicit_global_asset_job_def(), tags=tags,
                                         status=dg.DagsterRunStatus.STARTED,
                                         asset_selection=frozenset({dg.AssetKey(asset)}))


def _launch(h: Harness, request: dg.RunRequest) -> Any:
    """Record the requested run as STARTED, as the daemon would after launching it."""
    assert request.run_key is not None  # the sensors key every request
    return _started_run(h, {**request.tags, "dagster/run_key": request.run_key}, "delta_index")


def _partitions(data: Any) -> list[str]:
    return [r.tags["freshidx/source_partition"] for r in data.run_requests or []]


@pytest.mark.parametrize("policy", ["serialize", "skip", "queue"])
def test_delta_overlap_policy(make_harness: Any, policy: str) -> None:
    h = make_harness(delta_overlap=policy)
    h.write(0)
    first = h.tick()
    assert _partitions(first) == [at(0).path]
    # The priority is a tag of the job the sensor launches (freshidx_tests/defs/test_lanes.py).
    assert h.defs.resolve_job_def("delta_index_job").tags["dagster/priority"] == "10"
    _launch(h, first.run_requests[0])
    h.write(5)
    h.write(10)
    second = h.tick()
    if policy == "serialize":
        assert not second.run_requests and "will jump to the newest" in second.skip_message
        assert ledger.decision(h.store, "delta", at(5)) is None  # decided later, when the run ends
    elif policy == "skip":
        assert not second.run_requests and "overlap policy skip" in second.skip_message
        for m in (5, 10):
            entry = ledger.decision(h.store, "delta", at(m))
            assert entry is not None and entry["decision"] == "superseded" and "overlap policy skip" in entry["reason"]
    else:
        assert _partitions(second) == [at(10).path]  # requested now; the run queue serializes execution
        _launch(h, second.run_requests[0])
        third = h.tick()
        assert not third.run_requests and "is started" in third.skip_message.lower()


def test_skipped_partition_is_never_revisited(make_harness: Any) -> None:
    h = make_harness(delta_overlap="skip")
    h.write(0)
    run = _launch(h, h.tick().run_requests[0])
    h.write(5)
    assert not h.tick().run_requests
    h.instance.report_run_failed(h.instance.get_run_by_id(run.run_id))  # the run ends
    again = h.tick()
    assert not again.run_requests and "already decided" in again.skip_message
    h.write(10)
    assert _partitions(h.tick()) == [at(10).path]


def test_bad_overlap_policy_fails_at_load_naming_the_field() -> None:
    with pytest.raises(SettingsError, match=r"FRESHIDX_HOURLY_OVERLAP \(hourly_overlap\)"):
        Settings.from_env({"FRESHIDX_HOURLY_OVERLAP": "parallel"})
    with pytest.raises(SettingsError, match=r"FRESHIDX_READINESS \(readiness\).*sometimes"):
        Settings.from_env({"FRESHIDX_READINESS": "ad_updates=sometimes"})
    s = Settings.from_env({"FRESHIDX_READINESS": "quiet_period,ad_updates=marker"})
    assert (s.readiness_for("ad_updates"), s.readiness_for("signals")) == ("marker", "quiet_period")


# --------------------------------------------------------------------------- catch-up sensor (ads_hourly)


def _hourly_run(h: Harness, tags: dict[str, str]) -> Any:
    return _started_run(h, tags, "ads_hourly")


def _claimed(data: Any) -> list[str]:
    return [sorted(json.loads(r.tags[catchup.TAG_CLAIMS])) for r in data.run_requests or []]


@pytest.mark.parametrize("policy", ["serialize", "skip", "queue"])
def test_hourly_overlap_policy(make_harness: Any, policy: str) -> None:
    h = make_harness(hourly_overlap=policy, hourly_max_hours_per_run=1, hourly_late_checks_per_tick=0)
    write_hours(h, range(0, 3))
    ids = [layout.hour_id(hour(i)) for i in range(3)]
    # A UI backfill run of hour 2 is in flight: only "skip" holds the catch-up lane back for it.
    _hourly_run(h, {"dagster/partition": catchup.dagster_key(hour(2)), "dagster/backfill": "bf-1"})
    first = h.tick("ads_hourly_sensor")
    if policy == "skip":
        assert not first.run_requests and "1 run(s) of ads_hourly in flight (overlap policy skip)" in first.skip_message
        return
    assert _claimed(first) == [[ids[0]]]
    # The catch-up run of hour 0 is in flight: serialize waits for it, queue requests the next hour now.
    req = first.run_requests[0]
    _hourly_run(h, {**req.tags, "dagster/run_key": req.run_key})
    second = h.tick("ads_hourly_sensor")
    if policy == "serialize":
        assert not second.run_requests
        assert "1 catch-up run(s) in flight (overlap policy serialize)" in second.skip_message
    else:
        assert _claimed(second) == [[ids[1]]]  # never hour 2: the backfill holds it
