"""The supervisor's state file, ``state_dir/state.json``: written atomically by the supervisor (one per
state dir), read by clients (:mod:`freshidx.spark_server.lease`), ``freshidx status`` and the demo.

The same state is served by the supervisor's control endpoint (``GET /status``,
:mod:`freshidx.spark_server.control_server`): :func:`read_endpoint_state`.

Fields are the supervisor's (``status`` from :data:`~freshidx.spark_server.server_config.STATUSES`, ``pid``
of the JVM, ``url``, restart counters, heap and progress samples …) plus ``hostname`` and
``supervisor_pid``, which let a reader on the same host tell a live supervisor from a stale file.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from freshidx import procs

#: This host's name: pids in a state or lease file are only meaningful on the host that wrote them.
HOSTNAME = socket.gethostname()
STATE_FILE = "state.json"
URL_SETTING = "FRESHIDX_SPARK_SERVER_URL"


class ControlUnreachable(RuntimeError):
    """The control endpoint did not answer (one line naming ``FRESHIDX_SPARK_SERVER_URL``)."""


def now_iso() -> str:
    """The timestamps of state and lease files: UTC, milliseconds."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def atomic_write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` so that a reader sees the old or the new file, never a partial one."""
    # pid + thread in the temp name: the supervisor's threads and clients never share a temp file
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True, default=str)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_state(state_dir: Path | str) -> dict[str, Any] | None:
    """The supervisor's ``state.json``, or None if there is none (never started here).

    Adds ``supervisor_alive`` (bool, or None when the state was written on another host): a state
    whose supervisor died is stale, whatever its ``status`` says.
    """
    path = Path(state_dir) / STATE_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    if data.get("hostname") == HOSTNAME:
        data["supervisor_alive"] = procs.pid_alive(data.get("supervisor_pid"))
    else:
        data["supervisor_alive"] = None
    return data


def state_is_usable(state: dict[str, Any] | None) -> bool:
    """A client may use the server: ``up``, and (on this host) its supervisor and JVM are alive."""
    if not state or state.get("status") != "up":
        return False
    if state.get("hostname") == HOSTNAME:
        return bool(state.get("supervisor_alive")) and procs.pid_alive(state.get("pid"))
    return True


def unreachable(base_url: str, exc: BaseException) -> ControlUnreachable:
    reason = getattr(exc, "reason", exc)
    return ControlUnreachable(f"Spark server control endpoint {URL_SETTING}={base_url} unreachable: {reason}")


def read_endpoint_state(base_url: str, timeout_s: float = 10.0) -> dict[str, Any] | None:
    """The supervisor's state from its control endpoint ``GET /status`` (None if it has none);
    :class:`ControlUnreachable` when nothing answers."""
    try:
        with urllib.request.urlopen(f"{base_url.rstrip('/')}/status", timeout=timeout_s) as resp:
            doc = json.loads(resp.read())
    except urllib.error.HTTPError:
        return None
    except (OSError, ValueError) as exc:  # URLError, timeouts, refused connections, bad URLs
        raise unreachable(base_url, exc) from None
    return doc if isinstance(doc, dict) else None
