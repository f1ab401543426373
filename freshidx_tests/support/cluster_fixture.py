"""A real Spark standalone cluster on loopback (1 master + N workers from the installed pyspark), and a
runner that drives the freshidx assets through it from a separate driver process.

The builds run in a subprocess (``python -m freshidx_tests.support.cluster_fixture ...``) because a process
holds one SparkContext: the test process keeps its local session (the reference answers) and the
runner's driver is attached to the cluster. The runner prints ``PHASE <name>`` lines as it goes and
one ``RESULT <json>`` line at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from freshidx_tests.conftest import free_port
from freshidx_tests.support.polling import poll_until

#: JVM flags for the daemons and executors: start-up over peak speed on a loaded 2-core box (the same
#: reasoning as the local session defaults in freshidx.spark.session).
_LIGHT_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@functools.cache
def light_jvm() -> str:
    """:data:`_LIGHT_JVM` plus the class archive ``freshidx spark-cds`` prepared (``scripts/test.sh`` does),
    if any: the master, workers and executors are launched by ``spark-class`` with the classpath the archive
    was made with, so they map it (checked with ``-Xshare:on``); ``-Xshare:auto`` skips it otherwise."""
    from freshidx.spark.class_archive import map_options
    from freshidx.spark.local_archive import find_archive

    archive = find_archive("768m")
    return " ".join([_LIGHT_JVM, *(map_options(archive) if archive else [])])


def executor_conf() -> dict[str, str]:
    """Confs of the runner's driver beyond what SparkResource sets: small executors, fast JVMs, and the
    driver UI on a known loopback port (the kill test watches task activity through its REST API)."""
    return {
        "spark.executor.memory": "768m",
        "spark.executor.extraJavaOptions": light_jvm(),
        # a lost worker must not leave the build waiting long for its shuffle files / heartbeats
        "spark.network.timeout": "60s",
        "spark.executor.heartbeatInterval": "5s",
    }


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def daemon_env(log_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    env.update({
        "SPARK_HOME": str(spark_home()),
        # every listener of the daemons, their web UIs and the executors on loopback only
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(log_dir),
        "SPARK_DAEMON_JAVA_OPTS": light_jvm(),
        "SPARK_DAEMON_MEMORY": "256m",
        "PYSPARK_PYTHON": sys.executable,
    })
    return env


def session_pids(sid: int) -> list[int]:
    """Every live process of session ``sid`` (a daemon JVM, its executors and their Python workers)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == sid:  # fields after the command: state ppid pgrp session ...
            out.append(int(d.name))
    return out


def kill_session(sid: int, sig: int = signal.SIGKILL) -> None:
    for pid in session_pids(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


@dataclass
class Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    webui_port: int

    def json(self) -> dict[str, Any]:
        return dict(requests.get(f"http://127.0.0.1:{self.webui_port}/json/", timeout=5).json())

    def kill(self) -> None:
        """Like losing the host: the daemon, its executors and their Python workers, at once."""
        kill_session(self.proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)


@dataclass
class StandaloneCluster:
    """``spark-class ...Master`` and ``...Worker`` processes, each in its own session."""

    workdir: Path
    workers: int = 2
    worker_memory: str = "1g"
    master_port: int = 0
    master: Daemon | None = None
    worker_daemons: list[Daemon] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            return subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args],
                                    env=daemon_env(self.workdir / "logs"), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=self.workdir, start_new_session=True)
        finally:
            log.close()

    def start(self, timeout: float = 240.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.master_port, ui = free_port(), free_port()
        proc = self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                      "--port", str(self.master_port), "--webui-port", str(ui)])
        self.master = Daemon("master", proc, ui)
        for i in range(self.workers):
            self.start_worker(i)
        self.wait_workers(self.workers, timeout)

    def start_worker(self, i: int) -> Daemon:
        ui = free_port()
        wdir = self.workdir / f"worker-{i}"
        wdir.mkdir(exist_ok=True)
        proc = self._spawn(f"worker-{i}", [
            "org.apache.spark.deploy.worker.Worker", self.url, "--cores", "1", "--memory", self.worker_memory,
            "--host", "127.0.0.1", "--webui-port", str(ui), "--work-dir", str(wdir)])
        d = Daemon(f"worker-{i}", proc, ui)
        if i < len(self.worker_daemons):
            self.worker_daemons[i] = d
        else:
            self.worker_daemons.append(d)
        return d

    def alive_workers(self) -> int:
        assert self.master is not None
        if self.master.proc.poll() is not None:
            raise RuntimeError(f"master exited ({self.master.proc.returncode}); see {self.workdir}/master.log")
        try:
            state = self.master.json()
        except (requests.RequestException, ValueError):
            return 0  # web UI not up yet
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def wait_workers(self, n: int, timeout: float = 240.0) -> None:
        # generous: three JVMs start at once on a loaded 2-core box
        poll_until(lambda: self.alive_workers() >= n, timeout=timeout, interval=0.5,
                   what=f"{n} ALIVE workers at {self.url} (logs in {self.workdir})")

    def stop(self) -> None:
        for d in [*self.worker_daemons, *([self.master] if self.master else [])]:
            kill_session(d.proc.pid, signal.SIGTERM)
        for d in [*self.worker_daemons, *([self.master] if self.master else [])]:
            with contextlib.suppress(subprocess.TimeoutExpired):
                d.proc.wait(20)
            kill_session(d.proc.pid)  # stragglers (executors, Python workers) of that session


# ----------------------------------------------------------------------------------- scenarios

QUERIES = ("ads OR new OR sale", "pro OR max", "zanzibar quokka lantern")


def search_scenario(store_uri: dict[str, Any], cache: Path, **overrides: Any) -> dict[str, Any]:
    """Delta + full builds through the assets (freshidx_tests.serve.test_search_e2e's scenario)."""
    from freshidx.store import StoreConfig
    from freshidx_tests.serve import test_search_e2e

    real = test_search_e2e.Harness

    def harness(cfg: Any, instance: Any, **kw: Any) -> Any:
        return real(cfg, instance, **{**kw, **overrides})

    test_search_e2e.Harness = harness  # type: ignore[assignment,misc]  # the scenario builds its own harness
    try:
        return test_search_e2e.scenario(StoreConfig(**store_uri), cache)
    finally:
        test_search_e2e.Harness = real  # type: ignore[misc]


def hourly_scenario(store_uri: dict[str, Any], **overrides: Any) -> dict[str, list[str]]:
    """ads_hourly for 2 closed hours via the catch-up sensor and its runs; the published rows per hour."""
    import dagster as dg

    from freshidx.store import StoreConfig, layout
    from freshidx_tests.catchup.test_catchup import bucket_rows, drain, hour, write_hours
    from freshidx_tests.support.harness import Harness

    cfg = StoreConfig(**store_uri)
    with dg.instance_for_test() as instance:
        h = Harness(cfg, instance, hourly_max_hours_per_run=2, hourly_late_checks_per_tick=0, hourly_parts=2,
                    **overrides)
        try:
            write_hours(h, range(2))
            batches = drain(h)
            assert [b for bs in batches for b in bs] == [layout.hour_id(hour(i)) for i in range(2)], batches
            return {layout.hour_id(hour(i)): sorted(json.dumps(r, sort_keys=True, default=str)
                                                    for r in bucket_rows(h.store, cfg, layout.hour_id(hour(i))))
                    for i in range(2)}
        finally:
            h.close()


#: A full build big enough to still be running when a worker is killed (several seconds of tasks).
KILL_PARTITIONS = range(0, 60, 5)


def kill_gen() -> Any:
    from freshidx.tools.generate import GeneratorConfig

    return GeneratorConfig(seed=23, ads=4000, products=300, changes_per_partition=1500, malformed_rate=0.0)


def write_kill_data(store_uri: dict[str, Any]) -> None:
    from freshidx.store import StoreConfig, open_store
    from freshidx.tools.generate import write_partition
    from freshidx_tests.support.harness import at

    store = open_store(StoreConfig(**store_uri))
    for m in KILL_PARTITIONS:
        write_partition(store, kill_gen(), at(m))


def full_answers(store_uri: dict[str, Any], cache: Path) -> dict[str, Any]:
    """What the published full index answers (the pointer's version, opened by the real Searcher)."""
    from freshidx.publish.commit import read_pointer
    from freshidx.serve.searcher import Searcher
    from freshidx.store import StoreConfig, open_store

    store = open_store(StoreConfig(**store_uri))
    pointer, _ = read_pointer(store, "full")
    if pointer is None:
        return {"version": None}
    s = Searcher(store, cache)
    return {"version": pointer.version,
            "answers": {q: sorted(h.ad_id for h in s.search(q, k=500)) for q in QUERIES}}


def full_build(store_uri: dict[str, Any], **overrides: Any) -> bool:
    import dagster as dg

    from freshidx.store import StoreConfig
    from freshidx_tests.support.harness import Harness

    with dg.instance_for_test() as instance:
        h = Harness(StoreConfig(**store_uri), instance, full_max_age_seconds=10**9, **overrides)
        try:
            return bool(h.run(dg.RunRequest(asset_selection=[dg.AssetKey("full_index")]), raise_on_error=False).success)
        finally:
            h.close()


# ----------------------------------------------------------------------------------- runner

STARTED = time.monotonic()


def _phase(name: str) -> None:
    print(f"PHASE {name}", flush=True)


def _driver_session(master: str, ui_port: int | None) -> Any:
    """Start the driver's context first, with the test's extra confs; SparkResource then reuses it
    (getOrCreate) and adds what it always adds on a cluster (loopback driver, the package zip)."""
    from freshidx.spark.session import build_local_session, cluster_conf

    conf = {**cluster_conf(master), **executor_conf()}
    if ui_port:
        conf.update({"spark.ui.enabled": "true", "spark.ui.port": str(ui_port)})
    return build_local_session(master, conf=conf)


def _worker_view(session: Any) -> dict[str, Any]:
    """Where the executors import freshidx from (the shipped zip, not the installed copy)."""
    def where(_: Any) -> Any:
        import freshidx

        yield freshidx.__file__

    files = session.sparkContext.parallelize(range(4), 4).mapPartitions(where).collect()
    return {"freshidx_files": sorted(set(files))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m freshidx_tests.support.cluster_fixture")
    p.add_argument("what", choices=["scenarios", "kill-build"])
    p.add_argument("--store", required=True, help="StoreConfig fields as JSON")
    p.add_argument("--master", help="spark://host:port (driver in this process)")
    p.add_argument("--remote", help="sc://host:port of a Connect server")
    p.add_argument("--server-state", help="state dir of the `freshidx spark-server` supervisor")
    p.add_argument("--ui-port", type=int)
    p.add_argument("--cache", required=True)
    args = p.parse_args(argv)
    stores: dict[str, Any] = json.loads(args.store)
    overrides: dict[str, Any] = {}
    result: dict[str, Any] = {}
    if args.remote:
        overrides = {"spark_remote": args.remote, "spark_server_state": args.server_state}
    else:
        overrides = {"spark_master": args.master}
        session = _driver_session(args.master, args.ui_port)
        result["master"] = session.conf.get("spark.master")
        # SparkResource ships the package when it first gets the session; do the same before
        # looking, so the check sees what the runs see.
        from freshidx.spark.code_shipping import ship_to_cluster

        ship_to_cluster(session)
        result["workers"] = _worker_view(session)
    marks = [time.monotonic()]
    if args.what == "scenarios":
        _phase("search")
        result["search"] = search_scenario(stores["search"], Path(args.cache) / "search", **overrides)
        marks.append(time.monotonic())
        _phase("hourly")
        result["hourly"] = hourly_scenario(stores["hourly"], **overrides)
        marks.append(time.monotonic())
        result["seconds"] = {"start": round(marks[0] - STARTED, 1), "search": round(marks[1] - marks[0], 1),
                             "hourly": round(marks[2] - marks[1], 1)}
    else:
        _phase("kill-window")  # the full build starts now: the test kills a worker once tasks run
        started = time.monotonic()
        result["success"] = full_build(stores["kill"], **overrides)
        result["build_seconds"] = round(time.monotonic() - started, 1)
        result["full"] = full_answers(stores["kill"], Path(args.cache) / "kill")
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
