"""Leases: how a client tells the supervised Spark Connect server that it is using it.

The server cannot tell the supervisor which client operations are running, so clients say so:
:func:`acquire_lease` writes ``state_dir/leases/<run-id>--<pid>-<nonce>.json`` while a freshidx run
uses the server, and waits while the server is starting/draining/restarting/down, raising
:class:`ServerUnavailable` after ``timeout_s``. The lease is written *before* the state is re-read,
and the supervisor writes ``draining`` *before* it lists leases (:func:`active_leases`), so a client
either sees ``draining`` (and withdraws) or the supervisor sees its lease. Leases of dead processes on
this host are reaped. Client sessions do not survive a restart: create the Spark Connect session
inside the lease.

Client side only: no pyspark import (a run imports this before it has any Spark session).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from freshidx import procs
from freshidx.spark_server.server_state import HOSTNAME, atomic_write_json, now_iso, read_state, state_is_usable

_SAFE_RUN_ID = re.compile(r"[^A-Za-z0-9._-]")


class ServerUnavailable(RuntimeError):
    """The supervised Spark Connect server did not become usable within the caller's timeout."""


@dataclass(frozen=True)
class Lease:
    """A client's claim that it is using the server: no planned restart while it is held."""

    run_id: str
    path: Path
    url: str
    server_pid: int | None
    acquired_at: str
    waited_s: float


def _lease_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "leases"


@contextlib.contextmanager
def acquire_lease(
    state_dir: Path | str, run_id: str, timeout_s: float = 300.0, *, poll_s: float = 0.2
) -> Iterator[Lease]:
    """Hold a lease on the supervised server for the duration of the ``with`` block.

    Waits while the server is starting, draining, restarting or down; raises
    :class:`ServerUnavailable` if it is not ``up`` within ``timeout_s``. The yielded
    :class:`Lease` carries the ``sc://`` URL to connect to. Several leases with the same ``run_id``
    (e.g. steps of one run in different processes) are independent.
    """
    state_dir = Path(state_dir)
    leases = _lease_dir(state_dir)
    leases.mkdir(parents=True, exist_ok=True)
    safe = _SAFE_RUN_ID.sub("_", run_id)[:100] or "run"
    path = leases / f"{safe}--{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    state: dict[str, Any] | None = None
    while True:
        state = read_state(state_dir)
        if state_is_usable(state):
            assert state is not None
            lease_doc = {
                "run_id": run_id, "pid": os.getpid(), "hostname": HOSTNAME,
                "acquired_at": now_iso(), "server_pid": state.get("pid"),
            }
            atomic_write_json(path, lease_doc)
            # Re-read *after* the lease is visible: the supervisor writes "draining" before it lists
            # leases, so either we see "draining" here, or it sees our lease.
            again = read_state(state_dir)
            if state_is_usable(again) and again is not None and again.get("pid") == state.get("pid"):
                break
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        if time.monotonic() >= deadline:
            status = (state or {}).get("status", "no state file")
            if state and state.get("supervisor_alive") is False:
                status = f"{status}, but its supervisor (pid {state.get('supervisor_pid')}) is not running"
            raise ServerUnavailable(
                f"Spark Connect server supervised in {state_dir} not available after {timeout_s:.0f}s "
                f"(status: {status}; last restart reason: {(state or {}).get('last_restart_reason')}). "
                "Is `freshidx spark-server` running?"
            )
        time.sleep(poll_s)
    lease = Lease(
        run_id=run_id, path=path, url=str(state.get("url")), server_pid=state.get("pid"),
        acquired_at=lease_doc["acquired_at"], waited_s=round(time.monotonic() - t0, 3),
    )
    try:
        yield lease
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def active_leases(state_dir: Path | str, *, reap_stale: bool = True) -> list[dict[str, Any]]:
    """Leases currently held. Leases of processes that no longer exist on this host are removed."""
    out: list[dict[str, Any]] = []
    d = _lease_dir(Path(state_dir))
    if not d.is_dir():
        return out
    for p in sorted(d.glob("*.json")):
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            continue
        except (OSError, ValueError):
            # being written (atomic rename makes this rare) or garbage: count it, reap by age
            doc = {"run_id": p.name, "unreadable": True}
            with contextlib.suppress(OSError):
                if reap_stale and time.time() - p.stat().st_mtime > 3600:
                    p.unlink()
                    continue
        if reap_stale and doc.get("hostname") == HOSTNAME and not procs.pid_alive(doc.get("pid")):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
            continue
        doc["file"] = p.name
        out.append(doc)
    return out
