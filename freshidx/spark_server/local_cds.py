"""JDK AppCDS for local-mode Spark JVMs (the embedded default: Dagster runs, CLI commands, the demo's
builds, the test suite): a class archive that every later JVM maps instead of loading and verifying
Spark's ~10k classes again.

Measured on the 2-core box (a local session's start and first job, C1 only, quiet box): 17–18 CPU-s
and 14–15 s without the archive, 9–10 CPU-s and 7 s with it. A process that starts a local session pays
its JVM start each time (each Dagster run is a process of its own), so that is the cost it cuts.

The archive is made once per JDK + Spark jars + driver heap size (:func:`prepare`, ``freshidx
spark-cds``, which ``scripts/test.sh`` runs; ~60 s, 67 CPU-s): a throw-away JVM runs the JVM side of
a small build and dumps the classes it loaded when it exits (``-XX:ArchiveClassesAtExit``, which needs
no JDK tools, unlike the Connect server's ``jcmd`` dump in :mod:`freshidx.spark_server.cds`).
:func:`with_archive` then adds it to a local session's JVM options when it exists; ``-Xshare:auto``
makes a JVM that cannot use it (another JDK, a changed classpath) start without it, as before.
:func:`find_archive` picks it: a JVM with another heap under 32 GiB maps the default (1g) one. The
same archive serves every JVM ``spark-class`` launches from these jars: a Connect server without an
archive of its own (:func:`freshidx.spark_server.cds.plan_archive`), a standalone master, workers, executors.

The cache stays bounded: making an archive deletes the same jar path's superseded ones and those no JVM
was given for two weeks (:func:`remove_unused`).

``FRESHIDX_SPARK_CDS_DIR`` moves the archives (default ``$XDG_CACHE_HOME/freshidx/cds``, else
``~/.cache/freshidx/cds``); ``off`` turns sharing off.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from freshidx.spark_server.cds import archive_name, cds_key, map_options, remove_stale_dumps, remove_superseded
from freshidx.spark_server.server_config import parse_memory

CDS_DIR_ENV = "FRESHIDX_SPARK_CDS_DIR"
JAVA_OPTIONS = "spark.driver.extraJavaOptions"
#: The heap ``freshidx spark-cds`` prepares for by default (a local session's default heap).
DEFAULT_MEMORY = "1g"
#: Below this heap the JVM compresses pointers, and a dynamic archive maps at any heap size.
_COMPRESSED_POINTERS_BELOW = 32 * 1024**3
#: Options that already decide class data sharing: a caller that passes one keeps its own choice.
_CDS_FLAGS = ("SharedArchiveFile", "ArchiveClassesAtExit", "-Xshare")
_OFF = {"off", "none", "false", "0"}
#: An archive's modification time is moved to "now" when a JVM is given it, at most this often.
_USE_MARK_S = 3600
#: Archives no JVM was given for this long are deleted when ``freshidx spark-cds`` makes one.
UNUSED_AFTER_S = 14 * 24 * 3600


def archive_dir(env: Mapping[str, str] | None = None) -> Path | None:
    """Where local-mode archives live; None when ``FRESHIDX_SPARK_CDS_DIR=off``."""
    env = os.environ if env is None else env
    value = (env.get(CDS_DIR_ENV) or "").strip()
    if not value:
        return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "freshidx" / "cds"
    return None if value.lower() in _OFF else Path(value).expanduser().absolute()


def archive_path(directory: Path, driver_memory: str) -> Path | None:
    """The archive for this JDK, these Spark jars at this path as installed now (a JVM maps an archive only
    with the classpath it was dumped with, jar times included: two checkouts sharing the cache each get
    their own, and so does a reinstall) and this heap size; None where the JVM cannot use dynamic archives
    (JDK < 17, no ``java``)."""
    key = cds_key()
    return None if key is None else directory / archive_name("local", key, driver_memory)


def find_archive(driver_memory: str, env: Mapping[str, str] | None = None) -> Path | None:
    """The prepared archive a JVM with this heap can map: the one made for its heap, else the one made
    for the default heap (``freshidx spark-cds`` without ``--driver-memory``) when this heap is under
    32 GiB, where the JVM uses compressed pointers and a dynamic archive maps whatever the heap's size
    (checked with ``-Xshare:on`` at 768m, 1g and 2g). None when sharing is off or nothing was prepared."""
    directory = archive_dir(env)
    if directory is None or not directory.is_dir():
        return None
    candidates = [driver_memory]
    with contextlib.suppress(ValueError):  # a heap Spark will refuse anyway: only its own archive
        if parse_memory(driver_memory) < _COMPRESSED_POINTERS_BELOW:
            candidates.append(DEFAULT_MEMORY)
    for memory in candidates:
        archive = archive_path(directory, memory)
        if archive is not None and archive.is_file() and (st := archive.stat()).st_size > 0:
            if time.time() - st.st_mtime > _USE_MARK_S:  # its time says when it was last used (at most hourly)
                with contextlib.suppress(OSError):  # a read-only cache still maps
                    os.utime(archive)
            return archive
    return None


def remove_unused(directory: Path, keep: Path, max_idle_s: float = UNUSED_AFTER_S) -> list[Path]:
    """Delete the archives in ``directory`` no JVM was given for ``max_idle_s`` (:func:`find_archive` marks
    the one it picks): those of deleted checkouts and old installs elsewhere, ~190 MB each, which nothing
    else can tell from a live checkout's. A JVM mapping one keeps its mapping; a checkout that comes back
    gets a new one from ``freshidx spark-cds``. Returns what was deleted."""
    gone: list[Path] = []
    for other in directory.glob("spark-local-*.jsa"):
        with contextlib.suppress(OSError):
            if other != keep and time.time() - other.stat().st_mtime > max_idle_s:
                other.unlink()
                gone.append(other)
    return gone


def with_archive(conf: Mapping[str, str], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``conf`` (a local session's Spark conf) with the driver JVM mapping the archive, if there is one.

    Unchanged when sharing is off, when the caller's Java options already decide it, or when no prepared
    archive fits its heap (:func:`find_archive`; the check costs a ``java -version`` once per process)."""
    out = dict(conf)
    options = out.get(JAVA_OPTIONS, "")
    if any(flag in options for flag in _CDS_FLAGS):
        return out
    archive = find_archive(out.get("spark.driver.memory", DEFAULT_MEMORY), env)
    if archive is None:
        return out
    out[JAVA_OPTIONS] = " ".join([options, *map_options(archive)]).strip()
    return out


@dataclass(frozen=True)
class Prepared:
    """What :func:`prepare` did: ``status`` is ``exists``, ``written``, ``off``, ``unsupported`` or ``failed``."""

    status: str
    archive: str | None = None
    seconds: float = 0.0
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def prepare(directory: Path | None = None, driver_memory: str = DEFAULT_MEMORY, *, force: bool = False,
            timeout_s: float = 900.0) -> Prepared:
    """Make the archive for ``driver_memory`` unless it exists: a child process runs the JVM side of a
    small build in a local session whose JVM dumps its classes at exit (to a temp file, renamed into place once the
    JVM is gone, so a reader never maps half an archive). Never raises for a failed dump: sharing is an
    optimisation, and a JVM without an archive works as before."""
    t0 = time.monotonic()
    directory = archive_dir() if directory is None else directory
    if directory is None:
        return Prepared("off")
    archive = archive_path(directory, driver_memory)
    if archive is None:
        return Prepared("unsupported", error="no java 17+ on PATH / JAVA_HOME")
    if archive.is_file() and archive.stat().st_size > 0 and not force:
        return Prepared("exists", str(archive))
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a read-only home: local sessions start without an archive, as before
        return Prepared("failed", error=f"cannot create {directory}: {exc}")
    remove_stale_dumps(archive)
    tmp = directory / f"{archive.name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        error = _dump(tmp, driver_memory, t0 + timeout_s)
        if error is None:
            os.replace(tmp, archive)
            remove_superseded(archive)
            remove_unused(directory, archive)
            return Prepared("written", str(archive), round(time.monotonic() - t0, 1))
        return Prepared("failed", None, round(time.monotonic() - t0, 1), error)
    finally:
        tmp.unlink(missing_ok=True)


def _dump(tmp: Path, driver_memory: str, deadline: float) -> str | None:
    """Run the dump child; None once ``tmp`` holds a complete archive, else what went wrong."""
    import psutil

    cmd = [sys.executable, "-m", "freshidx.tools.local_cds_workload", str(tmp), driver_memory]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(1.0, deadline - time.monotonic()),
                              env={**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON") or sys.executable})
    except subprocess.TimeoutExpired:
        return "the dump's build did not finish in time"
    pids = [int(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("JVM_PID ")]
    if proc.returncode != 0 or not pids:
        return f"the dump's build failed ({proc.returncode}): {proc.stderr[-2000:]}"
    # The JVM outlives its Python parent by the dump itself (it exits when the gateway's pipe closes).
    with contextlib.suppress(psutil.Error):
        psutil.Process(pids[0]).wait(max(1.0, deadline - time.monotonic()))
    if psutil.pid_exists(pids[0]):
        return "the JVM was still dumping at the deadline"
    if not tmp.is_file() or tmp.stat().st_size == 0:
        return "the JVM exited without writing an archive"
    return None
