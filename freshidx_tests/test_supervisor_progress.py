"""The supervisor judges leased work by its progress, not by probes or JVM CPU (issue 17, item 1).

One real supervised Spark Connect server (``run_forever`` in a thread, free loopback port) shared by
the tests of this module, in file order:

* under the ``cpu_load`` fixture, a leased job that keeps progressing (Python workers computing,
  tasks completing) while every ``SELECT 1`` probe times out is *not* restarted, for three times
  the configured hang time;
* a leased job blocked forever in a Python UDF (no task completes, no worker uses CPU) *is*
  restarted, reason ``hung``, after the hang time and a bounded drain; the client cut off by the
  restart gets an ordinary exception (what the assets' ``RetryPolicy`` retries).

Waiting is polling with generous deadlines; the config is changed in place and restored.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from freshidx import procs
from freshidx.spark.lease import acquire_lease
from freshidx.spark.server_config import ServerConfig
from freshidx.spark.server_state import read_state
from freshidx.spark.supervisor import SparkConnectSupervisor
from freshidx_tests.conftest import free_port
from freshidx_tests.polling import poll_until

START_DEADLINE = 420.0  # spawn → warm-up done: ~40 s here, >250 s seen at load average 40
HANG_S = 20.0  # test (a): progress must be seen at least this often under load


def _state(state_dir: Path) -> dict[str, Any]:
    st = read_state(state_dir)
    assert st is not None
    return st


def _client(url: str) -> Any:
    from pyspark.sql import SparkSession

    return SparkSession.builder.remote(url).create()


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


class Supervised:
    def __init__(self, sup: SparkConnectSupervisor, thread: threading.Thread, stop: threading.Event) -> None:
        self.sup, self.thread, self.stop = sup, thread, stop
        self.errors: list[BaseException] = []


@pytest.fixture(scope="module")
def supervised(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervised]:
    cfg = ServerConfig(
        port=free_port(), state_dir=tmp_path_factory.mktemp("spark-server"), driver_memory="1g",
        class_data_sharing=False, health_interval_s=2.0, heap_check_interval_s=3600.0, drain_timeout_s=60.0,
        start_timeout_s=START_DEADLINE,
    )
    sup = SparkConnectSupervisor(cfg)
    stop = threading.Event()
    box: Supervised

    def run() -> None:
        try:
            sup.run_forever(stop)
        except BaseException as exc:
            box.errors.append(exc)

    thread = threading.Thread(target=run, name="supervisor", daemon=True)
    box = Supervised(sup, thread, stop)
    t0 = time.monotonic()
    thread.start()
    poll_until(lambda: (read_state(cfg.state_dir) or {}).get("status") == "up" or box.errors,
               timeout=START_DEADLINE + 10, what="first start")
    assert not box.errors, box.errors
    print(f"\nstart to ready: {time.monotonic() - t0:.1f}s timings={sup.last_timings}")
    try:
        yield box
    finally:
        stop.set()
        thread.join(60)
        sup.stop()


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
        with acquire_lease(state_dir, "busy-run", timeout_s=START_DEADLINE) as lease:
            spark = _client(lease.url)
            spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10")

            def work() -> None:  # long Python tasks (~2.5 s CPU each), job after job
                while not stop.is_set():
                    try:
                        spark.range(0, 400, numPartitions=4).mapInArrow(_udfs()[0], "id long").count()
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
            while time.monotonic() - t0 < 3 * HANG_S:
                st = _state(state_dir)
                assert (st["pid"], st["restarts"], st["status"]) == (before["pid"], before["restarts"], "up"), st
                assert not errors, errors
                stalled_max = max(stalled_max, st.get("progress_stalled_s") or 0.0)
                if st.get("progress_at") and st["progress_at"] not in progress_at:
                    progress_at.append(st["progress_at"])
                    ticks.append((st.get("probe_s") or 0.0, st.get("status_api_s") or 0.0))
                stop.wait(0.5)  # sampling the state file, not synchronising
            st = _state(state_dir)
            print(f"\nunder load for {3 * HANG_S:.0f}s: {st.get('health_busy_failures')} failed probes, "
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
        with acquire_lease(state_dir, "hung-run", timeout_s=START_DEADLINE) as lease:
            before = _state(state_dir)  # (inside the lease: the server is up and stays this JVM until drained)
            # Whatever the previous test left running must end first: it would be (real) progress.
            poll_until(lambda: _state(state_dir).get("active_tasks") == 0, timeout=START_DEADLINE, interval=0.5,
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
                            and s["status"] == "up" and s, timeout=START_DEADLINE + 60, interval=0.2,
                            what="hung restart")
            t_up = time.monotonic()
            assert st["last_restart_reason"] == "hung" and st["pid"] != before["pid"], st
            assert st["drain_timed_out_leases"] == ["hung-run"], st  # it waited for our lease, then gave up
            assert not procs.pid_alive(before["pid"]) and procs.session_members(before["pid"]) == []
            th.join(START_DEADLINE)
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
    with acquire_lease(state_dir, "after", timeout_s=START_DEADLINE) as lease:
        spark = _client(lease.url)
        try:
            assert spark.sql("SELECT 1 AS one").collect()[0]["one"] == 1
        finally:
            spark.stop()
