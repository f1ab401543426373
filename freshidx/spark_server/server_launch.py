"""How one Spark Connect server JVM is launched: its command line, environment, properties file, log,
and the port checks around it. No state and no waiting here: :mod:`freshidx.spark_server.server_process`
does the spawning, waiting and stopping.

The server is the one in the installed pyspark wheel: ``$SPARK_HOME/bin/spark-submit --class
SparkConnectServer`` (``spark-submit`` → ``spark-class`` → ``exec java``, so the child pid is the
JVM), run in a session of its own, through :data:`PDEATHSIG_SHIM`.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
from pathlib import Path
from typing import IO

from freshidx.spark.class_archive import spark_home
from freshidx.spark.session import WORKER_ARROW_POOL
from freshidx.spark_server.server_config import SERVER_CLASS, ServerConfig
from freshidx.spark_server.server_state import now_iso

# Run through this before spark-submit: the JVM gets SIGTERM (its shutdown hooks clean up; it exits
# in seconds) when the supervisor thread that spawned it ends, even by SIGKILL, and it never outlives a
# supervisor that died before the prctl took effect.
PDEATHSIG_SHIM = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, 15)  # PR_SET_PDEATHSIG, SIGTERM\n"
    "if os.getppid() != int(sys.argv[1]):\n    sys.exit(70)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)
_STARTED_RE = re.compile(rb"Spark Connect server started at: *(\S+):(\d+)")
_LOG_ROTATE_BYTES = 64 * 1024 * 1024


def command(config: ServerConfig, properties_path: Path) -> list[str]:
    """The argv of the JVM's start: the death-signal shim (parent = this process), then spark-submit."""
    home = spark_home()
    return [
        sys.executable, "-I", "-S", "-c", PDEATHSIG_SHIM, str(os.getpid()),
        str(home / "bin" / "spark-submit"),
        "--class", SERVER_CLASS,
        "--name", "freshidx Spark Connect server",
        "--master", config.master,
        "--driver-memory", config.driver_memory,
        "--properties-file", str(properties_path),
    ]


def environment(config: ServerConfig) -> dict[str, str]:
    """This process's environment minus whatever would make spark-submit a Connect *client*, and the
    Python workers' Arrow allocator (``session.WORKER_ARROW_POOL``) unless it names one."""
    env = dict(os.environ)
    env.setdefault("ARROW_DEFAULT_MEMORY_POOL", WORKER_ARROW_POOL)
    for var in ("SPARK_REMOTE", "SPARK_LOCAL_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "PYSPARK_SUBMIT_ARGS"):
        env.pop(var, None)
    env["SPARK_HOME"] = str(spark_home())
    env["SPARK_CONNECT_MODE"] = "0"  # as sbin/start-connect-server.sh does
    env["PYSPARK_PYTHON"] = config.python
    env["PYSPARK_DRIVER_PYTHON"] = config.python
    if config.is_local:
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


FAIR_SCHEDULER_XML = """<?xml version="1.0"?>
<allocations>
  <pool name="default"><schedulingMode>FAIR</schedulingMode><weight>1</weight><minShare>0</minShare></pool>
</allocations>
"""


def write_fair_scheduler(path: Path) -> None:
    """The allocation file: jobs in the default pool (every Connect session's) share slots fairly."""
    path.write_text(FAIR_SCHEDULER_XML, encoding="utf-8")


def write_properties(path: Path, conf: dict[str, str], java_opts: list[str]) -> None:
    """The ``--properties-file``: ``conf`` plus ``java_opts`` prepended to the driver's Java options.
    Owner-only (0600): the conf may carry credentials."""
    conf = dict(conf)
    if java_opts:
        key = "spark.driver.extraJavaOptions"
        conf[key] = " ".join([*java_opts, conf.get(key, "")]).strip()
    lines = []
    for key, value in sorted(conf.items()):
        k = key.replace("\\", "\\\\").replace("=", "\\=").replace(":", "\\:").replace(" ", "\\ ")
        v = value.replace("\\", "\\\\").replace("\n", "\\n")
        lines.append(f"{k}={v}\n")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.writelines(lines)


def open_log(path: Path) -> IO[bytes]:
    """``server.log`` for appending (rotated once over 64 MiB), with a banner for this start."""
    with contextlib.suppress(OSError):
        if path.stat().st_size > _LOG_ROTATE_BYTES:
            os.replace(path, path.with_suffix(".log.1"))
    log = open(path, "ab")  # noqa: SIM115
    log.write(f"\n===== freshidx supervisor: starting Spark Connect server at {now_iso()} =====\n".encode())
    log.flush()
    return log


def log_tail(path: Path, offset: int, limit: int = 3000) -> str:
    """The log since ``offset`` without Java stack frames (the message lines say what went wrong)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return ""
    lines = [ln for ln in data.decode("utf-8", "replace").splitlines() if not ln.startswith("\tat ")]
    return "\n".join(lines)[-limit:]


def bound_port(chunk: bytes) -> int | None:
    """The port the server says it listens on (Spark moves to port+1… if the chosen one is taken)."""
    m = _STARTED_RE.search(chunk)
    return int(m.group(2)) if m else None


def port_accepts(host: str, port: int, timeout: float = 0.5) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        return s.connect_ex((host, port)) == 0


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
