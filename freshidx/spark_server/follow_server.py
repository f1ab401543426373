"""Client side: a Connect session of a supervised server stops retrying a JVM the supervisor has replaced.

pyspark retries an RPC that finds no server (``UNAVAILABLE``) with an exponential backoff (the runs'
sessions cap one wait at 2 s, ~25 s in all: ``CONNECT_MAX_BACKOFF_MS`` of the ``spark`` resource). That is
right while the supervisor restarts the JVM on the same URL. Once it has promoted its warm spare
(:mod:`freshidx.spark_server.spare`) to serve on another URL, the old one never answers again, and a
micro-batch in flight would wait out its retries (~30-40 s seen) before failing. The session's retry
policies stay as they are, except that they give up once the supervisor's state says ``up`` at another URL:
the call fails at its next retry, the run drops its session and lease, and its retry leases the promoted JVM.
"""

from __future__ import annotations

import copy
from typing import Any

from freshidx.spark_server.control_client import ServerControl


def url_moved(state: dict[str, Any] | None, url: str) -> bool:
    """Whether the supervisor's ``state`` says its server is up at another URL than ``url``."""
    return bool(state) and state.get("status") == "up" and bool(state.get("url")) and state.get("url") != url  # type: ignore[union-attr]


def follow_promotions(session: Any, control: ServerControl, url: str) -> None:
    """Make Connect ``session`` (on ``url``, leased from ``control``) give up retrying once the server is up
    elsewhere; its retry policies (backoff, retry counts) are kept otherwise, and a state that cannot be read
    keeps them retrying."""
    client = getattr(session, "client", None)
    if client is None or not hasattr(client, "get_retry_policies"):
        return

    def moved() -> bool:
        try:
            return url_moved(control.state(), url)
        except Exception:
            return False

    def following(policy: Any) -> Any:
        inner = policy.can_retry
        out = copy.copy(policy)
        out.can_retry = lambda e: inner(e) and not moved()  # (asked only after a failed call)
        return out

    client.set_retry_policies([following(p) for p in client.get_retry_policies()])
