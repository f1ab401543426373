"""GraphQL access to a Dagster webserver: what the UI does, as calls (used by :class:`DagsterDev`).

Readiness questions (workspace loaded, daemons healthy), runs like the UI's Materialize and
Terminate buttons, partition backfills like its partition dialog, and sensors. Run status goes
through ``dagster_graphql.DagsterGraphQLClient``; the rest is hand-written (the documents:
:mod:`freshidx.tools.devserver_graphql_documents`) because the client has no call for it: workspace
load errors, daemon health, backfills, sensors, and launching an asset run with an empty
asset-check selection (the client's ``submit_job_execution`` cannot pass ``assetCheckSelection``,
and leaving it out would run every check of the selected assets too). ``terminate_runs`` uses the
client's mutation document but not its call, which raises when one run had already ended; here
that is a per-run result.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import requests
from dagster_graphql import DagsterGraphQLClient
from dagster_graphql.client.client_queries import TERMINATE_RUNS_JOB_MUTATION
from dagster_graphql.client.query import LAUNCH_PARTITION_BACKFILL_MUTATION

from freshidx.tools.devserver_graphql_documents import (
    BACKFILL_QUERY,
    CANCEL_BACKFILL_MUTATION,
    DAEMON_HEALTH_QUERY,
    LAUNCH_RUN_MUTATION,
    RUN_ERRORS_QUERY,
    SENSOR_QUERY,
    START_SENSOR_MUTATION,
    STOP_SENSOR_MUTATION,
    WORKSPACE_QUERY,
)

__all__ = [
    "ASSET_JOB_NAME",
    "BACKFILL_TERMINAL_STATUSES",
    "RUN_TERMINAL_STATUSES",
    "CodeLocationLoadError",
    "DagsterDevError",
    "GraphQLError",
    "WebserverClient",
]

#: The implicit job every asset belongs to; what the UI's Materialize button launches.
ASSET_JOB_NAME = "__ASSET_JOB"
RUN_TERMINAL_STATUSES = frozenset({"SUCCESS", "FAILURE", "CANCELED"})
BACKFILL_TERMINAL_STATUSES = frozenset({"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"})

POLL_INTERVAL = 0.25
_HTTP_TIMEOUT = 30


def poll_delays(first: float = 0.1, factor: float = 1.5, cap: float = 1.0) -> Iterator[float]:
    """The sleeps between the polls of a wait that may last a minute (a run): quick at first, then ``cap``
    apart. Each poll is a GraphQL request the webserver parses, validates and answers (in the suite, with
    the daemon and a run on the same 2 cores); a minute's wait costs ~65 of them instead of 240 at
    :data:`POLL_INTERVAL`, and a run's end is seen at most ``cap`` late."""
    delay = first
    while True:
        yield delay
        delay = min(cap, delay * factor)


class DagsterDevError(RuntimeError):
    """Base class for errors raised by :class:`DagsterDev` and its GraphQL calls."""


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


class GraphQLError(DagsterDevError):
    """The GraphQL endpoint answered with ``errors`` or the result was an error union member."""


def _location_error(location: str, error: dict[str, Any]) -> CodeLocationLoadError:
    messages = [str(error.get("message") or "").strip()]
    stack = "".join(error.get("stack") or [])
    for link in error.get("errorChain") or []:
        cause = link.get("error") or {}
        prefix = "caused by" if link.get("isExplicitLink") else "while handling"
        messages.append(f"{prefix}: {str(cause.get('message') or '').strip()}")
        stack = "".join(cause.get("stack") or []) or stack
    return CodeLocationLoadError(location, "\n".join(messages), stack)


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


# ----------------------------------------------------------------------------------------------- client


class WebserverClient:
    """GraphQL calls against the webserver at ``http://host:port`` (``0.0.0.0`` is reached on loopback).

    :meth:`check_alive` is a hook for waits: :class:`DagsterDev` raises there once its process died.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self._port = port
        self._session = requests.Session()
        self._client: DagsterGraphQLClient | None = None
        # location name -> repository names, filled by the workspace query
        self._locations: dict[str, list[str]] = {}

    @property
    def port(self) -> int:
        return self._port

    @property
    def _url_host(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"[{host}]" if ":" in host else host  # IPv6 literal

    @property
    def url(self) -> str:
        return f"http://{self._url_host}:{self._port}"

    @property
    def client(self) -> DagsterGraphQLClient:
        """Dagster's own GraphQL client for this webserver (connects per call)."""
        if self._client is None:
            self._client = DagsterGraphQLClient(self._url_host, port_number=self._port, timeout=_HTTP_TIMEOUT)
        return self._client

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
            self.refresh_workspace()
        return {k: list(v) for k, v in self._locations.items()}

    def close(self) -> None:
        """Drop keep-alive connections (so a stopping webserver has nothing to drain)."""
        self._session.close()

    def check_alive(self) -> None:
        """Raise if the server is known to be gone (no process to watch here)."""

    def server_info_status(self) -> int:
        """HTTP status of ``/server_info`` (200 once the webserver serves)."""
        return self._session.get(f"{self.url}/server_info", timeout=5).status_code

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
        # Not DagsterGraphQLClient.submit_job_execution: it cannot pass assetCheckSelection, and
        # without it the run would also execute every check of the selected assets.
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
        data = self.graphql(LAUNCH_RUN_MUTATION, {"executionParams": params})
        result = _check_union(data["launchRun"], "LaunchRunSuccess", f"materialize {asset_keys}")
        return str(result["run"]["runId"])

    def launch_job(self, job_name: str, tags: dict[str, str] | None = None,
                   run_config: dict[str, Any] | None = None) -> str:
        """Launch a run of a named job, like the job page's Launch button; returns the run id."""
        params: dict[str, Any] = {
            "selector": {"repositoryLocationName": self.location_name, "repositoryName": self.repository_name,
                         "jobName": job_name},
            "runConfigData": run_config or {},
            "mode": "default",
            "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in (tags or {}).items()]},
        }
        data = self.graphql(LAUNCH_RUN_MUTATION, {"executionParams": params})
        result = _check_union(data["launchRun"], "LaunchRunSuccess", f"launch {job_name}")
        return str(result["run"]["runId"])

    def terminate_runs(self, run_ids: list[str]) -> dict[str, str]:
        """Terminate runs like the UI's Terminate button; returns run id -> result typename."""
        if not run_ids:
            return {}
        # The client's terminate_runs raises when any run had already ended (a race the demo's stop
        # expects); its mutation document is used, with one result per run.
        data = self.graphql(TERMINATE_RUNS_JOB_MUTATION, {"runIds": list(run_ids)})
        result = data["terminateRuns"]
        if result.get("__typename") != "TerminateRunsResult":
            raise GraphQLError(f"terminateRuns failed: {result.get('__typename')}: {result.get('message')}")
        return {rid: str(r.get("__typename")) for rid, r in zip(run_ids, result["terminateRunResults"], strict=False)}

    def run_status(self, run_id: str) -> str:
        """The run's status name (``"SUCCESS"``, ...), through ``DagsterGraphQLClient.get_run_status``
        (which raises ``DagsterGraphQLClientError`` for an unknown run or an unreachable server)."""
        return self.client.get_run_status(run_id).value

    def wait_run(self, run_id: str, timeout: float = 120) -> str:
        """Poll until the run reaches SUCCESS / FAILURE / CANCELED; return that status."""
        deadline = time.monotonic() + timeout
        status = ""
        for delay in poll_delays():
            status = self.run_status(run_id)
            if status in RUN_TERMINAL_STATUSES:
                break
            self.check_alive()
            if time.monotonic() >= deadline:
                raise TimeoutError(f"run {run_id} still {status} after {timeout}s")
            time.sleep(delay)
        return status

    def run_errors(self, run_id: str, max_events: int = 20_000) -> list[str]:
        """The run's error events, oldest first, one line each
        (``EventType [step]: message: ErrorClass: error[: caused by CauseClass: cause]``).

        What a failed run's page shows in red, for an assertion message: a test that sees FAILURE can
        say why without the run's log (which CI does not keep). Reads at most ``max_events`` events."""
        lines: list[str] = []
        cursor: str | None = None
        seen = 0
        while seen < max_events:
            data = self.graphql(RUN_ERRORS_QUERY, {"runId": run_id, "afterCursor": cursor})["logsForRun"]
            if data.get("__typename") != "EventConnection":
                return [f"{data.get('__typename')}: {data.get('message')}"]
            for e in data["events"]:
                err = e.get("error")
                if not err:
                    continue
                step = f" [{e['stepKey']}]" if e.get("stepKey") else ""
                parts = [f"{e['__typename']}{step}", str(e.get("message"))]
                parts.append(f"{err.get('className')}: {(err.get('message') or '').strip()}")
                cause = err.get("cause")
                if cause:
                    parts.append(f"caused by {cause.get('className')}: {(cause.get('message') or '').strip()}")
                lines.append(": ".join(parts))
            seen += len(data["events"])
            cursor = data["cursor"]
            if not data["hasMore"]:
                break
        return lines

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
        data = self.graphql(BACKFILL_QUERY, {"backfillId": backfill_id})
        return _check_union(data["partitionBackfillOrError"], "PartitionBackfill", f"backfill {backfill_id}")

    def cancel_backfill(self, backfill_id: str) -> dict[str, Any]:
        """Cancel a backfill (``cancelPartitionBackfill``); return :meth:`backfill_status`."""
        data = self.graphql(CANCEL_BACKFILL_MUTATION, {"backfillId": backfill_id})
        _check_union(data["cancelPartitionBackfill"], "CancelBackfillSuccess", f"cancel {backfill_id}")
        return self.backfill_status(backfill_id)

    # ------------------------------------------------------------------ sensors

    def sensor_state(self, name: str, tick_limit: int = 10) -> dict[str, Any]:
        """``{name, id, selectorId, status, minIntervalSeconds, ticks: [...]}`` (newest tick first).

        ``id`` is the instigation-state id (what ``stopSensor`` takes); each tick has
        ``tickId status timestamp endTimestamp runIds runKeys skipReason error``.
        """
        variables = {"sensorSelector": self._sensor_selector(name), "tickLimit": tick_limit}
        data = self.graphql(SENSOR_QUERY, variables)
        return _flatten_sensor(_check_union(data["sensorOrError"], "Sensor", f"sensor {name}"))

    def start_sensor(self, name: str, timeout: float = 120) -> dict[str, Any]:
        """Start (enable) a sensor; return its :meth:`sensor_state` once the status holds."""
        def start() -> None:
            variables = {"sensorSelector": self._sensor_selector(name), "tickLimit": 0}
            _check_union(self.graphql(START_SENSOR_MUTATION, variables)["startSensor"], "Sensor",
                         f"start sensor {name}")

        return self._set_sensor_status(name, "RUNNING", start, timeout)

    def stop_sensor(self, name: str, timeout: float = 120, *, settle_with: str | None = None) -> dict[str, Any]:
        """Stop (disable) a sensor; return its :meth:`sensor_state` once the status holds.

        ``settle_with``: a sensor that ticks once per daemon loop (freshidx's ``freshidx_run_health_sensor``).
        The daemon reads which sensors run when a loop begins, so a loop already under way may still start a
        tick of the stopped sensor, and a freshidx delta tick then watches for new data for seconds. With
        ``settle_with``, return only once two of its ticks began after the stop (a loop that began after
        it) and the stopped sensor has no tick in flight: nothing written afterwards can reach it. A tick
        that read the sensor's state before the stop writes it back, RUNNING, as it begins (Dagster's
        ``mark_sensor_state_for_tick``): then the sensor is stopped again and the settling starts over."""
        def stop() -> None:
            state_id = self.sensor_state(name, tick_limit=0)["id"]
            _check_union(self.graphql(STOP_SENSOR_MUTATION, {"id": state_id})["stopSensor"],
                         "StopSensorMutationResult", f"stop sensor {name}")

        stopped_at = time.time()
        state = self._set_sensor_status(name, "STOPPED", stop, timeout)
        if settle_with is None:
            return state
        deadline = time.monotonic() + timeout
        while True:
            loops = [t for t in self.sensor_state(settle_with, tick_limit=5)["ticks"]
                     if t["timestamp"] > stopped_at and t["status"] != "STARTED"]
            state = self.sensor_state(name, tick_limit=1)
            ticks = state["ticks"]
            in_flight = bool(ticks and ticks[0]["status"] == "STARTED")
            if state["status"] != "STOPPED" and not in_flight:
                stopped_at = time.time()
                self._set_sensor_status(name, "STOPPED", stop, max(1.0, deadline - time.monotonic()))
                continue
            if len(loops) >= 2 and not in_flight:
                return self.sensor_state(name)
            if time.monotonic() >= deadline:
                raise DagsterDevError(f"sensor {name} stopped, but no two daemon loops of {settle_with} "
                                      f"after it within {timeout}s")
            time.sleep(POLL_INTERVAL)

    def _set_sensor_status(self, name: str, want: str, mutate: Callable[[], None], timeout: float) -> dict[str, Any]:
        """Apply ``mutate`` until the sensor's status is ``want`` with no tick in flight: a tick that
        started before the mutation can write back the status it read (seen once on a loaded box). An
        HTTP 5xx is retried too: on PostgreSQL the stop mutation failed with 500 once right after start-up,
        while the daemon ran the sensor's first tick (likely both writing its state row)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                mutate()
            except requests.HTTPError as exc:
                status = exc.response.status_code if exc.response is not None else 0
                if status < 500 or time.monotonic() >= deadline:
                    raise
                time.sleep(POLL_INTERVAL)
                continue
            while (st := self.sensor_state(name, tick_limit=1))["ticks"] and st["ticks"][0]["status"] == "STARTED":
                if time.monotonic() >= deadline:
                    break
                time.sleep(POLL_INTERVAL)
            if st["status"] == want:
                return self.sensor_state(name)
            if time.monotonic() >= deadline:
                raise DagsterDevError(f"sensor {name} is {st['status']}, not {want}, after {timeout}s")

    # ------------------------------------------------------------------ workspace

    def _sensor_selector(self, name: str) -> dict[str, str]:
        return {
            "repositoryLocationName": self.location_name,
            "repositoryName": self.repository_name,
            "sensorName": name,
        }

    def _first_location(self) -> tuple[str, str]:
        if not self._locations:
            pending = self.refresh_workspace()
            if pending:
                raise DagsterDevError(f"code locations not loaded yet: {pending}")
        for location, repos in self._locations.items():
            if repos:
                return location, repos[0]
        raise DagsterDevError(f"no loaded code location with a repository: {self._locations}")

    def refresh_workspace(self) -> list[str]:
        """Query the workspace; return names of locations still loading (empty = all loaded).

        Raises :class:`CodeLocationLoadError` for the first location that reports a PythonError.
        """
        data = self.graphql(WORKSPACE_QUERY)
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

    def unhealthy_daemons(self) -> list[str]:
        data = self.graphql(DAEMON_HEALTH_QUERY)
        statuses = data["instance"]["daemonHealth"]["allDaemonStatuses"]
        unhealthy = []
        for s in statuses:
            if s.get("required") and not s.get("healthy"):
                errors = [e.get("message", "") for e in s.get("lastHeartbeatErrors") or []]
                unhealthy.append(f"{s['daemonType']}{' (' + '; '.join(errors) + ')' if errors else ''}")
        return unhealthy


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
