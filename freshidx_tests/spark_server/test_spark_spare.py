"""The warm spare JVM (``freshidx spark-server --spare``, :mod:`freshidx.spark_server.spare`) with real JVMs.

* in process: a supervisor with a spare; the serving JVM is killed with ``SIGKILL``; the state says ``up`` at
  the spare's URL with the spare's pid, recorded as a promotion (not a restart: ``last_restart_promoted``);
  a leased session of the dead JVM stops retrying it (:mod:`freshidx.spark_server.follow_server`) while a new
  Connect session at the new URL runs SQL; a new spare comes up; stop leaves no JVM or Python worker;
* the CLI: the supervisor killed with ``SIGKILL`` takes both JVMs with it (each spawned by a thread that
  lives as long as its JVM: ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest

from freshidx import procs
from freshidx.spark_server import open_connect_session
from freshidx.spark_server.server_config import ServerConfig
from freshidx.spark_server.server_state import read_state
from freshidx.spark_server.spare import spare_dirs
from freshidx.spark_server.supervisor import SparkConnectSupervisor
from freshidx_tests.conftest import TEST_JVM_ARGS, TEST_JVM_CONF, free_port
from freshidx_tests.support.polling import poll_until

pytestmark = pytest.mark.slow

START_DEADLINE = 420.0  # two JVMs start one after the other on a loaded 2-core box
REPO = Path(__file__).resolve().parents[2]


def _spare_ready(state_dir: Path, not_pids: set[int]) -> dict[str, Any] | None:
    st = read_state(state_dir) or {}
    ok = (st.get("status") == "up" and st.get("spare_status") == "ready"
          and isinstance(st.get("spare_pid"), int) and st["spare_pid"] not in not_pids)
    return st if ok else None


class _Unavailable(grpc.RpcError):
    """What an RPC to a dead server raises (pyspark retries it)."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE


def _gone(pids: set[int]) -> bool:
    return all(not procs.pid_alive(p) and not procs.session_members(p) for p in pids)


def test_dead_jvm_is_replaced_by_the_promoted_spare(tmp_path: Path) -> None:
    from pyspark.sql import SparkSession

    cfg = ServerConfig(port=free_port(), state_dir=tmp_path / "state", driver_memory="1g", conf=dict(TEST_JVM_CONF),
                       health_interval_s=2.0, heap_check_interval_s=3600.0, start_timeout_s=START_DEADLINE,
                       cds_dump=False, spare=True)
    sup = SparkConnectSupervisor(cfg)
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            sup.run_forever(stop)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name="supervisor", daemon=True)
    thread.start()
    seen: set[int] = set()
    try:
        before = poll_until(lambda: errors or _spare_ready(cfg.state_dir, set()), timeout=2 * START_DEADLINE,
                            interval=0.2, what="serving JVM and spare up")
        assert not errors, errors
        serving, spare = before["pid"], before["spare_pid"]
        seen |= {serving, spare}
        assert spare != serving and before["spare_url"] != before["url"]
        assert read_state(spare_dirs(cfg.state_dir)[0])["pid"] == spare  # the spare's own state dir records it

        leased = open_connect_session(before["url"], cfg.state_dir, "run-1",
                                      build=lambda url: SparkSession.builder.remote(url).create())
        old_session = leased.__enter__()
        assert old_session.sql("SELECT 1 AS one").collect()[0]["one"] == 1
        policy = old_session.client.get_retry_policies()[0]
        assert policy.can_retry(_Unavailable())  # the server it leased is the serving one: retry as pyspark does

        os.kill(serving, signal.SIGKILL)

        def promoted() -> dict[str, Any] | None:
            st = read_state(cfg.state_dir) or {}
            return st if st.get("status") == "up" and st.get("restarts") == before["restarts"] + 1 else None

        st = poll_until(promoted, timeout=START_DEADLINE, interval=0.1, what="the spare promoted")
        assert st["last_restart_reason"] == "crash" and st["last_restart_promoted"] is True, st
        assert st["pid"] == spare and st["url"] == before["spare_url"] and st["port"] == sup.config.port
        assert st["promotions"] == 1 and not procs.pid_alive(serving)
        assert not policy.can_retry(_Unavailable())  # the old URL will never answer again
        with pytest.raises(Exception):  # noqa: B017 (whatever pyspark raises: it does not retry for minutes)
            old_session.sql("SELECT 2").collect()
        leased.__exit__(None, None, None)
        session = SparkSession.builder.remote(st["url"]).create()
        try:
            assert session.sql("SELECT 41 + 1 AS x").collect()[0]["x"] == 42
        finally:
            session.stop()

        after = poll_until(lambda: _spare_ready(cfg.state_dir, seen), timeout=START_DEADLINE, interval=0.2,
                           what="a new spare up")
        seen.add(after["spare_pid"])
        assert after["pid"] == spare and procs.pid_alive(after["spare_pid"])
    finally:
        stop.set()
        thread.join(60)
        sup.stop()
        seen |= {p for p in (sup.pid,) if p}
    assert not errors, errors
    assert _gone(seen), [p for p in seen if procs.pid_alive(p)]
    assert (read_state(cfg.state_dir) or {}).get("status") == "down"


def test_sigkilled_supervisor_takes_both_jvms_with_it(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    args = [sys.executable, "-m", "freshidx.spark_server.server", "--port", str(free_port()), "--state-dir",
            str(state_dir), "--driver-memory", "1g", "--no-cds-dump", "--control-port", "0", "--spare", "--json",
            *TEST_JVM_ARGS]
    with open(tmp_path / "cli.out", "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)
    pids: set[int] = set()
    try:
        def ready() -> dict[str, Any] | None:
            assert proc.poll() is None, (tmp_path / "cli.out").read_text()[-2000:]
            return _spare_ready(state_dir, set())

        st = poll_until(ready, timeout=2 * START_DEADLINE, interval=0.2, what="serving JVM and spare up")
        pids = {st["pid"], st["spare_pid"]}
        assert all(procs.pid_alive(p) for p in pids)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        poll_until(lambda: _gone(pids), timeout=60, interval=0.2, what=f"JVMs {pids} gone with their supervisor")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in pids:
            if procs.pid_alive(pid):
                procs.signal_session(pid, signal.SIGKILL)
