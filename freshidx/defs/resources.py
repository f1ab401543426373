"""Dagster resources: one ``ConfigurableResource`` per external system, plus the settings."""


import contextlib
import hashlib
import io
import os
import socket
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import dagster as dg
from dagster_aws.s3 import S3Resource
from pydantic import PrivateAttr

from freshidx.settings import Settings
from freshidx.store import ObjectStore, StoreConfig


class ObjectStoreResource(dg.ConfigurableResource):
    """The object store holding raw partitions, indexes, pointers and the ledger.

    ``file:///abs/path`` (embedded default) or ``s3://bucket/prefix``; for S3 the driver talks
    through dagster-aws's ``S3Resource`` (custom endpoint allowed) and executors get the same
    coordinates as a picklable :class:`~freshidx.store.StoreConfig`.
    """

    uri: str
    endpoint_url: str | None = None
    region_name: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None
    aws_session_token: str | None = None

    _store: Any = PrivateAttr(default=None)

    def store_config(self) -> StoreConfig:
        return StoreConfig(
            uri=self.uri, endpoint_url=self.endpoint_url, region=self.region_name,
            access_key_id=self.aws_access_key_id, secret_access_key=self.aws_secret_access_key,
            session_token=self.aws_session_token,
        )

    def open(self) -> ObjectStore:
        if self._store is None:
            cfg = self.store_config()
            if cfg.is_s3:
                from freshidx.store.s3 import S3Store

                s3 = S3Resource(
                    endpoint_url=self.endpoint_url, region_name=self.region_name or "us-east-1",
                    aws_access_key_id=self.aws_access_key_id,
                    aws_secret_access_key=self.aws_secret_access_key,
                    aws_session_token=self.aws_session_token,
                )
                self._store = S3Store(s3.get_client(), cfg.bucket, cfg.prefix, cfg.uri)
            else:
                from freshidx.store.local import LocalStore

                self._store = LocalStore(cfg.local_root, cfg.uri)
        return self._store


class SparkResource(dg.ConfigurableResource):
    """A SparkSession: local mode (embedded default), a cluster master (``spark://host:port``, the
    driver runs in this process and executors on the cluster's workers), or Spark Connect
    (``sc://host:port``; the server may itself be attached to a cluster).

    The session is created on first use, so runs that stop early never pay Spark start-up.
    Local and cluster-driver sessions are left running for the process (Dagster runs are one process
    each, and the test suite shares one session); Connect client sessions are closed at teardown.

    On a cluster master the driver ships the installed ``freshidx`` package to the executors as a
    zip (:func:`ship_package_zip`), see docs/deployment.md for what else the workers need.
    """

    remote: str | None = None
    master: str = "local[2]"
    conf: dict[str, str] = {}
    server_state_dir: str | None = None
    """State dir of a `freshidx spark-server` supervisor: runs hold a lease while they use it, so a
    planned restart drains first, and a run arriving during a restart waits (then fails clearly)."""
    # A drained restart on a loaded 2-core box took 53-175 s: a retry must outwait one.
    lease_timeout_seconds: float = 300.0

    _session: Any = PrivateAttr(default=None)
    _leases: Any = PrivateAttr(default=None)
    _run_id: str = PrivateAttr(default="adhoc")

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self._run_id = context.run_id or "adhoc"

    def get_session(self) -> Any:
        if self._session is None:
            from freshidx.spark.session import build_connect_session, build_local_session

            if self.remote:
                remote = self.remote
                if self.server_state_dir:
                    from freshidx.spark.lease import acquire_lease

                    self._leases = contextlib.ExitStack()
                    lease = self._leases.enter_context(
                        acquire_lease(self.server_state_dir, self._run_id, timeout_s=self.lease_timeout_seconds)
                    )
                    remote = lease.url or remote
                self._session = build_connect_session(remote, dict(self.conf))
            elif is_cluster_master(self.master):
                session = build_local_session(self.master, conf={**cluster_conf(self.master), **self.conf})
                ship_package_zip(session)
                self._session = session
            else:
                self._session = build_local_session(self.master, conf=dict(self.conf))
        return self._session

    @contextlib.contextmanager
    def session(self) -> Iterator[Any]:
        """The run's session, dropped (with its lease) if the body fails.

        A step retry runs in the same process with the same resource instance; had the Connect
        server been restarted meanwhile, a cached session would fail every retry at once
        (``NO_ACTIVE_SESSION``). Dropping it makes the retry lease and connect afresh.
        """
        try:
            yield self.get_session()
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        """Forget a Connect session and release its lease (local sessions stay: they are per process)."""
        if self._session is not None and self.remote:
            with contextlib.suppress(Exception):  # the server may be gone; nothing to close then
                self._session.stop()
            self._session = None
        if self._leases is not None:
            self._leases.close()
            self._leases = None

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self.discard()


_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def is_cluster_master(master: str) -> bool:
    """A master whose executors are separate processes, possibly on other hosts (not ``local[...]``)."""
    return not master.startswith("local")


def cluster_conf(master: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """Confs a driver needs on a cluster, on top of the session builder's local defaults.

    The builder pins the driver's RPC and block manager to 127.0.0.1 (right for local mode). Executors
    on other hosts must reach the driver, so it advertises ``SPARK_LOCAL_HOSTNAME`` (Spark's own
    variable; else this host's name) and binds ``SPARK_LOCAL_IP`` (else all interfaces). A master on
    loopback means the whole cluster is on this machine: keep loopback then.
    """
    e = os.environ if env is None else env
    host = urlsplit(master.split(",")[0]).hostname or ""
    if host in _LOOPBACK:
        return {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    return {
        "spark.driver.host": e.get("SPARK_LOCAL_HOSTNAME") or socket.getfqdn(),
        "spark.driver.bindAddress": e.get("SPARK_LOCAL_IP") or "0.0.0.0",
    }


def package_zip(target_dir: str | None = None) -> Path:
    """A zip of the installed ``freshidx`` package (sources only), named by its content hash.

    The hash in the name means a code change is a new file: ``addPyFile`` refuses to replace a file
    of the same name with other content, and executors never run a stale copy.
    """
    import freshidx

    root = Path(freshidx.__file__).parent
    files = sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                   and p.suffix not in (".pyc", ".pyo"))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for p in files:
            info = zipfile.ZipInfo(str(Path("freshidx") / p.relative_to(root)), date_time=(2000, 1, 1, 0, 0, 0))
            z.writestr(info, p.read_bytes(), zipfile.ZIP_DEFLATED)  # fixed dates: same code → same bytes
    data = buf.getvalue()
    out_dir = Path(target_dir or os.path.join(tempfile.gettempdir(), "freshidx-pyfiles"))
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"freshidx-{hashlib.sha256(data).hexdigest()[:16]}.zip"
    if not out.exists():
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, out)  # concurrent runs may build the same zip: last rename wins, same bytes
    return out


def ship_package_zip(session: Any) -> Path:
    """Put this process's ``freshidx`` on the executors' ``sys.path`` (ahead of any installed copy).

    Chosen over installing freshidx on the workers: the executors then always run exactly the
    driver's code (a code-location deploy needs no worker restart, and no version skew is possible),
    and imports inside task functions resolve (cloudpickle by value covers only what a closure
    references). Workers still need the *dependencies* (pyarrow, tantivy, pydantic, boto3): run them
    from the same image or environment (docs/deployment.md).
    """
    path = package_zip()
    ctx = session.sparkContext
    # A later run in the same process reuses the context: add each zip once (Spark ignores a repeat
    # of the path anyway, but pyspark would list it twice in the workers' includes).
    if path.name not in (getattr(ctx, "_python_includes", None) or []):
        ctx.addPyFile(str(path))
    return path


PIPELINE_FIELDS = (
    "source", "window_minutes", "sensor_interval_seconds", "max_scan_hours", "max_attempts", "delta_shards",
    "full_shards", "full_every_hours", "lag_warn_seconds", "lag_fail_seconds", "silence_warn_seconds",
    "silence_fail_seconds", "stuck_seconds", "full_max_age_seconds", "sla_interval_seconds", "partitions_start",
    "keep_versions", "delta_max_drop_fraction", "full_max_drop_fraction",
    "readiness", "quiet_seconds", "close_grace_seconds", "hourly_max_hours_per_run", "hourly_timeout_seconds",
    "hourly_max_attempts", "hourly_lookahead_hours", "hourly_late_lookback_hours", "hourly_late_checks_per_tick",
    "hourly_parts", "hourly_sensor_interval_seconds", "delta_overlap", "hourly_overlap", "catchup_autostart",
    "max_future_skew_seconds",
)


class FreshidxSettings(dg.ConfigurableResource):
    """Pipeline settings (window, trigger interval, thresholds) as Dagster config; defaults from env.

    Every field mirrors :class:`freshidx.settings.Settings` and is validated by it.
    """

    source: str = "ad_updates"
    window_minutes: int = 300
    sensor_interval_seconds: int = 5
    max_scan_hours: int = 0
    max_attempts: int = 3
    delta_shards: int = 2
    full_shards: int = 2
    full_every_hours: int = 3
    lag_warn_seconds: int = 600
    lag_fail_seconds: int = 1800
    silence_warn_seconds: int = 900
    silence_fail_seconds: int = 3600
    stuck_seconds: int = 900
    full_max_age_seconds: int = 6 * 3600
    sla_interval_seconds: int = 30
    partitions_start: str = "2026-01-01"
    keep_versions: int = 5
    delta_max_drop_fraction: float = 0.9
    full_max_drop_fraction: float = 0.5
    readiness: str = "visible"
    quiet_seconds: int = 300
    close_grace_seconds: int = 60
    hourly_max_hours_per_run: int = 4
    hourly_timeout_seconds: int = 1800
    hourly_max_attempts: int = 3
    hourly_lookahead_hours: int = 72
    hourly_late_lookback_hours: int = 24
    hourly_late_checks_per_tick: int = 2
    hourly_parts: int = 1
    hourly_sensor_interval_seconds: int = 30
    delta_overlap: str = "serialize"
    hourly_overlap: str = "serialize"
    catchup_autostart: bool = True
    max_future_skew_seconds: int = 3600

    def settings(self, store_uri: str, endpoint_url: str | None = None) -> Settings:
        return Settings.from_env({}, store=store_uri, s3_endpoint_url=endpoint_url,
                                 **{f: getattr(self, f) for f in PIPELINE_FIELDS})


def _secret(name: str) -> Any:
    # EnvVar keeps the secret out of the UI's config view; only reference variables that exist,
    # since an unset EnvVar fails resource initialisation.
    return dg.EnvVar(name) if os.environ.get(name) else None


def build_resources(settings: Settings) -> dict[str, Any]:
    cfg = settings.store_config()
    return {
        "store": ObjectStoreResource(
            uri=settings.store, endpoint_url=cfg.endpoint_url, region_name=cfg.region,
            aws_access_key_id=_secret("AWS_ACCESS_KEY_ID"),
            aws_secret_access_key=_secret("AWS_SECRET_ACCESS_KEY"),
            aws_session_token=_secret("AWS_SESSION_TOKEN"),
        ),
        "spark": SparkResource(remote=settings.spark_remote, master=settings.spark_master,
                               server_state_dir=settings.spark_server_state),
        "freshidx": FreshidxSettings(**{f: getattr(settings, f) for f in PIPELINE_FIELDS}),
    }
