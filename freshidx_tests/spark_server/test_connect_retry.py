"""A run whose Spark Connect server is restarting fails clearly and is retried; it never hangs.

Everything is real: a supervised Spark Connect server (``freshidx spark-server`` as a subprocess,
on a free loopback port) and a Dagster run of ``delta_index`` (``dagster asset materialize`` as a
subprocess, on a persistent instance in a temp ``DAGSTER_HOME``, read here through its storage).
No Spark client runs in the pytest process.

Scenario: a long-running "run" (the test) holds a lease and a planned restart is requested
(``SIGHUP``), so the server is *draining* when the ``delta_index`` run starts. The run's lease
wait is bounded (``lease_timeout_seconds``), so attempt 1 fails with a ``ServerUnavailable`` that
names the draining server; the asset's ``RetryPolicy`` schedules attempt 2. Only after that
failure is recorded does the test release its lease: the supervisor restarts the JVM, and a later
attempt leases the new server and publishes (the delta pointer advances). Waiting is polling with
a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from freshidx.publish.commit import read_pointer
from freshidx.spark_server.lease import acquire_lease
from freshidx.spark_server.server_state import read_state
from freshidx.store import StoreConfig, open_store
from freshidx.tools.devserver import prepare_home
from freshidx.tools.generate import GeneratorConfig, write_partition
from freshidx_tests.conftest import CONNECT_ENV, TEST_JVM_ARGS, free_port, stop_spark_server
from freshidx_tests.support.harness import at
from freshidx_tests.support.polling import poll_until

REPO = Path(__file__).resolve().parents[2]
GEN = GeneratorConfig(seed=11, ads=200, products=30, changes_per_partition=20)
START_DEADLINE = 240.0  # spawn → warm-up done; ~25 s here under load
LEASE_TIMEOUT_S = 40  # per attempt; attempts 2 and 3 (10 s apart) leave ~100 s for the JVM restart



@pytest.fixture
def spark_server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path]]:
    """``freshidx spark-server`` in its own session; stopped with SIGTERM (SIGKILL as a last resort)."""
    state_dir = tmp_path / "spark-server"
    log = tmp_path / "spark-server.out"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "freshidx.spark_server.server", "--port", str(free_port()),
             "--state-dir", str(state_dir),
             "--driver-memory", "1g", "--drain-timeout", "600", "--cds-dir", str(tmp_path / "cds"), "--no-warm-up",
             "--json", *TEST_JVM_ARGS],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO,
        )
    try:
        yield proc, state_dir, log
    finally:
        stop_spark_server(proc)


def _error_text(err: Any) -> str:
    """A SerializableErrorInfo with its whole cause/context chain, as text."""
    parts = []
    while err is not None:
        parts.append(f"{err.cls_name}: {err.message}")
        err = err.cause or getattr(err, "context", None)
    return "\n".join(parts)


def _step_events(instance: dg.DagsterInstance, run_id: str) -> list[Any]:
    return [e.dagster_event for e in instance.all_logs(run_id) if e.dagster_event is not None]


@pytest.mark.daemon
def test_run_during_a_connect_restart_fails_clearly_and_is_retried(
    tmp_path: Path, spark_server: tuple[subprocess.Popen[bytes], Path, Path]
) -> None:
    server, state_dir, server_log = spark_server
    store_cfg = StoreConfig(uri=(tmp_path / "store").as_uri())
    store = open_store(store_cfg)
    for m in (0, 5, 10):
        write_partition(store, GEN, at(m))
    assert read_pointer(store, "delta")[0] is None

    up = poll_until(lambda: (s := read_state(state_dir)) and s.get("status") == "up" and s,
                    timeout=START_DEADLINE, interval=0.5, what=f"spark-server up ({server_log})")
    first_jvm = up["pid"]

    home = prepare_home(tmp_path / "dagster_home", REPO / "dagster.yaml")
    env = {**os.environ, "DAGSTER_HOME": str(home), "FRESHIDX_STORE": store_cfg.uri,
           "FRESHIDX_PARTITIONS_START": "2026-11-01", "PYSPARK_PYTHON": sys.executable,
           "FRESHIDX_SPARK_REMOTE": up["url"], "FRESHIDX_SPARK_SERVER_STATE": str(state_dir)}
    for var in CONNECT_ENV:
        env.pop(var, None)
    # Run config for a resource replaces *all* its constructor-bound values (they are not merged),
    # so the Connect fields are repeated next to the shorter lease timeout.
    run_config = {"resources": {"spark": {"config": {
        "remote": up["url"], "server_state_dir": str(state_dir), "lease_timeout_seconds": LEASE_TIMEOUT_S}}}}
    out_path = tmp_path / "materialize.out"
    instance = dg.DagsterInstance.from_config(str(home))
    run: subprocess.Popen[bytes] | None = None
    try:
        with acquire_lease(state_dir, "test-long-running-run", timeout_s=60):
            # A planned restart must wait for our lease: the server is draining, not usable.
            server.send_signal(signal.SIGHUP)
            poll_until(lambda: (read_state(state_dir) or {}).get("status") == "draining", timeout=60,
                       what="server draining")
            with open(out_path, "wb") as out:
                run = subprocess.Popen(
                    [sys.executable, "-m", "dagster", "asset", "materialize", "-m", "freshidx.definitions",
                     "--select", "delta_index", "--config-json", json.dumps(run_config)],
                    env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                )

            def retry_scheduled() -> Any:
                if run is not None and run.poll() is not None:
                    raise AssertionError(f"run process ended before a retry: {out_path.read_text()[-3000:]}")
                for r in instance.get_runs(limit=1):
                    for ev in _step_events(instance, r.run_id):
                        if ev.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY:
                            return r.run_id, ev
                return None

            run_id, retry_event = poll_until(retry_scheduled, timeout=LEASE_TIMEOUT_S + 120, interval=0.5,
                                             what=f"attempt 1 failing and a retry being scheduled ({out_path})")
            # Still draining: nothing restarted behind the failed attempt's back.
            assert (read_state(state_dir) or {}).get("status") == "draining"
        # Lease released: the supervisor restarts the JVM; a later attempt gets the new server.
        rc = run.wait(timeout=3 * (LEASE_TIMEOUT_S + 10) + 120)
        output = out_path.read_text(errors="replace")
        assert rc == 0, output[-4000:]

        # Attempt 1 failed clearly: the ServerUnavailable names the draining server and its timeout.
        error = _error_text(retry_event.event_specific_data.error)
        assert "ServerUnavailable" in error, error
        assert f"not available after {LEASE_TIMEOUT_S}s" in error and "status: draining" in error, error

        events = _step_events(instance, run_id)
        types = [e.event_type for e in events]
        assert dg.DagsterEventType.STEP_SUCCESS in types and dg.DagsterEventType.STEP_RESTARTED in types
        assert types.count(dg.DagsterEventType.STEP_UP_FOR_RETRY) <= 2  # within RetryPolicy(max_retries=2)
        dagster_run = instance.get_run_by_id(run_id)
        assert dagster_run is not None and dagster_run.status == dg.DagsterRunStatus.SUCCESS

        # It published once the server was back: the pointer advanced to the newest partition.
        ptr, _ = read_pointer(store, "delta")
        assert ptr is not None and ptr.source_partition == at(10).path
        st = read_state(state_dir) or {}
        assert st.get("status") == "up" and st.get("restarts", 0) >= 1
        assert st.get("last_restart_reason") == "planned-manual" and st.get("pid") != first_jvm
    finally:
        if run is not None and run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(10)
        instance.dispose()
