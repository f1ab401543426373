"""Continuous mode's hot standby through a real ``dagster dev`` (webserver + daemon) on the shipped instance.

With ``FRESHIDX_CONTINUOUS_STANDBY`` on (the default) the watchdog keeps two live ``delta_continuous`` runs:
the oldest is active and publishes, the other warms up and then waits as the standby (``freshidx/role``).
``kill -9`` of the active run's worker → the standby finds the worker gone, reports the run failed, takes
over, and publishes the next partition itself (by run id); the watchdog starts a new standby behind it.
Never more than two live runs, the pointer never goes back, and only the active run writes the heartbeat.
The seconds from the kill to the next publication are printed, not asserted (``freshidx bench`` measures).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from freshidx.defs.runs.health import run_facts
from freshidx.defs.runs.run_status import IN_FLIGHT
from freshidx.publish.commit import read_pointer
from freshidx.store import StoreConfig, open_store
from freshidx.store.records import Heartbeat
from freshidx.tools.devserver import DagsterDev, prepare_home
from freshidx.tools.generate import write_partition
from freshidx.trigger import ledger
from freshidx.trigger.continuous_rules import JOB_NAME
from freshidx.trigger.continuous_standby import TAG_ROLE
from freshidx_tests.support.polling import poll_until
from freshidx_tests.trigger.test_daemon_e2e import GEN, REPO, SLA_OFF, at, env_for

pytestmark = pytest.mark.slow


@pytest.fixture
def dev(tmp_path: Path, shared_spark_connect: dict[str, str]) -> Iterator[tuple[DagsterDev, StoreConfig]]:
    cfg = StoreConfig(uri=(tmp_path / "store").as_uri())
    store = open_store(cfg)
    for m in range(0, 30, 5):  # before start-up: the first run folds 0..20 into 25
        write_partition(store, GEN, at(m))
    home = prepare_home(tmp_path / "dagster_home", REPO / "dagster.yaml")
    env = {**env_for(cfg, shared_spark_connect), **SLA_OFF, "FRESHIDX_DELTA_MODE": "continuous",
           "FRESHIDX_SENSOR_INTERVAL_SECONDS": "5"}
    assert "FRESHIDX_CONTINUOUS_STANDBY" not in env  # the default is under test
    with DagsterDev(home=home, module="freshidx.definitions", env=env, cwd=REPO) as d:
        yield d, cfg


class Watch:
    """Samples the continuous runs and the pointer while the test waits."""

    def __init__(self, instance: dg.DagsterInstance, cfg: StoreConfig) -> None:
        self.instance, self.store = instance, open_store(cfg)
        self.max_live = 0
        self.seen: list[tuple[int, str]] = []

    def live(self) -> list[dg.DagsterRun]:
        runs = list(self.instance.get_runs(dg.RunsFilter(job_name=JOB_NAME, statuses=IN_FLIGHT)))
        self.max_live = max(self.max_live, len(runs))
        ptr, _ = read_pointer(self.store, "delta")
        if ptr is not None and ptr.source_partition is not None:
            cur = (ptr.seq, ptr.source_partition)
            assert not self.seen or cur >= self.seen[-1], (self.seen[-1], cur)
            self.seen.append(cur)
        return runs

    def pair(self, exclude: frozenset[str] = frozenset()) -> tuple[tuple[dg.DagsterRun, int], dg.DagsterRun] | None:
        """(the active run and its worker pid, the warmed-up standby), once both are there."""
        runs = {r.tags.get(TAG_ROLE): r for r in self.live() if r.run_id not in exclude
                and r.status == dg.DagsterRunStatus.STARTED}
        active, standby = runs.get("active"), runs.get("standby")
        if active is None or standby is None:
            return None
        pid = run_facts(self.instance, active).pid
        return ((active, pid), standby) if pid is not None else None

    def published(self, partition: str) -> bool:
        self.live()
        return bool(self.seen) and self.seen[-1][1] == partition


@pytest.mark.daemon
@pytest.mark.timeout(1200)
def test_standby_takes_over_after_kill_and_a_new_standby_follows(dev: tuple[DagsterDev, StoreConfig]) -> None:
    d, cfg = dev
    store = open_store(cfg)
    instance = dg.DagsterInstance.from_config(str(d.home))
    w = Watch(instance, cfg)
    try:
        (active, pid), standby = poll_until(w.pair, timeout=420, interval=0.5,
                                            what="an active continuous run and a warmed-up standby")
        created = {r.run_id: r for r in (active, standby)}
        assert standby.tags["dagster/run_key"] == f"{JOB_NAME}:after:{active.run_id}"
        poll_until(lambda: w.published(at(25).path), timeout=300, interval=0.5, what="first publication")
        # The ledger records the outcome right after the compare-and-swap: the pointer can be seen first.
        entry = poll_until(lambda: ledger.decision(store, "delta", at(25)), timeout=120, interval=0.1,
                           what="the ledger's decision on 25")
        assert entry is not None and entry.decision == "published" and entry.run_id == active.run_id, entry
        # Written after the publication's tick (not with it): waited for. The standby writes none.
        hb = poll_until(lambda: Heartbeat.latest(store, "delta"), timeout=120, interval=0.5, what="a heartbeat")
        assert hb.run_id == active.run_id

        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        write_partition(store, GEN, at(30))  # arrives after the kill: only the standby can publish it
        poll_until(lambda: w.published(at(30).path), timeout=300, interval=0.1, what="publication of 30 after kill")
        took = time.monotonic() - killed
        entry = poll_until(lambda: ledger.decision(store, "delta", at(30)), timeout=120, interval=0.1,
                           what="the ledger's decision on 30")
        assert entry is not None and entry.decision == "published", entry
        assert entry.run_id == standby.run_id, (entry.run_id, standby.run_id, active.run_id)
        print(f"standby {standby.run_id[:8]} published partition 30 {took:.1f} s after kill -9 of the active "
              f"run's worker (written right after the kill; loaded box: an indication, not the bench)")
        old = instance.get_run_by_id(active.run_id)
        assert old is not None and old.status == dg.DagsterRunStatus.FAILURE
        now_active = instance.get_run_by_id(standby.run_id)
        assert now_active is not None and now_active.tags[TAG_ROLE] == "active"

        (active2, _), standby2 = poll_until(lambda: w.pair(exclude={active.run_id}), timeout=420, interval=0.5,
                                            what="a new warmed-up standby behind the new active run")
        assert active2.run_id == standby.run_id and standby2.run_id not in created
        assert standby2.tags["dagster/run_key"] == f"{JOB_NAME}:after:{standby.run_id}"
        hb = poll_until(lambda: (h := Heartbeat.latest(store, "delta")) is not None and h.run_id == standby.run_id
                        and h, timeout=120, interval=0.5, what="the new active run's heartbeat")
        assert hb.ended is None
        assert w.max_live <= 2, w.max_live  # never more than the active and the standby
    finally:
        instance.dispose()
