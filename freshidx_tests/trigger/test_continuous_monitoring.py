"""Continuous mode under Dagster run monitoring, through a real ``dagster dev`` on the shipped instance.

The shipped instance keeps run monitoring on with a ``max_runtime_seconds`` sized for ordinary runs; a
continuous run lives until its planned restart (``FRESHIDX_CONTINUOUS_MAX_RUNTIME``) and carries its own
``dagster/max_runtime`` (planned restart + grace), so monitoring never cancels it. Here the instance's
default is cut to 60 s and polled every 5 s, the planned restart is 120 s, and partitions keep arriving
for five minutes: every continuous run that ends does so by its planned restart (SUCCESS,
``freshidx/ended=max_runtime``), none is FAILED or CANCELED although each outlived the instance's
default, and every partition written is published or folded. The pure derivation and the tag on the job
and the watchdog's request: freshidx_tests/trigger/test_continuous_runtime_tag.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import yaml

from freshidx.defs.runs.run_status import IN_FLIGHT
from freshidx.publish.commit import read_pointer
from freshidx.store import StoreConfig, open_store
from freshidx.tools.devserver import DagsterDev, prepare_home
from freshidx.tools.devserver_graphql_base import DAEMON_HEALTH_QUERY
from freshidx.tools.generate import write_partition
from freshidx.trigger import ledger
from freshidx.trigger.continuous_rules import JOB_NAME, MAX_RUNTIME_TAG, monitoring_max_runtime
from freshidx_tests.support.polling import poll_until
from freshidx_tests.trigger.test_daemon_e2e import GEN, REPO, SLA_OFF, at, env_for

pytestmark = pytest.mark.slow

INSTANCE_MAX_RUNTIME = 60  # run_monitoring.max_runtime_seconds of the test's instance: below every run's life
MONITORING_POLL = 5  # run_monitoring.poll_interval_seconds: monitoring would fire within seconds of the limit
MAX_RUNTIME = 120  # FRESHIDX_CONTINUOUS_MAX_RUNTIME: a planned restart every two minutes
ARRIVAL_EVERY = 25.0  # seconds between two new partitions
ARRIVALS = 12  # × ARRIVAL_EVERY = five minutes of arrivals
ENDED_OK = {"status": "SUCCESS", "freshidx/ended": "max_runtime"}


def monitored_home(root: Path) -> Path:
    """A DAGSTER_HOME with the shipped dagster.yaml, its run monitoring left on and made strict."""
    home = prepare_home(root / "dagster_home", REPO / "dagster.yaml")
    path = home / "dagster.yaml"
    config = yaml.safe_load(path.read_text())
    assert config["run_monitoring"]["enabled"] is True  # the shipped instance monitors runs
    config["run_monitoring"].update(max_runtime_seconds=INSTANCE_MAX_RUNTIME, poll_interval_seconds=MONITORING_POLL)
    path.write_text(yaml.safe_dump(config))
    return home


@pytest.fixture
def dev(tmp_path: Path, shared_spark_connect: dict[str, str]) -> Iterator[tuple[DagsterDev, StoreConfig]]:
    cfg = StoreConfig(uri=(tmp_path / "store").as_uri())
    write_partition(open_store(cfg), GEN, at(0))  # before start-up: the first run publishes it
    # One run, no standby: run monitoring's limit on the run is under test, and "never two live runs" below.
    env = {**env_for(cfg, shared_spark_connect), **SLA_OFF, "FRESHIDX_DELTA_MODE": "continuous",
           "FRESHIDX_SENSOR_INTERVAL_SECONDS": "5", "FRESHIDX_CONTINUOUS_MAX_RUNTIME": str(MAX_RUNTIME),
           "FRESHIDX_CONTINUOUS_STANDBY": "false"}
    with DagsterDev(home=monitored_home(tmp_path), module="freshidx.definitions", env=env, cwd=REPO) as d:
        yield d, cfg


class Watch:
    """Samples the continuous runs while the test waits: every status each run was seen in, and how many
    were live at once."""

    def __init__(self, instance: dg.DagsterInstance, cfg: StoreConfig) -> None:
        self.instance, self.store = instance, open_store(cfg)
        self.statuses: dict[str, set[str]] = {}
        self.max_live = 0

    def sample(self) -> list[dg.DagsterRun]:
        runs = list(self.instance.get_runs(dg.RunsFilter(job_name=JOB_NAME)))
        for r in runs:
            self.statuses.setdefault(r.run_id, set()).add(r.status.value)
        self.max_live = max(self.max_live, sum(r.status in IN_FLIGHT for r in runs))
        return runs

    def planned_restarts(self) -> list[dg.DagsterRun]:
        return [r for r in self.sample() if r.status not in IN_FLIGHT and r.tags.get("freshidx/ended") == "max_runtime"]

    def pointer_at(self, partition: str) -> bool:
        self.sample()
        ptr, _ = read_pointer(self.store, "delta")
        return ptr is not None and ptr.source_partition == partition


def monitoring_daemon(d: DagsterDev) -> dict[str, object] | None:
    statuses = d.graphql(DAEMON_HEALTH_QUERY)["instance"]["daemonHealth"]["allDaemonStatuses"]
    return next((s for s in statuses if s["daemonType"] == "MONITORING" and s["required"] and s["healthy"]), None)


@pytest.mark.daemon
@pytest.mark.timeout(1500)
def test_continuous_runs_end_by_planned_restart_under_run_monitoring(
        dev: tuple[DagsterDev, StoreConfig]) -> None:
    d, cfg = dev
    store = open_store(cfg)
    instance = dg.DagsterInstance.from_config(str(d.home))
    w = Watch(instance, cfg)
    try:
        assert instance.run_monitoring_enabled and instance.run_monitoring_max_runtime_seconds == INSTANCE_MAX_RUNTIME
        poll_until(lambda: monitoring_daemon(d), timeout=120, interval=1, what="the run monitoring daemon, healthy")
        written = [at(0)]
        for i in range(1, ARRIVALS + 1):  # one partition every ARRIVAL_EVERY s, sampling the runs meanwhile
            write_partition(store, GEN, at(i))
            written.append(at(i))
            due = time.monotonic() + ARRIVAL_EVERY
            poll_until(lambda due=due: w.sample() is not None and time.monotonic() >= due,
                       timeout=ARRIVAL_EVERY + 120, interval=1, what="the next arrival")
        poll_until(lambda: w.pointer_at(written[-1].path), timeout=300, interval=1, what="the last partition published")
        ended = poll_until(lambda: len(w.planned_restarts()) >= 2 and w.planned_restarts(), timeout=420, interval=1,
                           what="two continuous runs ended by their planned restart")

        runs = w.sample()
        limit = str(monitoring_max_runtime(MAX_RUNTIME))
        for r in runs:
            assert r.tags.get(MAX_RUNTIME_TAG) == limit, (r.run_id, r.tags)  # the run's own limit ...
            assert float(r.tags[MAX_RUNTIME_TAG]) > MAX_RUNTIME > INSTANCE_MAX_RUNTIME  # ... above its plan
        seen = {run_id: sorted(s) for run_id, s in w.statuses.items()}
        assert not [run_id for run_id, s in seen.items() if {"FAILURE", "CANCELED", "CANCELING"} & set(s)], seen
        finished = [r for r in runs if r.status not in IN_FLIGHT]
        assert finished and all({"status": r.status.value, "freshidx/ended": r.tags.get("freshidx/ended")} == ENDED_OK
                                 for r in finished), [(r.run_id, r.status.value, r.tags) for r in finished]
        # Each outlived the instance's default by far more than a monitoring poll: monitoring would have
        # cancelled it there without its own tag.
        for r in ended:
            record = instance.get_run_record_by_id(r.run_id)
            assert record is not None and record.start_time and record.end_time
            lived = record.end_time - record.start_time
            print(f"continuous run {r.run_id[:8]}: {r.status.value}, ended {r.tags['freshidx/ended']} after "
                  f"{lived:.0f} s, {MAX_RUNTIME_TAG}={r.tags[MAX_RUNTIME_TAG]}")
            assert lived >= MAX_RUNTIME > INSTANCE_MAX_RUNTIME + MONITORING_POLL
        assert w.max_live == 1, w.max_live  # never two
        fates = {p.path: e.decision if (e := ledger.decision(store, "delta", p)) else None for p in written}
        assert set(fates.values()) <= {"published", "folded"}, fates
        print(f"{len(runs)} continuous runs, {len(ended)} planned restarts; partitions: "
              f"{sum(v == 'published' for v in fates.values())} published, "
              f"{sum(v == 'folded' for v in fates.values())} folded")
    finally:
        instance.dispose()
