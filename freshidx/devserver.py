"""Supervise a ``dagster dev`` process (webserver + daemon + code server).

Used by ``freshidx demo`` (UI on 127.0.0.1:3000) and by end-to-end tests (free loopback port).
Everything is driven through the webserver's GraphQL API, the same way the UI does it:

* readiness = ``/server_info`` answers, every code location is LOADED without a load error, and
  every required daemon reports healthy; a code location that fails to load raises
  :class:`CodeLocationLoadError` with the Python error immediately (no waiting for a timeout);
* runs are launched like the UI's "Materialize" button (``launchRun`` of ``__ASSET_JOB`` with an
  asset selection) and backfills like the UI's partition dialog (``launchPartitionBackfill``).

The process is started in its own session (process group), stopped with SIGINT to the whole
group and SIGKILL as a fallback.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import requests
from dagster_graphql.client.client_queries import TERMINATE_RUNS_JOB_MUTATION
from dagster_graphql.client.query import LAUNCH_PARTITION_BACKFILL_MUTATION

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
    "free_port",
    "prepare_home",
    "process_group_pids",
]

#: The implicit job every asset belongs to; what the UI's Materialize button launches.
ASSET_JOB_NAME = "__ASSET_JOB"
RUN_TERMINAL_STATUSES = frozenset({"SUCCESS", "FAILURE", "CANCELED"})
BACKFILL_TERMINAL_STATUSES = frozenset({"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"})

_MINIMAL_DAGSTER_YAML = "telemetry:\n  enabled: false\n"
_POLL_INTERVAL = 0.25
_HTTP_TIMEOUT = 30.0
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class DagsterDevError(RuntimeError):
    """Base class for errors raised by :class:`DagsterDev`."""


class DagsterDevExited(DagsterDevError):
    """The ``dagster dev`` process exited while we were waiting for it."""


class CodeLocationLoadError(DagsterDevError):
    """A code location failed to load (the workspace reports a ``PythonError``).

    ``error_message`` joins the messages of the error and its causes (``DagsterUserCodeLoadError``
    wraps the real ``SyntaxError``/``ImportError``); ``stack`` is the innermost error's traceback.
    """

    def __init__(self, location: str, message: str, stack: str = "") -> None:
        super().__init__(f"code location {location!r} failed to load: {message}\n{stack}".rstrip())
        self.location = location
        self.error_message = message
        self.stack = stack


def _location_error(location: str, error: dict[str, Any]) -> CodeLocationLoadError:
    messages = [str(error.get("message") or "").strip()]
    stack = "".join(error.get("stack") or [])
    for link in error.get("errorChain") or []:
        cause = link.get("error") or {}
        prefix = "caused by" if link.get("isExplicitLink") else "while handling"
        messages.append(f"{prefix}: {str(cause.get('message') or '').strip()}")
        stack = "".join(cause.get("stack") or []) or stack
    return CodeLocationLoadError(location, "\n".join(messages), stack)


class GraphQLError(DagsterDevError):
    """The GraphQL endpoint answered with ``errors`` or the result was an error union member."""


class WaitAborted(DagsterDevError):
    """``wait_ready``'s ``abort`` callback asked to stop waiting (e.g. the demo got SIGTERM)."""


# --------------------------------------------------------------------------------------------- helpers


def prepare_home(home: Path, dagster_yaml: Path | None) -> Path:
    """Create ``home`` (a DAGSTER_HOME) and put a dagster.yaml in it.

    ``dagster_yaml`` is copied as is; with ``None`` a minimal instance config (telemetry off) is written.
    """
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    target = home / "dagster.yaml"
    if dagster_yaml is None:
        target.write_text(_MINIMAL_DAGSTER_YAML)
    elif Path(dagster_yaml).resolve() != target.resolve():
        shutil.copyfile(dagster_yaml, target)
    return home


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on ``host`` a moment ago (the usual bind-to-0 probe)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def process_group_pids(pgid: int) -> list[int]:
    """PIDs of live (non-zombie) processes in process group ``pgid`` (Linux ``/proc``).

    Falls back to ``killpg(pgid, 0)`` (which also counts zombies) where ``/proc`` is unavailable.
    """
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    pids: list[int] = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ..." - comm may contain spaces/parens, so split after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3 and fields[0] != "Z" and int(fields[2]) == pgid:
            pids.append(int(entry.name))
    return sorted(pids)


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


def _check_union(result: dict[str, Any] | None, ok_typename: str, what: str) -> dict[str, Any]:
    """Return ``result`` if its ``__typename`` is ``ok_typename``, else raise with its message."""
    if result is None:
        raise GraphQLError(f"{what}: empty result")
    typename = result.get("__typename")
    if typename != ok_typename:
        message = result.get("message") or ""
        if typename == "RunConfigValidationInvalid":
            message = "; ".join(f"{e.get('path')}: {e.get('message')}" for e in result.get("errors", []))
        stack = "".join(result.get("stack") or [])
        raise GraphQLError(f"{what} failed: {typename}: {message}\n{stack}".rstrip())
    return result


# ----------------------------------------------------------------------------------------------- queries

_WORKSPACE_QUERY = """
query FreshidxWorkspace {
  workspaceOrError {
    __typename
    ... on Workspace {
      locationEntries {
        name
        loadStatus
        locationOrLoadError {
          __typename
          ... on RepositoryLocation { name repositories { name } }
          ... on PythonError {
            message
            stack
            className
            errorChain { isExplicitLink error { message stack className } }
          }
        }
      }
    }
    ... on PythonError { message stack }
  }
}
"""

_DAEMON_HEALTH_QUERY = """
query FreshidxDaemonHealth {
  instance {
    daemonHealth {
      allDaemonStatuses { daemonType required healthy lastHeartbeatErrors { message } }
    }
  }
}
"""

_LAUNCH_RUN_MUTATION = """
mutation FreshidxLaunchRun($executionParams: ExecutionParams!) {
  launchRun(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { runId status } }
    ... on RunConfigValidationInvalid { errors { message path reason } }
    ... on Error { message }
    ... on PythonError { stack }
  }
}
"""

_RUN_STATUS_QUERY = """
query FreshidxRunStatus($runId: ID!) {
  runOrError(runId: $runId) {
    __typename
    ... on Run { runId status }
    ... on Error { message }
  }
}
"""

_BACKFILL_QUERY = """
query FreshidxBackfill($backfillId: String!) {
  partitionBackfillOrError(backfillId: $backfillId) {
    __typename
    ... on PartitionBackfill {
      id
      status
      numPartitions
      partitionNames
      error { message stack }
      runs(limit: 1000) { runId status tags { key value } }
    }
    ... on Error { message }
  }
}
"""

_CANCEL_BACKFILL_MUTATION = """
mutation FreshidxCancelBackfill($backfillId: String!) {
  cancelPartitionBackfill(backfillId: $backfillId) {
    __typename
    ... on CancelBackfillSuccess { backfillId }
    ... on Error { message }
    ... on PythonError { stack }
  }
}
"""

_SENSOR_FIELDS = """
  __typename
  ... on Sensor {
    name
    minIntervalSeconds
    sensorState {
      id
      selectorId
      status
      ticks(limit: $tickLimit) {
        tickId status timestamp runIds runKeys skipReason error { message }
      }
    }
  }
  ... on Error { message }
  ... on PythonError { stack }
"""

_SENSOR_QUERY = (
    "query FreshidxSensor($sensorSelector: SensorSelector!, $tickLimit: Int) {\n"
    "  sensorOrError(sensorSelector: $sensorSelector) {" + _SENSOR_FIELDS + "}\n}\n"
)

_START_SENSOR_MUTATION = (
    "mutation FreshidxStartSensor($sensorSelector: SensorSelector!, $tickLimit: Int) {\n"
    "  startSensor(sensorSelector: $sensorSelector) {" + _SENSOR_FIELDS + "}\n}\n"
)

_STOP_SENSOR_MUTATION = """
mutation FreshidxStopSensor($id: String!) {
  stopSensor(id: $id) {
    __typename
    ... on StopSensorMutationResult { instigationState { id status } }
    ... on Error { message }
    ... on PythonError { stack }
  }
}
"""


# ------------------------------------------------------------------------------------------- DagsterDev


class DagsterDev:
    """A supervised ``dagster dev`` subprocess plus a small GraphQL client for it.

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
        self.home = Path(home).resolve()
        self.host = host
        self._port = port if port is not None else free_port(host)
        self._env = dict(env or {})
        self.cwd = Path(cwd) if cwd is not None else None
        self.log_path = Path(log_path) if log_path is not None else self.home / "dagster-dev.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._pgid: int | None = None
        self._session = requests.Session()
        # location name -> repository names, filled by the workspace query
        self._locations: dict[str, list[str]] = {}

    # ------------------------------------------------------------------ properties

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        if ":" in host:  # IPv6 literal
            host = f"[{host}]"
        return f"http://{host}:{self._port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "dagster",
            "dev",
            "-h",
            self.host,
            "-p",
            str(self._port),
            *self._target,
        ]

    @property
    def location_name(self) -> str:
        """Name of the (first) loaded code location; helpers target this location."""
        return self._first_location()[0]

    @property
    def repository_name(self) -> str:
        """Name of the first repository of :attr:`location_name` (``__repository__`` for Definitions)."""
        return self._first_location()[1]

    @property
    def locations(self) -> dict[str, list[str]]:
        """Loaded code locations and their repository names (from the last workspace query)."""
        if not self._locations:
            self._refresh_workspace()
        return {k: list(v) for k, v in self._locations.items()}

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
        probe_host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        if _port_in_use(probe_host, self._port):
            # Otherwise /server_info would be answered by whatever already listens there.
            raise DagsterDevError(f"port {self._port} on {probe_host} is already in use")
        self.home.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self._env, "DAGSTER_HOME": str(self.home)}
        # Left behind by a Spark Connect client in this process; would force runs into Connect mode.
        for var in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE"):
            if var not in self._env:
                env.pop(var, None)
        with open(self.log_path, "ab") as log:
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

    def wait_ready(self, timeout: float = 180, abort: Callable[[], bool] | None = None) -> Self:
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
            self._check_alive()
            try:
                if stage == "webserver /server_info":
                    r = self._session.get(f"{self.url}/server_info", timeout=5)
                    if r.status_code == 200:
                        stage = "code locations"
                    else:
                        detail = f"HTTP {r.status_code}"
                if stage == "code locations":
                    pending = self._refresh_workspace()
                    if not pending:
                        stage = "daemons"
                    else:
                        detail = f"not loaded: {pending}"
                if stage == "daemons":
                    unhealthy = self._unhealthy_daemons()
                    if not unhealthy:
                        return self
                    detail = f"unhealthy: {unhealthy}"
            except requests.RequestException as exc:
                detail = f"{type(exc).__name__}: {exc}"
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"dagster dev on {self.url} not ready after {timeout}s (waiting for {stage}; {detail})\n"
                    f"--- tail of {self.log_path} ---\n{_tail(self.log_path)}"
                )
            time.sleep(_POLL_INTERVAL)

    def stop(self, timeout: float = 20) -> int | None:
        """SIGINT the process group, wait up to ``timeout`` s, then SIGKILL. Idempotent.

        Returns the exit code of ``dagster dev`` (None if it was never started).
        """
        proc, pgid = self._proc, self._pgid
        if proc is None or pgid is None:
            return None
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        self._session.close()  # drop keep-alive connections so the webserver has nothing to drain
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

    # ------------------------------------------------------------------ GraphQL

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        """POST a GraphQL document; return ``data``. Raises on HTTP errors and on ``errors``."""
        r = self._session.post(
            f"{self.url}/graphql",
            json={"query": query, "variables": variables or {}},
            timeout=_HTTP_TIMEOUT,
        )
        try:
            body = r.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and body.get("errors"):
            msgs = "; ".join(str(e.get("message", e)) for e in body["errors"])
            raise GraphQLError(f"GraphQL errors (HTTP {r.status_code}): {msgs}")
        r.raise_for_status()
        if not isinstance(body, dict) or not isinstance(body.get("data"), dict):
            raise GraphQLError(f"unexpected GraphQL response (HTTP {r.status_code}): {r.text[:500]}")
        return body["data"]

    # ------------------------------------------------------------------ runs

    def materialize(
        self,
        asset_keys: list[str],
        run_config: dict[str, Any] | None = None,
        tags: dict[str, str] | None = None,
    ) -> str:
        """Launch a run of ``__ASSET_JOB`` restricted to ``asset_keys``, like the UI's Materialize button.

        Asset keys use ``/`` between path components (``"a/b"`` -> ``["a", "b"]``). Returns the run id.
        """
        params: dict[str, Any] = {
            "selector": {
                "repositoryLocationName": self.location_name,
                "repositoryName": self.repository_name,
                "jobName": ASSET_JOB_NAME,
                "assetSelection": [{"path": _key_path(k)} for k in asset_keys],
                "assetCheckSelection": [],
            },
            "runConfigData": run_config or {},
            "mode": "default",
            "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in (tags or {}).items()]},
        }
        data = self.graphql(_LAUNCH_RUN_MUTATION, {"executionParams": params})
        result = _check_union(data["launchRun"], "LaunchRunSuccess", f"materialize {asset_keys}")
        return str(result["run"]["runId"])

    def terminate_runs(self, run_ids: list[str]) -> dict[str, str]:
        """Terminate runs like the UI's Terminate button; returns run id -> result typename."""
        if not run_ids:
            return {}
        data = self.graphql(TERMINATE_RUNS_JOB_MUTATION, {"runIds": list(run_ids)})
        result = data["terminateRuns"]
        if result.get("__typename") != "TerminateRunsResult":
            raise GraphQLError(f"terminateRuns failed: {result.get('__typename')}: {result.get('message')}")
        return {rid: str(r.get("__typename")) for rid, r in zip(run_ids, result["terminateRunResults"], strict=False)}

    def run_status(self, run_id: str) -> str:
        data = self.graphql(_RUN_STATUS_QUERY, {"runId": run_id})
        return str(_check_union(data["runOrError"], "Run", f"run {run_id}")["status"])

    def wait_run(self, run_id: str, timeout: float = 120) -> str:
        """Poll until the run reaches SUCCESS / FAILURE / CANCELED; return that status."""
        deadline = time.monotonic() + timeout
        status = ""
        while True:
            status = self.run_status(run_id)
            if status in RUN_TERMINAL_STATUSES:
                return status
            self._check_alive()
            if time.monotonic() >= deadline:
                raise TimeoutError(f"run {run_id} still {status} after {timeout}s")
            time.sleep(_POLL_INTERVAL)

    # ------------------------------------------------------------------ backfills

    def launch_partition_backfill(
        self,
        asset_key: str,
        partition_keys: list[str] | None = None,
        range: tuple[str, str] | None = None,
        title: str = "freshidx backfill",
        tags: dict[str, str] | None = None,
    ) -> str:
        """Launch an asset backfill like the UI's partition dialog; return the backfill id.

        Exactly one of ``partition_keys`` (explicit list) or ``range`` (inclusive start, end) is needed.
        """
        if (partition_keys is None) == (range is None):
            raise ValueError("pass exactly one of partition_keys / range")
        path = _key_path(asset_key)
        params: dict[str, Any] = {"title": title}
        if partition_keys is not None:
            params["assetSelection"] = [{"path": path}]
            params["partitionNames"] = list(partition_keys)
        else:
            assert range is not None
            params["partitionsByAssets"] = [
                {"assetKey": {"path": path}, "partitions": {"range": {"start": range[0], "end": range[1]}}}
            ]
        if tags:
            params["tags"] = [{"key": k, "value": v} for k, v in tags.items()]
        data = self.graphql(LAUNCH_PARTITION_BACKFILL_MUTATION, {"backfillParams": params})
        result = _check_union(data["launchPartitionBackfill"], "LaunchBackfillSuccess", f"backfill of {asset_key}")
        return str(result["backfillId"])

    def backfill_status(self, backfill_id: str) -> dict[str, Any]:
        """``{id, status, numPartitions, partitionNames, error, runs: [{runId, status, tags}]}``."""
        data = self.graphql(_BACKFILL_QUERY, {"backfillId": backfill_id})
        return _check_union(data["partitionBackfillOrError"], "PartitionBackfill", f"backfill {backfill_id}")

    def cancel_backfill(self, backfill_id: str) -> dict[str, Any]:
        """Cancel a backfill (``cancelPartitionBackfill``); return :meth:`backfill_status`."""
        data = self.graphql(_CANCEL_BACKFILL_MUTATION, {"backfillId": backfill_id})
        _check_union(data["cancelPartitionBackfill"], "CancelBackfillSuccess", f"cancel {backfill_id}")
        return self.backfill_status(backfill_id)

    def wait_backfill(self, backfill_id: str, timeout: float = 180) -> dict[str, Any]:
        """Poll until the backfill reaches a terminal status; return :meth:`backfill_status`."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.backfill_status(backfill_id)
            if status["status"] in BACKFILL_TERMINAL_STATUSES:
                return status
            self._check_alive()
            if time.monotonic() >= deadline:
                raise TimeoutError(f"backfill {backfill_id} still {status['status']} after {timeout}s")
            time.sleep(_POLL_INTERVAL)

    # ------------------------------------------------------------------ sensors

    def sensor_state(self, name: str, tick_limit: int = 10) -> dict[str, Any]:
        """``{name, id, selectorId, status, minIntervalSeconds, ticks: [...]}`` (newest tick first).

        ``id`` is the instigation-state id (what ``stopSensor`` takes); each tick has
        ``tickId status timestamp runIds runKeys skipReason error``.
        """
        variables = {"sensorSelector": self._sensor_selector(name), "tickLimit": tick_limit}
        data = self.graphql(_SENSOR_QUERY, variables)
        return _flatten_sensor(_check_union(data["sensorOrError"], "Sensor", f"sensor {name}"))

    def start_sensor(self, name: str) -> dict[str, Any]:
        """Start (enable) a sensor; return its :meth:`sensor_state`."""
        variables = {"sensorSelector": self._sensor_selector(name), "tickLimit": 0}
        data = self.graphql(_START_SENSOR_MUTATION, variables)
        _check_union(data["startSensor"], "Sensor", f"start sensor {name}")
        return self.sensor_state(name)

    def stop_sensor(self, name: str) -> dict[str, Any]:
        """Stop (disable) a sensor; return its :meth:`sensor_state`."""
        state_id = self.sensor_state(name, tick_limit=0)["id"]
        data = self.graphql(_STOP_SENSOR_MUTATION, {"id": state_id})
        _check_union(data["stopSensor"], "StopSensorMutationResult", f"stop sensor {name}")
        return self.sensor_state(name)

    # ------------------------------------------------------------------ internals

    def _sensor_selector(self, name: str) -> dict[str, str]:
        return {
            "repositoryLocationName": self.location_name,
            "repositoryName": self.repository_name,
            "sensorName": name,
        }

    def _first_location(self) -> tuple[str, str]:
        if not self._locations:
            pending = self._refresh_workspace()
            if pending:
                raise DagsterDevError(f"code locations not loaded yet: {pending}")
        for location, repos in self._locations.items():
            if repos:
                return location, repos[0]
        raise DagsterDevError(f"no loaded code location with a repository: {self._locations}")

    def _refresh_workspace(self) -> list[str]:
        """Query the workspace; return names of locations still loading (empty = all loaded).

        Raises :class:`CodeLocationLoadError` for the first location that reports a PythonError.
        """
        data = self.graphql(_WORKSPACE_QUERY)
        ws = data["workspaceOrError"]
        if ws.get("__typename") != "Workspace":
            raise GraphQLError(f"workspace query failed: {ws.get('__typename')}: {ws.get('message')}")
        entries = ws.get("locationEntries") or []
        if not entries:
            return ["<no locations yet>"]
        locations: dict[str, list[str]] = {}
        pending: list[str] = []
        for entry in entries:
            loc = entry.get("locationOrLoadError") or {}
            if loc.get("__typename") == "PythonError":
                raise _location_error(entry["name"], loc)
            if entry.get("loadStatus") != "LOADED" or loc.get("__typename") != "RepositoryLocation":
                pending.append(f"{entry['name']}={entry.get('loadStatus')}")
                continue
            locations[entry["name"]] = [r["name"] for r in loc.get("repositories") or []]
        self._locations = locations
        return pending

    def _unhealthy_daemons(self) -> list[str]:
        data = self.graphql(_DAEMON_HEALTH_QUERY)
        statuses = data["instance"]["daemonHealth"]["allDaemonStatuses"]
        unhealthy = []
        for s in statuses:
            if s.get("required") and not s.get("healthy"):
                errors = [e.get("message", "") for e in s.get("lastHeartbeatErrors") or []]
                unhealthy.append(f"{s['daemonType']}{' (' + '; '.join(errors) + ')' if errors else ''}")
        return unhealthy

    def _check_alive(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            raise DagsterDevExited(
                f"dagster dev exited with code {self._proc.returncode}\n"
                f"--- tail of {self.log_path} ---\n{_tail(self.log_path)}"
            )


def _key_path(asset_key: str) -> list[str]:
    return [p for p in asset_key.split("/") if p]


def _flatten_sensor(sensor: dict[str, Any]) -> dict[str, Any]:
    state = sensor.get("sensorState") or {}
    return {
        "name": sensor.get("name"),
        "id": state.get("id"),
        "selectorId": state.get("selectorId"),
        "status": state.get("status"),
        "minIntervalSeconds": sensor.get("minIntervalSeconds"),
        "ticks": state.get("ticks") or [],
    }
