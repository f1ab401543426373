"""Spark sessions for freshidx: local in-process, or a Spark Connect client. Same code either way.

Every session gets the freshidx Python data sources registered (:func:`register_sources`).

Python workers must run the project's interpreter (``PYSPARK_PYTHON``), otherwise they start
``python3`` from ``PATH`` and fail to import pyarrow or freshidx. :func:`build_local_session` sets it
to ``sys.executable`` unless already set. For Spark Connect the *server* decides which interpreter
its workers run: start it with ``PYSPARK_PYTHON`` pointing at an interpreter that has pyarrow.
freshidx itself reaches the server's workers by value (cloudpickle), see
:func:`build_connect_session`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

from pyspark.sql import SparkSession

from freshidx.spark.server_config import NO_CALL_SITES

# Set on a session object once our data sources are registered on it.
_REGISTERED_ATTR = "_freshidx_sources_registered"

LOCAL_DEFAULTS: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # freshidx.transform.parse_records relies on it (the default since Spark 3.4).
    "spark.sql.json.enablePartialResults": "true",
    # The driver only ever collects small values (file lists, commit messages): keep it lean and
    # fail loudly if some code path tries to pull data through it.
    "spark.driver.memory": "1g",
    "spark.driver.maxResultSize": "256m",
    # Loopback only: no hostname lookups at start-up, nothing listening on public interfaces.
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    # Start-up over peak speed: local mode is for small jobs (tests, demo, the embedded store), and on
    # a contended 2-core machine C2 compiler threads and the parallel GC roughly double the time to a
    # first result (measured: 60-73 s -> 34-38 s for session + first two jobs at load average ~10).
    # Pass your own spark.driver.extraJavaOptions (or use a Connect server) for heavy local runs.
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    # Debuggability of Python workers (a segfault prints a traceback instead of "worker crashed").
    "spark.python.worker.faulthandler.enabled": "true",
    # No Python call site recorded per DataFrame call: 5 py4j round trips become 1 (see NO_CALL_SITES).
    **NO_CALL_SITES,
}

# Runtime (session) confs that a Connect client may set; the server owns everything else.
CONNECT_DEFAULTS: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.json.enablePartialResults": "true",
}


def build_local_session(
    master: str = "local[2]", app_name: str = "freshidx", conf: dict[str, str] | None = None
) -> SparkSession:
    """An in-process Spark session (``getOrCreate``) with freshidx defaults and data sources registered.

    ``conf`` overrides the defaults in :data:`LOCAL_DEFAULTS`. Static confs (memory, master, …) only
    take effect if this call starts the JVM; runtime SQL confs are applied to an existing session too.
    The JVM maps the class archive ``freshidx spark-cds`` prepared, if any (:mod:`freshidx.spark.local_cds`).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # A Spark Connect client created earlier in this process (or a parent's) leaves these set, and
    # the builder then refuses local mode (CONNECT_URL_NOT_SET). Asking for local mode means local.
    for var in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE"):
        os.environ.pop(var, None)
    from freshidx.spark.local_cds import with_archive

    builder: Any = SparkSession.builder.master(master).appName(app_name)
    for key, value in with_archive({**LOCAL_DEFAULTS, **(conf or {})}).items():
        builder = builder.config(key, value)
    spark: SparkSession = builder.getOrCreate()
    register_sources(spark)
    return spark


def build_connect_session(
    remote: str, conf: dict[str, str] | None = None, *, ship_code: bool = True
) -> SparkSession:
    """A Spark Connect client session to ``sc://host:port`` with freshidx data sources registered.

    With ``ship_code`` (default) the ``freshidx`` package is pickled *by value* into every data
    source and ``mapInArrow`` function sent to the server, so the server's Python workers need only
    pyspark + pyarrow, not freshidx. Pass ``ship_code=False`` when freshidx is installed on the
    server (smaller task payloads, and the server's version of the code is used).
    """
    if ship_code:
        ship_package_by_value()
    builder: Any = SparkSession.builder.remote(remote)
    for key, value in {**CONNECT_DEFAULTS, **(conf or {})}.items():
        builder = builder.config(key, value)
    # create(), not getOrCreate(): a new session every time (a cached one may belong to a server that
    # was restarted since), and it works beside a classic SparkSession in the same process, where
    # getOrCreate() raises SESSION_ALREADY_EXIST.
    spark: SparkSession = builder.create()
    register_sources(spark)
    return spark


def ship_package_by_value() -> None:
    """Make cloudpickle serialize freshidx functions/classes by value (for Connect servers without it)."""
    from pyspark import cloudpickle

    import freshidx

    cloudpickle.register_pickle_by_value(freshidx)


def register_sources(spark: SparkSession) -> None:
    """Register the freshidx Python data sources on ``spark``. Idempotent per session object."""
    if getattr(spark, _REGISTERED_ATTR, False):
        return
    from freshidx.spark.raw_source import RawLinesSource

    spark.dataSource.register(RawLinesSource)
    with contextlib.suppress(AttributeError):  # a slotted session class: re-registering is harmless
        setattr(spark, _REGISTERED_ATTR, True)
