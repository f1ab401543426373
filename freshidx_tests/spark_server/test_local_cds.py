"""The class archive of local-mode Spark JVMs (:mod:`freshidx.spark.local_archive`; ``freshidx spark-cds``,
:mod:`freshidx.spark_server.local_cds`, makes it).

* which JVM options a local session gets: the archive only when there is one for its heap size, never
  over the caller's own sharing options, nothing when ``FRESHIDX_SPARK_CDS_DIR=off``;
* ``freshidx spark-cds`` leaves an archive that a new local session's JVM really maps (``jcmd VM.info``
  reports the mapped size), and a corrupt archive at that path costs the sharing, not the session.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from freshidx.spark import class_archive, local_archive
from freshidx.spark_server import cds, local_cds
from freshidx.spark_server.jvm import jcmd
from freshidx.spark_server.server_config import ServerConfig

OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def _archive(directory: Path, memory: str = "1g") -> Path:
    path = local_archive.archive_path(directory, memory)
    if path is None:
        pytest.skip("no Java 17+ here: no class data sharing to test")
    return path


def test_the_archive_is_added_only_when_there_is_one_for_the_heap_size(tmp_path: Path) -> None:
    env = {local_archive.CDS_DIR_ENV: str(tmp_path)}
    conf = {local_archive.JAVA_OPTIONS: OPTS, "spark.driver.memory": "1g"}
    assert local_archive.with_archive(conf, env) == conf  # nothing prepared yet
    archive = _archive(tmp_path)
    archive.write_bytes(b"x")
    got = local_archive.with_archive(conf, env)
    assert got[local_archive.JAVA_OPTIONS] == f"{OPTS} -XX:SharedArchiveFile={archive} -Xshare:auto -Xlog:cds*=error"
    assert {k: v for k, v in got.items() if k != local_archive.JAVA_OPTIONS} == {"spark.driver.memory": "1g"}
    # another heap under 32 GiB maps the default heap's archive (the same compressed-pointer mode) ...
    two = local_archive.with_archive({**conf, "spark.driver.memory": "2g"}, env)[local_archive.JAVA_OPTIONS]
    assert f"-XX:SharedArchiveFile={archive} " in two
    # ... unless one was made for it; a 64 GiB heap (no compressed pointers) maps only its own
    own = _archive(tmp_path, "2g")
    own.write_bytes(b"x")
    assert local_archive.find_archive("2g", env) == own
    assert local_archive.find_archive("64g", env) is None
    assert local_archive.with_archive({**conf, "spark.driver.memory": "64g"}, env)[local_archive.JAVA_OPTIONS] == OPTS


def test_a_reinstall_of_the_jars_gets_a_new_archive_and_the_superseded_ones_go(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # CI reuses one checkout path with a fresh virtualenv: same jar names and path, new jar times, and the
    # JVM silently refuses an archive dumped with the old jars (`-Xshare:auto`), so the name must change.
    home = tmp_path / "spark"
    (home / "jars").mkdir(parents=True)
    for name in ("a.jar", "b.jar"):
        (home / "jars" / name).write_bytes(b"jar")
    monkeypatch.setattr(class_archive, "spark_home", lambda: home)
    cache = tmp_path / "cds"
    cache.mkdir()
    before = _archive(cache)
    assert local_archive.archive_path(cache, "1g") == before  # stable while nothing changes
    os.utime(home / "jars" / "b.jar", ns=(0, 1_000_000_000))
    after = _archive(cache)
    assert after != before and after.name.split("-")[:5] == before.name.split("-")[:5]
    # what is left next to a fresh archive: the other heap's and other jar directories' archives, nothing stale
    other_dir = cache / before.name.replace(before.name.split("-")[4], "0" * 8)
    unstamped = cache / ("-".join(before.name.split("-")[:5]) + "-1g.jsa")  # the name before the stamp
    for path in (before, unstamped, other_dir, _archive(cache, "2g"), after):
        path.write_bytes(b"x")
    cds.remove_superseded(after)
    assert sorted(p.name for p in cache.iterdir()) == sorted([after.name, other_dir.name, _archive(cache, "2g").name])


def test_archives_no_jvm_was_given_for_two_weeks_go_when_one_is_made(tmp_path: Path) -> None:
    env = {local_archive.CDS_DIR_ENV: str(tmp_path)}
    archive = _archive(tmp_path)
    archive.write_bytes(b"x")
    old = time.time() - local_cds.UNUSED_AFTER_S - 3600
    os.utime(archive, (old, old))
    assert local_archive.find_archive("1g", env) == archive
    assert time.time() - archive.stat().st_mtime < 600  # given to a JVM: marked as used now
    stale = tmp_path / "spark-local-jdk17-000000000000-00000000-00000000-1g.jsa"  # a deleted checkout's
    recent = tmp_path / "spark-local-jdk17-000000000000-11111111-11111111-1g.jsa"  # a live one, used lately
    for path, at in ((stale, old), (recent, time.time() - 3 * 24 * 3600)):
        path.write_bytes(b"x")
        os.utime(path, (at, at))
    fresh = _archive(tmp_path, "2g")  # the one just made
    fresh.write_bytes(b"x")
    os.utime(fresh, (old, old))
    assert local_cds.remove_unused(tmp_path, fresh) == [stale]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([archive.name, recent.name, fresh.name])


def test_a_connect_server_without_its_own_archive_maps_the_prepared_one_and_dumps_none(tmp_path: Path) -> None:
    prepared = _archive(tmp_path / "prepared")
    prepared.parent.mkdir()
    prepared.write_bytes(b"x")
    cfg = ServerConfig(state_dir=tmp_path / "state", driver_memory="2g")
    found = local_archive.find_archive(cfg.driver_memory, {local_archive.CDS_DIR_ENV: str(prepared.parent)})
    assert found == prepared
    plan = cds.plan_archive(cfg, found)
    assert f"-XX:SharedArchiveFile={prepared}" in plan.options and "-Xshare:auto" in plan.options
    assert plan.pending is None and plan.in_use is None  # no dump; never deleted by a failed start
    # the server's own archive wins once it has one
    key = class_archive.cds_key()
    assert key is not None
    own = tmp_path / "state" / "cds" / class_archive.archive_name("connect", key, "2g")
    own.parent.mkdir(parents=True)
    own.write_bytes(b"x")
    plan = cds.plan_archive(cfg, found)
    assert f"-XX:SharedArchiveFile={own}" in plan.options and plan.in_use == own
    own.unlink()
    # nothing prepared: dump one (with jcmd), unless told not to; sharing off: nothing at all
    plan = cds.plan_archive(cfg, None)
    assert plan.in_use is None and (plan.pending is not None) == (jcmd() is not None), plan
    assert cds.plan_archive(dataclasses.replace(cfg, cds_dump=False), None).options == []
    assert cds.plan_archive(dataclasses.replace(cfg, class_data_sharing=False), found).options == []


def test_the_callers_own_sharing_options_and_off_win(tmp_path: Path) -> None:
    _archive(tmp_path).write_bytes(b"x")
    env = {local_archive.CDS_DIR_ENV: str(tmp_path)}
    for own in ("-Xshare:off", "-XX:SharedArchiveFile=/elsewhere.jsa", "-XX:ArchiveClassesAtExit=/x.jsa"):
        conf = {local_archive.JAVA_OPTIONS: f"{OPTS} {own}"}
        assert local_archive.with_archive(conf, env) == conf
    assert local_archive.archive_dir({local_archive.CDS_DIR_ENV: "off"}) is None
    assert local_archive.with_archive({}, {local_archive.CDS_DIR_ENV: "off"}) == {}
    assert local_archive.archive_dir({"XDG_CACHE_HOME": "/c"}) == Path("/c/freshidx/cds")


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
        env[local_archive.CDS_DIR_ENV] = str(env_dir)
    proc = subprocess.run([sys.executable, "-c", _SESSION, tool], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.slow
def test_spark_cds_leaves_an_archive_a_new_local_jvm_maps_and_a_corrupt_one_is_skipped(tmp_path: Path) -> None:
    if jcmd() is None or local_archive.archive_path(tmp_path, "1g") is None:
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
    assert re.match(r"spark-local-jdk\d+-[0-9a-f]{12}-[0-9a-f]{8}-[0-9a-f]{8}-1g\.jsa$", corrupt.name)


@pytest.mark.slow
def test_a_connect_server_started_without_dumping_maps_the_prepared_archive(tmp_path: Path) -> None:
    from freshidx.spark_server.server_state import read_state
    from freshidx_tests.conftest import TEST_JVM_ARGS, free_port, stop_spark_server
    from freshidx_tests.support.polling import poll_until

    tool = jcmd()
    if tool is None or local_archive.archive_path(tmp_path, "1g") is None:
        pytest.skip("needs a JDK 17+ with jcmd")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    done = local_cds.prepare()  # scripts/test.sh made it already: a no-op then
    assert done.status in ("exists", "written"), done
    archive = Path(str(done.archive))
    state = tmp_path / "state"
    with open(tmp_path / "server.out", "wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "freshidx.spark_server.server", "--port", str(free_port()),
             "--state-dir", str(state),
             "--driver-memory", "2g", "--no-cds-dump", "--no-warm-up", *TEST_JVM_ARGS],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        st = poll_until(lambda: (s if (s := read_state(state) or {}).get("status") == "up" else None),
                        timeout=600, interval=0.5, what="the server up")
        info = subprocess.run([tool, str(st["pid"]), "VM.info"], capture_output=True, text=True, timeout=120).stdout
        m = re.search(r"CDS archive\(s\) mapped at: .*size (\d+)", info)
        assert m and int(m.group(1)) > archive.stat().st_size, (m and m.group(0), archive)
        assert not (state / "cds").exists() and "cds_dump_s" not in st["last_start_timings"], st
    finally:
        stop_spark_server(server)
