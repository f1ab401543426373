"""The Dagster side of ``freshidx demo``, as three supervised processes instead of one ``dagster dev``.

``dagster dev`` exits (and took the whole demo with it) when its webserver or daemon dies, although the
UI is not on the data path. The demo therefore starts what ``dagster dev`` starts, with the same flags
and environment (dagster/_cli/dev.py), each as a child of its own that
:class:`~freshidx.tools.demo_supervisor.Supervisor` restarts:

* ``code-server``: ``dagster code-server start -m freshidx.definitions`` on a free loopback port (the
  proxy ``dagster dev`` runs too, so the UI's "Reload" reloads the code); runs are launched by it, so
  run workers are its descendants;
* ``webserver``: ``dagster-webserver -w <home>/workspace.yaml`` (the workspace names that port);
* ``daemon``: ``dagster-daemon run -w <home>/workspace.yaml``.

A restarted code server listens on the same port; the webserver and the daemon reconnect to it by
themselves (Dagster watches a ``grpc_server`` location's server id). A run worker keeps running when its
code server dies (it is a separate process), so the continuous delta run keeps publishing.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import requests
import yaml

from freshidx.defs.shared.lanes import POOL_LIMITS
from freshidx.tools.demo_supervisor import Supervisor, stop_children
from freshidx.tools.devserver import WaitAborted, WebserverPortTaken, set_pool_limits
from freshidx.tools.devserver_graphql import WebserverClient

#: The location name ``dagster dev -m freshidx.definitions`` gives the code (runs and tests refer to it).
LOCATION = "freshidx.definitions"
HOST = "127.0.0.1"
#: Seconds each Dagster process gets to stop after SIGINT before its group is killed.
STOP_GRACE_S = 60.0
#: What the webserver (uvicorn) logs when its port is taken.
_BIND_FAILED = b"error while attempting to bind on address"


def port_in_use(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


@dataclass(frozen=True)
class DagsterCommands:
    """The three command lines, with ``dagster dev``'s flags (its log levels and formats, the instance ref)."""

    web_port: int
    code_port: int
    workspace: Path
    instance_ref: str
    startup_timeout: int

    def code_server(self) -> list[str]:
        return [sys.executable, "-m", "dagster", "code-server", "start", "--host", HOST, "--port", str(self.code_port),
                "--log-level", "warning", "--inject-env-vars-from-instance", "--instance-ref", self.instance_ref,
                "--location-name", LOCATION, "--startup-timeout", str(self.startup_timeout), "-m", LOCATION]

    def webserver(self) -> list[str]:
        return [sys.executable, "-m", "dagster_webserver", "--host", HOST, "--port", str(self.web_port),
                "--dagster-log-level", "info", "--log-format", "colored", "--live-data-poll-rate", "2000",
                *self._shared()]

    def daemon(self) -> list[str]:
        return [sys.executable, "-m", "dagster._daemon", "run", "--log-level", "info", "--log-format", "colored",
                *self._shared()]

    def _shared(self) -> list[str]:
        return ["--instance-ref", self.instance_ref, "--code-server-log-level", "warning",
                "--workspace", str(self.workspace)]


def workspace_yaml(code_port: int) -> str:
    """The workspace the webserver and the daemon load: the one code server, like ``dagster dev``'s."""
    return yaml.safe_dump({"load_from": [{"grpc_server": {"host": HOST, "port": code_port,
                                                          "location_name": LOCATION}}]})


def dagster_env(env: dict[str, str], dagster_home: Path) -> dict[str, str]:
    """The processes' environment: the demo's, ``env`` over it, and what ``dagster dev`` sets."""
    out = {**os.environ, **env, "DAGSTER_HOME": str(dagster_home), "DAGSTER_IS_DEV_CLI": "1", "DAGSTER_verbose": ""}
    # Left behind by a Spark Connect client in this process; would force runs into Connect mode.
    for var in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE"):
        if var not in env:
            out.pop(var, None)
    return out


class DagsterParts:
    """Starts the code server, webserver and daemon under ``sup``, waits for them, stops them; the
    GraphQL calls (Terminate, readiness) go to the webserver through :attr:`client`."""

    def __init__(self, sup: Supervisor, commands: DagsterCommands, env: dict[str, str], logs: Path) -> None:
        self.sup, self.commands, self.env, self.logs = sup, commands, env, logs
        self.client = WebserverClient(HOST, commands.web_port)
        self._web_log_start = 0

    @property
    def url(self) -> str:
        return self.client.url

    @property
    def is_running(self) -> bool:
        """The webserver and the code server run: what Terminate (the stop's first step) needs."""
        return all((c := self.sup.get(n)) is not None and c.running for n in ("webserver", "code-server"))

    def start_code_server(self) -> None:
        self.commands.workspace.write_text(workspace_yaml(self.commands.code_port))
        # Pools get their limits before any daemon runs (as DagsterDev does); then the code server.
        set_pool_limits(POOL_LIMITS, self.env, self.logs / "dagster-instance.log")
        self.sup.add("code-server", lambda _: self._popen(self.commands.code_server(), "code-server.log"),
                     self.logs / "code-server.log")

    def start_ui_and_daemon(self) -> None:
        self.sup.add("webserver", self._start_webserver, self.logs / "webserver.log")
        self.sup.add("daemon", lambda _: self._popen(self.commands.daemon(), "daemon.log"), self.logs / "daemon.log")

    def _start_webserver(self, _: int) -> subprocess.Popen[bytes]:
        log = self.logs / "webserver.log"
        self._web_log_start = log.stat().st_size if log.exists() else 0
        return self._popen(self.commands.webserver(), "webserver.log")

    def _popen(self, cmd: list[str], log_name: str) -> subprocess.Popen[bytes]:
        # Each in a session of its own: a terminal's Ctrl-C reaches only the demo, which stops them in order.
        # The demo handles SIGINT, so the child starts with the default (Python's KeyboardInterrupt) whatever
        # the demo inherited.
        with open(self.logs / log_name, "ab") as log:
            return subprocess.Popen(cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    def wait_code_server(self, timeout: float, abort: Callable[[], bool]) -> None:
        """Until the code server listens (the proxy binds its port only once the code is loaded)."""
        self._until(lambda: port_in_use(self.commands.code_port), timeout, abort,
                    f"the code server on {HOST}:{self.commands.code_port} (log: {self.logs / 'code-server.log'})")

    def wait_ready(self, timeout: float, abort: Callable[[], bool]) -> None:
        """Until the webserver answers, the location is loaded and the required daemons are healthy.
        Raises :class:`WaitAborted`, :class:`WebserverPortTaken`, ``CodeLocationLoadError``, ``TimeoutError``."""

        def ready() -> bool:
            try:
                return (self.client.server_info_status() == 200 and not self.client.refresh_workspace()
                        and not self.client.unhealthy_daemons())
            except requests.RequestException:
                if self._webserver_bind_failed():
                    raise WebserverPortTaken(f"{HOST}:{self.commands.web_port} is already in use") from None
                return False

        self._until(ready, timeout, abort, f"the Dagster UI on {self.url} (logs: {self.logs})")

    def _until(self, done: Callable[[], bool], timeout: float, abort: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if abort():
                raise WaitAborted(f"stopped while waiting for {what}")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"not ready after {timeout:.0f}s: {what}")
            self.sup.poll()  # a part that crashes while starting is restarted meanwhile
            time.sleep(0.5)

    def _webserver_bind_failed(self) -> bool:
        try:
            with open(self.logs / "webserver.log", "rb") as f:
                f.seek(self._web_log_start)
                return _BIND_FAILED in f.read()
        except OSError:
            return False

    def terminate_runs(self, run_ids: list[str]) -> dict[str, str]:
        """Terminate runs like the UI's button (through the webserver)."""
        return self.client.terminate_runs(run_ids)

    def stop(self, timeout: float = STOP_GRACE_S) -> None:
        """Stop the three at once: SIGINT, up to ``timeout`` s, then SIGKILL of their groups. Run workers
        still in the code server's group get the SIGINT too (as under ``dagster dev``)."""
        self.client.close()
        parts = [c for n in ("daemon", "webserver", "code-server") if (c := self.sup.get(n)) is not None]
        stop_children(parts, timeout, signal.SIGINT)

