"""JDK class data sharing (AppCDS) for Spark JVMs: which archive fits a JVM, and how a JVM maps one.

A class archive holds the classes a JVM loaded (Spark's ~10k), so that a later JVM of the same JDK with
the same Spark jars maps them instead of loading and verifying them again. An archive is named after
what it was made with (:func:`archive_name`: the JDK, the jars as installed, the heap), because a JVM maps
one only with the classpath it was dumped with. These primitives serve every JVM ``spark-class`` launches
from the installed jars: a local session's driver (:mod:`freshidx.spark.local_archive`), and the
supervised Connect server (:mod:`freshidx.spark_server.cds`, which also dumps archives of its own).

Engine code: nothing here imports pyspark except to find the installed Spark distribution.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path


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


def map_options(archive: Path) -> list[str]:
    """The JVM options that map ``archive``: ``-Xshare:auto`` starts a JVM that cannot use it (another JDK,
    another classpath) without it; ``-Xlog``: otherwise a warning per signed jar."""
    return [f"-XX:SharedArchiveFile={archive}", "-Xshare:auto", "-Xlog:cds*=error"]
