"""A loopback HTTP proxy in front of an S3-protocol server that injects seeded faults, for
``freshidx bench chaos`` (:mod:`freshidx.tools.bench_chaos`).

Every request gets one fault, chosen by :func:`choose_fault` from a seeded generator:

* ``error``: answered ``500`` or ``503`` (an S3 error body) without reaching the server;
* ``drop``: the connection is closed before the request is forwarded (the server never sees it);
* ``lost``: forwarded (the server applies it), then the connection is closed without an answer, so
  the client never hears that a write landed;
* ``delay``: forwarded after :attr:`FaultRates.delay_s` seconds;
* ``forward``: forwarded as it is.

:meth:`FaultProxy.counts` says how many requests got each. The choice is pure (:func:`choose_fault`);
the proxy does the I/O. Requests are handled in threads, so a delayed one holds up nobody else.
"""

from __future__ import annotations

import collections
import http.client
import random
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal
from urllib.parse import urlparse

Fault = Literal["forward", "error", "drop", "lost", "delay"]
FAULTS: tuple[Fault, ...] = ("error", "drop", "lost", "delay")

_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
               "upgrade", "expect"}
_ERROR_BODY = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>injected by the "
               "chaos proxy</Message></Error>")
_ERROR_CODES = {500: "InternalError", 503: "SlowDown"}


@dataclass(frozen=True)
class FaultRates:
    """The share of requests that get each fault (the rest are forwarded as they are)."""

    error: float = 0.05
    drop: float = 0.01
    lost: float = 0.01
    delay: float = 0.02
    delay_s: float = 2.0

    def __post_init__(self) -> None:
        shares = (self.error, self.drop, self.lost, self.delay)
        if any(not 0.0 <= s <= 1.0 for s in shares) or sum(shares) > 1.0:
            raise ValueError(f"fault rates must be in [0, 1] and add up to at most 1, got {shares}")
        if self.delay_s < 0:
            raise ValueError(f"delay_s must be >= 0, got {self.delay_s}")


def choose_fault(draw: float, rates: FaultRates) -> Fault:
    """The fault of a request for a uniform ``draw`` in [0, 1)."""
    edge = 0.0
    for fault, share in zip(FAULTS, (rates.error, rates.drop, rates.lost, rates.delay), strict=True):
        edge += share
        if draw < edge:
            return fault
    return "forward"


class FaultProxy:
    """``with FaultProxy(upstream, rates, seed) as proxy: ... proxy.endpoint ...``"""

    def __init__(self, upstream: str, rates: FaultRates, seed: int, host: str = "127.0.0.1") -> None:
        u = urlparse(upstream)
        self.upstream_host = u.hostname or "127.0.0.1"
        self.upstream_port = u.port or 80
        self.rates = rates
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._counts: collections.Counter[str] = collections.Counter()
        self._server = _Server((host, 0), self)
        self._thread = threading.Thread(target=self._server.serve_forever, name="chaos-proxy", daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=30)

    def next_fault(self) -> Fault:
        with self._lock:
            fault = choose_fault(self._rng.random(), self.rates)
            self._counts["requests"] += 1
            self._counts[fault] += 1
            return fault

    def count(self, what: str) -> None:
        with self._lock:
            self._counts[what] += 1

    def counts(self) -> dict[str, int]:
        """Requests seen, and how many got each fault (``error_500``/``error_503`` split the errors)."""
        with self._lock:
            return {k: self._counts.get(k, 0) for k in ("requests", "forward", *FAULTS, "error_500", "error_503",
                                                         "upstream_failed", "client_gone")}

    def error_status(self) -> int:
        with self._lock:
            return self._rng.choice((500, 503))

    def forward(self, method: str, target: str, body: bytes, headers: dict[str, str]
                ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=120)
        try:
            conn.request(method, target, body=body or None, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.reason, resp.getheaders(), resp.read()
        finally:
            conn.close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], proxy: FaultProxy) -> None:
        super().__init__(address, _Handler)
        self.proxy = proxy


class _Handler(BaseHTTPRequestHandler):
    """Reads a request, applies its fault (:func:`choose_fault`), forwards it or not, answers it or not."""

    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive like real S3; also answers Expect: 100-continue

    def log_message(self, format: str, *args: object) -> None:
        return

    def handle(self) -> None:
        try:
            super().handle()
        except ConnectionError:  # the client went away mid-request (a killed process)
            self.server.proxy.count("client_gone")

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
        fault = self.server.proxy.next_fault()
        if fault == "drop":  # never forwarded: the client sees the connection close
            self.close_connection = True
            return
        if fault == "error":
            self._error(self.server.proxy.error_status())
            return
        if fault == "delay":
            time.sleep(self.server.proxy.rates.delay_s)  # the injected fault itself
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        if body or self.command in ("PUT", "POST"):
            headers["Content-Length"] = str(len(body))
        try:
            status, reason, resp_headers, data = self.server.proxy.forward(self.command, self.path, body, headers)
        except OSError:
            self.server.proxy.count("upstream_failed")
            self.close_connection = True
            return
        if fault == "lost":  # applied upstream; the answer never reaches the client
            self.close_connection = True
            return
        self._reply(status, reason, resp_headers, data)

    def _error(self, status: int) -> None:
        self.server.proxy.count(f"error_{status}")
        data = _ERROR_BODY.format(code=_ERROR_CODES[status]).encode()
        self._reply(status, None, [("Content-Type", "application/xml")], data)

    def _reply(self, status: int, reason: str | None, headers: list[tuple[str, str]], data: bytes) -> None:
        try:
            self._send(status, reason, headers, data)
        except ConnectionError:  # the client went away (a killed process): nothing to answer
            self.server.proxy.count("client_gone")
            self.close_connection = True

    def _send(self, status: int, reason: str | None, headers: list[tuple[str, str]], data: bytes) -> None:
        self.send_response_only(status, reason)
        for k, v in headers:
            if k.lower() not in _HOP_BY_HOP and not (k.lower() == "content-length" and self.command != "HEAD"):
                self.send_header(k, v)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD" and data:
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle
