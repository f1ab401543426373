"""Through a real ``dagster dev``: the run worker of a delta run is killed with ``kill -9``.

The run is marked FAILURE within a minute (by the code server's orphan check while it lives, or by
``freshidx_run_health_sensor`` from the recorded worker pid — either way, never left STARTED), and
the delta sensor then jumps to the newest partition, with the killed run named in the ledger entry
of the partition it gave up on.

One ``dagster dev`` is shared by the tests of this module, in file order: the last one kills it
(with its run worker) and starts a second one on the same instance and store.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator

import dagster as dg
import pytest

from freshidx.defs.runs.health import failure_reason, run_facts
from freshidx.store import StoreConfig, open_store
from freshidx.tools.devserver import DagsterDev, prepare_home
from freshidx.tools.generate import write_partition
from freshidx.trigger import ledger
from freshidx_tests.support.polling import poll_until
from freshidx_tests.trigger.test_daemon_e2e import (
    GEN,
    REPO,
    SLA_OFF,
    SLA_SENSOR,
    assert_stopped_before_start,
    at,
    env_for,
    pointer_at,
)


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory,
        shared_spark_connect: dict[str, str]) -> Iterator[tuple[DagsterDev, StoreConfig]]:
    root = tmp_path_factory.mktemp("run-health-e2e")
    cfg = StoreConfig(uri=(root / "store").as_uri())
    home = prepare_home(root / "dagster_home", REPO / "dagster.yaml")
    # SLA sensor off: its full_index build is not under test here
    d = DagsterDev(home=home, module="freshidx.definitions", env={**env_for(cfg, shared_spark_connect), **SLA_OFF},
                   cwd=REPO)
    d.start()
    try:
        d.wait_ready(timeout=240)
        assert_stopped_before_start(d, SLA_SENSOR)
        yield d, cfg
    finally:
        d.stop()  # idempotent: the last test has killed it already


@pytest.mark.daemon
def test_killed_run_worker_is_failed_fast_and_the_sensor_jumps_to_the_newest(
        dev: tuple[DagsterDev, StoreConfig]) -> None:
    d, cfg = dev
    assert d.graphql("{ shouldShowNux }")["shouldShowNux"] is False  # dagster.yaml nux: enabled: false
    store = open_store(cfg)
    instance = dg.DagsterInstance.from_config(str(d.home))
    try:
        for m in range(0, 30, 5):
            write_partition(store, GEN, at(m))

        def worker() -> tuple[dg.DagsterRun, int] | None:
            runs = instance.get_runs(dg.RunsFilter(tags={"freshidx/pipeline": "delta"}, statuses=[
                dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]))
            for r in runs:
                pid = run_facts(instance, r).pid
                if pid is not None:
                    return r, pid
            return None

        run, pid = poll_until(worker, timeout=240, interval=0.2, what="a delta run with a worker pid")
        assert run.tags["freshidx/source_partition"] == at(25).path
        write_partition(store, GEN, at(30))  # visible before the kill: the sensor must jump, not retry
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()

        def ended() -> dg.DagsterRun | None:
            r = instance.get_run_by_id(run.run_id)
            return r if r is not None and r.is_finished else None

        final = poll_until(ended, timeout=120, interval=0.5, what="the killed run to be marked finished")
        detected_s = time.monotonic() - killed_at
        reason = failure_reason(instance, run.run_id)
        print(f"killed run {run.run_id[:8]} marked {final.status.value} after {detected_s:.1f}s: {reason}")
        assert final.status == dg.DagsterRunStatus.FAILURE
        # Dagster's orphan check (code server alive) or freshidx run health (pid recorded) said why.
        assert f"pid {pid}" in reason or "terminated by signal 9" in reason, reason

        # The sensor jumps to the newest partition and says why it gave up on the killed one.
        poll_until(lambda: pointer_at(cfg) == at(30).path, timeout=300, interval=1, what="jump to the newest")
        entry = poll_until(lambda: ledger.decision(store, "delta", at(25)), timeout=120, interval=0.1,
                           what="the ledger's decision on 25")  # written right after the swap
        assert entry is not None and entry["decision"] == "folded", entry
        assert entry["reason"].startswith(f"folded into the micro-batch for {at(30).path}"), entry
        assert f"its run {run.run_id[:8]}" in entry["reason"], entry
        assert "ended FAILURE" in entry["reason"], entry
    finally:
        instance.dispose()


@pytest.mark.daemon
def test_run_left_started_by_a_killed_dagster_dev_is_failed_by_run_health_after_restart(
        dev: tuple[DagsterDev, StoreConfig], shared_spark_connect: dict[str, str]) -> None:
    """Nothing reports a run whose code server died with it; the next dagster dev's
    freshidx_run_health_sensor finds its recorded worker pid gone, fails it, and the delta moves on."""
    first, cfg = dev  # the module's dagster dev (the test above left the delta serving at(30), if it ran)
    store = open_store(cfg)
    home = first.home
    gave_up, newest = at(35), at(40)  # newer than anything the test above wrote
    write_partition(store, GEN, gave_up)
    second = DagsterDev(home=home, module="freshidx.definitions",
                        env={**env_for(cfg, shared_spark_connect), **SLA_OFF}, cwd=REPO)
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        def worker() -> tuple[dg.DagsterRun, int] | None:
            for r in instance.get_runs(dg.RunsFilter(
                    tags={"freshidx/pipeline": "delta", "freshidx/source_partition": gave_up.path},
                    statuses=[dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED])):
                pid = run_facts(instance, r).pid
                if pid is not None:
                    return r, pid
            return None

        run, pid = poll_until(worker, timeout=240, interval=0.2, what="a delta run with a worker pid")
        write_partition(store, GEN, newest)
        # dagster dev, its daemon, code server and the run worker die at once, like a crash.
        assert first.pid is not None
        os.killpg(first.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        first.stop()
        left = instance.get_run_by_id(run.run_id)
        assert left is not None and not left.is_finished  # nobody reported it

        second.start()
        second.wait_ready(timeout=240)
        t0 = time.monotonic()

        def ended() -> dg.DagsterRun | None:
            r = instance.get_run_by_id(run.run_id)
            return r if r is not None and r.is_finished else None

        final = poll_until(ended, timeout=120, interval=0.5, what="run health to fail the orphaned run")
        detected_s = time.monotonic() - t0
        reason = failure_reason(instance, run.run_id)
        print(f"orphaned run {run.run_id[:8]} marked {final.status.value} {detected_s:.1f}s after ready: {reason}")
        assert final.status == dg.DagsterRunStatus.FAILURE and f"run worker (pid {pid}) is gone" in reason
        lost = ledger.partition_entries(store, "delta", gave_up)["a1.lost"]
        assert lost["run_id"] == run.run_id

        poll_until(lambda: pointer_at(cfg) == newest.path, timeout=300, interval=1, what="jump to the newest")
        entry = ledger.decision(store, "delta", gave_up)
        assert entry is not None and entry["decision"] == "folded", entry
        assert f"its run {run.run_id[:8]}" in entry["reason"] and f"pid {pid}" in entry["reason"], entry
    finally:
        second.stop()
        first.stop()
        instance.dispose()
