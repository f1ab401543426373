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

Runs are here; the connection and workspace are :mod:`freshidx.tools.devserver_graphql_base`, backfills
:mod:`freshidx.tools.devserver_backfills`, sensors :mod:`freshidx.tools.devserver_sensors`.
"""

from __future__ import annotations

import time
from typing import Any

from dagster_graphql.client.client_queries import TERMINATE_RUNS_JOB_MUTATION

from freshidx.tools.devserver_backfills import BACKFILL_TERMINAL_STATUSES, BackfillCalls
from freshidx.tools.devserver_graphql_base import (
    POLL_INTERVAL,
    CodeLocationLoadError,
    DagsterDevError,
    GraphQLError,
    check_union,
    key_path,
    poll_delays,
)
from freshidx.tools.devserver_graphql_documents import LAUNCH_RUN_MUTATION, RUN_ERRORS_QUERY
from freshidx.tools.devserver_sensors import SensorCalls

__all__ = [
    "ASSET_JOB_NAME",
    "BACKFILL_TERMINAL_STATUSES",
    "POLL_INTERVAL",
    "RUN_TERMINAL_STATUSES",
    "CodeLocationLoadError",
    "DagsterDevError",
    "GraphQLError",
    "WebserverClient",
    "poll_delays",
]

#: The implicit job every asset belongs to; what the UI's Materialize button launches.
ASSET_JOB_NAME = "__ASSET_JOB"
RUN_TERMINAL_STATUSES = frozenset({"SUCCESS", "FAILURE", "CANCELED"})


class WebserverClient(BackfillCalls, SensorCalls):
    """GraphQL calls against the webserver at ``http://host:port`` (``0.0.0.0`` is reached on loopback).

    :meth:`check_alive` is a hook for waits: :class:`DagsterDev` raises there once its process died.
    """

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
                "assetSelection": [{"path": key_path(k)} for k in asset_keys],
                "assetCheckSelection": [],
            },
            "runConfigData": run_config or {},
            "mode": "default",
            "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in (tags or {}).items()]},
        }
        data = self.graphql(LAUNCH_RUN_MUTATION, {"executionParams": params})
        result = check_union(data["launchRun"], "LaunchRunSuccess", f"materialize {asset_keys}")
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
        result = check_union(data["launchRun"], "LaunchRunSuccess", f"launch {job_name}")
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
