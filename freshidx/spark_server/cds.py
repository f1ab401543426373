"""JDK AppCDS for the Spark Connect server: a class archive that later starts map instead of loading
and verifying every class again.

Most of a start is JVM class loading and JIT (port open ~8–30 s, first query several seconds more;
the supervisor pays both with a warm-up before it reports ``up``). With ``class_data_sharing`` the
first JVM started for a ``cds_dir`` (per JDK, Spark jars and heap size) is started with
``-XX:+RecordDynamicDumpInfo`` and, once warmed up and before it is reported up, dumps every class it
has loaded with ``jcmd <pid> VM.cds dynamic_dump`` (10–50 s, once); every later start maps that
archive (``-XX:SharedArchiveFile``): on the loaded 2-core test box the port opened in 4.8–14 s instead
of 14–30 s. (Dumping at exit, ``-XX:ArchiveClassesAtExit``, was tried and rejected: it added 17–50 s
to the first planned restart, while clients wait.) A JVM ignores an archive it cannot use; the
supervisor deletes an archive of its own in use by a start that fails.

A server with no archive of its own maps the one ``freshidx spark-cds`` prepared for local sessions
(:mod:`freshidx.spark_server.local_cds`: same JDK, same jars, so the same classes) and dumps none.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from freshidx.spark_server.jvm import jcmd, run_jcmd
from freshidx.spark_server.server_config import ServerConfig, spark_home

#: Files older than this next to an archive are temp files of dumps that never finished.
_STALE_TMP_S = 3600


@dataclass(frozen=True)
class ArchivePlan:
    """What one JVM start does about class data sharing."""

    options: list[str]  # JVM flags
    pending: tuple[Path, Path] | None = None  # (temp file of the dump, final archive): dump once warm
    in_use: Path | None = None  # the archive this start maps


@functools.cache
def cds_key() -> str | None:
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


def jars_id() -> str:
    """The Spark jars as a JVM checks them before it maps an archive dumped with them: their directory, and
    each jar's size and modification time. A reinstall at the same path (a fresh virtualenv, a new CI
    checkout) changes the times, and the JVM then starts without the old archive, silently
    (``-Xshare:auto``): so an archive's name carries both, and a reinstall makes (and maps) a new one."""
    jars = spark_home() / "jars"
    where = hashlib.sha256(os.path.realpath(jars).encode()).hexdigest()[:8]
    stamp = hashlib.sha256()
    for jar in sorted(jars.glob("*.jar")):
        st = jar.stat()
        stamp.update(f"{jar.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return f"{where}-{stamp.hexdigest()[:8]}"


def archive_name(kind: str, key: str, memory: str) -> str:
    """``spark-<kind>-<cds_key>-<jars dir>-<jar stamp>-<heap>.jsa`` (:func:`jars_id`; compressed-pointer modes
    depend on the heap)."""
    return f"spark-{kind}-{key}-{jars_id()}-{memory.strip().lower()}.jsa"


def remove_superseded(archive: Path) -> None:
    """Delete the archives next to ``archive`` made for the same JDK and jar directory but for jars since
    replaced (another stamp, or a name from before the stamp): no JVM maps them any more, and each is ~190 MB."""
    parts = archive.name.split("-")
    if len(parts) < 7:
        return
    for other in archive.parent.glob("-".join(parts[:5]) + "-*.jsa"):
        if other.name.split("-")[5] != parts[5]:
            with contextlib.suppress(OSError):
                other.unlink()


def map_options(archive: Path) -> list[str]:
    """The JVM options that map ``archive``: ``-Xshare:auto`` starts a JVM that cannot use it (another JDK,
    another classpath) without it; ``-Xlog``: otherwise a warning per signed jar."""
    return [f"-XX:SharedArchiveFile={archive}", "-Xshare:auto", "-Xlog:cds*=error"]


def plan_archive(config: ServerConfig, prepared: Path | None = None) -> ArchivePlan:
    """Map the server's own archive if there is one; else map ``prepared`` (the archive ``freshidx
    spark-cds`` made for this JDK and these jars, :func:`freshidx.spark_server.local_cds.find_archive`), which
    starts the server as fast as its own (quiet 2-core box, 2g heap: 10.3-10.9 CPU-s to up against 11.2 with
    its own and 16.9-17.8 without) and costs no dump; else get ready to dump one, unless ``config.cds_dump``
    is off (nothing without jcmd or JDK 17)."""
    if not config.class_data_sharing:
        return ArchivePlan([])
    key = cds_key()
    if key is None:
        return ArchivePlan([])
    cds_dir = config.cds_dir or config.state_dir / "cds"
    xmx = config.driver_memory.lower()  # compressed-oops mode depends on the heap size
    archive = cds_dir / archive_name("connect", key, xmx)
    if archive.is_file() and archive.stat().st_size > 0:
        return ArchivePlan(map_options(archive), in_use=archive)
    if prepared is not None:
        # not in_use: shared with local sessions and remade by `freshidx spark-cds`, so never deleted here
        return ArchivePlan(map_options(prepared))
    if not config.cds_dump or jcmd() is None:
        return ArchivePlan([])
    cds_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_dumps(archive)
    remove_superseded(archive)
    pending = (cds_dir / f"{archive.name}.{uuid.uuid4().hex[:8]}.tmp", archive)
    return ArchivePlan(["-XX:+RecordDynamicDumpInfo", "-Xlog:cds*=error"], pending=pending)


def remove_stale_dumps(archive: Path) -> None:
    """Delete the temp files next to ``archive`` of dumps that never finished (older than an hour)."""
    for stale in archive.parent.glob(f"{archive.name}.*.tmp"):
        with contextlib.suppress(OSError):
            if time.time() - stale.stat().st_mtime > _STALE_TMP_S:
                stale.unlink()


def dump_archive(
    pid: int, pending: tuple[Path, Path], deadline: float, cancel: Callable[[], bool]
) -> dict[str, Any] | None:
    """Write the class archive of warmed-up JVM ``pid`` (``jcmd VM.cds dynamic_dump``) to a temp file,
    then rename it into place. Returns the state fields to record (``cds_archive`` / ``cds_error``),
    or None if ``cancel()`` became true (the temp file is removed)."""
    tmp, archive = pending
    out = run_jcmd(pid, "VM.cds", "dynamic_dump", str(tmp), timeout=max(5.0, deadline - time.monotonic()),
                   cancel=cancel)
    if cancel():
        tmp.unlink(missing_ok=True)
        return None
    try:
        if out is not None and tmp.is_file() and tmp.stat().st_size > 0:
            os.replace(tmp, archive)
            return {"cds_archive": str(archive), "cds_error": None}
        tmp.unlink(missing_ok=True)
        return {"cds_error": f"dynamic_dump failed: {out!r}"[:500]}
    except OSError as exc:
        return {"cds_error": str(exc)[:500]}
