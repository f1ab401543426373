"""Spark sessions for freshidx: local in-process, a cluster's driver, or a Spark Connect client. Same code
either way.

Every session gets the freshidx Python data sources registered (:func:`register_sources`).

Its conf is :data:`REQUIRED_CONF` (what freshidx is correct with, in every mode) plus, in local mode
only, :data:`LOCAL_TUNING` (start-up over peak speed, no UI, loopback): :func:`driver_conf` decides.

Python workers must run the project's interpreter (``PYSPARK_PYTHON``), otherwise they start
``python3`` from ``PATH`` and fail to import pyarrow or freshidx. :func:`build_local_session` sets it
to ``sys.executable`` unless already set. For Spark Connect the *server* decides which interpreter
its workers run: start it with ``PYSPARK_PYTHON`` pointing at an interpreter that has pyarrow.
freshidx itself reaches the workers as a zip once per session (:mod:`freshidx.spark.code_shipping`).

pyspark is imported when a session is made, so the conf decisions here import nothing heavy.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Set on a session object once our data sources are registered on it.
_REGISTERED_ATTR = "_freshidx_sources_registered"

#: PySpark 4 wraps every DataFrame/Column call to record its Python call site for error messages. In local
#: mode that costs ~5 py4j round trips per call instead of one (the conf lookup, the origin's set and
#: clear); freshidx builds its plans from fixed code, so the call site says nothing a traceback does not
#: (docs/benchmarks.md has the measurement). A static conf: a Connect client reads the server's, which
#: ``freshidx spark-server`` sets too.
NO_CALL_SITES = {"spark.python.sql.dataFrameDebugging.enabled": "false"}

#: What freshidx needs to be correct, in every mode (local, a cluster's driver, a Connect session):
#: timestamps are UTC, ``mapInArrow``/``toPandas`` go through Arrow, and
#: :func:`freshidx.spark.transform.parse_records` relies on partial JSON results (the default since Spark 3.4).
#: All runtime confs, so a Connect client may set them too.
REQUIRED_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.json.enablePartialResults": "true",
}

#: The memory allocator of Arrow in the Python workers (``ARROW_DEFAULT_MEMORY_POOL``): the C library's.
#: A task's Arrow work (parse, state lookup, merge) allocates and frees large buffers; pyarrow's default
#: allocator hands freed pages back to the kernel and faults them in again, which on a kernel with
#: transparent huge pages costs seconds of system time per large micro-batch
#: (docs/operations.md#arrow-memory-in-the-python-workers).
WORKER_ARROW_POOL = "system"
#: How a session whose driver runs here gives its workers :data:`WORKER_ARROW_POOL` (``spark_config``
#: overrides it). A Connect server's workers inherit the server's environment instead
#: (``freshidx spark-server`` sets it there).
WORKER_ENV_CONF: dict[str, str] = {"spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL": WORKER_ARROW_POOL}

#: A local-mode driver listens on loopback only: no hostname lookups at start-up, nothing listening on
#: public interfaces. A cluster's driver gets :func:`cluster_conf` instead.
LOOPBACK_DRIVER: dict[str, str] = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}

#: Local-mode tuning: small jobs (tests, the demo, the embedded store) on a small machine. Never given to a
#: cluster's driver, where it would cripple the application (no UI, 4 shuffle partitions, a 1 GB driver,
#: a C1-only JVM).
LOCAL_TUNING: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    # The driver only ever collects small values (file lists, commit messages): keep it lean and
    # fail loudly if some code path tries to pull data through it.
    "spark.driver.memory": "1g",
    "spark.driver.maxResultSize": "256m",
    # Start-up over peak speed: on a contended 2-core machine C2 compiler threads and the parallel GC
    # roughly double the time to a first result. Pass your own spark.driver.extraJavaOptions (or use a
    # Connect server) for heavy local runs.
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    # Debuggability of Python workers (a segfault prints a traceback instead of "worker crashed").
    "spark.python.worker.faulthandler.enabled": "true",
    # No Python call site recorded per DataFrame call: 5 py4j round trips become 1 (see NO_CALL_SITES).
    **NO_CALL_SITES,
}

#: A local session's defaults (``spark_config`` overrides them).
LOCAL_DEFAULTS: dict[str, str] = {**REQUIRED_CONF, **WORKER_ENV_CONF, **LOOPBACK_DRIVER, **LOCAL_TUNING}

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def is_cluster_master(master: str) -> bool:
    """A master whose executors are separate processes, possibly on other hosts (not ``local[...]``)."""
    return not master.startswith("local")


def cluster_conf(master: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Confs a driver needs on a cluster: how its executors reach it.

    Executors on other hosts must reach the driver, so it advertises ``SPARK_LOCAL_HOSTNAME`` (Spark's own
    variable; else this host's name) and binds ``SPARK_LOCAL_IP`` (else all interfaces). A master on
    loopback means the whole cluster is on this machine: keep loopback then.
    """
    e = os.environ if env is None else env
    host = urlsplit(master.split(",")[0]).hostname or ""
    if host in _LOOPBACK:
        return dict(LOOPBACK_DRIVER)
    return {
        "spark.driver.host": e.get("SPARK_LOCAL_HOSTNAME") or socket.getfqdn(),
        "spark.driver.bindAddress": e.get("SPARK_LOCAL_IP") or "0.0.0.0",
    }


def driver_conf(master: str, spark_config: Mapping[str, str] | None = None,
                env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The builder conf of a session whose driver runs in this process; ``spark_config`` wins.

    Local mode: :data:`LOCAL_DEFAULTS`. A cluster's driver: :data:`REQUIRED_CONF`, :data:`WORKER_ENV_CONF`
    and :func:`cluster_conf` only, so Spark's and the cluster's own defaults apply to everything else.
    """
    base = ({**REQUIRED_CONF, **WORKER_ENV_CONF, **cluster_conf(master, env)} if is_cluster_master(master)
            else LOCAL_DEFAULTS)
    return {**base, **(spark_config or {})}


def conf_strings(spark_config: Mapping[str, Any]) -> dict[str, str]:
    """A Spark conf as strings, nested mappings flattened to dotted keys (as dagster-pyspark's
    ``spark_config`` accepts them: ``{"spark": {"executor": {"memory": "2g"}}}``); booleans as Spark
    spells them."""
    out: dict[str, str] = {}
    for key, value in spark_config.items():
        if isinstance(value, Mapping):
            out.update({f"{key}.{k}": v for k, v in conf_strings(value).items()})
        elif isinstance(value, bool):
            out[str(key)] = "true" if value else "false"
        else:
            out[str(key)] = str(value)
    return out


def build_local_session(
    master: str = "local[2]", app_name: str = "freshidx", conf: Mapping[str, str] | None = None
) -> SparkSession:
    """A session whose driver runs in this process (``getOrCreate``), local mode or a cluster's driver,
    with :func:`driver_conf` and the freshidx data sources registered.

    ``conf`` overrides the defaults. Static confs (memory, master, …) only take effect if this call starts
    the JVM; runtime SQL confs are applied to an existing session too. In local mode the JVM maps the class
    archive ``freshidx spark-cds`` prepared, if any (:func:`_with_class_archive`).
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # A Spark Connect client created earlier in this process (or a parent's) leaves these set, and
    # the builder then refuses local mode (CONNECT_URL_NOT_SET). Asking for local mode means local.
    for var in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE"):
        os.environ.pop(var, None)
    full = driver_conf(master, conf)
    if not is_cluster_master(master):
        full = _with_class_archive(full)
    builder: Any = SparkSession.builder.master(master).appName(app_name)
    for key, value in full.items():
        builder = builder.config(key, value)
    spark: SparkSession = builder.getOrCreate()
    register_sources(spark)
    return spark


def _with_class_archive(conf: dict[str, str]) -> dict[str, str]:
    """``conf`` with the driver JVM mapping the local class archive, if ``freshidx spark-cds`` prepared one
    (:func:`freshidx.spark.local_archive.with_archive`); without one a session starts as it always did."""
    from freshidx.spark.local_archive import with_archive

    return with_archive(conf)


def build_connect_session(
    remote: str, conf: Mapping[str, str] | None = None, *, ship_code: bool = True
) -> SparkSession:
    """A Spark Connect client session to ``sc://host:port`` with freshidx data sources registered.

    With ``ship_code`` (default) this process's ``freshidx`` goes to the session's workers once, as a
    session artifact (:func:`freshidx.spark.code_shipping.ship_to_connect`), so the server's workers need
    its dependencies, not freshidx. ``ship_code=False``: the workers import the server's installed copy.
    """
    from pyspark.sql import SparkSession

    from freshidx.spark.code_shipping import ship_to_connect

    builder: Any = SparkSession.builder.remote(remote)
    # A Connect client sets only runtime (session) confs: REQUIRED_CONF; the server owns everything else.
    for key, value in {**REQUIRED_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    # create(), not getOrCreate(): a new session every time (a cached one may belong to a server that
    # was restarted since), and it works beside a classic SparkSession in the same process, where
    # getOrCreate() raises SESSION_ALREADY_EXIST.
    spark: SparkSession = builder.create()
    try:
        _take_the_place_of_a_stopped_session(spark)
        if ship_code:
            ship_to_connect(spark)
        register_sources(spark)
    except BaseException:
        # create() already made it the process's default session: a half-made one must not stay there.
        close_session(spark, release=False)
        raise
    return spark


def _take_the_place_of_a_stopped_session(spark: Any) -> None:
    """Make ``spark`` the process's default and this thread's active Connect session where those are a
    stopped one. pyspark binds some results to them (a local checkpoint's DataFrame: ``SparkSession.active()``),
    and ``create()`` fills them only when they are empty; a client pyspark closed on an error (a server
    that lost the session) is stopped without emptying them, and every later checkpoint in the process would
    fail with ``NO_ACTIVE_OR_DEFAULT_SESSION``, whatever session the caller holds."""
    cls = type(spark)
    lock, local = getattr(cls, "_lock", None), getattr(cls, "_active_session", None)
    if lock is None or local is None or not hasattr(cls, "_default_session"):
        return  # another pyspark: nothing to mend
    with lock:
        default = cls._default_session
        if default is None or default.is_stopped:
            cls._default_session = spark
    active = getattr(local, "session", None)
    if active is None or active.is_stopped:
        local.session = spark


def close_session(session: Any, *, release: bool) -> None:
    """Stop a Spark Connect client session, never raising; ``release=False`` skips the ReleaseSession RPC
    (the server may be hung or gone, and waiting for its answer is what the caller must not do; or the
    server keeps the session for the next run)."""
    if session is None:
        return
    session.release_session_on_close = release
    with contextlib.suppress(Exception):
        session.stop()


def is_connect_session(session: Any) -> bool:
    return type(session).__module__.startswith("pyspark.sql.connect")


def application_info(session: Any) -> tuple[str | None, str | None]:
    """The Spark application behind ``session``: its id and its UI's URL (None where unknown or off).

    A classic session asks its SparkContext. A Connect client sees the server's confs only, in one RPC
    (``conf.getAll``): the id, and the UI's address when the UI is on at a fixed port (a server that
    picked a free port, ``spark.ui.port=0``, does not say which).
    """
    if not is_connect_session(session):
        ctx = session.sparkContext
        return ctx.applicationId, ctx.uiWebUrl
    return connect_application_info(session.conf.getAll)


def connect_application_info(confs: Mapping[str, str]) -> tuple[str | None, str | None]:
    """:func:`application_info` from a Connect server's confs."""
    app_id = confs.get("spark.app.id")
    port = confs.get("spark.ui.port", "4040")
    host = confs.get("spark.driver.host")
    if confs.get("spark.ui.enabled", "true").lower() != "true" or port == "0" or not host:
        return app_id, None
    return app_id, f"http://{host}:{port}"


_LOCAL_MASTER = re.compile(r"^local(?:\[(\d+)(?:,\s*\d+)?\])?$")


def task_slots(session: Any) -> int | None:
    """How many tasks ``session``'s Spark runs at once, where it says: a classic session's default
    parallelism; over Connect, the server's ``spark.default.parallelism``, else the threads of its
    ``local[N]`` / ``local[N,F]`` master (one RPC). None where it cannot say: a Connect server on
    ``local[*]`` (its cores are not the client's) or on a cluster (executors come and go)."""
    if not is_connect_session(session):
        return int(session.sparkContext.defaultParallelism)
    confs = session.conf.getAll
    if confs.get("spark.default.parallelism"):
        return int(confs["spark.default.parallelism"])
    return local_master_threads(confs.get("spark.master", ""))


def local_master_threads(master: str) -> int | None:
    """The task threads of a ``local`` / ``local[N]`` / ``local[N,F]`` master; None for any other."""
    match = _LOCAL_MASTER.match(master.strip())
    if match is None:
        return None
    return int(match.group(1)) if match.group(1) else 1


def register_sources(spark: SparkSession) -> None:
    """Register the freshidx Python data sources on ``spark``. Idempotent per session object."""
    if getattr(spark, _REGISTERED_ATTR, False):
        return
    from freshidx.spark.raw_source import RawLinesSource

    spark.dataSource.register(RawLinesSource)
    with contextlib.suppress(AttributeError):  # a slotted session class: re-registering is harmless
        setattr(spark, _REGISTERED_ATTR, True)
