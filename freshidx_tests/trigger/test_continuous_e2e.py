"""Continuous mode through a real ``dagster dev`` (webserver + daemon).

With ``FRESHIDX_DELTA_MODE=continuous`` the watchdog sensor starts one ``delta_continuous`` run by
itself, the delta sensor requests nothing, and the run publishes the newest partition on a warm Spark
Connect session. ``kill -9`` of the run's worker → the watchdog notices the dead worker and starts a
new run within two of its ticks; the new run jumps to the newest partition; the pointer never
regresses and there are never two live continuous runs.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import dagster as dg
import pytest

from freshidx.defs.runs.health import run_facts
from freshidx.defs.runs.run_status import IN_FLIGHT
from freshidx.publish.commit import read_pointer
from freshidx.store import StoreConfig, open_store
from freshidx.tools.devserver import DagsterDev, prepare_home
from freshidx.tools.generate import write_partition
from freshidx.trigger import ledger
from freshidx.trigger.continuous_rules import JOB_NAME, TAG_WHY
from freshidx_tests.support.polling import poll_until
from freshidx_tests.trigger.test_daemon_e2e import (
    GEN,
    REPO,
    SLA_OFF,
    at,
    env_for,
)

INTERVAL = 5  # FRESHIDX_SENSOR_INTERVAL_SECONDS: the watchdog's tick
WATCHDOG = "delta_continuous_watchdog"


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory,
        shared_spark_connect: dict[str, str]) -> Iterator[tuple[DagsterDev, StoreConfig]]:
    root = tmp_path_factory.mktemp("continuous-e2e")
    cfg = StoreConfig(uri=(root / "store").as_uri())
    store = open_store(cfg)
    for m in range(0, 30, 5):  # before start-up: the first run folds 0..20 into 25
        write_partition(store, GEN, at(m))
    home = prepare_home(root / "dagster_home", REPO / "dagster.yaml")
    # SLA sensor off: its full_index build is not under test here
    # One run, no standby: the watchdog's own restart after a kill is under test here (the standby taking
    # over: test_continuous_standby.py).
    env = {**env_for(cfg, shared_spark_connect), **SLA_OFF, "FRESHIDX_DELTA_MODE": "continuous",
           "FRESHIDX_SENSOR_INTERVAL_SECONDS": str(INTERVAL), "FRESHIDX_CONTINUOUS_STANDBY": "false"}
    with DagsterDev(home=home, module="freshidx.definitions", env=env, cwd=REPO) as d:  # started and ready
        yield d, cfg


class Watch:
    """Samples the instance and the pointer while the test waits: never two live continuous runs, and
    the pointer's (seq, partition) never goes back."""

    def __init__(self, instance: dg.DagsterInstance, cfg: StoreConfig) -> None:
        self.instance, self.store = instance, open_store(cfg)
        self.seen: list[tuple[int, str]] = []
        self.max_live = 0

    def sample(self) -> tuple[int, str] | None:
        live = self.instance.get_runs(dg.RunsFilter(job_name=JOB_NAME, statuses=IN_FLIGHT))
        self.max_live = max(self.max_live, len(live))
        ptr, _ = read_pointer(self.store, "delta")
        if ptr is None or ptr.source_partition is None:
            return None
        cur = (ptr.seq, ptr.source_partition)
        if self.seen:
            assert cur >= self.seen[-1], (self.seen[-1], cur)  # seq and partition order together
        self.seen.append(cur)
        return cur

    def at(self, partition: str) -> bool:
        cur = self.sample()
        return cur is not None and cur[1] == partition

    def worker(self, exclude: str | None = None) -> tuple[dg.DagsterRun, int] | None:
        self.sample()
        for r in self.instance.get_runs(dg.RunsFilter(job_name=JOB_NAME, statuses=[dg.DagsterRunStatus.STARTED])):
            pid = run_facts(self.instance, r).pid
            if r.run_id != exclude and pid is not None:
                return r, pid
        return None


@pytest.mark.daemon
@pytest.mark.timeout(900)
def test_watchdog_starts_restarts_after_kill_and_pointer_never_regresses(
        dev: tuple[DagsterDev, StoreConfig]) -> None:
    d, cfg = dev
    store = open_store(cfg)
    instance = dg.DagsterInstance.from_config(str(d.home))
    w = Watch(instance, cfg)
    try:
        run, pid = poll_until(w.worker, timeout=240, interval=0.5, what="a continuous run with a worker pid")
        assert run.tags[TAG_WHY] == "none at start-up"
        poll_until(lambda: w.at(at(25).path), timeout=300, interval=0.5, what="first continuous publication")
        for m in range(0, 25, 5):
            entry = poll_until(lambda m=m: ledger.decision(store, "delta", at(m)), timeout=120, interval=0.1,
                               what=f"the ledger's decision on {m}")  # written right after the swap
            assert entry is not None and entry["decision"] == "folded", (m, entry)
        # Sensor mode is off: no delta_index run was requested by the sensor.
        assert not instance.get_runs(dg.RunsFilter(tags={"dagster/sensor_name": "delta_index_sensor"}))
        # The live run takes a new partition on its next tick (its session is warm).
        t_write = time.monotonic()
        write_partition(store, GEN, at(30))
        poll_until(lambda: w.at(at(30).path), timeout=120, interval=0.25, what="continuous publication of 30")
        print(f"continuous: partition 30 published {time.monotonic() - t_write:.1f}s after it was written "
              "(small window, loaded box: an indication, not the bench)")

        os.kill(pid, signal.SIGKILL)
        killed, killed_at = time.monotonic(), time.time()
        for m in (35, 40):  # arrive while no run is live: the next run jumps to 40
            write_partition(store, GEN, at(m))
        new_run, _ = poll_until(lambda: w.worker(exclude=run.run_id), timeout=120, interval=0.25,
                                what="a new continuous run after kill -9")
        restarted_s = time.monotonic() - killed
        old = instance.get_run_by_id(run.run_id)
        assert old is not None and old.status == dg.DagsterRunStatus.FAILURE
        assert new_run.tags[TAG_WHY] == "previous ended: FAILURE"
        assert new_run.tags["dagster/run_key"] == f"{JOB_NAME}:after:{run.run_id}"
        # Within two watchdog ticks, counted on the sensor's own tick history (not timed: a busy box
        # stretches the seconds, not the ticks): the tick that requested the new run is the first or
        # second one to end after the kill (a tick that started just before it and evaluated after it
        # counts: it could see the dead worker).
        ticks = d.sensor_state(WATCHDOG, tick_limit=100)["ticks"]
        (launching,) = [t for t in ticks if new_run.run_id in (t["runIds"] or [])]
        since_kill = [t for t in ticks if (t["endTimestamp"] or float("inf")) > killed_at
                      and t["timestamp"] <= launching["timestamp"]]
        assert 1 <= len(since_kill) <= 2, [(t["timestamp"] - killed_at, (t["endTimestamp"] or 0) - killed_at,
                                            t["status"], t["runIds"]) for t in ticks[:6]]
        print(f"new continuous run {new_run.run_id[:8]} requested by watchdog tick {len(since_kill)} after kill -9,"
              f" started {restarted_s:.1f}s after it")

        poll_until(lambda: w.at(at(40).path), timeout=240, interval=0.25, what="jump to the newest after restart")
        entry = poll_until(lambda: ledger.decision(store, "delta", at(35)), timeout=120, interval=0.1,
                           what="the ledger's decision on 35")  # written right after the swap
        assert entry is not None and entry["decision"] == "folded", entry

        # UI "Terminate" ends the idle loop promptly; the watchdog starts the next run.
        t0 = time.monotonic()
        d.terminate_runs([new_run.run_id])
        assert d.wait_run(new_run.run_id, timeout=60) == "CANCELED"
        print(f"terminated continuous run ended after {time.monotonic() - t0:.1f}s")
        third, _ = poll_until(lambda: w.worker(exclude=new_run.run_id), timeout=120, interval=0.25,
                              what="a new continuous run after terminate")
        assert third.run_id != run.run_id and third.tags[TAG_WHY].startswith("previous ended: CANCELED")
        assert w.max_live == 1, w.max_live  # never two
    finally:
        instance.dispose()
