"""The supervisor's control endpoint: status, leases and kept session ids over HTTP (JSON bodies).

For deployments where runs, daemon and Spark Connect server share no filesystem and no host (e.g.
Kubernetes): clients set ``FRESHIDX_SPARK_SERVER_URL`` (:class:`~freshidx.spark_server.control_client.EndpointControl`)
instead of sharing the state directory. Served by the supervisor process itself
(``freshidx spark-server --control-port``), on the Connect server's bind address.

=========================================  ===================================================================
``GET /status``                            the supervisor's state (what ``state.json`` holds)
``POST /leases`` ``{run_id, pid, hostname}``  200 ``{lease_id, url, server_pid, ttl_s, acquired_at}``; 409
                                           ``{state}`` while the server is not usable (the client retries)
``POST /leases/<id>/renew``                200, or 410 once the lease is unknown (expired, or another supervisor)
``DELETE /leases/<id>``                    release (idempotent)
``GET /leases``                            the leases held (``{"leases": [...]}``)
``GET|PUT /sessions/<name>``               a kept session's ``{session_id, code}`` (404 if none)
=========================================  ===================================================================

**Ordering.** A lease is granted under the same lock under which the supervisor changes its status, so
a client either gets ``409 draining`` or the drain that follows sees its lease (as the lease files'
write-then-reread order guarantees in the directory mode).

**Expiry.** Leases live in the supervisor's memory. A lease whose client stops renewing is dropped
``ttl_s`` after its last renewal (this replaces the same-host pid reaping of lease files).

**Supervisor restart.** A supervisor that crashed took its JVM with it (``PR_SET_PDEATHSIG``), so the
sessions its leases protected are gone too. The new supervisor starts with no leases and answers a
renewal of an old one with 410: the client stops renewing (the run's next Spark call fails and its
retry leases again), rather than re-registering a lease that protects nothing.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from freshidx.spark_server.control_client import DirectoryControl
from freshidx.spark_server.server_state import now_iso

_NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}$")
_MAX_BODY = 64 * 1024


@dataclass
class _Held:
    doc: dict[str, Any]
    expires: float = field(default=0.0)


class ControlPlane:
    """The leases and kept sessions behind the endpoint; the HTTP layer is :class:`ControlServer`.

    ``state()`` is the supervisor's state, ``usable()`` whether a client may use the server now, and
    ``lock`` the lock under which the supervisor changes its status (the ordering guarantee above).
    """

    def __init__(self, state: Callable[[], dict[str, Any]], usable: Callable[[dict[str, Any]], bool],
                 lock: Any, sessions: DirectoryControl, ttl_s: float = 30.0) -> None:
        self._state = state
        self._usable = usable
        self._status_lock = lock
        self._sessions = sessions
        self.ttl_s = ttl_s
        self._leases: dict[str, _Held] = {}
        self._lock = threading.Lock()

    def status(self) -> dict[str, Any]:
        state = dict(self._state())
        state["supervisor_alive"] = True  # it answered
        state["endpoint_leases"] = [d["run_id"] for d in self.leases()]
        return state

    def acquire(self, run_id: str, client: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """``(lease, state)``: a lease if the server is usable now, else ``(None, state)``."""
        with self._status_lock:  # the supervisor writes "draining" under it, then lists leases
            state = dict(self._state())
            if not self._usable(state):
                return None, state
            lease_id = uuid.uuid4().hex
            doc = {"run_id": run_id, "pid": client.get("pid"), "hostname": client.get("hostname"),
                   "acquired_at": now_iso(), "server_pid": state.get("pid"), "lease_id": lease_id,
                   "via": "endpoint"}
            with self._lock:
                self._leases[lease_id] = _Held(doc, time.monotonic() + self.ttl_s)
        return {**doc, "url": state.get("url"), "ttl_s": self.ttl_s}, state

    def renew(self, lease_id: str) -> bool:
        with self._lock:
            self._expire()
            held = self._leases.get(lease_id)
            if held is None:
                return False
            held.expires = time.monotonic() + self.ttl_s
            return True

    def release(self, lease_id: str) -> bool:
        with self._lock:
            return self._leases.pop(lease_id, None) is not None

    def leases(self) -> list[dict[str, Any]]:
        """The leases held now (expired ones dropped), in the shape of the lease files' documents."""
        with self._lock:
            self._expire()
            return [dict(h.doc) for h in self._leases.values()]

    def _expire(self) -> None:
        now = time.monotonic()
        for lease_id in [k for k, h in self._leases.items() if h.expires <= now]:
            del self._leases[lease_id]

    def read_session(self, name: str) -> dict[str, Any] | None:
        return self._sessions.read_session(name)

    def write_session(self, name: str, record: dict[str, Any]) -> None:
        self._sessions.write_session(name, {"session_id": str(record.get("session_id")),
                                            "code": str(record.get("code"))})


class _Handler(BaseHTTPRequestHandler):
    server: ControlServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the supervisor's state is its log; one line per renewal would drown it

    def _send(self, code: int, doc: dict[str, Any]) -> None:
        body = json.dumps(doc, default=str).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        if length > _MAX_BODY:
            raise ValueError("body too large")
        doc = json.loads(self.rfile.read(length) or b"{}") if length else {}
        if not isinstance(doc, dict):
            raise ValueError("a JSON object expected")
        return doc

    def _parts(self) -> list[str]:
        path = urllib.parse.urlsplit(self.path).path
        return [urllib.parse.unquote(p) for p in path.strip("/").split("/") if p]

    def _dispatch(self, method: str) -> None:
        try:
            code, doc = route(self.server.plane, method, self._parts(), self._body)
        except ValueError as exc:
            code, doc = 400, {"error": str(exc)}
        except Exception as exc:  # the endpoint answers whatever goes wrong in one request
            code, doc = 500, {"error": f"{type(exc).__name__}: {exc}"}
        self._send(code, doc)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")


def route(plane: ControlPlane, method: str, parts: list[str],
          body: Callable[[], dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    """``(HTTP status, JSON body)`` of one request (see the module docstring's table)."""
    match method, parts:
        case "GET", ["status"]:
            return 200, plane.status()
        case "GET", ["leases"]:
            return 200, {"leases": plane.leases(), "ttl_s": plane.ttl_s}
        case "POST", ["leases"]:
            req = body()
            run_id = str(req.get("run_id") or "")
            if not run_id:
                return 400, {"error": "run_id required"}
            lease, state = plane.acquire(run_id[:200], req)
            return (200, lease) if lease is not None else (409, {"state": state})
        case "POST", ["leases", lease_id, "renew"]:
            ok = plane.renew(lease_id)
            return (200, {"lease_id": lease_id, "ttl_s": plane.ttl_s}) if ok else (410, {"error": "unknown lease"})
        case "DELETE", ["leases", lease_id]:
            return 200, {"released": plane.release(lease_id)}
        case "GET", ["sessions", name] if _NAME.match(name):
            kept = plane.read_session(name)
            return (200, kept) if kept is not None else (404, {"error": f"no kept session {name}"})
        case "PUT", ["sessions", name] if _NAME.match(name):
            req = body()
            if not req.get("session_id") or not req.get("code"):
                return 400, {"error": "session_id and code required"}
            plane.write_session(name, req)
            return 200, {"name": name}
    return 404, {"error": f"no such endpoint: {method} /{'/'.join(parts)}"}


class ControlServer(ThreadingHTTPServer):
    """The HTTP server of a :class:`ControlPlane`, serving from a daemon thread."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, plane: ControlPlane, host: str, port: int) -> None:
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), _Handler)
        self.plane = plane
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        shown = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
        return f"http://{shown}:{port}"

    def start(self) -> ControlServer:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="freshidx-spark-control", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:  # shutdown() waits for serve_forever: only if it runs
            with contextlib.suppress(Exception):
                self.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self.server_close()
