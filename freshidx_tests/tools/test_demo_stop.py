"""``freshidx demo`` stopped with SIGTERM while its first runs are in flight.

Shows (a) no process of its tree survives (dagster dev, daemon, code server, run workers, the
generator, the Spark supervisor and its JVM — checked against a snapshot of the tree taken just
before the signal, and by the demo id every child carries), (b) no run is left unfinished, the runs
that were in flight are tagged ``freshidx/interrupted``, and (c) nothing is parked.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import dagster as dg
import pytest

from freshidx import procs
from freshidx.catchup import planner as catchup
from freshidx.defs.runs.health import NOT_FINISHED, RUNNING
from freshidx.store import StoreConfig, open_store
from freshidx.tools.devserver import free_port
from freshidx.trigger import run_health
from freshidx_tests.support.polling import poll_until

FRESHIDX = Path(sys.executable).with_name("freshidx")


def _tree(root: int) -> dict[int, float]:
    """pid -> start time of ``root`` and all its live descendants."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out: dict[int, float] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        started = procs.process_start_time(pid)
        if started is not None:
            out[pid] = started
        todo += children.get(pid, [])
    return out


def _survivors(snapshot: dict[int, float]) -> list[str]:
    left = []
    for pid, started in snapshot.items():
        if procs.process_start_time(pid) == started:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
            except OSError:
                continue
            left.append(f"{pid}: {cmd}")
    return left


@pytest.mark.daemon
def test_sigterm_leaves_no_process_no_started_run_and_nothing_parked(tmp_path: Path) -> None:
    demo_id = uuid.uuid4().hex
    home = tmp_path / "demo"
    store_cfg = StoreConfig(uri=(tmp_path / "store").as_uri())
    out_path = tmp_path / "demo.out"
    env = {**os.environ, "FRESHIDX_DEMO_ID": demo_id, "PYSPARK_PYTHON": sys.executable,
           "FRESHIDX_CLOSE_GRACE_SECONDS": "0"}
    for var in ("DAGSTER_HOME", "SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "FRESHIDX_DELTA_MODE"):
        env.pop(var, None)
    spark_port = free_port()
    t0 = time.monotonic()
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(
            [str(FRESHIDX), "demo", "--store", store_cfg.uri, "--home", str(home), "--port", str(free_port()),
             "--spark-port", str(spark_port), "--every", "15", "--history-minutes", "90", "--duration", "900"],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        poll_until(lambda: proc.poll() is not None or "Dagster UI:" in out_path.read_text(), timeout=240,
                   interval=0.5, what="the demo's UI to be ready")
        assert proc.poll() is None, out_path.read_text()[-3000:]
        instance = dg.DagsterInstance.from_config(str(home / "dagster_home"))
        try:
            def in_flight() -> list[dg.DagsterRun]:
                return list(instance.get_runs(dg.RunsFilter(statuses=RUNNING)))

            running = poll_until(in_flight, timeout=180, interval=0.5, what="a run to start")
            snapshot = _tree(proc.pid)
            # Runs go to the demo's supervised Connect server: dagster dev (and so its run workers)
            # carries the server's URL.
            pointed = procs.processes_with_env("FRESHIDX_SPARK_REMOTE", f"sc://127.0.0.1:{spark_port}")
            assert any("dagster" in procs.cmdline(p) for p in pointed), [procs.cmdline(p) for p in pointed]
            ready_s = time.monotonic() - t0
            proc.send_signal(signal.SIGTERM)
            t_stop = time.monotonic()
            rc = proc.wait(240)
            stop_s = time.monotonic() - t_stop
            text = out_path.read_text()
            print(f"ready+first run {ready_s:.0f}s, stop {stop_s:.0f}s, {len(snapshot)} processes in the tree\n"
                  + text[-2500:])
            assert rc == 0, text[-3000:]
            assert "stopped:" in text
            assert "delta mode: continuous" in text  # the demo's default (FRESHIDX_DELTA_MODE unset)

            # (a) nothing left: neither the snapshot of the tree nor anything carrying the demo id
            assert _survivors(snapshot) == []
            assert procs.processes_with_env("FRESHIDX_DEMO_ID", demo_id) == []

            # (b) no run left unfinished; the ones in flight were interrupted, not failed on their own
            assert list(instance.get_runs(dg.RunsFilter(statuses=NOT_FINISHED))) == []
            for r in running:
                after = instance.get_run_by_id(r.run_id)
                assert after is not None and run_health.is_interrupted(after.tags), after
                assert after.status in (dg.DagsterRunStatus.CANCELED, dg.DagsterRunStatus.FAILURE)
        finally:
            instance.dispose()

        # (c) nothing parked: no hour, no delta partition
        store = open_store(store_cfg)
        state, _ = catchup.CatchupState.load(store, catchup.ASSET)
        assert state.parked == []
        parked = [o.key for o in store.list("ledger/").objects if ".parked" in o.key]
        assert parked == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        procs.kill_all(procs.processes_with_env("FRESHIDX_DEMO_ID", demo_id))
