"""Leases: how a client tells the supervised Spark Connect server that it is using it.

The server cannot tell the supervisor which client operations are running, so clients say so:
:func:`acquire_lease` holds a lease while a freshidx run uses the server, and waits while the server
is starting/draining/restarting/down, raising :class:`ServerUnavailable` after ``timeout_s``. Where the
lease lives is the control's business (:mod:`freshidx.spark_server.control_client`): a file
``state_dir/leases/<run-id>--<pid>-<nonce>.json`` in the one-host mode, or the supervisor's memory
behind its control endpoint (renewed in the background, expired after a TTL). Either way a client
either sees ``draining`` (and withdraws) or the supervisor's drain sees its lease: the directory
client writes its lease *before* it re-reads the state and the supervisor writes ``draining``
*before* it lists leases (:func:`active_leases`); the endpoint decides both under one lock. Leases of
dead processes on this host are reaped. Client sessions do not survive a restart: create the Spark
Connect session inside the lease.

Client side only: no pyspark import (a run imports this before it has any Spark session).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from freshidx import procs
from freshidx.spark_server.control_client import ServerControl, control_for
from freshidx.spark_server.server_state import HOSTNAME


class ServerUnavailable(RuntimeError):
    """The supervised Spark Connect server did not become usable within the caller's timeout."""


@dataclass(frozen=True)
class Lease:
    """A client's claim that it is using the server: no planned restart while it is held."""

    run_id: str
    path: Path | None  # the lease file (directory mode)
    url: str
    server_pid: int | None
    acquired_at: str
    waited_s: float
    lease_id: str = ""


def _lease_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "leases"


@contextlib.contextmanager
def acquire_lease(
    where: Path | str | ServerControl, run_id: str, timeout_s: float = 300.0, *, poll_s: float = 0.2
) -> Iterator[Lease]:
    """Hold a lease on the supervised server for the duration of the ``with`` block.

    ``where`` is the supervisor's state directory, its control endpoint (``http://host:port``) or a
    :class:`~freshidx.spark_server.control_client.ServerControl`. Waits while the server is starting,
    draining, restarting, down (or its endpoint does not answer); raises :class:`ServerUnavailable` if it
    is not ``up`` within ``timeout_s``. The yielded :class:`Lease` carries the ``sc://`` URL to connect
    to. Several leases with the same ``run_id`` (e.g. steps of one run in different processes) are
    independent.
    """
    control = control_for(where)
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    while True:
        grant, state = control.try_lease(run_id)
        if grant is not None:
            break
        if time.monotonic() >= deadline:
            raise ServerUnavailable(_unavailable(control, state, timeout_s))
        time.sleep(poll_s)
    lease = Lease(run_id=run_id, path=grant.path, url=grant.url, server_pid=grant.server_pid,
                  acquired_at=grant.acquired_at, waited_s=round(time.monotonic() - t0, 3), lease_id=grant.lease_id)
    try:
        with control.keep_alive(grant):
            yield lease
    finally:
        control.release(grant)


def _unavailable(control: ServerControl, state: dict[str, Any] | None, timeout_s: float) -> str:
    status = (state or {}).get("status", "no state file")
    if state and state.get("supervisor_alive") is False:
        status = f"{status}, but its supervisor (pid {state.get('supervisor_pid')}) is not running"
    if state and state.get("error"):
        status = f"{status}: {state['error']}"
    return (
        f"Spark Connect server {control.where} not available after {timeout_s:.0f}s "
        f"(status: {status}; last restart reason: {(state or {}).get('last_restart_reason')}). "
        "Is `freshidx spark-server` running?"
    )


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
