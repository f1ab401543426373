"""The warm-up of a fresh Spark Connect server: the first query on it takes seconds (JIT, class
loading), so :class:`~freshidx.spark_server.server_process.ServerProcess` pays it before it reports
the server ``up``: a real SQL query, then one Python task."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from freshidx.spark.session import close_session
from freshidx.spark_server.connect_client import call_with_timeout, connect_session, warmup_batches


class WarmUpFailed(RuntimeError):
    """The warm-up's query or Python job answered, but wrongly."""


def warm_up(url: str, deadline: float, stopping: Callable[[], bool]) -> dict[str, float]:
    """Run the warm-up on a client session of its own before ``deadline`` (monotonic; a stop request,
    ``stopping()``, ends it too: TimeoutError); returns its timings (seconds)."""
    box: dict[str, Any] = {}

    def work() -> dict[str, float]:
        t = time.monotonic()
        box["session"] = session = connect_session(url, quick_retries=False)
        rows = session.range(1000).selectExpr("sum(id) AS s").collect()
        if rows[0]["s"] != 499500:
            raise WarmUpFailed(f"warm-up SQL returned {rows!r}")
        t_sql = time.monotonic()
        # One Python task: it proves the workers import freshidx and warms the JVM's Arrow/Python path;
        # Connect pools Python workers per session, so no run would ever reuse a second warm one.
        df = session.range(4, numPartitions=1).mapInArrow(warmup_batches, "module string, python string")
        got = df.distinct().collect()
        if not got or not all(r["module"] for r in got):
            raise WarmUpFailed(f"warm-up Python job returned {got!r}")
        t_py = time.monotonic()
        box.pop("session")
        close_session(session, release=True)  # still inside the timeout
        return {"warmup_sql_s": round(t_sql - t, 3), "warmup_python_s": round(t_py - t_sql, 3)}

    def abort() -> None:
        close_session(box.get("session"), release=False)

    try:
        return call_with_timeout(work, max(1.0, deadline - time.monotonic()), abort, stopping)
    finally:
        close_session(box.get("session"), release=False)
