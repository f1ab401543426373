"""A named Spark Connect session the server keeps between runs (one per pipeline).

A Connect session owns its Python worker pool, its plan cache and, through those workers, the decoded
state the micro-batch's segment task keeps (:mod:`freshidx.delta.executor.decoded_cache`). A run that opens a
new session pays for all of it again (a micro-batch in a new session takes about twice as long as one
attached to the session the previous run used: docs/benchmarks.md). And a closed session leaves its
Python worker daemon behind in the server (SPARK-54055: one more server process per compaction run in a
soak) until the supervisor's process-count restart. So every freshidx run
attaches to its pipeline's server-side session by id (delta runs, sensor-triggered or continuous,
share one) and never releases it: it ends with the server
(a restarted server does not know the id and creates the session afresh) or after the server's idle
timeout (``spark.connect.session.manager.defaultSessionTimeout``), after which the server answers
``INVALID_HANDLE.SESSION_CLOSED`` and the run starts a new id (:func:`attach`).

The id is kept by the supervisor (``sessions/<name>.json`` in its state dir, beside the leases; read and
written directly or through its control endpoint: :mod:`~freshidx.spark_server.control_client`), so only
runs that lease a ``freshidx spark-server`` share a session; without one every run opens its own. Beside it is
the version of freshidx's code the session's workers run (:func:`freshidx.spark.code_shipping.code_version`):
a reused worker keeps the modules it imported, so a run with other code starts a new session.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from freshidx.spark_server.control_client import DirectoryControl, ServerControl, control_for

log = logging.getLogger(__name__)

SESSION_CLOSED = "INVALID_HANDLE.SESSION_CLOSED"


def session_file(state_dir: str | Path, name: str) -> Path:
    return DirectoryControl(state_dir).session_file(name)


def read_session_id(where: str | Path | ServerControl, name: str, code: str) -> str | None:
    """The kept session ``name`` if its workers run ``code`` (else ``None``: a new one is needed)."""
    kept = control_for(where).read_session(name)
    try:
        if kept is None or kept.get("code") != code:
            return None
        return str(uuid.UUID(str(kept["session_id"])))  # only a well-formed id is sent to the server
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def new_session_id(where: str | Path | ServerControl, name: str, code: str) -> str:
    """A fresh id for ``name`` running ``code``, recorded atomically (two runs racing here both get a
    working session; the last write is the one the next run attaches to)."""
    session_id = str(uuid.uuid4())
    control_for(where).write_session(name, {"session_id": session_id, "code": code})
    return session_id


def with_session_id(remote: str, session_id: str) -> str:
    """``sc://host:port[/;params]`` with ``session_id`` set (any session_id already there is replaced)."""
    base, sep, params = remote.partition("/;")
    kept = [p for p in params.split(";") if p and not p.startswith("session_id=")] if sep else []
    return f"{base.rstrip('/')}/;" + ";".join([*kept, f"session_id={session_id}"])


def is_session_closed(exc: BaseException) -> bool:
    condition = getattr(exc, "getCondition", lambda: None)()
    return condition == SESSION_CLOSED or SESSION_CLOSED in str(exc)


def attach(remote: str, where: str | Path | ServerControl, name: str, connect: Callable[[str], Any]) -> Any:
    """``connect(url)`` to the kept session ``name`` (created on the server by its first use); a closed
    one is replaced by a new id once, and so is one whose workers run other code than this process."""
    from freshidx.spark.code_shipping import code_version

    code = code_version()
    control = control_for(where)
    session_id = read_session_id(control, name, code) or new_session_id(control, name, code)
    try:
        return connect(with_session_id(remote, session_id))
    except Exception as exc:
        if not is_session_closed(exc):
            raise
        _close_failed_client(session_id)
        log.info("kept Spark Connect session %s (%s) was closed by the server; starting a new one",
                 name, session_id)
        return connect(with_session_id(remote, new_session_id(control, name, code)))


def _close_failed_client(session_id: str) -> None:
    """pyspark's ``create()`` makes the client and registers it as the active session before its first
    RPC fails, then drops it: closed here (without a release RPC: the server has closed the session),
    or its exit hook would retry that release for minutes at process exit."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from freshidx.spark.session import close_session

    failed = ConnectSession.getActiveSession()
    if failed is not None and failed.session_id == session_id:
        close_session(failed, release=False)
