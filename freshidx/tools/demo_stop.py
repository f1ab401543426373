"""How ``freshidx demo`` stops (:func:`shutdown`): in-flight runs tagged interrupted and terminated like
the UI's Terminate button, then the Dagster processes (daemon, webserver, code server), the generator and
the Spark server, and last every process that still carries the demo's id: run workers the demo adopted
after their code server died included (:mod:`freshidx.tools.demo_supervisor`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import dagster as dg

#: Every child of a demo carries its id in this variable: the stop's last sweep finds them by it.
DEMO_ID_ENV = "FRESHIDX_DEMO_ID"
TERMINATE_GRACE_S = 20.0  # runs get this long to end after Terminate, before the Dagster processes stop
SUPERVISOR_GRACE_S = 45.0  # the Spark supervisor drains/stops its JVM within its own stop timeout


class DagsterProcesses(Protocol):
    """What the stop needs of the Dagster side: the demo's supervised parts
    (:class:`~freshidx.tools.demo_dagster.DagsterParts`) or one ``dagster dev`` (``DagsterDev``)."""

    @property
    def is_running(self) -> bool: ...

    def terminate_runs(self, run_ids: list[str]) -> dict[str, str]: ...

    def stop(self) -> object: ...


def shutdown(dev: DagsterProcesses, generator: subprocess.Popen[bytes] | None, server: subprocess.Popen[bytes] | None,
             state_dir: Path, instance: dg.DagsterInstance, demo_id: str) -> dict[str, int]:
    """Stop everything the demo started; never raises. Returns counts for the closing line."""
    from freshidx.defs.runs.health import interrupt_runs
    from freshidx.procs import kill_all, processes_with_env

    summary = {"runs_terminated": 0, "runs_marked_interrupted": 0, "processes_killed": 0}
    if generator is not None:
        _stop_group(generator, signal.SIGTERM, 10)
    with contextlib.suppress(Exception):
        summary["runs_terminated"] = _terminate_runs(dev, instance)
    with contextlib.suppress(Exception):
        dev.stop()
    with contextlib.suppress(Exception):  # created meanwhile, or the worker never acknowledged
        summary["runs_marked_interrupted"] = len(interrupt_runs(instance))
    if server is not None:
        _stop_supervisor(server, state_dir)
    # Last resort, whatever state anything was in: every process that carries this demo's id.
    for _ in range(3):
        left = processes_with_env(DEMO_ID_ENV, demo_id)
        if not left:
            break
        summary["processes_killed"] += len(left)
        kill_all(left)
        _wait(lambda: not processes_with_env(DEMO_ID_ENV, demo_id), 5)
    return summary


def _terminate_runs(dev: DagsterProcesses, instance: dg.DagsterInstance) -> int:
    """Tag unfinished runs interrupted, then Terminate them through the webserver (like the UI), so
    workers end their Spark work and record CANCELED; waits at most :data:`TERMINATE_GRACE_S`."""
    import dagster as dg

    from freshidx.defs.runs.health import NOT_FINISHED, tag_interrupted

    if not dev.is_running:
        return 0
    ids = [r.run_id for r in instance.get_runs(dg.RunsFilter(statuses=NOT_FINISHED), limit=100)]
    if not ids:
        return 0
    tag_interrupted(instance, ids)  # before they end: no sensor may count them as failures
    results: dict[str, str] | None = None
    with contextlib.suppress(Exception):
        results = dev.terminate_runs(ids)
    # A run whose Terminate failed (the code server that launched it was restarted since) does not end by
    # itself: no waiting for it; the stop marks it interrupted and the sweep ends its worker.
    waited = ids if results is None else [i for i in ids if results.get(i) == "TerminateRunSuccess"]

    def all_finished() -> bool:
        return all((r := instance.get_run_by_id(i)) is None or r.is_finished for i in waited)

    _wait(all_finished, TERMINATE_GRACE_S)
    return len(ids)


def _stop_supervisor(server: subprocess.Popen[bytes], state_dir: Path) -> None:
    """SIGTERM the supervisor (it stops its JVM); after its grace kill its group, then the JVM's
    session through the pid in state.json (the JVM runs in its own session)."""
    from freshidx.procs import kill_all

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(server.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.wait(SUPERVISOR_GRACE_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(server.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.wait(10)
    try:
        from freshidx.procs import cmdline, session_members
        from freshidx.spark_server.server_state import read_state

        state = read_state(state_dir) or {}
        pid = state.get("pid")
        if isinstance(pid, int) and pid > 0 and "SparkConnectServer" in cmdline(pid):
            kill_all([*session_members(pid), pid])
    except Exception as exc:  # the sweep by demo id still follows
        print(f"  (could not check the Spark JVM: {exc})", file=sys.stderr)


def _stop_group(proc: subprocess.Popen[bytes], sig: int, grace: float) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)


def _wait(done: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if done():
                return True
        except Exception:  # a transient read error (SQLite busy) is retried until the deadline
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.25)

