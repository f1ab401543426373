"""Supervise a ``dagster dev`` process (webserver + daemon + code server).

Used by ``freshidx demo`` (UI on 127.0.0.1:3000) and by end-to-end tests (free loopback port), through
the webserver's GraphQL API (:mod:`freshidx.tools.devserver_graphql`), the same way the UI does it:

* readiness = ``/server_info`` answers, every code location is LOADED without a load error, and
  every required daemon reports healthy; a code location that fails to load raises
  :class:`CodeLocationLoadError` with the Python error immediately (no waiting for a timeout); so does
  a webserver that cannot bind its port (:meth:`DagsterDev._move_to_a_free_port`);
* runs are launched like the UI's "Materialize" button (``launchRun`` of ``__ASSET_JOB`` with an
  asset selection) and backfills like the UI's partition dialog (``launchPartitionBackfill``).

Started in its own session (process group), stopped with SIGINT to the group and SIGKILL as a fallback.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from types import TracebackType
from typing import Self

import requests

from freshidx.defs.shared.lanes import POOL_LIMITS
from freshidx.procs import group_members
from freshidx.tools.devserver_graphql import (
    ASSET_JOB_NAME,
    BACKFILL_TERMINAL_STATUSES,
    POLL_INTERVAL,
    RUN_TERMINAL_STATUSES,
    CodeLocationLoadError,
    DagsterDevError,
    GraphQLError,
    WebserverClient,
)

__all__ = [
    "ASSET_JOB_NAME",
    "BACKFILL_TERMINAL_STATUSES",
    "RUN_TERMINAL_STATUSES",
    "CodeLocationLoadError",
    "DagsterDev",
    "DagsterDevError",
    "DagsterDevExited",
    "GraphQLError",
    "WaitAborted",
    "WebserverPortTaken",
    "free_port",
    "packaged_dagster_yaml",
    "prepare_home",
    "process_group_pids",
]

_MINIMAL_DAGSTER_YAML = "telemetry:\n  enabled: false\n"
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class DagsterDevExited(DagsterDevError):
    """The ``dagster dev`` process exited while we were waiting for it."""


class WaitAborted(DagsterDevError):
    """``wait_ready``'s ``abort`` callback asked to stop waiting (e.g. the demo got SIGTERM)."""


class WebserverPortTaken(DagsterDevError):
    """The webserver could not bind its port: another process holds it."""


#: What the webserver (uvicorn) logs when its port is taken; how many other free ports a picked port may move to.
_BIND_FAILED, _PORT_RETRIES = b"error while attempting to bind on address", 3


# --------------------------------------------------------------------------------------------- helpers


def prepare_home(home: Path, dagster_yaml: Path | Traversable | None) -> Path:
    """Create ``home`` (a DAGSTER_HOME) and put a dagster.yaml in it.

    ``dagster_yaml`` (a file, or package data such as :func:`packaged_dagster_yaml`) is copied as is;
    with ``None`` a minimal instance config (telemetry off) is written.
    """
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    target = home / "dagster.yaml"
    if dagster_yaml is None:
        target.write_text(_MINIMAL_DAGSTER_YAML)
    elif not (isinstance(dagster_yaml, Path) and dagster_yaml.resolve() == target.resolve()):
        target.write_bytes(dagster_yaml.read_bytes())
    return home


def set_pool_limits(limits: Mapping[str, int], env: Mapping[str, str], log_path: Path) -> None:
    """Give the instance's pools their limits before its daemon starts (``dagster instance concurrency set``).
    A pool whose limit exists is enforced from the queue's first pass; one created from ``default_limit``
    only after the pass that first sees it (:data:`POOL_LIMITS`). One after the other: the first call
    creates a new instance's storage, and two at once would both create it."""
    failed = []
    with open(log_path, "ab") as log:
        for pool, limit in limits.items():
            code = subprocess.run(
                [sys.executable, "-m", "dagster", "instance", "concurrency", "set", pool, str(limit)],
                env=dict(env), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, check=False,
            ).returncode
            if code != 0:
                failed.append(pool)
    if failed:
        raise DagsterDevError(f"could not set the limits of pools {failed} (see {log_path})")


def packaged_dagster_yaml() -> Traversable:
    """The one-machine instance config (``freshidx/dagster_home/dagster.yaml``, package data: the same
    in a source checkout and an installed wheel; identical to the checkout's top-level ``dagster.yaml``)."""
    return files("freshidx") / "dagster_home" / "dagster.yaml"


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on ``host`` a moment ago (the usual bind-to-0 probe)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def process_group_pids(pgid: int) -> list[int]:
    """PIDs of live (non-zombie) processes in process group ``pgid``."""
    return group_members(pgid)


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


def _tail(path: Path, max_lines: int = 60, max_bytes: int = 64_000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            text = f.read().decode(errors="replace")
    except OSError as exc:
        return f"<could not read {path}: {exc}>"
    lines = _ANSI_RE.sub("", text).splitlines()
    return "\n".join(lines[-max_lines:])


# ------------------------------------------------------------------------------------------- DagsterDev


class DagsterDev(WebserverClient):
    """A supervised ``dagster dev`` subprocess; its GraphQL calls come from :class:`WebserverClient`.

    Exactly one of ``module`` / ``python_file`` / ``workspace`` selects the code (``-m`` / ``-f`` /
    ``-w``); when ``python_file`` or ``workspace`` is given, ``module`` is ignored. ``env`` is merged
    over ``os.environ``; ``DAGSTER_HOME`` is always ``home``.
    """

    def __init__(
        self,
        *,
        home: Path,
        port: int | None = None,
        host: str = "127.0.0.1",
        module: str | None = "freshidx.definitions",
        python_file: Path | None = None,
        workspace: Path | None = None,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        log_path: Path | None = None,
        pool_limits: Mapping[str, int] | None = None,
    ) -> None:
        if python_file is not None and workspace is not None:
            raise ValueError("pass at most one of python_file / workspace")
        if python_file is not None:
            self._target = ["-f", str(Path(python_file).resolve())]
        elif workspace is not None:
            self._target = ["-w", str(Path(workspace).resolve())]
        elif module is not None:
            self._target = ["-m", module]
        else:
            raise ValueError("one of module / python_file / workspace is required")
        super().__init__(host, port if port is not None else free_port(host))
        self._picked_port, self._port_retries, self._log_start = port is None, 0, 0
        self.home = Path(home).resolve()
        self._env = dict(env or {})
        self.cwd = Path(cwd) if cwd is not None else None
        self.log_path = Path(log_path) if log_path is not None else self.home / "dagster-dev.log"
        self.pool_limits = dict(POOL_LIMITS if pool_limits is None else pool_limits)
        self._proc: subprocess.Popen[bytes] | None = None
        self._pgid: int | None = None

    # ------------------------------------------------------------------ properties

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "freshidx.tools.dagster_main",  # `python -m dagster`, with SIGINT/SIGTERM always handled
            "dev",
            "-h",
            self.host,
            "-p",
            str(self.port),
            *self._target,
        ]

    @property
    def is_running(self) -> bool:
        """True while the ``dagster dev`` process is alive (a property, not a method)."""
        return self._proc is not None and self._proc.poll() is None

    def group_pids(self) -> list[int]:
        """Live processes left in the ``dagster dev`` process group (empty once fully stopped)."""
        return process_group_pids(self._pgid) if self._pgid is not None else []

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Self:
        if self._proc is not None:
            raise DagsterDevError("already started")
        self.check_port()
        self.home.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self._env, "DAGSTER_HOME": str(self.home)}
        # Left behind by a Spark Connect client in this process; would force runs into Connect mode.
        for var in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE"):
            if var not in self._env:
                env.pop(var, None)
        set_pool_limits(self.pool_limits, env, self.log_path)
        with open(self.log_path, "ab") as log:
            self._log_start = log.tell()  # this start's lines only (the log is appended to)
            self._proc = subprocess.Popen(
                self.command,
                env=env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._pgid = self._proc.pid  # new session => the child leads its own process group
        atexit.register(self.stop)
        return self

    def wait_ready(self, timeout: float = 300, abort: Callable[[], bool] | None = None) -> Self:
        """Poll until the webserver answers, every location is loaded and required daemons are healthy.

        Raises :class:`CodeLocationLoadError` as soon as a location reports a load error,
        :class:`DagsterDevExited` if the process dies, :class:`TimeoutError` after ``timeout`` seconds,
        :class:`WaitAborted` as soon as ``abort()`` returns True (a stop requested during start-up).
        """
        if self._proc is None:
            raise DagsterDevError("not started")
        deadline = time.monotonic() + timeout
        stage = "webserver /server_info"
        detail = ""
        while True:
            if abort is not None and abort():
                raise WaitAborted(f"stopped while waiting for {stage}")
            self.check_alive()
            try:
                if stage == "webserver /server_info":
                    code = self.server_info_status()
                    if code == 200:
                        stage = "code locations"
                    else:
                        detail = f"HTTP {code}"
                if stage == "code locations":
                    pending = self.refresh_workspace()
                    if not pending:
                        stage = "daemons"
                    else:
                        detail = f"not loaded: {pending}"
                if stage == "daemons":
                    unhealthy = self.unhealthy_daemons()
                    if not unhealthy:
                        return self
                    detail = f"unhealthy: {unhealthy}"
            except requests.RequestException as exc:
                detail = f"{type(exc).__name__}: {exc}"
                if stage == "webserver /server_info" and self._webserver_bind_failed():
                    self._move_to_a_free_port()
                    continue
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"dagster dev on {self.url} not ready after {timeout}s (waiting for {stage}; {detail})\n"
                    f"--- tail of {self.log_path} ---\n{_tail(self.log_path)}"
                )
            time.sleep(POLL_INTERVAL)

    def check_port(self) -> None:
        """Raise :class:`WebserverPortTaken` if something listens on the port (it would answer for the webserver)."""
        probe_host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        if _port_in_use(probe_host, self.port):
            raise WebserverPortTaken(f"{probe_host}:{self.port} is already in use")

    def _webserver_bind_failed(self) -> bool:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_start)
                return _BIND_FAILED in f.read()
        except OSError:
            return False

    def _move_to_a_free_port(self) -> None:
        """Start again on another free port: another process took the one this class picked after its probe
        (``dagster dev`` would run on without a webserver). A port the caller chose is theirs to free."""
        taken = self.port
        self.stop()
        if not self._picked_port or self._port_retries >= _PORT_RETRIES:
            raise WebserverPortTaken(f"the webserver could not bind {self.host}:{taken}: another process holds it "
                                     f"(see {self.log_path})")
        self._port_retries += 1
        self._proc = self._pgid = None
        self._port, self._client = free_port(self.host), None
        self._session = requests.Session()  # stop() closed the old one
        self.start()

    def stop(self, timeout: float = 90) -> int | None:
        """SIGINT the process group, wait up to ``timeout`` s, then SIGKILL. Idempotent.

        The deadline is generous: on a loaded 2-core box ``dagster dev`` took over 20 s to stop
        (webserver, daemon threads and code server each shut down in turn); a clean stop returns at once.

        Returns the exit code of ``dagster dev`` (None if it was never started).
        """
        proc, pgid = self._proc, self._pgid
        if proc is None or pgid is None:
            return None
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        self.close()  # drop keep-alive connections so the webserver has nothing to drain
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGINT)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
                proc.wait()
        # dagster dev is gone; give its children (webserver, daemon, code server, run workers) a
        # moment to follow, then kill whatever is left in the group.
        grace = time.monotonic() + min(5.0, max(timeout, 0.5))
        while process_group_pids(pgid) and time.monotonic() < grace:
            time.sleep(0.1)
        if process_group_pids(pgid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
            hard = time.monotonic() + 5.0
            while process_group_pids(pgid) and time.monotonic() < hard:
                time.sleep(0.05)
        return proc.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Block until ``dagster dev`` exits on its own (e.g. for ``freshidx demo``); return its exit code."""
        if self._proc is None:
            raise DagsterDevError("not started")
        return self._proc.wait(timeout)

    def __enter__(self) -> Self:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def check_alive(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            raise DagsterDevExited(
                f"dagster dev exited with code {self._proc.returncode}\n"
                f"--- tail of {self.log_path} ---\n{_tail(self.log_path)}"
            )
