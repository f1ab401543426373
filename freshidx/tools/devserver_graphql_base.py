"""The connection every webserver GraphQL call goes through (:class:`WebserverBase`): the endpoint, its
errors, and the workspace (which code location and repository the calls target, daemon health).

The calls themselves: runs in :mod:`freshidx.tools.devserver_graphql`, backfills in
:mod:`freshidx.tools.devserver_backfills`, sensors in :mod:`freshidx.tools.devserver_sensors`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import requests
from dagster_graphql import DagsterGraphQLClient

from freshidx.tools.devserver_graphql_documents import DAEMON_HEALTH_QUERY, WORKSPACE_QUERY

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


def check_union(result: dict[str, Any] | None, ok_typename: str, what: str) -> dict[str, Any]:
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


def key_path(asset_key: str) -> list[str]:
    """``"a/b"`` -> ``["a", "b"]``: an asset key as the GraphQL API takes it."""
    return [p for p in asset_key.split("/") if p]


class WebserverBase:
    """GraphQL against the webserver at ``http://host:port`` and its workspace; the calls are subclasses'."""

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

    # ------------------------------------------------------------------ workspace

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
