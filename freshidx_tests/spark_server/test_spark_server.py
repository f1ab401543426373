"""The supervised Spark Connect server: a real JVM on a free loopback port, killed and restarted.

One supervisor (``run_forever`` in a thread) is shared by the tests of this module, in file order:
query + Python worker importing freshidx → planned restart held off by a lease → the supervisor
judges leased work by its progress, not by probes or JVM CPU → kill -9 → heap
sampling → stop leaves no process. The CLI entry point gets its own server. The first start dumps
an AppCDS class archive that every later start (the CLI's too) maps. Waiting is always
polling with a deadline; the JVM start is slow on a loaded 2-core box, so deadlines are generous.

Progress, not probes:

* under the ``cpu_load`` fixture, a leased job that keeps progressing (Python workers computing,
  tasks completing) while every ``SELECT 1`` probe times out is *not* restarted, for twice the
  configured hang time (a wrongful verdict would come after one hang time without progress);
* a leased job blocked forever in a Python UDF (no task completes, no worker uses CPU) *is*
  restarted, reason ``hung``, after the hang time and a bounded drain; the client cut off by the
  restart gets an ordinary exception (what the assets' ``RetryPolicy`` retries).

The config is changed in place and restored.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import PySparkException

from freshidx import procs
from freshidx.serve import status
from freshidx.spark.class_archive import parse_memory
from freshidx.spark.local_archive import CDS_DIR_ENV
from freshidx.spark.session import WORKER_ARROW_POOL
from freshidx.spark_server import server_launch
from freshidx.spark_server.jvm import jcmd, sample_memory
from freshidx.spark_server.lease import ServerUnavailable, acquire_lease, active_leases
from freshidx.spark_server.server_config import SERVER_CLASS, ServerConfig
from freshidx.spark_server.server_process import StateDirBusy
from freshidx.spark_server.server_state import HOSTNAME, read_state
from freshidx.spark_server.supervisor import SparkConnectSupervisor
from freshidx_tests.conftest import TEST_JVM_ARGS, TEST_JVM_CONF, free_port
from freshidx_tests.support.polling import poll_until

START_DEADLINE = 240.0  # spawn → warm-up done; ~10 s quiet, 20–40 s under load
LOADED_START_DEADLINE = 420.0  # the progress tests: ~40 s here, >250 s seen at load average 40
HANG_S = 20.0  # test (a): progress must be seen at least this often under load
WATCH_S = 2 * HANG_S  # test (a): how long the busy server is watched (it would be judged hung after HANG_S)


# ------------------------------------------------------------------------------------------
# helpers




def _client(url: str) -> Any:
    """A fresh Spark Connect client session (a cached one would point at a dead server)."""
    from pyspark.sql import SparkSession

    return SparkSession.builder.remote(url).create()


def _query_and_python_job(url: str) -> dict[str, Any]:
    """SELECT + a mapInArrow whose task imports freshidx.store.partitions on the server's worker."""
    spark = _client(url)
    try:
        assert spark.sql("SELECT 41 + 1 AS x").collect()[0]["x"] == 42

        def in_task(batches):  # type: ignore[no-untyped-def]  # nested: pickled by value
            import sys as worker_sys

            import pyarrow as pa

            import freshidx.store.partitions as parts

            for b in batches:
                n = b.num_rows
                yield pa.RecordBatch.from_pydict(
                    {"module": [parts.__file__] * n, "python": [worker_sys.executable] * n,
                     "parsed": [parts.PartitionId.parse("year=2026/month=11/day=21/hour=14/minute=05").compact] * n}
                )

        rows = spark.range(6, numPartitions=3).mapInArrow(in_task, "module string, python string, parsed string")
        got = {tuple(r) for r in rows.distinct().collect()}
    finally:
        spark.stop()
    assert len(got) == 1, got
    module, python, parsed = got.pop()
    return {"module": module, "python": python, "parsed": parsed}


def _jvm_processes(marker: str) -> list[int]:
    """Pids whose command line mentions ``marker`` (the supervisor's properties file path)."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            cmd = procs.cmdline(int(name))
            if SERVER_CLASS in cmd and marker in cmd:
                pids.append(int(name))
    return pids


def _state(state_dir: Path) -> dict[str, Any]:
    st = read_state(state_dir)
    assert st is not None
    return st


class Supervised:
    def __init__(self, sup: SparkConnectSupervisor, thread: threading.Thread, stop: threading.Event) -> None:
        self.sup, self.thread, self.stop = sup, thread, stop
        self.errors: list[BaseException] = []

    @property
    def state_dir(self) -> Path:
        return self.sup.state_dir


@pytest.fixture(scope="module")
def cds_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cds")


@pytest.fixture(scope="module")
def supervised(tmp_path_factory: pytest.TempPathFactory, cds_dir: Path) -> Iterator[Supervised]:
    cfg = ServerConfig(
        port=free_port(), state_dir=tmp_path_factory.mktemp("spark-server"), driver_memory="1g", cds_dir=cds_dir,
        conf=dict(TEST_JVM_CONF), health_interval_s=2.0, heap_check_interval_s=3600.0, drain_timeout_s=60.0,
        start_timeout_s=LOADED_START_DEADLINE,
    )
    # This module tests the server's own archive (dumped by the first start, mapped by the restarts), so
    # the one `freshidx spark-cds` prepared, which a server without its own maps instead, is turned off.
    with pytest.MonkeyPatch.context() as env:
        env.setenv(CDS_DIR_ENV, "off")
        yield from _supervise(cfg)


def _supervise(cfg: ServerConfig) -> Iterator[Supervised]:
    sup = SparkConnectSupervisor(cfg)
    stop = threading.Event()
    box: Supervised

    def run() -> None:
        try:
            sup.run_forever(stop)
        except BaseException as exc:
            box.errors.append(exc)

    t0 = time.monotonic()
    thread = threading.Thread(target=run, name="supervisor", daemon=True)
    box = Supervised(sup, thread, stop)
    thread.start()
    try:  # (a first start that fails stops the supervisor too)
        poll_until(lambda: (read_state(cfg.state_dir) or {}).get("status") == "up" or box.errors,
                   timeout=LOADED_START_DEADLINE + 10, what="first start")
        assert not box.errors, box.errors
        print(f"\nstart to ready: {time.monotonic() - t0:.1f}s timings={sup.last_timings}")
        yield box
    finally:
        stop.set()
        thread.join(60)
        sup.stop()


# ------------------------------------------------------------------------------------------
# no server needed


def test_memory_strings_and_defaults(tmp_path: Path) -> None:
    assert parse_memory("2g") == 2 * 1024**3
    assert parse_memory("512m") == 512 * 1024**2
    assert parse_memory("1024") == 1024
    with pytest.raises(ValueError):
        parse_memory("lots")
    cfg = ServerConfig(state_dir=tmp_path, conf={"spark.sql.shuffle.partitions": "3", "spark.ui.enabled": "true"})
    conf = cfg.spark_conf()
    assert cfg.url == "sc://127.0.0.1:15002" and cfg.master == "local[2,4]"
    assert conf["spark.connect.grpc.binding.address"] == "127.0.0.1"
    assert conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert conf["spark.pyspark.python"] == sys.executable
    assert conf["spark.python.sql.dataFrameDebugging.enabled"] == "false"  # static: the clients read it
    assert conf["spark.sql.shuffle.partitions"] == "3" and conf["spark.ui.enabled"] == "true"  # extra conf wins
    with pytest.raises(ValueError):
        ServerConfig(state_dir=tmp_path, max_heap_fraction=1.5)


def test_the_servers_python_workers_get_the_worker_arrow_pool_unless_one_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = ServerConfig(state_dir=tmp_path)
    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    assert server_launch.environment(cfg)["ARROW_DEFAULT_MEMORY_POOL"] == WORKER_ARROW_POOL
    monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
    assert server_launch.environment(cfg)["ARROW_DEFAULT_MEMORY_POOL"] == "jemalloc"


def test_lease_without_server_times_out_clearly(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with pytest.raises(ServerUnavailable, match=r"no state file.*freshidx spark-server"), \
            acquire_lease(tmp_path, "run-1", timeout_s=0.5):
        pass
    assert time.monotonic() - t0 < 5
    assert list((tmp_path / "leases").iterdir()) == []


def test_stale_leases_are_reaped(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    leases = tmp_path / "leases"
    leases.mkdir()
    (leases / "gone--1-x.json").write_text(json.dumps(
        {"run_id": "gone", "pid": int(dead.stdout), "hostname": HOSTNAME}))
    (leases / "alive--2-y.json").write_text(json.dumps(
        {"run_id": "alive", "pid": os.getpid(), "hostname": HOSTNAME}))
    assert [d["run_id"] for d in active_leases(tmp_path)] == ["alive"]
    assert sorted(p.name for p in leases.iterdir()) == ["alive--2-y.json"]


def test_jvm_left_by_a_killed_supervisor_is_killed_on_next_start(tmp_path: Path) -> None:
    sup = SparkConnectSupervisor(ServerConfig(state_dir=tmp_path, port=free_port()))
    # stands in for the orphaned JVM: same markers on its command line, its own session
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", SERVER_CLASS, str(sup.properties_path)],
        start_new_session=True,
    )
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        # A real leftover JVM exec'd long ago; a child just forked still shows pytest's command line until
        # its exec (on a loaded box that took long enough for kill_leftover to see no markers once).
        poll_until(lambda: SERVER_CLASS in procs.cmdline(orphan.pid), timeout=120, interval=0.05,
                   what="the stand-in orphan's command line")
        (tmp_path / "state.json").write_text(json.dumps(
            {"status": "up", "pid": orphan.pid, "hostname": HOSTNAME, "supervisor_pid": bystander.pid}))
        # not ours (no markers): left alone
        (tmp_path / "other").mkdir()
        (tmp_path / "other" / "state.json").write_text(json.dumps(
            {"status": "up", "pid": bystander.pid, "hostname": HOSTNAME}))
        SparkConnectSupervisor(ServerConfig(state_dir=tmp_path / "other")).kill_leftover()
        assert bystander.poll() is None
        sup.kill_leftover()
        # generous: on a loaded box a just-started process can take seconds to die (seen once: >10 s)
        assert orphan.wait(60) == -signal.SIGKILL
        assert bystander.poll() is None
    finally:
        for p in (orphan, bystander):
            if p.poll() is None:
                p.kill()
                p.wait(10)


# ------------------------------------------------------------------------------------------
# one real server, shared, in order


@pytest.mark.daemon
def test_start_query_and_python_worker_imports_freshidx(supervised: Supervised) -> None:
    st = _state(supervised.state_dir)
    assert st["status"] == "up" and st["supervisor_alive"] is True
    assert st["url"] == f"sc://127.0.0.1:{supervised.sup.config.port}"
    assert st["pid"] == supervised.sup.pid and procs.pid_alive(st["pid"])
    assert st["restarts"] == 0 and st["last_restart_reason"] is None
    for key in ("started_at", "updated_at", "last_start_timings"):
        assert st[key], key
    assert (supervised.state_dir / "server.log").stat().st_size > 0
    assert supervised.sup.health_check() is True
    cmd = procs.cmdline(st["pid"])
    assert "-Xmx1g" in cmd and str(supervised.sup.properties_path) in cmd
    # a fresh cds dir: this JVM recorded its classes and dumped them once warmed up
    assert "-XX:+RecordDynamicDumpInfo" in cmd, cmd
    assert st["last_start_timings"]["cds_dump_s"] > 0 and Path(st["cds_archive"]).is_file(), st
    # Runs share one application: jobs of the default pool (every Connect session) are scheduled FAIR.
    log = (supervised.state_dir / "server.log").read_text(errors="replace")
    assert "pool: default, schedulingMode: FAIR" in log, log[-3000:]

    t0 = time.monotonic()
    res = _query_and_python_job(st["url"])
    print(f"\nclient session + query + python job: {time.monotonic() - t0:.2f}s")
    import freshidx.store.partitions

    assert res["module"] == freshidx.store.partitions.__file__  # the installed package, not a pickled copy
    assert res["python"] == sys.executable
    assert res["parsed"] == "20261121T1405"


@pytest.mark.daemon
def test_planned_restart_waits_for_the_lease(supervised: Supervised) -> None:
    sup = supervised.sup
    state_dir = supervised.state_dir
    before = _state(state_dir)
    with acquire_lease(state_dir, "dagster-run-1", timeout_s=30) as lease:
        assert lease.server_pid == before["pid"] and lease.url == before["url"]
        assert [d["run_id"] for d in active_leases(state_dir)] == ["dagster-run-1"]
        sup.config.restart_every_s = 2.0  # the server is older than that: a planned restart is due
        poll_until(lambda: _state(state_dir)["status"] == "draining", timeout=30, what="draining")
        sup.config.restart_every_s = 3600.0  # the reason is taken; no second restart after this one
        # a newcomer does not get in while draining
        with pytest.raises(ServerUnavailable, match="draining"), acquire_lease(state_dir, "late", timeout_s=0.5):
            pass
        # the lease holder keeps working, on the same server, for as long as it holds the lease
        hold_until = time.monotonic() + 3.0
        spark = _client(lease.url)
        try:
            while time.monotonic() < hold_until:
                assert spark.sql("SELECT 1 AS one").collect()[0]["one"] == 1
                st = _state(state_dir)
                assert st["status"] == "draining" and st["pid"] == before["pid"]
                assert sup.pid == before["pid"]
        finally:
            spark.stop()
        assert st["leases"] == ["dagster-run-1"]
    released = time.monotonic()
    # Right after release the server is draining/restarting: a new run waits, then proceeds.
    assert _state(state_dir)["status"] in ("draining", "restarting")
    with acquire_lease(state_dir, "dagster-run-2", timeout_s=START_DEADLINE + 30) as lease2:
        took = time.monotonic() - released
        assert lease2.waited_s > 0 and lease2.server_pid != before["pid"]
        st = _state(state_dir)
        assert st["status"] == "up" and st["restarts"] == before["restarts"] + 1
        assert st["last_restart_reason"] == "planned-age" and st["drain_timed_out_leases"] == []
        print(f"\nlease released → new lease granted: {took:.1f}s (supervisor restart: "
              f"{st['last_restart_duration_s']}s, {st['last_start_timings']})")
        assert _query_and_python_job(lease2.url)["python"] == sys.executable
    assert not procs.pid_alive(before["pid"])
    # later starts map the class archive the first one dumped
    assert "-XX:SharedArchiveFile=" in procs.cmdline(st["pid"])


# ------------------------------------------------------------------------------------------
# progress, not probes; these tests had their own server in test_supervisor_progress.py


def _udfs() -> tuple[Any, Any]:
    """(burn, block_forever) mapInArrow bodies; nested so they are pickled by value for the server."""

    def burn(batches):  # type: ignore[no-untyped-def]
        import time as t

        import pyarrow as pa

        for b in batches:
            end = t.process_time() + 0.25  # CPU, not wall: a starved worker still has to do the work
            while t.process_time() < end:
                pass
            yield pa.RecordBatch.from_pydict({"id": [1] * b.num_rows})

    def block_forever(batches):  # type: ignore[no-untyped-def]
        import threading as th

        for _ in batches:
            th.Event().wait()
        yield from ()

    return burn, block_forever


@pytest.mark.daemon
def test_progressing_leased_job_is_not_restarted_when_probes_fail_under_load(
    supervised: Supervised, cpu_load: list[Any]
) -> None:
    sup, state_dir = supervised.sup, supervised.sup.state_dir
    cfg = sup.config
    before = _state(state_dir)
    assert before["ui_url"], before  # the progress signal's REST API was found
    saved = (cfg.health_timeout_s, cfg.hang_timeout_s)
    stop = threading.Event()
    errors: list[BaseException] = []
    try:
        with acquire_lease(state_dir, "busy-run", timeout_s=LOADED_START_DEADLINE) as lease:
            spark = _client(lease.url)
            spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10")

            # One long Python task per job (~5 s CPU), job after job: one busy slot shows the progress as
            # well as two, and leaves the other core to the rest of the suite (40 s of it).
            def work() -> None:
                while not stop.is_set():
                    try:
                        spark.range(0, 200, numPartitions=1).mapInArrow(_udfs()[0], "id long").count()
                    except Exception as exc:
                        if not stop.is_set():
                            errors.append(exc)
                        return

            worker = threading.Thread(target=work, daemon=True)
            worker.start()
            cfg.hang_timeout_s = HANG_S
            cfg.health_timeout_s = 0.001  # every probe fails, as on a starved box
            t0 = time.monotonic()
            progress_at: list[str] = []
            stalled_max = 0.0
            ticks: list[tuple[float, float]] = []
            while time.monotonic() - t0 < WATCH_S:
                st = _state(state_dir)
                assert (st["pid"], st["restarts"], st["status"]) == (before["pid"], before["restarts"], "up"), st
                assert not errors, errors
                stalled_max = max(stalled_max, st.get("progress_stalled_s") or 0.0)
                if st.get("progress_at") and st["progress_at"] not in progress_at:
                    progress_at.append(st["progress_at"])
                    ticks.append((st.get("probe_s") or 0.0, st.get("status_api_s") or 0.0))
                stop.wait(0.5)  # sampling the state file, not synchronising
            st = _state(state_dir)
            print(f"\nunder load for {WATCH_S:.0f}s: {st.get('health_busy_failures')} failed probes, "
                  f"{len(progress_at)} progress marks ({progress_at}), (probe s, status API s) per tick {ticks}, "
                  f"longest stall seen {stalled_max}s, last: {st.get('progress')}")
            assert st["health_busy_since"] and st["health_busy_failures"] >= cfg.health_failures + 1, st
            # every tick saw progress (ticks are slow under load: the REST API answers in seconds)
            assert stalled_max < HANG_S and len(progress_at) >= 3, (stalled_max, progress_at)
            # (Once the lease goes, an unleased server whose probes keep failing IS restarted, as before.)
            cfg.health_timeout_s = saved[0]
            stop.set()
            spark.interruptAll()
            worker.join(120)
            spark.stop()
    finally:
        stop.set()
        cfg.health_timeout_s, cfg.hang_timeout_s = saved


@pytest.mark.daemon
def test_leased_job_without_progress_is_restarted_as_hung_after_draining(supervised: Supervised) -> None:
    from pyspark.errors import PySparkException

    sup, state_dir = supervised.sup, supervised.sup.state_dir
    cfg = sup.config
    saved = (cfg.hang_timeout_s, cfg.drain_timeout_s)
    cfg.hang_timeout_s, cfg.drain_timeout_s = 12.0, 8.0
    box: dict[str, Any] = {}
    try:
        with acquire_lease(state_dir, "hung-run", timeout_s=LOADED_START_DEADLINE) as lease:
            before = _state(state_dir)  # (inside the lease: the server is up and stays this JVM until drained)
            # Whatever the previous test left running must end first: it would be (real) progress.
            poll_until(lambda: _state(state_dir).get("active_tasks") == 0, timeout=LOADED_START_DEADLINE, interval=0.5,
                       what="no task running before the blocked job")
            spark = _client(lease.url)

            def blocked() -> None:
                try:
                    spark.range(0, 4, numPartitions=2).mapInArrow(_udfs()[1], "id long").collect()
                except BaseException as exc:
                    box["error"] = exc
                    box["at"] = time.monotonic()

            t0 = time.monotonic()
            th = threading.Thread(target=blocked, daemon=True)
            th.start()
            try:
                poll_until(lambda: _state(state_dir)["status"] == "draining", timeout=cfg.hang_timeout_s + 120,
                           interval=0.2, what="draining a hung server")
            except TimeoutError as exc:
                raise AssertionError(f"not judged hung: {_state(state_dir)}") from exc
            t_drain = time.monotonic()
            st = _state(state_dir)
            assert st["draining_reason"] == "hung" and st["pid"] == before["pid"], st
            # (active_tasks is None when the REST API is starved too; the stall is what counts)
            assert "no progress" in st["progress"] and st["progress_stalled_s"] >= cfg.hang_timeout_s, st
            st = poll_until(lambda: (s := _state(state_dir))["restarts"] == before["restarts"] + 1
                            and s["status"] == "up" and s, timeout=LOADED_START_DEADLINE + 60, interval=0.2,
                            what="hung restart")
            t_up = time.monotonic()
            assert st["last_restart_reason"] == "hung" and st["pid"] != before["pid"], st
            assert st["drain_timed_out_leases"] == ["hung-run"], st  # it waited for our lease, then gave up
            assert not procs.pid_alive(before["pid"]) and procs.session_members(before["pid"]) == []
            th.join(LOADED_START_DEADLINE)
            t_err = box.get("at")
            print(f"\nblocked job → draining {t_drain - t0:.1f}s, → up again {t_up - t0:.1f}s; client error after "
                  f"{(t_err - t0) if t_err else float('nan'):.1f}s: {type(box.get('error')).__name__}: "
                  f"{str(box.get('error'))[:200]}")
            # Cut off by the restart: an ordinary exception, which Dagster's RetryPolicy retries.
            assert isinstance(box.get("error"), PySparkException), box
            spark.stop()
    finally:
        cfg.hang_timeout_s, cfg.drain_timeout_s = saved
    # the new server works (a retry would lease it)
    with acquire_lease(state_dir, "after", timeout_s=LOADED_START_DEADLINE) as lease:
        spark = _client(lease.url)
        try:
            assert spark.sql("SELECT 1 AS one").collect()[0]["one"] == 1
        finally:
            spark.stop()


@pytest.mark.daemon
def test_kill_9_is_restarted(supervised: Supervised) -> None:
    from freshidx.defs.shared.resources import SparkResource

    before = _state(supervised.state_dir)
    old_pid = before["pid"]
    # A run's resource holding a session of the server that is about to die (as a step would).
    resource = SparkResource(remote=before["url"], server_state_dir=str(supervised.state_dir),
                             lease_timeout_seconds=START_DEADLINE)
    with resource.session() as session:
        assert session.sql("SELECT 1 AS one").collect()[0]["one"] == 1
    t0 = time.monotonic()
    os.kill(old_pid, signal.SIGKILL)
    def restarted() -> dict[str, Any] | None:
        s = read_state(supervised.state_dir)
        return s if s and s["status"] == "up" and s["restarts"] == before["restarts"] + 1 else None

    st = poll_until(restarted, timeout=START_DEADLINE + 30, interval=0.2, what="restart after kill -9")
    timings = st["last_start_timings"]
    took = time.monotonic() - t0
    assert st["last_restart_reason"] == "crash"
    assert st["pid"] != old_pid and not procs.pid_alive(old_pid)
    assert procs.session_members(old_pid) == []  # its Python workers went too
    print(f"\nkill -9 → up again: {took:.1f}s (supervisor: {st['last_restart_duration_s']}s, {timings})")
    assert _query_and_python_job(st["url"])["python"] == sys.executable
    try:
        # The step fails on the dead server's session; the resource drops it (and its lease) ...
        with pytest.raises(PySparkException), resource.session() as stale:
            stale.sql("SELECT 2").collect()
        assert resource._spark_session is None and active_leases(supervised.state_dir) == []
        # ... so the retry, in the same process with the same resource, leases and connects afresh.
        with resource.session() as fresh:
            assert fresh.sql("SELECT 3 AS three").collect()[0]["three"] == 3
    finally:
        resource.discard()
    assert active_leases(supervised.state_dir) == []


@pytest.mark.daemon
def test_failed_probes_count_only_when_the_server_is_not_busy_with_leased_runs(supervised: Supervised) -> None:
    sup, state_dir = supervised.sup, supervised.state_dir
    before = _state(state_dir)
    timeout = sup.config.health_timeout_s
    stop = threading.Event()
    try:
        with acquire_lease(state_dir, "busy-run", timeout_s=START_DEADLINE) as lease:
            spark = _client(lease.url)

            def burn() -> None:  # a leased run holding both task slots
                while not stop.is_set():
                    with contextlib.suppress(Exception):
                        spark.range(0, 200_000_000, numPartitions=2).selectExpr("sum(hash(id))").collect()

            worker = threading.Thread(target=burn, daemon=True)
            worker.start()
            # Probes that always time out stand in for a server too busy to answer in time.
            sup.config.health_timeout_s = 0.001
            need = sup.config.health_failures + 1
            st = poll_until(lambda: (s := _state(state_dir)).get("health_busy_failures", 0) >= need and s,
                            timeout=120, interval=0.2, what=f"{need} failed probes while busy")
            assert st["health_busy_since"] and st["status"] == "up"
            shown = status.spark_server(str(state_dir))  # what `freshidx status` prints from
            assert shown is not None and shown["health_busy_since"] == st["health_busy_since"]
            assert (st["pid"], st["restarts"]) == (before["pid"], before["restarts"]), "a busy server was restarted"
            stop.set()
            worker.join(120)
            spark.stop()
        # Lease released, the JVM idle, the probes still failing: that is a hung server, restarted.
        st = poll_until(lambda: (s := _state(state_dir))["restarts"] == before["restarts"] + 1 and s,
                        timeout=START_DEADLINE + 60, interval=0.1, what="health restart")
        sup.config.health_timeout_s = timeout
        assert st["last_restart_reason"] == "health" and st["pid"] != before["pid"]
        # the busy episode ended with the lease: no stale count left for the next reader of state.json
        assert (st["health_busy_since"], st["health_busy_failures"]) == (None, 0), st
    finally:
        stop.set()
        sup.config.health_timeout_s = timeout
    poll_until(lambda: _state(state_dir)["status"] == "up", timeout=START_DEADLINE, what="up again")
    assert _query_and_python_job(_state(state_dir)["url"])["python"] == sys.executable


@pytest.mark.daemon
def test_heap_is_sampled_with_jcmd_and_threshold_triggers(supervised: Supervised, tmp_path: Path) -> None:
    sup = supervised.sup
    assert sup.pid is not None
    sample = sample_memory(sup.pid, parse_memory("1g"))
    if jcmd() is None:
        pytest.skip("no jcmd here")
    assert sample.source == "jcmd"
    assert sample.heap_max_bytes is not None and 0.9 * 1024**3 < sample.heap_max_bytes <= 1024**3
    assert sample.heap_used_bytes and 0 < sample.heap_used_bytes < sample.heap_max_bytes
    assert sample.rss_bytes and sample.rss_bytes > sample.heap_used_bytes // 4
    # the decision, on a probe object pointed at the same JVM (leaves the shared supervisor alone)
    probe = SparkConnectSupervisor(replace(sup.config, state_dir=tmp_path, max_heap_fraction=1e-4))
    probe._proc, probe._started_mono = sup._proc, time.monotonic()
    assert probe.planned_restart_reason() == "planned-heap"
    (tmp_path / "b").mkdir()
    probe2 = SparkConnectSupervisor(replace(sup.config, state_dir=tmp_path / "b", max_heap_fraction=0.99))
    probe2._proc, probe2._started_mono = sup._proc, time.monotonic()
    assert probe2.planned_restart_reason() is None
    hs = _state(tmp_path / "b")
    assert hs["heap_source"] == "jcmd" and hs["heap_max_bytes"] == sample.heap_max_bytes
    assert hs["session_processes"] >= 1  # the JVM at least (plus its Python worker daemons)
    # Leaked Python workers: more processes in the JVM's session than allowed → a planned restart.
    (tmp_path / "c").mkdir()
    probe3 = SparkConnectSupervisor(replace(sup.config, state_dir=tmp_path / "c", max_heap_fraction=0.99,
                                            max_session_processes=hs["session_processes"] - 1 or 1))
    probe3._proc, probe3._started_mono = sup._proc, time.monotonic()
    expected = "planned-processes" if hs["session_processes"] > 1 else None
    assert probe3.planned_restart_reason() == expected


@pytest.mark.daemon
def test_second_supervisor_on_the_same_state_dir_is_refused(supervised: Supervised) -> None:
    other = SparkConnectSupervisor(replace(supervised.sup.config, port=free_port()))
    with pytest.raises(StateDirBusy, match="another supervisor"):
        other.start()
    assert _state(supervised.state_dir)["status"] == "up"


@pytest.mark.daemon
def test_stop_leaves_no_process_behind(supervised: Supervised) -> None:
    sup = supervised.sup
    pid = sup.pid
    assert pid is not None
    members = procs.session_members(pid)  # the kill -9 test ran a Python job on this JVM
    assert len(members) > 1, members  # the JVM and its Python worker daemon(s)
    supervised.stop.set()
    supervised.thread.join(60)
    assert not supervised.thread.is_alive() and not supervised.errors
    t0 = time.monotonic()
    sup.stop()
    print(f"\nstop: {time.monotonic() - t0:.1f}s")
    assert not any(procs.pid_alive(p) for p in members)
    assert procs.session_members(pid) == []
    assert _jvm_processes(str(sup.properties_path)) == []
    st = _state(supervised.state_dir)
    assert st["status"] == "down" and st["pid"] is None
    with pytest.raises(ServerUnavailable, match="down"), acquire_lease(supervised.state_dir, "x", timeout_s=0.3):
        pass


# ------------------------------------------------------------------------------------------
# the CLI entry point


@pytest.mark.daemon
def test_cli_runs_in_foreground_and_cleans_up_on_sigterm(tmp_path: Path, cds_dir: Path) -> None:
    port = free_port()
    state_dir = tmp_path / "cli"
    log = tmp_path / "cli.out"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "freshidx.spark_server.server", "--port", str(port), "--state-dir", str(state_dir),
             "--driver-memory", "1g", "--cds-dir", str(cds_dir), "--no-warm-up", "--json", *TEST_JVM_ARGS],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        st = poll_until(lambda: (s := read_state(state_dir)) and s["status"] == "up" and s,
                        timeout=START_DEADLINE + 10, what=f"CLI server up ({log})")
        assert st["supervisor_pid"] == proc.pid and st["url"] == f"sc://127.0.0.1:{port}"
        status = subprocess.run(
            [sys.executable, "-m", "freshidx.spark_server.server", "--status", "--json", "--state-dir", str(state_dir)],
            capture_output=True, text=True, timeout=60, check=True)
        assert json.loads(status.stdout)["pid"] == st["pid"]
        jvm = st["pid"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert not procs.pid_alive(jvm) and procs.session_members(jvm) == []
    assert _jvm_processes(str(state_dir)) == []
    assert _state(state_dir)["status"] == "down"
    events = [json.loads(line)["status"] for line in log.read_text().splitlines() if line.startswith("{")]
    assert events[0] == "starting" and "up" in events and events[-1] == "down"
