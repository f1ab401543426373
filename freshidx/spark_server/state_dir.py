"""Who owns a Spark Connect server's state directory: one supervisor at a time (an ``flock`` on
``state_dir/supervisor.lock``), and the JVM a supervisor killed with ``SIGKILL`` left behind (found
through its recorded pid and command line, :class:`~freshidx.spark_server.server_process.ServerProcess`
kills it before it starts a JVM of its own)."""

from __future__ import annotations

import contextlib
import fcntl
import signal
import time
from pathlib import Path
from typing import IO

from freshidx import procs
from freshidx.spark_server.server_config import SERVER_CLASS
from freshidx.spark_server.server_state import HOSTNAME, read_state


def lock_state_dir(state_dir: Path) -> IO[str] | None:
    """The open, locked ``supervisor.lock`` of ``state_dir``; None if another process holds the lock."""
    state_dir.mkdir(parents=True, exist_ok=True)
    f = open(state_dir / "supervisor.lock", "a+", encoding="utf-8")  # noqa: SIM115
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


def unlock_state_dir(lock: IO[str]) -> None:
    with contextlib.suppress(OSError):
        fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    lock.close()


def kill_leftover_jvm(state_dir: Path, properties_path: Path) -> None:
    """Kill the JVM a previous supervisor of ``state_dir`` recorded, if it still runs here with this state
    dir's properties (a pid reused by anything else is left alone), and wait until it is gone."""
    old = read_state(state_dir) or {}
    pid = old.get("pid")
    if (
        isinstance(pid, int)
        and old.get("hostname") == HOSTNAME
        and procs.pid_alive(pid)
        and SERVER_CLASS in procs.cmdline(pid)
        and str(properties_path) in procs.cmdline(pid)
    ):
        procs.signal_session(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30  # the new JVM needs its port: wait for the old one to be gone
        while procs.pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
