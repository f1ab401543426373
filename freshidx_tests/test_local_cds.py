"""The class archive of local-mode Spark JVMs (:mod:`freshidx.spark.local_cds`, ``freshidx spark-cds``).

* which JVM options a local session gets: the archive only when there is one for its heap size, never
  over the caller's own sharing options, nothing when ``FRESHIDX_SPARK_CDS_DIR=off``;
* ``freshidx spark-cds`` leaves an archive that a new local session's JVM really maps (``jcmd VM.info``
  reports the mapped size), and a corrupt archive at that path costs the sharing, not the session.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from freshidx.spark import local_cds
from freshidx.spark.jvm import jcmd

OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def _archive(directory: Path, memory: str = "1g") -> Path:
    path = local_cds.archive_path(directory, memory)
    if path is None:
        pytest.skip("no Java 17+ here: no class data sharing to test")
    return path


def test_the_archive_is_added_only_when_there_is_one_for_the_heap_size(tmp_path: Path) -> None:
    env = {local_cds.CDS_DIR_ENV: str(tmp_path)}
    conf = {local_cds.JAVA_OPTIONS: OPTS, "spark.driver.memory": "1g"}
    assert local_cds.with_archive(conf, env) == conf  # nothing prepared yet
    archive = _archive(tmp_path)
    archive.write_bytes(b"x")
    got = local_cds.with_archive(conf, env)
    assert got[local_cds.JAVA_OPTIONS] == f"{OPTS} -XX:SharedArchiveFile={archive} -Xshare:auto -Xlog:cds*=error"
    assert {k: v for k, v in got.items() if k != local_cds.JAVA_OPTIONS} == {"spark.driver.memory": "1g"}
    # another heap size: another compressed-pointer layout, another archive
    assert local_cds.with_archive({**conf, "spark.driver.memory": "2g"}, env)[local_cds.JAVA_OPTIONS] == OPTS


def test_the_callers_own_sharing_options_and_off_win(tmp_path: Path) -> None:
    _archive(tmp_path).write_bytes(b"x")
    env = {local_cds.CDS_DIR_ENV: str(tmp_path)}
    for own in ("-Xshare:off", "-XX:SharedArchiveFile=/elsewhere.jsa", "-XX:ArchiveClassesAtExit=/x.jsa"):
        conf = {local_cds.JAVA_OPTIONS: f"{OPTS} {own}"}
        assert local_cds.with_archive(conf, env) == conf
    assert local_cds.archive_dir({local_cds.CDS_DIR_ENV: "off"}) is None
    assert local_cds.with_archive({}, {local_cds.CDS_DIR_ENV: "off"}) == {}
    assert local_cds.archive_dir({"XDG_CACHE_HOME": "/c"}) == Path("/c/freshidx/cds")


def test_prepare_reports_a_directory_it_cannot_create_instead_of_raising(tmp_path: Path) -> None:
    _archive(tmp_path)  # skips without Java 17+
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    done = local_cds.prepare(blocker / "cds")
    assert done.status == "failed" and done.archive is None and "cannot create" in (done.error or ""), done


#: A new process's local session: its JVM's mapped CDS size (``jcmd VM.info``) and a query's answer.
_SESSION = """
import json, re, subprocess, sys
from freshidx.spark.session import build_local_session
s = build_local_session()
pid = s.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
info = subprocess.run([sys.argv[1], str(pid), "VM.info"], capture_output=True, text=True, timeout=120).stdout
m = re.search(r"CDS archive\\(s\\) mapped at: .*size (\\d+)", info)
print(json.dumps({"mapped": int(m.group(1)) if m else 0, "sum": s.range(100).selectExpr("sum(id)").first()[0]}))
"""


def _session(env_dir: Path | None) -> dict[str, int]:
    tool = jcmd()
    assert tool is not None
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    if env_dir is not None:
        env[local_cds.CDS_DIR_ENV] = str(env_dir)
    proc = subprocess.run([sys.executable, "-c", _SESSION, tool], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.slow
def test_spark_cds_leaves_an_archive_a_new_local_jvm_maps_and_a_corrupt_one_is_skipped(tmp_path: Path) -> None:
    if jcmd() is None or local_cds.archive_path(tmp_path, "1g") is None:
        pytest.skip("needs a JDK 17+ with jcmd")
    # The default directory: scripts/test.sh prepared it already (then this is a no-op), as a user's
    # set-up does; the suite's own sessions map it too.
    proc = subprocess.run([sys.executable, "-m", "freshidx.cli", "spark-cds", "--json"], capture_output=True,
                          text=True, timeout=1200, env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = json.loads(proc.stdout)
    assert done["status"] in ("exists", "written"), done
    archive = Path(done["archive"])
    got = _session(None)
    assert got["sum"] == 4950
    # the JVM mapped the base archive plus ours on top (the base alone is a few MB)
    assert got["mapped"] > archive.stat().st_size, (got, archive.stat().st_size)

    corrupt = _archive(tmp_path / "cds")
    corrupt.parent.mkdir()
    corrupt.write_bytes(os.urandom(1 << 16))
    got = _session(corrupt.parent)
    assert got["sum"] == 4950  # the session starts and answers without the archive
    assert got["mapped"] < archive.stat().st_size, got
    assert re.match(r"spark-local-jdk\d+-[0-9a-f]{12}-[0-9a-f]{8}-1g\.jsa$", corrupt.name)
