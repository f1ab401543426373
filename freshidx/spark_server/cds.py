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
(:mod:`freshidx.spark.local_archive`: same JDK, same jars, so the same classes) and dumps none. Which
archive fits a JVM and how a JVM maps one is the engine's (:mod:`freshidx.spark.class_archive`); this
module decides what the server's starts do about it and dumps the server's own.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from freshidx.spark.class_archive import archive_name, cds_key, map_options
from freshidx.spark_server.jvm import jcmd, run_jcmd
from freshidx.spark_server.server_config import ServerConfig

#: Files older than this next to an archive are temp files of dumps that never finished.
_STALE_TMP_S = 3600


@dataclass(frozen=True)
class ArchivePlan:
    """What one JVM start does about class data sharing."""

    options: list[str]  # JVM flags
    pending: tuple[Path, Path] | None = None  # (temp file of the dump, final archive): dump once warm
    in_use: Path | None = None  # the archive this start maps


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


def plan_archive(config: ServerConfig, prepared: Path | None = None) -> ArchivePlan:
    """Map the server's own archive if there is one; else map ``prepared`` (the archive ``freshidx
    spark-cds`` made for this JDK and these jars, :func:`freshidx.spark.local_archive.find_archive`), which
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
