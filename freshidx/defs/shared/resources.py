"""Dagster resources: one ``ConfigurableResource`` per external system, plus the settings."""


import contextlib
import logging
import socket
import urllib.parse
from collections.abc import Iterator
from typing import Any, Self

import dagster as dg
from dagster_aws.s3 import S3Resource
from dagster_pyspark import LazyPySparkResource
from pydantic import Field, PrivateAttr

from freshidx.settings import PipelineSettings, Settings
from freshidx.spark.code_shipping import ship_to_cluster
from freshidx.spark.session import (
    application_info,
    build_connect_session,
    build_local_session,
    close_session,
    conf_strings,
    is_cluster_master,
)
from freshidx.store import DEFAULT_FIRST_TRY_S, ObjectStore, StoreConfig, open_store
from freshidx.trigger.run_health import TAG_WORKER, worker_identity

log = logging.getLogger(__name__)


class ObjectStoreResource(dg.ConfigurableResource):
    """The object store holding raw partitions, indexes, pointers and the ledger.

    ``file:///abs/path`` (embedded default) or ``s3://bucket/prefix``. How to reach S3 (endpoint,
    region, credentials, retries) is dagster-aws's ``S3Resource``, a dependency as in dagster-aws's
    own S3 IO manager; a local store ignores it, and its defaults need no S3 settings. Executors get
    the same coordinates as a picklable :class:`~freshidx.store.StoreConfig`.
    """

    uri: str
    s3: dg.ResourceDependency[S3Resource] = Field(default_factory=S3Resource)
    s3_first_try_seconds: float = Field(
        DEFAULT_FIRST_TRY_S, ge=0, le=60,
        description="a read not answered within this is asked again at once (then with S3Resource's retries); 0 = off")

    _store: Any = PrivateAttr(default=None)

    @property
    def endpoint_url(self) -> str | None:
        return self.s3.endpoint_url

    def store_config(self) -> StoreConfig:
        return StoreConfig(
            uri=self.uri, endpoint_url=self.s3.endpoint_url, region=self.s3.region_name,
            access_key_id=self.s3.aws_access_key_id, secret_access_key=self.s3.aws_secret_access_key,
            session_token=self.s3.aws_session_token, first_try_seconds=self.s3_first_try_seconds,
        )

    def open(self) -> ObjectStore:
        if self._store is None:
            cfg = self.store_config()
            if cfg.is_s3:
                from freshidx.store.s3 import S3Store
                from freshidx.store.s3_clients import s3_client, s3_quick_client

                # freshidx's one client configuration (path-style, as the CLI) from all of S3Resource's
                # fields (same names, a test pins it): S3Resource.get_client() would be a second one.
                fields = {name: getattr(self.s3, name) for name in S3Resource.model_fields}
                self._store = S3Store(s3_client(**fields), cfg.bucket, cfg.prefix, cfg.uri,
                                      quick_client=s3_quick_client(cfg.first_try_seconds, **fields))
            else:
                self._store = open_store(cfg)
        return self._store


class SparkResource(LazyPySparkResource):
    """dagster-pyspark's lazily created SparkSession, in three ways to get it: local mode (embedded default),
    a cluster master (``spark://host:port``, the driver runs in this process and executors on the cluster's
    workers), or Spark Connect (``sc://host:port``; the server may itself be attached to a cluster).

    ``spark_config`` (dagster-pyspark's field, also ``FRESHIDX_SPARK_CONF``) is the Spark conf: local mode
    lays it over freshidx's local defaults, a cluster's driver gets it besides only what freshidx needs
    (:func:`freshidx.spark.session.driver_conf`), a Connect client sets it on its session.

    The session is created on first use (``spark_session``, :meth:`get_session`, :meth:`session`), so runs
    that stop early never pay Spark start-up. Local and cluster-driver sessions are left running for the
    process (Dagster runs are one process each, and the test suite shares one session); Connect client
    sessions are always created anew (``create()``) and closed at teardown.

    With ``server_url`` (its control endpoint) or ``server_state_dir`` the Connect session is leased from a
    ``freshidx spark-server`` (:func:`freshidx.spark_server.open_connect_session`); that package is imported
    only then.

    On a cluster master the driver ships the installed ``freshidx`` package to the executors as a
    zip (:func:`freshidx.spark.code_shipping.ship_to_cluster`), see docs/deployment.md for what else the workers need.
    """

    spark_config: dict[str, Any] = {}
    remote: str | None = None
    master: str = "local[2]"
    server_state_dir: str | None = None
    """State dir of a `freshidx spark-server` supervisor: runs hold a lease while they use it, so a
    planned restart drains first, and a run arriving during a restart waits (then fails clearly)."""
    server_url: str | None = None
    """Control endpoint ``http://host:port`` of a `freshidx spark-server` (``--control-port``): leases, kept
    sessions and status over the network, for runs that share no filesystem with the server. Wins over
    ``server_state_dir``."""
    # A drained restart on a loaded 2-core box can take minutes: a retry must outwait one.
    lease_timeout_seconds: float = 300.0
    keep_sessions: bool = True
    """Runs that ask for a kept session (``session(keep_as="delta")``: every freshidx run asks, by its
    pipeline's name) attach to one server-side Connect session by name instead of opening a new one
    (warm Python workers, plan cache, decoded state; and no Python worker daemon left behind per run:
    :mod:`freshidx.spark_server.kept_session`). Needs ``server_url`` or ``server_state_dir``; ``False`` = a new
    session per run."""

    _exit: Any = PrivateAttr(default=None)
    _app_info: Any = PrivateAttr(default=None)
    _run_id: str = PrivateAttr(default="adhoc")

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self._run_id = context.run.run_id if context.run else "adhoc"
        if context.run is not None and context.instance is not None:
            # Where this run's worker pid means something: run health judges it only there
            # (freshidx.trigger.run_health); never a reason to fail the run.
            with contextlib.suppress(Exception):
                context.instance.add_run_tags(context.run.run_id, {TAG_WORKER: worker_identity()})

    @property
    def supervisor(self) -> str | None:
        """Where the supervised server's leases and kept sessions are: its endpoint, else its state dir."""
        return self.server_url or self.server_state_dir

    @property
    def spark_session(self) -> Any:
        """dagster-pyspark's accessor: the run's session (:meth:`get_session`)."""
        return self.get_session()

    @property
    def spark_context(self) -> Any:
        return self.get_session().sparkContext

    def get_session(self, keep_as: str | None = None) -> Any:
        """The run's session (created on first use). ``keep_as`` names the kept Connect session to attach
        to (see :attr:`keep_sessions`); the first call decides, later calls return the same session."""
        if self._spark_session is None:
            self._spark_session = self._open(keep_as)
        return self._spark_session

    def _open(self, keep_as: str | None) -> Any:
        conf = conf_strings(self.spark_config)
        if self.remote:
            return self._open_connect(self.remote, conf, keep_as)
        session = build_local_session(self.master, conf=conf)
        if is_cluster_master(self.master):
            ship_to_cluster(session)
        return session

    def _open_connect(self, remote: str, conf: dict[str, str], keep_as: str | None) -> Any:
        def build(url: str) -> Any:
            return _fail_fast(build_connect_session(url, conf))

        stack = contextlib.ExitStack()
        if self.supervisor:
            from freshidx.spark_server import open_connect_session

            session = stack.enter_context(open_connect_session(
                remote, self.supervisor, self._run_id, build=build,
                keep_as=keep_as if self.keep_sessions else None, lease_timeout_s=self.lease_timeout_seconds))
        else:
            session = build(remote)
            stack.callback(close_session, session, release=True)
        self._exit = stack
        return session

    @contextlib.contextmanager
    def session(self, keep_as: str | None = None) -> Iterator[Any]:
        """The run's session, dropped (with its lease) if the body fails.

        A step retry runs in the same process with the same resource instance; had the Connect
        server been restarted meanwhile, a cached session would fail every retry at once
        (``NO_ACTIVE_SESSION``). Dropping it makes the retry lease and connect afresh.
        """
        try:
            yield self.get_session(keep_as)
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        """Forget a Connect session and release its lease (local sessions stay: they are per process).
        A kept session is left open on the server for the next run."""
        stack, self._exit = self._exit, None
        if stack is not None:
            self._spark_session = None
            self._app_info = None
            stack.close()  # closing never raises: the server may be gone

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self.discard()

    def server_draining(self) -> bool:
        """Whether the supervised Connect server drains for a planned restart (False without one)."""
        if not (self.remote and self.supervisor):
            return False
        from freshidx.spark_server import server_status

        return server_status(self.supervisor) == "draining"

    def server_answers(self) -> bool | None:
        """Whether the Spark Connect server answers now (None without Connect): a supervised one says it is
        ``up`` and its port accepts a connection; a plain one, its port. Cheap enough to poll twice a second."""
        if not self.remote:
            return None
        url: str = self.remote
        if self.supervisor:
            from freshidx.spark_server import supervisor_state

            state = supervisor_state(self.supervisor) or {}
            if state.get("status") != "up":
                return False
            url = str(state.get("url") or url)
        return _port_accepts(url)

    def serving_server(self) -> str | None:
        """Which supervised Connect server serves now (its URL and JVM pid: a promoted spare or a restart
        changes it); None while none is up, or without a supervisor."""
        if not (self.remote and self.supervisor):
            return None
        from freshidx.spark_server import supervisor_state

        state = supervisor_state(self.supervisor) or {}
        return f"{state.get('url')}#{state.get('pid')}" if state.get("status") == "up" else None

    def spark_metadata(self) -> dict[str, dg.MetadataValue]:
        """The Spark application of this run's session, for materialization metadata: ``spark_app_id`` and
        ``spark_ui`` where known. Empty when the run made no session; never raises (asked once per session)."""
        if self._spark_session is None:
            return {}
        if self._app_info is None:
            self._app_info = self._application_info()
        app_id, ui = self._app_info
        meta: dict[str, dg.MetadataValue] = {}
        if app_id:
            meta["spark_app_id"] = dg.MetadataValue.text(app_id)
        if ui:
            meta["spark_ui"] = dg.MetadataValue.url(ui)
        return meta

    def _application_info(self) -> tuple[str | None, str | None]:
        try:
            app_id, ui = application_info(self._spark_session)
            if ui is None and self.remote and self.supervisor:
                from freshidx.spark_server import server_ui_url

                ui = server_ui_url(self.supervisor)  # a supervised server picks its UI port
            return app_id, ui
        except Exception as exc:  # metadata only: the run's outcome does not depend on it
            log.warning("no Spark application info for the materialization metadata: %s", exc)
            return None, None


#: The longest pause (ms) between two of the Connect client's retries of an unreachable server. pyspark's
#: default (60 s, ×4 each time) made a call on a killed server wait a minute after its restart before failing
#: on the session the new server does not know; capped, the call still rides out a blip of ~25 s and fails
#: within seconds of the restart, and the caller retries on a fresh session (docs/architecture.md#continuous-mode).
CONNECT_MAX_BACKOFF_MS = 2000


def _fail_fast(session: Any) -> Any:
    from pyspark.sql.connect.client.retries import DefaultPolicy

    session.client.set_retry_policies([DefaultPolicy(max_backoff=CONNECT_MAX_BACKOFF_MS)])
    return session


def _port_accepts(url: str, timeout: float = 0.5) -> bool:
    """Whether ``sc://host:port[/;params]`` accepts a TCP connection (a killed server's port refuses at once)."""
    parsed = urllib.parse.urlsplit(url)
    try:
        with socket.create_connection((parsed.hostname or "localhost", parsed.port or 15002), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


class FreshidxSettings(dg.ConfigurableResource, PipelineSettings):
    """Pipeline settings (window, trigger interval, thresholds) as Dagster config.

    The fields, their defaults and their validation are :class:`freshidx.settings.PipelineSettings`'
    (inherited, not repeated), so launchpad config is checked as ``FRESHIDX_*`` is.
    """

    @classmethod
    def from_settings(cls, settings: Settings) -> Self:
        return cls(**settings.pipeline())

    def settings(self, store_uri: str, endpoint_url: str | None = None) -> Settings:
        values = {name: getattr(self, name) for name in PipelineSettings.model_fields}
        return Settings.from_env({}, store=store_uri, s3_endpoint_url=endpoint_url, **values)
