"""How a client reaches a supervised Spark Connect server's control: one interface, two implementations.

* :class:`DirectoryControl` – the supervisor's state directory, shared by every client (one host, or a
  shared volume): ``state.json``, ``leases/*.json``, ``sessions/<name>.json``. Leases of dead processes
  on the supervisor's host are reaped by pid (:func:`freshidx.spark_server.lease.active_leases`).
* :class:`EndpointControl` – the supervisor's HTTP control endpoint (``FRESHIDX_SPARK_SERVER_URL``,
  :mod:`freshidx.spark_server.control_server`): nothing shared but the network. A lease is renewed by a
  background thread while it is held and expires on the server after its TTL when renewals stop.

:func:`control_for` picks one from what a caller was given (``http(s)://…`` = the endpoint, else a
directory). The lease and kept-session logic (:mod:`~freshidx.spark_server.lease`,
:mod:`~freshidx.spark_server.kept_session`) is written once against :class:`ServerControl`.

Client side only: no pyspark import.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from freshidx.spark_server.server_state import (
    HOSTNAME,
    URL_SETTING,
    ControlUnreachable,
    atomic_write_json,
    now_iso,
    read_endpoint_state,
    read_state,
    state_is_usable,
    unreachable,
)

log = logging.getLogger(__name__)

_SAFE_RUN_ID = re.compile(r"[^A-Za-z0-9._-]")
_HTTP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Grant:
    """A lease the server granted: ``lease_id`` names it to the control (a file name, or the endpoint's id)."""

    lease_id: str
    url: str
    server_pid: int | None
    acquired_at: str
    ttl_s: float | None = None  # the endpoint's: renew well within it
    path: Path | None = None  # the directory's lease file


class ServerControl(ABC):
    """Status, leases and kept session ids of one supervised server."""

    #: where, for messages: "supervised in DIR" / "behind FRESHIDX_SPARK_SERVER_URL=…"
    where: str

    @abstractmethod
    def state(self) -> dict[str, Any] | None:
        """The supervisor's state (``status``, ``url``, ``ui_url``, ``pid``, …), None if unknown."""

    @abstractmethod
    def try_lease(self, run_id: str) -> tuple[Grant | None, dict[str, Any] | None]:
        """A lease, or ``(None, state)`` while the server is not usable (the caller waits and retries)."""

    @abstractmethod
    def release(self, grant: Grant) -> None:
        """Give the lease back (never raises)."""

    @contextlib.contextmanager
    def keep_alive(self, grant: Grant) -> Iterator[None]:
        """Keep ``grant`` valid while the block runs (a directory lease needs nothing)."""
        yield

    @abstractmethod
    def read_session(self, name: str) -> dict[str, Any] | None:
        """The kept session ``name``'s record ``{"session_id", "code"}``, None if there is none."""

    @abstractmethod
    def write_session(self, name: str, record: dict[str, Any]) -> None:
        """Record the kept session ``name`` (last writer wins)."""


class DirectoryControl(ServerControl):
    """The supervisor's state directory (the one-host mode)."""

    def __init__(self, state_dir: str | Path) -> None:
        self.state_dir = Path(state_dir)
        self.where = f"supervised in {self.state_dir}"

    def state(self) -> dict[str, Any] | None:
        return read_state(self.state_dir)

    def try_lease(self, run_id: str) -> tuple[Grant | None, dict[str, Any] | None]:
        leases = self.state_dir / "leases"
        leases.mkdir(parents=True, exist_ok=True)
        state = read_state(self.state_dir)
        if not state_is_usable(state):
            return None, state
        assert state is not None
        safe = _SAFE_RUN_ID.sub("_", run_id)[:100] or "run"
        path = leases / f"{safe}--{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
        doc = {"run_id": run_id, "pid": os.getpid(), "hostname": HOSTNAME, "acquired_at": now_iso(),
               "server_pid": state.get("pid")}
        atomic_write_json(path, doc)
        # Re-read *after* the lease is visible: the supervisor writes "draining" before it lists
        # leases, so either we see "draining" here, or it sees our lease.
        again = read_state(self.state_dir)
        if state_is_usable(again) and again is not None and again.get("pid") == state.get("pid"):
            return Grant(path.name, str(state.get("url")), state.get("pid"), doc["acquired_at"], path=path), state
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return None, again

    def release(self, grant: Grant) -> None:
        if grant.path is not None:
            with contextlib.suppress(FileNotFoundError):
                grant.path.unlink()

    def session_file(self, name: str) -> Path:
        return self.state_dir / "sessions" / f"{name}.json"

    def read_session(self, name: str) -> dict[str, Any] | None:
        try:
            doc = json.loads(self.session_file(name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def write_session(self, name: str, record: dict[str, Any]) -> None:
        path = self.session_file(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(record), encoding="utf-8")
        os.replace(tmp, path)


class EndpointControl(ServerControl):
    """The supervisor's HTTP control endpoint (nothing shared but the network)."""

    def __init__(self, base_url: str, *, timeout_s: float = _HTTP_TIMEOUT_S) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.where = f"behind {URL_SETTING}={self.base_url}"

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        """``(HTTP status, JSON body)``; :class:`ControlUnreachable` when nothing answers."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.base_url}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return resp.status, _json(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, _json(exc.read())
        except (OSError, ValueError) as exc:  # URLError, timeouts, refused connections, bad URLs
            raise unreachable(self.base_url, exc) from None

    def state(self) -> dict[str, Any] | None:
        return read_endpoint_state(self.base_url, self.timeout_s)

    def try_lease(self, run_id: str) -> tuple[Grant | None, dict[str, Any] | None]:
        try:
            status, doc = self.call("POST", "/leases", {"run_id": run_id, "pid": os.getpid(), "hostname": HOSTNAME})
        except ControlUnreachable as exc:
            return None, {"status": "unreachable", "error": str(exc)}
        if status != 200:
            return None, doc.get("state") or doc
        return Grant(str(doc["lease_id"]), str(doc["url"]), doc.get("server_pid"), str(doc["acquired_at"]),
                     ttl_s=float(doc["ttl_s"])), None

    def release(self, grant: Grant) -> None:
        try:
            self.call("DELETE", f"/leases/{urllib.parse.quote(grant.lease_id)}")
        except ControlUnreachable as exc:  # the lease expires after its TTL anyway
            log.warning("%s; lease %s left to expire", exc, grant.lease_id)

    def renew(self, grant: Grant) -> bool:
        """True while the server knows the lease; False once it is gone (expired, or a restarted supervisor)."""
        status, _ = self.call("POST", f"/leases/{urllib.parse.quote(grant.lease_id)}/renew")
        return status == 200

    @contextlib.contextmanager
    def keep_alive(self, grant: Grant) -> Iterator[None]:
        stop = threading.Event()
        thread = threading.Thread(target=self._renew_until, args=(grant, stop), daemon=True,
                                  name=f"freshidx-lease-{grant.lease_id[:8]}")
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=self.timeout_s + 1)

    def _renew_until(self, grant: Grant, stop: threading.Event) -> None:
        # A third of the TTL: two renewals may fail (a busy supervisor, a network blip) before it expires.
        interval = max(0.05, (grant.ttl_s or 30.0) / 3)
        while not stop.wait(interval):
            try:
                if not self.renew(grant):
                    # The supervisor no longer knows the lease (it expired, or the supervisor was restarted,
                    # which also restarted the JVM this run's session lived on): nothing to protect any more.
                    log.warning("lease %s on %s is gone; not renewing it", grant.lease_id, self.where)
                    return
            except ControlUnreachable as exc:
                log.warning("%s; retrying the lease renewal", exc)

    def read_session(self, name: str) -> dict[str, Any] | None:
        status, doc = self.call("GET", f"/sessions/{urllib.parse.quote(name)}")
        return doc if status == 200 else None

    def write_session(self, name: str, record: dict[str, Any]) -> None:
        status, doc = self.call("PUT", f"/sessions/{urllib.parse.quote(name)}", record)
        if status != 200:
            raise ControlUnreachable(f"{URL_SETTING}={self.base_url} refused the kept session {name}: {doc}")


def _json(raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw or b"{}")
    except ValueError:
        return {"error": raw[:200].decode(errors="replace")}
    return doc if isinstance(doc, dict) else {"value": doc}


def is_endpoint(where: str | Path) -> bool:
    return isinstance(where, str) and where.startswith(("http://", "https://"))


def control_for(where: str | Path | ServerControl) -> ServerControl:
    """The control of a server given as a control, an ``http(s)://`` endpoint URL or a state directory."""
    if isinstance(where, ServerControl):
        return where
    if is_endpoint(where):
        return EndpointControl(str(where))
    return DirectoryControl(where)
