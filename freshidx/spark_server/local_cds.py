"""``freshidx spark-cds``: make the class archive local-mode Spark JVMs map (JDK AppCDS; which archive a
local session maps, and how, is the engine's: :mod:`freshidx.spark.local_archive`).

The archive is made once per JDK + Spark jars + driver heap size (:func:`prepare`, ``freshidx
spark-cds``, which ``scripts/test.sh`` runs; ~60 s, 67 CPU-s): a throw-away JVM runs the JVM side of
a small build and dumps the classes it loaded when it exits (``-XX:ArchiveClassesAtExit``, which needs
no JDK tools, unlike the Connect server's ``jcmd`` dump in :mod:`freshidx.spark_server.cds`).

The cache stays bounded: making an archive deletes the same jar path's superseded ones and those no JVM
was given for two weeks (:func:`remove_unused`; :func:`freshidx.spark.local_archive.find_archive` marks the
one it gives a JVM).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from freshidx.spark.local_archive import DEFAULT_MEMORY, archive_dir, archive_path
from freshidx.spark_server.cds import remove_stale_dumps, remove_superseded

#: Archives no JVM was given for this long are deleted when ``freshidx spark-cds`` makes one.
UNUSED_AFTER_S = 14 * 24 * 3600


def remove_unused(directory: Path, keep: Path, max_idle_s: float = UNUSED_AFTER_S) -> list[Path]:
    """Delete the archives in ``directory`` no JVM was given for ``max_idle_s``
    (:func:`freshidx.spark.local_archive.find_archive` marks the one it picks): those of deleted checkouts and
    old installs elsewhere, ~190 MB each, which nothing else can tell from a live checkout's. A JVM mapping one
    keeps its mapping; a checkout that comes back gets a new one from ``freshidx spark-cds``. Returns what was
    deleted."""
    gone: list[Path] = []
    for other in directory.glob("spark-local-*.jsa"):
        with contextlib.suppress(OSError):
            if other != keep and time.time() - other.stat().st_mtime > max_idle_s:
                other.unlink()
                gone.append(other)
    return gone


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
