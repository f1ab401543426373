"""A loopback HTTP proxy in front of a real S3-protocol server (moto), with per-request faults.

Not a mock: every request reaches moto unless a rule says otherwise. Faults it can inject:

* ``drop_response``: forward the request (moto applies it), then close the client's connection
  without answering, so the client never hears that its write landed (a lost response);
* ``strip_conditions``: remove ``If-None-Match`` / ``If-Match`` before forwarding, like an
  S3-compatible server or proxy that ignores conditional writes;
* ``stall``: hold the request until the test calls :meth:`S3Proxy.release` (a request stuck on the
  network), then forward it.

Every request is recorded (method, path, status or ``None`` when dropped) for assertions.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal
from urllib.parse import unquote, urlparse

Action = Literal["forward", "drop_response", "strip_conditions", "stall"]
#: Decides what to do with one request: ``rule(method, path, headers)``.
Rule = Callable[[str, str, dict[str, str]], Action]

_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
               "upgrade", "expect"}
_CONDITIONS = {"if-none-match", "if-match"}
#: The longest a stalled request is held if the test never releases it.
STALL_LIMIT_S = 300.0


@dataclass(frozen=True)
class Seen:
    method: str
    path: str  # URL path, unquoted, without the query
    conditional: bool  # carried If-None-Match / If-Match as sent by the client
    action: Action
    status: int | None  # what the client got; None = response dropped


class S3Proxy:
    """``with S3Proxy(moto_endpoint, rule) as proxy: ... proxy.endpoint ...``"""

    def __init__(self, upstream: str, rule: Rule | None = None) -> None:
        u = urlparse(upstream)
        self.upstream_host = u.hostname or "127.0.0.1"
        self.upstream_port = u.port or 80
        self.rule: Rule = rule or (lambda *_: "forward")
        self.seen: list[Seen] = []
        self._released = threading.Event()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-proxy", daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> S3Proxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=30)

    def release(self) -> None:
        """Let the stalled requests through (and every later one that a rule stalls)."""
        self._released.set()

    def record(self, seen: Seen) -> None:
        with self._lock:
            self.seen.append(seen)

    def requests(self, method: str | None = None, contains: str = "") -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if (method is None or s.method == method) and contains in s.path]

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive like real S3; also answers Expect: 100-continue

            def log_message(self, format: str, *args: object) -> None:
                return

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass  # trailers
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _handle(self) -> None:
                body = self._body()
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                path = unquote(urlparse(self.path).path)
                conditional = any(k.lower() in _CONDITIONS for k in headers)
                action = proxy.rule(self.command, path, headers)
                if action == "stall":
                    proxy._released.wait(STALL_LIMIT_S)
                if action == "strip_conditions":
                    headers = {k: v for k, v in headers.items() if k.lower() not in _CONDITIONS}
                if body or self.command in ("PUT", "POST"):
                    headers["Content-Length"] = str(len(body))
                conn = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=120)
                try:
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    resp_headers = resp.getheaders()
                    status, reason = resp.status, resp.reason
                finally:
                    conn.close()
                if action == "drop_response":
                    # The upstream applied the request; the client hears nothing and sees the
                    # connection close, exactly like a response lost on the network.
                    proxy.record(Seen(self.command, path, conditional, action, None))
                    self.close_connection = True
                    return
                proxy.record(Seen(self.command, path, conditional, action, status))
                self.send_response_only(status, reason)
                for k, v in resp_headers:
                    if k.lower() not in _HOP_BY_HOP and not (k.lower() == "content-length"
                                                               and self.command != "HEAD"):
                        self.send_header(k, v)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD" and data:
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        return Handler


def drop_first(n: int, method: str, contains: str) -> Rule:
    """Drop the response of the first ``n`` matching requests (``contains`` in the unquoted path)."""
    lock = threading.Lock()
    left = [n]

    def rule(m: str, path: str, headers: dict[str, str]) -> Action:
        if m != method or contains not in path or "/_freshidx/probe/" in path:
            return "forward"
        with lock:
            if left[0] <= 0:
                return "forward"
            left[0] -= 1
            return "drop_response"

    return rule


def stall_first(n: int, method: str | None = None, *, every_other: bool = False) -> Rule:
    """Stall the first ``n`` requests (of ``method``, or of any); ``every_other``: the 1st, 3rd, … (the
    request after a stalled one, e.g. its retry, is forwarded)."""
    lock = threading.Lock()
    left = [n]
    seen = [0]

    def rule(m: str, path: str, headers: dict[str, str]) -> Action:
        with lock:
            if left[0] <= 0 or (method is not None and m != method):
                return "forward"
            seen[0] += 1
            if every_other and seen[0] % 2 == 0:
                return "forward"
            left[0] -= 1
            return "stall"

    return rule


def strip_conditions(method: str, path: str, headers: dict[str, str]) -> Action:
    return "strip_conditions"
