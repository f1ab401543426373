"""Spark Connect client sessions for the supervisor's own use: health probes and the warm-up.

They never touch pyspark's default/active session (a freshidx run in the same process keeps its own),
retry briefly (a probe that waits minutes says nothing), and run under a timeout in a daemon thread
(:func:`call_with_timeout`): a hung server must not hang the supervisor. pyspark is imported only
when a session is made, so importing this module stays cheap. Closing one is the pipeline's own
:func:`freshidx.spark.session.close_session`.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


def warmup_batches(batches: Iterator[Any]) -> Iterator[Any]:
    """mapInArrow body of the warm-up: proves the server's Python workers can import freshidx."""
    import pyarrow as pa

    import freshidx.store.partitions

    for batch in batches:
        yield pa.RecordBatch.from_pydict(
            {"module": [freshidx.store.partitions.__file__] * batch.num_rows,
             "python": [sys.executable] * batch.num_rows}
        )


def call_with_timeout(
    fn: Callable[[], T], timeout_s: float, on_timeout: Callable[[], None], cancel: Callable[[], bool] | None = None
) -> T:
    """Run ``fn`` in a daemon thread. After ``timeout_s`` (or once ``cancel()`` is true) call
    ``on_timeout`` (which should make ``fn`` fail, e.g. close its channel) and raise TimeoutError."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    th = threading.Thread(target=target, name="freshidx-spark-probe", daemon=True)
    th.start()
    deadline = time.monotonic() + timeout_s
    while th.is_alive() and (left := deadline - time.monotonic()) > 0:
        if cancel is not None and cancel():
            break
        th.join(min(0.1, left))
    if th.is_alive():
        with contextlib.suppress(Exception):
            on_timeout()
        cancelled = cancel is not None and cancel()
        raise TimeoutError("cancelled" if cancelled else f"no answer within {timeout_s}s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def connect_session(url: str, *, quick_retries: bool) -> Any:
    """A Spark Connect client session that does not touch pyspark's default/active session."""
    from pyspark.sql.connect.client.retries import DefaultPolicy
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    session = ConnectSession(connection=url)
    if quick_retries:
        session.client.set_retry_policies([DefaultPolicy(max_retries=2, initial_backoff=100, max_backoff=1000)])
    return session


def select_one(session: Any) -> bool:
    """The health probe's query: ``SELECT 1`` answered correctly."""
    rows = session.sql("SELECT 1 AS one").collect()
    return bool(rows) and rows[0]["one"] == 1
