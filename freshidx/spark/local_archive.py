"""The class archive of local-mode Spark JVMs (the embedded default: Dagster runs, CLI commands, the demo's
builds, the test suite): a local session's driver maps the one ``freshidx spark-cds`` prepared, if any.

Measured on the 2-core box (a local session's start and first job, C1 only, quiet box): 17–18 CPU-s
and 14–15 s without the archive, 9–10 CPU-s and 7 s with it. A process that starts a local session pays
its JVM start each time (each Dagster run is a process of its own), so that is the cost it cuts.

:func:`with_archive` adds the archive to a local session's JVM options when one exists
(:func:`freshidx.spark.session.build_local_session` calls it); ``-Xshare:auto`` makes a JVM that cannot use
it (another JDK, a changed classpath) start without it, as before. :func:`find_archive` picks it: a JVM
with another heap under 32 GiB maps the default (1g) one. The same archive serves every JVM ``spark-class``
launches from these jars: a Connect server without an archive of its own
(:func:`freshidx.spark_server.cds.plan_archive`), a standalone master, workers, executors.

Making the archive is an operation, not the engine's: :func:`freshidx.spark_server.local_cds.prepare`
(``freshidx spark-cds``, which ``scripts/test.sh`` runs), which also keeps the cache bounded. Without a
prepared archive a local session starts as it always did.

``FRESHIDX_SPARK_CDS_DIR`` moves the archives (default ``$XDG_CACHE_HOME/freshidx/cds``, else
``~/.cache/freshidx/cds``); ``off`` turns sharing off.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping
from pathlib import Path

from freshidx.spark.class_archive import archive_name, cds_key, map_options, parse_memory

CDS_DIR_ENV = "FRESHIDX_SPARK_CDS_DIR"
JAVA_OPTIONS = "spark.driver.extraJavaOptions"
#: The heap ``freshidx spark-cds`` prepares for by default (a local session's default heap).
DEFAULT_MEMORY = "1g"
#: Below this heap the JVM compresses pointers, and a dynamic archive maps at any heap size.
_COMPRESSED_POINTERS_BELOW = 32 * 1024**3
#: Options that already decide class data sharing: a caller that passes one keeps its own choice.
_CDS_FLAGS = ("SharedArchiveFile", "ArchiveClassesAtExit", "-Xshare")
_OFF = {"off", "none", "false", "0"}
#: An archive's modification time is moved to "now" when a JVM is given it, at most this often (the
#: cache's clean-up, :func:`freshidx.spark_server.local_cds.remove_unused`, goes by it).
_USE_MARK_S = 3600


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
