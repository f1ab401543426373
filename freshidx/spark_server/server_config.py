"""How to run and supervise one Spark Connect server: :class:`ServerConfig`, its Spark conf, and the
vocabulary of the supervisor's state file (statuses, restart reasons).

Kept apart from the supervisor so that the CLI, the benchmarks and the tests can build a configuration
without importing the machinery that runs it. What the supervisor does with these settings:
:mod:`freshidx.spark_server.supervisor`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from freshidx.spark.class_archive import parse_memory
from freshidx.spark.session import NO_CALL_SITES

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_STATE_DIR = Path(".freshidx") / "spark-server"
DEFAULT_PORT = 15002
#: ``status`` in ``state.json``; a client may lease the server only while it is ``up``.
STATUSES = ("starting", "up", "draining", "restarting", "down")
#: ``last_restart_reason`` in ``state.json``: ``crash`` is immediate, every other one drains first.
RESTART_REASONS = ("crash", "health", "hung", "planned-age", "planned-heap", "planned-processes", "planned-manual")


@dataclass
class ServerConfig:
    """How to run and supervise one Spark Connect server. Durations are seconds."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    master: str = "local[2,4]"  # 2 threads, a task is tried up to 4 times
    conf: dict[str, str] = field(default_factory=dict)  # extra Spark confs; they override ours
    state_dir: Path = DEFAULT_STATE_DIR
    restart_every_s: float = 24 * 3600.0
    max_heap_fraction: float = 0.85
    # Spark Connect starts a Python worker daemon per client session and does not reap it
    # (SPARK-54055; idle workers go after a minute, see spark_conf): the heap stays fine while the
    # session grows.
    # More processes than this in the JVM's session → a planned (drained) restart. 0 = off.
    max_session_processes: int = 48
    health_interval_s: float = 5.0
    health_timeout_s: float = 15.0
    health_failures: int = 3  # consecutive failed health checks before a restart (only without leases)
    # With leases held, restart (drained) only after the jobs made no progress for this long (progress.py).
    hang_timeout_s: float = 300.0
    heap_check_interval_s: float = 30.0
    drain_timeout_s: float = 120.0
    driver_memory: str = "2g"
    start_timeout_s: float = 240.0  # spawn → port open → warm-up done
    stop_timeout_s: float = 30.0  # SIGTERM → SIGKILL
    poll_interval_s: float = 0.5  # process liveness
    python: str = sys.executable  # PYSPARK_PYTHON of the server's Python workers
    warm_up: bool = True
    # JDK AppCDS: the first JVM dumps the classes it loaded once warmed up, later starts map them
    # (port open ~2.5x sooner here). Needs jcmd (JDK >= 17). ``cds_dir`` None = ``state_dir/cds``.
    # Without an archive of its own the server maps the one `freshidx spark-cds` made, if any, and
    # dumps none; ``cds_dump`` off = never dump (map an archive only if one exists).
    class_data_sharing: bool = True
    cds_dir: Path | None = None
    cds_dump: bool = True
    # The control endpoint (control_server.py) on ``host``: 0 = none (the CLI's default is port + 1).
    control_port: int = 0
    lease_ttl_s: float = 30.0  # an endpoint lease not renewed for this long is dropped
    # A second JVM kept warm and promoted when the serving one dies (spare.py): seconds instead of a
    # ~30 s restart, for twice the memory. Off by default (docs/operations.md).
    spare: bool = False

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir).expanduser().absolute()
        if not 0 < self.port < 65536:
            raise ValueError(f"port out of range: {self.port}")
        if not 0 < self.max_heap_fraction <= 1:
            raise ValueError(f"max_heap_fraction must be in (0, 1]: {self.max_heap_fraction}")
        if self.restart_every_s <= 0 or self.health_interval_s <= 0 or self.drain_timeout_s < 0:
            raise ValueError("restart_every_s and health_interval_s must be > 0, drain_timeout_s >= 0")
        if self.max_session_processes < 0:
            raise ValueError(f"max_session_processes must be >= 0: {self.max_session_processes}")
        if self.health_failures < 1:
            raise ValueError("health_failures must be >= 1")
        if not 0 <= self.control_port < 65536 or self.lease_ttl_s <= 0:
            raise ValueError(f"control_port out of range ({self.control_port}) or lease_ttl_s <= 0")
        if self.hang_timeout_s <= 0:
            raise ValueError(f"hang_timeout_s must be > 0: {self.hang_timeout_s}")
        parse_memory(self.driver_memory)  # validates
        if self.cds_dir is not None:
            self.cds_dir = Path(self.cds_dir).expanduser().absolute()

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"sc://{host}:{self.port}"

    @property
    def fair_scheduler_path(self) -> Path:
        """The scheduler allocation file (written before each start: the default pool is FAIR)."""
        return self.state_dir / "fairscheduler.xml"

    @property
    def is_local(self) -> bool:
        return self.master.startswith("local")

    def spark_conf(self) -> dict[str, str]:
        """Everything the server starts with (``conf`` wins over the defaults)."""
        conf: dict[str, str] = {
            "spark.connect.grpc.binding.address": self.host,
            "spark.connect.grpc.binding.port": str(self.port),
            # The UI's REST API is the supervisor's progress signal (progress.py): a random port (0),
            # read back from the log; loopback only via SPARK_LOCAL_IP in local mode; no kill links.
            "spark.ui.enabled": "true",
            "spark.ui.port": "0",
            "spark.ui.killEnabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.execution.arrow.pyspark.enabled": "true",
            "spark.pyspark.python": self.python,
            "spark.python.worker.faulthandler.enabled": "true",
            # Static, and read by the clients: no call site recorded per DataFrame call, where it
            # saves a stack walk and an import attempt per call (~60 us).
            **NO_CALL_SITES,
            # Python workers are reused (Spark's default, restated because it was off here before): a
            # fresh worker per task costs fork + pyarrow/freshidx imports, ~0.35-0.45 s per Python task
            # on this box, and a micro-batch has two in a row (read, segment). Measured, warm Connect
            # session, 100k-doc window: micro-batch 2.7-3.7 s -> 2.2-2.5 s (docs/benchmarks.md).
            # Connect keys worker pools by session and never drops a closed session's daemon
            # (SPARK-54055); its idle workers are stopped after a minute (measured: 19 -> 9 processes,
            # 3.4 -> 1.8 GiB 80 s after three sessions closed), so reuse adds no lasting processes.
            # max_session_processes bounds what stays.
            "spark.python.worker.reuse": "true",
            # the `store` option of our data source carries credentials
            "spark.sql.redaction.options.regex": "(?i)url|^store$",
            # Every run shares this one application. FIFO would queue a micro-batch's small stages
            # behind a full or hourly build's long ones (measured under 4 CPU hogs: delta runs of 3+
            # min while a build ran); FAIR within the default pool gives each job its share of slots
            # (Connect cannot pick a pool per session: SPARK-48040 was not merged).
            "spark.scheduler.mode": "FAIR",
            "spark.scheduler.allocation.file": self.fair_scheduler_path.as_uri(),
        }
        if self.is_local:
            # Driver RPC and block manager listen on loopback only (in local mode nothing else needs
            # them); without this they bind the host's public address on random ports.
            conf["spark.driver.host"] = "127.0.0.1"
            conf["spark.driver.bindAddress"] = "127.0.0.1"
        conf.update({str(k): str(v) for k, v in self.conf.items()})
        return conf
