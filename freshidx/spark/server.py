"""A supervised Spark Connect server: health checks, crash restarts, planned restarts with draining.

``freshidx spark-server`` (or ``python -m freshidx.spark.server``) runs the Spark Connect server of
the installed pyspark wheel as a *foreground* child (``$SPARK_HOME/bin/spark-submit --class
SparkConnectServer``; ``spark-submit`` → ``spark-class`` → ``exec java``, so the child pid is the
JVM) in its own session, and acts as the watchdog the design asks for:

* **liveness** – the process is polled every ``poll_interval_s``; if it died (OOM killer,
  ``kill -9``) it is restarted at once (reason ``crash``);
* **health and progress** – every ``health_interval_s`` a Spark Connect client session runs
  ``SELECT 1`` under a short timeout, and the progress of the server's jobs is sampled
  (:mod:`freshidx.spark.progress`: task/stage counters and live I/O metrics from the driver's UI REST
  API on a random loopback port, plus the CPU time of the server's Python workers; *not* the JVM's
  CPU, which a starved JVM cannot get and an idle one spends on heartbeats and probes). While runs
  hold leases, probes do not decide anything (a failed one is recorded as ``health_busy_since`` /
  ``health_busy_failures``): the server is restarted (reason ``hung``) only once its jobs made no
  progress for ``hang_timeout_s``. A server nobody leases is restarted (reason ``health``) after
  ``health_failures`` failed probes in a row;
* **planned restarts** – when the JVM is older than ``restart_every_s`` (reason ``planned-age``) or
  its heap stays over ``max_heap_fraction`` of ``-Xmx`` even after a full GC (``planned-heap``), the
  supervisor *drains* first (so do ``hung`` and ``health``; only a dead JVM is restarted at once):
  it marks the state ``draining`` and waits (up to ``drain_timeout_s``) until no client holds a
  lease, then restarts. ``SIGHUP`` (CLI) requests one (``planned-manual``).
  More than ``max_session_processes`` processes in the JVM's session (Python worker daemons that
  Spark Connect leaks per client session) is a planned restart too (``planned-processes``).

**Heap measurement.** ``jcmd <pid> GC.heap_info`` gives the used heap, ``jcmd <pid> VM.flags`` the
``MaxHeapSize`` (both ~0.3 s of CPU, sampled every ``heap_check_interval_s``, not every health
check). A sample over the threshold is confirmed with ``jcmd <pid> GC.run`` (a full GC) and sampled
again, so garbage waiting for collection never triggers a restart: only a live set over the
threshold does. Without ``jcmd`` (a JRE without the JDK tools) the fallback is the process RSS from
``/proc`` against ``-Xmx`` (``heap_source: "rss"``), which over-counts (metaspace, code cache,
threads) and so restarts earlier.

**Leases.** The server cannot tell us which client operations are running, so clients say so:
:func:`acquire_lease` writes ``state_dir/leases/<run-id>--<pid>-<nonce>.json`` while a freshidx run
uses the server, and waits while the server is starting/draining/restarting/down, raising
:class:`ServerUnavailable` after ``timeout_s``. The lease is written *before* the state is re-read,
and the supervisor writes ``draining`` *before* it lists leases, so a client either sees
``draining`` (and withdraws) or the supervisor sees its lease. Leases of dead processes on this host
are reaped. Client sessions do not survive a restart: create the Spark Connect session inside the
lease.

**Start-up time.** Most of a start is JVM class loading and JIT (port open ~8–30 s, first query
several seconds more; the supervisor pays both with a warm-up before it reports ``up``). With
``class_data_sharing`` the first JVM started for a ``cds_dir`` (per JDK, Spark jars and heap size)
is started with ``-XX:+RecordDynamicDumpInfo`` and, once warmed up and before it is reported up,
dumps every class it has loaded with ``jcmd <pid> VM.cds dynamic_dump`` (10–50 s, once); every
later start maps that archive (``-XX:SharedArchiveFile``): on the loaded 2-core test box the port
opened in 4.8–14 s instead of 14–30 s. (Dumping at exit, ``-XX:ArchiveClassesAtExit``, was tried
and rejected: it added 17–50 s to the first planned restart, while clients wait.) A JVM ignores an
archive it cannot use; an archive in use by a start that fails is deleted.

**State** is ``state_dir/state.json`` (written atomically), read with :func:`read_state`. The JVM's
stdout/stderr go to ``state_dir/server.log``. Only one supervisor may own a ``state_dir`` (an
``flock`` on ``state_dir/supervisor.lock``); a JVM left behind by a supervisor that was killed with
``SIGKILL`` is found through the recorded pid and its command line and killed on the next start.
On stop the whole session of the JVM (the JVM *and* its Python worker daemons, which put themselves
in their own process group) gets ``SIGTERM``, then ``SIGKILL`` after ``stop_timeout_s``.

**Stopping at any moment.** ``SIGTERM``/``SIGINT`` to ``freshidx spark-server`` call
:meth:`SparkConnectSupervisor.request_stop` from the handler: the current JVM's session gets
``SIGTERM`` at once, whatever the supervisor is doing (starting, warming up, dumping the archive,
draining, restarting), every wait in a start polls the request (a JVM spawned just before it is
killed right after ``Popen``), no JVM is spawned after it, the JVM gets at most ``STOP_GRACE_S``
before ``SIGKILL``, and the last status written is ``down`` (with ``stopped_at``). The JVM is also
started with ``PR_SET_PDEATHSIG`` = ``SIGTERM`` (a small exec shim before ``spark-submit``): if the
supervisor is killed with ``SIGKILL``, its JVM shuts down with it (the worker daemons exit when the
JVM's pipes close), and the recorded-pid check above remains for anything else. The death signal
follows the *thread* that spawned the JVM: start and supervise from one long-lived thread.

**Clients cut off by a restart** see a ``pyspark.errors.PySparkException`` (e.g. ``SparkConnectGrpcException``
or ``Cannot call methods on a stopped SparkContext``), an ordinary exception: the assets' Dagster
``RetryPolicy`` retries it, and the retry leases again (waiting while the server restarts).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

from freshidx.spark.progress import ProgressTracker, SparkStatusClient, python_worker_cpu_s, ui_port_from_log

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_STATE_DIR = Path(".freshidx") / "spark-server"
DEFAULT_PORT = 15002
STATUSES = ("starting", "up", "draining", "restarting", "down")
RESTART_REASONS = ("crash", "health", "hung", "planned-age", "planned-heap", "planned-processes", "planned-manual")
#: After a stop request the JVM gets at most this long to exit on SIGTERM (callers such as the demo
#: SIGKILL the supervisor ~30 s after their SIGTERM; the JVM must be gone well before).
STOP_GRACE_S = 10.0
# Run through this before spark-submit: the JVM gets SIGTERM (its shutdown hooks clean up; it exits
# in seconds) when the supervisor thread that spawned it ends, even by SIGKILL, and it never outlives a
# supervisor that died before the prctl took effect.
_PDEATHSIG_SHIM = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, 15)  # PR_SET_PDEATHSIG, SIGTERM\n"
    "if os.getppid() != int(sys.argv[1]):\n    sys.exit(70)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)

_STARTED_RE = re.compile(rb"Spark Connect server started at: *(\S+):(\d+)")
_HEAP_USED_RE = re.compile(r"\btotal (\d+)K, used (\d+)K")
_MAX_HEAP_RE = re.compile(r"-XX:MaxHeapSize=(\d+)")
_SAFE_RUN_ID = re.compile(r"[^A-Za-z0-9._-]")
_LOG_ROTATE_BYTES = 64 * 1024 * 1024
_HOSTNAME = socket.gethostname()

T = TypeVar("T")


class ServerUnavailable(RuntimeError):
    """The supervised Spark Connect server did not become usable within the caller's timeout."""


class ServerStartError(RuntimeError):
    """The Spark Connect server could not be started (or warmed up)."""


class StateDirBusy(ServerStartError):
    """Another live supervisor owns the state directory."""


# --------------------------------------------------------------------------------------------
# configuration


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
    # Spark Connect starts Python worker daemons per client session and does not reap them
    # (measured ~3 processes / ~150 MiB RSS per run without worker reuse, see spark_conf): the
    # heap stays fine while the session grows.
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
    class_data_sharing: bool = True
    cds_dir: Path | None = None

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
            # Connect keys Python worker pools by session (SPARK_JOB_ARTIFACT_UUID) and never reaps a
            # closed session's pool (SPARK-54055). Without reuse only the pool's daemon stays behind:
            # measured 3 instead of 7 processes and ~150 instead of ~650 MiB RSS left per run, at
            # the same batch latency (docs/benchmarks.md).
            "spark.python.worker.reuse": "false",
            # the `store` option of our data source carries credentials
            "spark.sql.redaction.options.regex": "(?i)url|^store$",
        }
        if self.is_local:
            # Driver RPC and block manager listen on loopback only (in local mode nothing else needs
            # them); without this they bind the host's public address on random ports.
            conf["spark.driver.host"] = "127.0.0.1"
            conf["spark.driver.bindAddress"] = "127.0.0.1"
        conf.update({str(k): str(v) for k, v in self.conf.items()})
        return conf


def parse_memory(text: str) -> int:
    """Bytes of a JVM/Spark memory string: ``2g``, ``512m``, ``1024k``, ``1t`` or plain bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)b?\s*", text.lower())
    if not m:
        raise ValueError(f"not a memory size: {text!r}")
    return int(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " ")


def spark_home() -> Path:
    """The Spark distribution inside the installed pyspark wheel (or ``$SPARK_HOME`` if set)."""
    env = os.environ.get("SPARK_HOME")
    if env and (Path(env) / "bin" / "spark-submit").exists():
        return Path(env)
    import pyspark

    return Path(pyspark.__file__).parent


# --------------------------------------------------------------------------------------------
# state file


def _now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def _atomic_write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True, default=str)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _pid_alive(pid: int | None) -> bool:
    if not pid or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (our own dead child not yet reaped) still answers kill(0)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def read_state(state_dir: Path | str) -> dict[str, Any] | None:
    """The supervisor's ``state.json``, or None if there is none (never started here).

    Adds ``supervisor_alive`` (bool, or None when the state was written on another host): a state
    whose supervisor died is stale, whatever its ``status`` says.
    """
    path = Path(state_dir) / "state.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    if data.get("hostname") == _HOSTNAME:
        data["supervisor_alive"] = _pid_alive(data.get("supervisor_pid"))
    else:
        data["supervisor_alive"] = None
    return data


def _state_is_usable(state: dict[str, Any] | None) -> bool:
    if not state or state.get("status") != "up":
        return False
    if state.get("hostname") == _HOSTNAME:
        return bool(state.get("supervisor_alive")) and _pid_alive(state.get("pid"))
    return True


# --------------------------------------------------------------------------------------------
# leases (client side)


@dataclass(frozen=True)
class Lease:
    """A client's claim that it is using the server: no planned restart while it is held."""

    run_id: str
    path: Path
    url: str
    server_pid: int | None
    acquired_at: str
    waited_s: float


def _lease_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "leases"


@contextlib.contextmanager
def acquire_lease(
    state_dir: Path | str, run_id: str, timeout_s: float = 300.0, *, poll_s: float = 0.2
) -> Iterator[Lease]:
    """Hold a lease on the supervised server for the duration of the ``with`` block.

    Waits while the server is starting, draining, restarting or down; raises
    :class:`ServerUnavailable` if it is not ``up`` within ``timeout_s``. The yielded
    :class:`Lease` carries the ``sc://`` URL to connect to. Several leases with the same ``run_id``
    (e.g. steps of one run in different processes) are independent.
    """
    state_dir = Path(state_dir)
    leases = _lease_dir(state_dir)
    leases.mkdir(parents=True, exist_ok=True)
    safe = _SAFE_RUN_ID.sub("_", run_id)[:100] or "run"
    path = leases / f"{safe}--{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    state: dict[str, Any] | None = None
    while True:
        state = read_state(state_dir)
        if _state_is_usable(state):
            assert state is not None
            lease_doc = {
                "run_id": run_id, "pid": os.getpid(), "hostname": _HOSTNAME,
                "acquired_at": _now_iso(), "server_pid": state.get("pid"),
            }
            _atomic_write_json(path, lease_doc)
            # Re-read *after* the lease is visible: the supervisor writes "draining" before it lists
            # leases, so either we see "draining" here, or it sees our lease.
            again = read_state(state_dir)
            if _state_is_usable(again) and again is not None and again.get("pid") == state.get("pid"):
                break
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        if time.monotonic() >= deadline:
            status = (state or {}).get("status", "no state file")
            if state and state.get("supervisor_alive") is False:
                status = f"{status}, but its supervisor (pid {state.get('supervisor_pid')}) is not running"
            raise ServerUnavailable(
                f"Spark Connect server supervised in {state_dir} not available after {timeout_s:.0f}s "
                f"(status: {status}; last restart reason: {(state or {}).get('last_restart_reason')}). "
                "Is `freshidx spark-server` running?"
            )
        time.sleep(poll_s)
    lease = Lease(
        run_id=run_id, path=path, url=str(state.get("url")), server_pid=state.get("pid"),
        acquired_at=lease_doc["acquired_at"], waited_s=round(time.monotonic() - t0, 3),
    )
    try:
        yield lease
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def active_leases(state_dir: Path | str, *, reap_stale: bool = True) -> list[dict[str, Any]]:
    """Leases currently held. Leases of processes that no longer exist on this host are removed."""
    out: list[dict[str, Any]] = []
    d = _lease_dir(Path(state_dir))
    if not d.is_dir():
        return out
    for p in sorted(d.glob("*.json")):
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            continue
        except (OSError, ValueError):
            # being written (atomic rename makes this rare) or garbage: count it, reap by age
            doc = {"run_id": p.name, "unreadable": True}
            with contextlib.suppress(OSError):
                if reap_stale and time.time() - p.stat().st_mtime > 3600:
                    p.unlink()
                    continue
        if reap_stale and doc.get("hostname") == _HOSTNAME and not _pid_alive(doc.get("pid")):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
            continue
        doc["file"] = p.name
        out.append(doc)
    return out


# --------------------------------------------------------------------------------------------
# process helpers


def session_members(sid: int) -> list[int]:
    """Pids whose session id is ``sid`` (the JVM we started with ``setsid`` and its descendants)."""
    pids: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return pids
    for name in entries:
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields_ = stat.rsplit(")", 1)[-1].split()
        # after the comm: state ppid pgrp session ...
        if len(fields_) > 3 and fields_[3] == str(sid) and fields_[0] != "Z":
            pids.append(int(name))
    return pids


def _signal_session(sid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, sig)
    for pid in session_members(sid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process (all its threads) so far, from ``/proc``."""
    try:
        fields_ = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
        return (int(fields_[11]) + int(fields_[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def rss_bytes(pid: int) -> int | None:
    """Resident set size of a process in bytes, from ``/proc``; ``None`` if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _port_accepts(host: str, port: int, timeout: float = 0.5) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        return s.connect_ex((host, port)) == 0


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _jcmd() -> str | None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "jcmd").exists():
        return str(Path(java_home) / "bin" / "jcmd")
    return shutil.which("jcmd")


@dataclass
class MemorySample:
    heap_used_bytes: int | None
    heap_max_bytes: int | None
    rss_bytes: int | None
    source: str  # "jcmd" | "rss"

    @property
    def fraction(self) -> float | None:
        if not self.heap_max_bytes:
            return None
        used = self.heap_used_bytes if self.source == "jcmd" else self.rss_bytes
        return None if used is None else used / self.heap_max_bytes


def _run_jcmd(
    pid: int, *command: str, timeout: float = 20.0, cancel: Callable[[], bool] | None = None
) -> str | None:
    exe = _jcmd()
    if exe is None:
        return None
    try:
        proc = subprocess.Popen([exe, str(pid), *command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    except OSError:
        return None
    deadline = time.monotonic() + timeout
    while True:  # polled, so a stop request does not wait for a CDS dump (10-50 s)
        try:
            out, _ = proc.communicate(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline or (cancel is not None and cancel()):
                proc.kill()
                proc.communicate()
                return None
    return out if proc.returncode == 0 else None


def sample_memory(pid: int, xmx_bytes: int, max_heap_cache: dict[int, int] | None = None) -> MemorySample:
    """Heap used / max of JVM ``pid`` via ``jcmd``; falls back to RSS vs ``xmx_bytes``."""
    rss = rss_bytes(pid)
    out = _run_jcmd(pid, "GC.heap_info")
    m = _HEAP_USED_RE.search(out or "")
    if m:
        heap_max: int | None = (max_heap_cache or {}).get(pid)
        if heap_max is None:
            flags = _run_jcmd(pid, "VM.flags")
            mm = _MAX_HEAP_RE.search(flags or "")
            heap_max = int(mm.group(1)) if mm else xmx_bytes
            if max_heap_cache is not None:
                max_heap_cache[pid] = heap_max
        return MemorySample(int(m.group(2)) * 1024, heap_max, rss, "jcmd")
    return MemorySample(None, xmx_bytes, rss, "rss")


@functools.cache
def _cds_key() -> str | None:
    """Identifies the JVM + Spark jars an archive belongs to; None if this JVM cannot do AppCDS."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not java:
        return None
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30, check=False).stderr
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not m:
        return None
    major = int(m.group(2) if m.group(1) == "1" else m.group(1))
    if major < 17:  # jcmd VM.cds dynamic_dump (+RecordDynamicDumpInfo) arrived in JDK 17
        return None
    jars = sorted(p.name for p in (spark_home() / "jars").glob("*.jar"))
    digest = hashlib.sha256("\n".join([os.path.realpath(java), out, *jars]).encode()).hexdigest()
    return f"jdk{major}-{digest[:12]}"


def _warmup_batches(batches: Iterator[Any]) -> Iterator[Any]:
    """mapInArrow body of the warm-up: proves the server's Python workers can import freshidx."""
    import pyarrow as pa

    import freshidx.partitions

    for batch in batches:
        yield pa.RecordBatch.from_pydict(
            {"module": [freshidx.partitions.__file__] * batch.num_rows, "python": [sys.executable] * batch.num_rows}
        )


def _call_with_timeout(
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


def _connect_session(url: str, *, quick_retries: bool) -> Any:
    """A Spark Connect client session that does not touch pyspark's default/active session."""
    from pyspark.sql.connect.client.retries import DefaultPolicy
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    session = ConnectSession(connection=url)
    if quick_retries:
        session.client.set_retry_policies([DefaultPolicy(max_retries=2, initial_backoff=100, max_backoff=1000)])
    return session


def _close_session(session: Any, *, release: bool) -> None:
    if session is None:
        return
    session.release_session_on_close = release
    with contextlib.suppress(Exception):
        session.stop()


# --------------------------------------------------------------------------------------------
# the supervisor


class SparkConnectSupervisor:
    """Starts, watches and restarts one Spark Connect server. Thread-safe; see the module docstring."""

    def __init__(
        self, config: ServerConfig, *, on_state: Callable[[dict[str, Any]], None] | None = None
    ) -> None:
        self.config = config
        self.state_dir = config.state_dir
        self.state_path = self.state_dir / "state.json"
        self.log_path = self.state_dir / "server.log"
        self.properties_path = self.state_dir / "spark-connect.properties"
        self._on_state = on_state
        self._proc: subprocess.Popen[bytes] | None = None
        self._proc_lock = threading.RLock()
        self._state_lock = threading.RLock()
        self._state: dict[str, Any] = {}
        self._stop = threading.Event()  # stop requested (request_stop / stop): no JVM may outlive it
        self._stop_at: float | None = None
        self._run_stop: threading.Event | None = None  # run_forever's stop event
        self._status_client: SparkStatusClient | None = None  # the JVM's UI REST API (progress.py)
        self._health_failures = 0
        self._busy_since: str | None = None
        self._busy_failures = 0
        self._restart_requested: str | None = None
        self._pending_reason: str | None = None  # a restart that failed and must be retried
        self._lock_file: IO[str] | None = None
        self._health_session: Any = None
        self._started_mono: float | None = None
        self._max_heap_cache: dict[int, int] = {}
        self._cds_pending: tuple[Path, Path] | None = None  # (temp file of the dump, final archive)
        self._cds_in_use: Path | None = None
        self._xmx = parse_memory(config.driver_memory)
        self.last_timings: dict[str, float] = {}

    # ---- state ------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None else None

    def state(self) -> dict[str, Any]:
        with self._state_lock:
            return dict(self._state)

    def _stopping(self) -> bool:
        return self._stop.is_set() or (self._run_stop is not None and self._run_stop.is_set())

    def _update_state(self, **changes: Any) -> dict[str, Any]:
        if self._stop.is_set() and changes.get("status") not in (None, "down"):
            changes.pop("status")  # once a stop is requested, the last status written is "down"
        with self._state_lock:
            status_changed = "status" in changes and changes["status"] != self._state.get("status")
            self._state.update(changes)
            self._state["updated_at"] = _now_iso()
            if self._started_mono is not None and self._state.get("pid"):
                self._state["uptime_s"] = round(time.monotonic() - self._started_mono, 1)
            snapshot = dict(self._state)
            _atomic_write_json(self.state_path, snapshot)
        if status_changed and self._on_state is not None:
            with contextlib.suppress(Exception):
                self._on_state(snapshot)
        return snapshot

    # ---- ownership of the state dir ----------------------------------------------------------

    def _take_lock(self) -> None:
        if self._lock_file is not None:
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        f = open(self.state_dir / "supervisor.lock", "a+", encoding="utf-8")  # noqa: SIM115
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            other = read_state(self.state_dir) or {}
            raise StateDirBusy(
                f"another supervisor owns {self.state_dir} (pid {other.get('supervisor_pid')})"
            ) from None
        self._lock_file = f

    def _release_lock(self) -> None:
        if self._lock_file is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None

    def _kill_leftover(self) -> None:
        """A JVM recorded by a previous supervisor of this state dir that was killed itself."""
        old = read_state(self.state_dir) or {}
        pid = old.get("pid")
        if (
            isinstance(pid, int)
            and old.get("hostname") == _HOSTNAME
            and _pid_alive(pid)
            and SERVER_CLASS in _cmdline(pid)
            and str(self.properties_path) in _cmdline(pid)
        ):
            _signal_session(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30  # the new JVM needs its port: wait for the old one to be gone
            while _pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)

    # ---- start / stop ------------------------------------------------------------------------

    def start(self) -> dict[str, Any]:
        """Start the server and wait until it answers a real query. Returns timings (seconds).

        The JVM is killed when the thread that calls this ends (``PR_SET_PDEATHSIG``): call it from
        the thread that keeps supervising (as :meth:`run_forever` does)."""
        self._stop.clear()
        self._stop_at = None
        return self._start()

    def _start(self) -> dict[str, Any]:
        self._take_lock()
        with self._state_lock:
            if not self._state:
                self._state = {
                    "status": None, "restarts": 0, "supervisor_pid": os.getpid(),
                    "supervisor_started_at": _now_iso(), "hostname": _HOSTNAME, "url": self.config.url,
                    "host": self.config.host, "port": self.config.port, "master": self.config.master,
                    "log": str(self.log_path), "state_dir": str(self.state_dir),
                    "last_restart_at": None, "last_restart_reason": None, "pid": None,
                }
        with self._proc_lock:
            if self._proc is not None and self._proc.poll() is None:
                return dict(self.last_timings)
            self._kill_leftover()
            self._update_state(status="starting" if not self._state.get("restarts") else "restarting")
            return self._spawn_and_wait()

    def _command(self) -> list[str]:
        home = spark_home()
        return [
            sys.executable, "-I", "-S", "-c", _PDEATHSIG_SHIM, str(os.getpid()),
            str(home / "bin" / "spark-submit"),
            "--class", SERVER_CLASS,
            "--name", "freshidx Spark Connect server",
            "--master", self.config.master,
            "--driver-memory", self.config.driver_memory,
            "--properties-file", str(self.properties_path),
        ]

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        for var in ("SPARK_REMOTE", "SPARK_LOCAL_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "PYSPARK_SUBMIT_ARGS"):
            env.pop(var, None)
        env["SPARK_HOME"] = str(spark_home())
        env["SPARK_CONNECT_MODE"] = "0"  # as sbin/start-connect-server.sh does
        env["PYSPARK_PYTHON"] = self.config.python
        env["PYSPARK_DRIVER_PYTHON"] = self.config.python
        if self.config.is_local:
            env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        return env

    def _write_properties(self, java_opts: list[str]) -> None:
        conf = self.config.spark_conf()
        if java_opts:
            key = "spark.driver.extraJavaOptions"
            conf[key] = " ".join([*java_opts, conf.get(key, "")]).strip()
        lines = []
        for key, value in sorted(conf.items()):
            k = key.replace("\\", "\\\\").replace("=", "\\=").replace(":", "\\:").replace(" ", "\\ ")
            v = value.replace("\\", "\\\\").replace("\n", "\\n")
            lines.append(f"{k}={v}\n")
        fd = os.open(self.properties_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.writelines(lines)

    def _cds_options(self) -> list[str]:
        """JVM flags for class data sharing: map the archive if there is one, else get ready to dump one."""
        self._cds_pending = None
        self._cds_in_use = None
        if not self.config.class_data_sharing or _jcmd() is None:
            return []
        key = _cds_key()
        if key is None:
            return []
        cds_dir = self.config.cds_dir or self.state_dir / "cds"
        cds_dir.mkdir(parents=True, exist_ok=True)
        xmx = self.config.driver_memory.lower()  # compressed-oops mode depends on the heap size
        archive = cds_dir / f"spark-connect-{key}-{xmx}.jsa"
        # (-Xlog: otherwise ~800 "[warning][cds] Skipping …: Signed JAR" lines)
        if archive.is_file() and archive.stat().st_size > 0:
            self._cds_in_use = archive
            return [f"-XX:SharedArchiveFile={archive}", "-Xshare:auto", "-Xlog:cds*=error"]
        for stale in cds_dir.glob(f"{archive.name}.*.tmp"):
            with contextlib.suppress(OSError):
                if time.time() - stale.stat().st_mtime > 3600:
                    stale.unlink()
        self._cds_pending = (cds_dir / f"{archive.name}.{uuid.uuid4().hex[:8]}.tmp", archive)
        return ["-XX:+RecordDynamicDumpInfo", "-Xlog:cds*=error"]

    def _dump_cds(self, pid: int, deadline: float) -> float | None:
        """Write the class archive of the warmed-up JVM (``jcmd VM.cds dynamic_dump``), before it is
        reported up: the first start pays 10–50 s once, no later restart has to."""
        pending, self._cds_pending = self._cds_pending, None
        if pending is None:
            return None
        tmp, archive = pending
        t = time.monotonic()
        out = _run_jcmd(pid, "VM.cds", "dynamic_dump", str(tmp), timeout=max(5.0, deadline - time.monotonic()),
                        cancel=self._stopping)
        if self._stopping():
            tmp.unlink(missing_ok=True)
            raise ServerStartError("stop requested while dumping the class archive")
        try:
            if out is not None and tmp.is_file() and tmp.stat().st_size > 0:
                os.replace(tmp, archive)
                self._update_state(cds_archive=str(archive), cds_error=None)
            else:
                tmp.unlink(missing_ok=True)
                self._update_state(cds_error=f"dynamic_dump failed: {out!r}"[:500])
        except OSError as exc:
            self._update_state(cds_error=str(exc)[:500])
        return round(time.monotonic() - t, 3)

    def _open_log(self) -> IO[bytes]:
        with contextlib.suppress(OSError):
            if self.log_path.stat().st_size > _LOG_ROTATE_BYTES:
                os.replace(self.log_path, self.log_path.with_suffix(".log.1"))
        log = open(self.log_path, "ab")  # noqa: SIM115
        log.write(f"\n===== freshidx supervisor: starting Spark Connect server at {_now_iso()} =====\n".encode())
        log.flush()
        return log

    def _log_tail(self, offset: int, limit: int = 3000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except OSError:
            return ""
        lines = [ln for ln in data.decode("utf-8", "replace").splitlines() if not ln.startswith("\tat ")]
        return "\n".join(lines)[-limit:]

    def _spawn_and_wait(self, when_up: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
        """Spawn the JVM, wait for the port, warm up; ``when_up`` adds fields to the "up" state write."""
        cfg = self.config
        if self._stopping():
            raise ServerStartError("stop requested")
        if not _port_free(cfg.host if cfg.host not in ("", "::") else "0.0.0.0", cfg.port):
            raise ServerStartError(f"port {cfg.host}:{cfg.port} is already in use")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        workdir = self.state_dir / "work"  # spark-warehouse etc. land here, not in the caller's cwd
        workdir.mkdir(exist_ok=True)
        self._write_properties(self._cds_options())
        log = self._open_log()
        offset = log.tell()
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(
                self._command(), cwd=workdir, env=self._env(), stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        finally:
            log.close()
        self._proc = proc
        self._started_mono = t0
        self._max_heap_cache.clear()
        try:
            # (a stop requested between Popen and the line above did not see this JVM: it is killed below)
            self._update_state(pid=proc.pid, started_at=_now_iso(), heap_used_bytes=None, heap_max_bytes=None,
                               rss_bytes=None, ui_url=None)
            self._wait_listening(proc, offset, t0 + cfg.start_timeout_s)
            t_port = time.monotonic()
            timings = {"port_open_s": round(t_port - t0, 3)}
            if cfg.warm_up:
                timings.update(self._warm_up(t0 + cfg.start_timeout_s))
            if (dumped := self._dump_cds(proc.pid, t0 + cfg.start_timeout_s)) is not None:
                timings["cds_dump_s"] = dumped
            self._reset_health_session()
            timings["ready_s"] = round(time.monotonic() - t0, 3)
        except BaseException as exc:
            tail = self._log_tail(offset)
            died = proc.poll() is not None
            self._terminate()
            if died and self._cds_in_use is not None:  # never let a bad archive keep the server down
                self._cds_in_use.unlink(missing_ok=True)
            self._update_state(status="down", pid=None, last_pid=proc.pid, last_error=f"start failed: {exc}")
            if isinstance(exc, ServerStartError | KeyboardInterrupt):
                raise
            raise ServerStartError(
                f"Spark Connect server did not become ready: {exc}\n--- server.log ---\n{tail}"
            ) from exc
        self.last_timings = timings
        self._update_state(status="up", last_error=None, consecutive_health_failures=0,
                           last_start_timings=timings, last_health_at=_now_iso(), **(when_up() if when_up else {}))
        return dict(timings)

    def _wait_listening(self, proc: subprocess.Popen[bytes], offset: int, deadline: float) -> None:
        cfg = self.config
        probe_host = "127.0.0.1" if cfg.host in ("0.0.0.0", "::", "") else cfg.host
        scanned = offset
        while True:
            if self._stopping():
                raise ServerStartError("stop requested while starting")
            rc = proc.poll()
            if rc is not None:
                raise ServerStartError(f"server exited with code {rc} while starting\n{self._log_tail(offset)}")
            # Spark retries a busy port on port+1 …: make sure it is listening where we expect.
            with contextlib.suppress(OSError), open(self.log_path, "rb") as f:
                f.seek(scanned)
                chunk = f.read()
                chunk = chunk[: chunk.rfind(b"\n") + 1]  # whole lines only (a port number may be cut)
                m = _STARTED_RE.search(chunk)
                if m and int(m.group(2)) != cfg.port:
                    raise ServerStartError(f"server bound port {int(m.group(2))} instead of {cfg.port}")
                if (ui_port := ui_port_from_log(chunk)) is not None:  # logged before the Connect port opens
                    self._status_client = SparkStatusClient(f"http://{probe_host}:{ui_port}",
                                                            timeout_s=min(10.0, cfg.health_timeout_s))
                    self._update_state(ui_url=self._status_client.base)
                scanned += len(chunk)
            if _port_accepts(probe_host, cfg.port):
                return
            if time.monotonic() > deadline:
                raise ServerStartError(f"port {cfg.port} not open after {cfg.start_timeout_s}s")
            time.sleep(0.1)

    def _warm_up(self, deadline: float) -> dict[str, float]:
        """The first query on a fresh server takes seconds (JIT, class loading): pay it here."""
        url = self.config.url
        box: dict[str, Any] = {}

        def work() -> dict[str, float]:
            t = time.monotonic()
            box["session"] = session = _connect_session(url, quick_retries=False)
            rows = session.range(1000).selectExpr("sum(id) AS s").collect()
            if rows[0]["s"] != 499500:
                raise ServerStartError(f"warm-up SQL returned {rows!r}")
            t_sql = time.monotonic()
            df = session.range(4, numPartitions=2).mapInArrow(_warmup_batches, "module string, python string")
            got = df.distinct().collect()
            if not got or not all(r["module"] for r in got):
                raise ServerStartError(f"warm-up Python job returned {got!r}")
            t_py = time.monotonic()
            box.pop("session")
            _close_session(session, release=True)  # still inside the timeout
            return {"warmup_sql_s": round(t_sql - t, 3), "warmup_python_s": round(t_py - t_sql, 3)}

        def abort() -> None:
            _close_session(box.get("session"), release=False)

        try:
            return _call_with_timeout(work, max(1.0, deadline - time.monotonic()), abort, self._stopping)
        finally:
            _close_session(box.get("session"), release=False)

    def _terminate(self) -> None:
        """SIGTERM the JVM's whole session, SIGKILL after ``stop_timeout_s``; reap."""
        with self._proc_lock:
            self._reset_health_session(create=False)
            proc = self._proc
            if proc is None:
                return
            sid = proc.pid
            self._status_client = None
            if proc.poll() is None:
                _signal_session(sid, signal.SIGTERM)
                give_up = time.monotonic() + self.config.stop_timeout_s
                while proc.poll() is None:
                    if self._stopping():  # a stop request shortens a restart's grace too
                        give_up = min(give_up, (self._stop_at or time.monotonic()) + STOP_GRACE_S)
                    if time.monotonic() >= give_up:
                        _signal_session(sid, signal.SIGKILL)
                        with contextlib.suppress(subprocess.TimeoutExpired):
                            proc.wait(10)
                        break
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(0.1)
            # Python worker daemons (own process groups, same session) that outlived the JVM
            for sig, grace in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
                if not session_members(sid):
                    break
                _signal_session(sid, sig)
                deadline = time.monotonic() + grace
                while session_members(sid) and time.monotonic() < deadline:
                    time.sleep(0.05)
            self._proc = None
            self._started_mono = None

    def request_stop(self) -> None:
        """Ask for a stop from anywhere (a signal handler too: takes no lock). Whatever the supervisor is
        doing, the current JVM gets SIGTERM now, every start or restart in progress gives up, and no
        JVM is spawned after this. :meth:`stop` finishes the job (SIGKILL after the grace, reaping)."""
        if self._stop_at is None:
            self._stop_at = time.monotonic()
        self._stop.set()
        proc = self._proc
        if proc is not None and proc.returncode is None:  # not reaped: the pid is still this JVM's
            _signal_session(proc.pid, signal.SIGTERM)

    def stop(self) -> None:
        """Stop supervising and stop the server (no JVM or Python worker is left behind)."""
        self.request_stop()
        with self._proc_lock:  # waits for a start/restart in progress to notice the request
            self._terminate()
            if self._state:
                self._update_state(status="down", pid=None, restarting_reason=None, stopped_at=_now_iso())
            self._release_lock()

    def request_restart(self, reason: str = "planned-manual") -> None:
        """Ask :meth:`run_forever` for a drained restart at its next tick."""
        self._restart_requested = reason

    # ---- health ------------------------------------------------------------------------------

    def _reset_health_session(self, *, create: bool = True) -> None:
        # Never a ReleaseSession RPC here: the server may be hung, and it is about to go anyway.
        old, self._health_session = self._health_session, None
        _close_session(old, release=False)
        if create:
            self._health_session = _connect_session(self.config.url, quick_retries=True)

    def health_check(self, timeout_s: float | None = None) -> bool:
        """True if the process lives and a Spark Connect session answers ``SELECT 1`` in time."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return False
        session = self._health_session
        if session is None:
            try:
                session = self._health_session = _connect_session(self.config.url, quick_retries=True)
            except Exception:
                return False

        def probe() -> bool:
            rows = session.sql("SELECT 1 AS one").collect()
            return bool(rows) and rows[0]["one"] == 1

        try:
            ok = _call_with_timeout(
                probe, timeout_s or self.config.health_timeout_s, lambda: _close_session(session, release=False)
            )
        except Exception:
            ok = False
        if not ok and self._health_session is session:
            self._health_session = None
            _close_session(session, release=False)
        return ok

    def _sample_memory(self) -> MemorySample | None:
        pid = self.pid
        if pid is None:
            return None
        sample = sample_memory(pid, self._xmx, self._max_heap_cache)
        self._update_state(heap_used_bytes=sample.heap_used_bytes, heap_max_bytes=sample.heap_max_bytes,
                           rss_bytes=sample.rss_bytes, heap_source=sample.source, heap_sampled_at=_now_iso())
        return sample

    def planned_restart_reason(self, *, check_heap: bool = True) -> str | None:
        """``planned-age`` / ``-heap`` / ``-processes`` / a requested reason, or None if none is due."""
        if self._restart_requested:
            return self._restart_requested
        if self._started_mono is not None and time.monotonic() - self._started_mono > self.config.restart_every_s:
            return "planned-age"
        if check_heap:
            sample = self._sample_memory()
            frac = sample.fraction if sample else None
            if frac is not None and frac > self.config.max_heap_fraction:
                if sample is not None and sample.source == "jcmd" and self.pid is not None:
                    _run_jcmd(self.pid, "GC.run", timeout=60)  # only a live set over the line counts
                    sample = self._sample_memory()
                    frac = sample.fraction if sample else None
                if frac is not None and frac > self.config.max_heap_fraction:
                    return "planned-heap"
            pid = self.pid
            if pid is not None:
                procs = len(session_members(pid))  # the JVM was started with setsid: sid == pid
                self._update_state(session_processes=procs)
                if self.config.max_session_processes and procs > self.config.max_session_processes:
                    return "planned-processes"
        return None

    # ---- restarts ----------------------------------------------------------------------------

    def _drain(self, reason: str) -> bool:
        """Mark draining, wait until no lease is held (or the timeout). False if asked to stop."""
        self._update_state(status="draining", drain_started_at=_now_iso(), draining_reason=reason)
        deadline = time.monotonic() + self.config.drain_timeout_s
        while True:
            leases = active_leases(self.state_dir)
            if not leases:
                self._update_state(drain_timed_out_leases=[])
                return True
            if self._proc is None or self._proc.poll() is not None:
                return True  # it died meanwhile: nothing left to drain
            if time.monotonic() >= deadline:
                self._update_state(drain_timed_out_leases=[d.get("run_id") for d in leases])
                return True
            held = [d.get("run_id") for d in leases]
            if held != self._state.get("leases"):
                self._update_state(leases=held)
            if self._stop.wait(0.2) or self._stopping():
                return False

    def _restart(self, reason: str) -> dict[str, Any]:
        """Stop the JVM (if any) and start a new one; counted once it is up."""
        t0 = time.monotonic()
        self._restart_requested = None  # one asked for while this runs is honoured afterwards
        with self._proc_lock:
            old_pid = self.pid or self._state.get("last_pid")
            self._update_state(status="restarting", restarting_reason=reason, leases=[])
            self._terminate()

            def restarted() -> dict[str, Any]:
                return {
                    "restarts": int(self._state.get("restarts") or 0) + 1, "last_restart_at": _now_iso(),
                    "last_restart_reason": reason, "last_restart_duration_s": round(time.monotonic() - t0, 3),
                    "last_restart_old_pid": old_pid, "restarting_reason": None,
                }

            timings = self._spawn_and_wait(restarted)
        self._pending_reason = None
        return {**timings, "restart_s": self._state["last_restart_duration_s"]}

    def run_forever(self, stop_event: threading.Event | None = None) -> None:
        """Supervise until ``stop_event`` is set (or :meth:`request_stop` / :meth:`stop`). Starts the
        server if needed.

        Does not stop the server on return; call :meth:`stop` for that. Raises
        :class:`StateDirBusy` if another supervisor owns the state dir; every other failure to
        start is retried with exponential backoff (status ``down``, ``last_error``).
        """
        stop = stop_event or threading.Event()
        self._run_stop = stop
        cfg = self.config
        failed_starts = 0
        tracker = ProgressTracker(cfg.hang_timeout_s)
        next_health = time.monotonic() + cfg.health_interval_s
        next_heap = time.monotonic() + min(cfg.heap_check_interval_s, cfg.health_interval_s)

        def fresh_jvm() -> None:
            nonlocal next_health
            self._health_failures, self._busy_since = 0, None
            tracker.reset(time.monotonic())
            next_health = time.monotonic() + cfg.health_interval_s

        try:
            while not self._stopping():
                try:
                    proc = self._proc
                    if proc is None:  # first start, or a restart that failed: retry with backoff
                        try:
                            if self._pending_reason:
                                self._restart(self._pending_reason)
                            else:
                                self._start()
                            failed_starts = 0
                        except StateDirBusy:
                            raise
                        except ServerStartError as exc:
                            if self._stopping():
                                break
                            failed_starts += 1
                            self._update_state(status="down", last_error=str(exc)[:4000])
                            stop.wait(min(60.0, 2.0**failed_starts))
                        fresh_jvm()
                        continue
                    if proc.poll() is not None:  # dead: restarted at once, nothing to drain
                        self._update_state(last_exit_code=proc.returncode)
                        self._restart_or_mark_down("crash")
                        fresh_jvm()
                        continue
                    now = time.monotonic()
                    reason: str | None = None
                    if now >= next_health:
                        reason = self._health_tick(tracker)
                        next_health = time.monotonic() + cfg.health_interval_s
                    if reason is None:
                        check_heap = now >= next_heap
                        if check_heap:
                            next_heap = now + cfg.heap_check_interval_s
                        reason = self.planned_restart_reason(check_heap=check_heap)
                    if reason is not None:  # every restart of a live JVM drains first
                        if not self._drain(reason):
                            break
                        dead = self._proc is None or self._proc.poll() is not None
                        self._restart_or_mark_down("crash" if dead else reason)
                        fresh_jvm()
                        continue
                except StateDirBusy:
                    raise
                except Exception as exc:  # keep supervising whatever goes wrong in one tick
                    self._update_state(last_error=f"supervisor: {type(exc).__name__}: {exc}"[:4000])
                stop.wait(cfg.poll_interval_s)
        finally:
            self._run_stop = None

    def _health_tick(self, tracker: ProgressTracker) -> str | None:
        """Probe, sample progress, record both; ``hung`` / ``health`` if a (drained) restart is due.

        With leases held only progress counts (a failed probe is recorded as ``health_busy_*``); the
        probe failure count applies to a server nobody is using."""
        proc = self._proc
        if proc is None:
            return None
        t0 = time.monotonic()
        ok = self.health_check()
        t1 = time.monotonic()
        leased = bool(active_leases(self.state_dir))
        client = self._status_client
        status = client.sample() if client is not None else None
        t2 = time.monotonic()
        cpu = python_worker_cpu_s(proc.pid, session_members(proc.pid))
        tracker.hang_timeout_s = self.config.hang_timeout_s  # (the config may be changed while running)
        verdict = tracker.observe(time.monotonic(), leased=leased, probe_ok=ok, status=status, python_cpu_s=cpu)
        changes: dict[str, Any] = {
            "progress": verdict.why, "progress_stalled_s": round(verdict.stalled_s, 1),
            "active_tasks": status.active_tasks if status else None,
            "status_api_error": status.error if status else "no UI",
            "probe_s": round(t1 - t0, 2), "status_api_s": round(t2 - t1, 2),
        }
        if verdict.progressed:
            changes["progress_at"] = _now_iso()
        if ok:
            self._health_failures, self._busy_since = 0, None
            changes.update(last_health_at=_now_iso(), consecutive_health_failures=0, health_busy_since=None)
        elif leased:
            if self._busy_since is None:
                self._busy_since, self._busy_failures = _now_iso(), 0
            self._busy_failures += 1
            changes.update(health_busy_since=self._busy_since, health_busy_failures=self._busy_failures)
        else:
            self._health_failures += 1
            changes.update(consecutive_health_failures=self._health_failures)
        self._update_state(**changes)
        if verdict.hung:
            return "hung"
        if not leased and self._health_failures >= self.config.health_failures and proc.poll() is None:
            self._health_failures = 0
            return "health"
        return None

    def _restart_or_mark_down(self, reason: str) -> None:
        try:
            self._restart(reason)
        except ServerStartError as exc:
            # run_forever sees no process and retries this restart with backoff
            self._pending_reason = reason
            self._update_state(status="down", last_error=str(exc)[:4000])


if __name__ == "__main__":  # the CLI: freshidx.cli.spark_server (``freshidx spark-server``)
    from freshidx.cli.spark_server import main

    sys.exit(main())
