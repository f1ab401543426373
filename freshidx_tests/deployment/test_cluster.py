"""freshidx on a real Spark standalone cluster (1 master + 2 workers on loopback, one per module).

* delta, full and ``ads_hourly`` builds whose driver is attached to the cluster (``spark://``) give the
  same search answers / bucket rows as local mode, on the moto S3 server; the executors import the
  freshidx zip the driver shipped, not an installed copy;
* the same through a supervised Spark Connect server attached to the cluster
  (``freshidx spark-server --master spark://…``);
* a worker killed (with its executor and Python workers) while the full build's tasks run: the build
  retries on the other worker or fails cleanly; ``CURRENT`` is unchanged or names a complete version
  whose answers equal local mode's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

import pytest
import requests

from freshidx.store import StoreConfig
from freshidx_tests.conftest import free_port, make_s3_config
from freshidx_tests.support.cluster_fixture import (
    StandaloneCluster,
    daemon_env,
    full_answers,
    full_build,
    hourly_scenario,
    light_jvm,
    search_scenario,
    write_kill_data,
)
from freshidx_tests.support.polling import poll_until

# Generous: every build is real Spark work, and the suite's box is a loaded 2-core machine.
pytestmark = [pytest.mark.s3, pytest.mark.heavy, pytest.mark.timeout(1500)]
REPO = Path(__file__).resolve().parents[2]


def store_fields(cfg: StoreConfig) -> dict[str, Any]:
    return {k: v for k, v in asdict(cfg).items() if v is not None}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    c = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster"), workers=2)
    try:
        c.start(timeout=240)
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    """Local mode's answers, computed once per module (by the first test, while its runner works)."""
    return {}


def local_reference(ref: dict[str, Any], moto_endpoint: str, tmp: Path) -> dict[str, Any]:
    """The answers of local mode (this process's local session, the suite's ``spark`` fixture)."""
    if not ref:
        t0 = time.monotonic()
        ref["search"] = search_scenario(store_fields(make_s3_config(moto_endpoint)), tmp / "ref-search")
        ref["hourly"] = hourly_scenario(store_fields(make_s3_config(moto_endpoint)))
        print(f"local reference: {time.monotonic() - t0:.1f} s")
    return ref


class Runner:
    """``python -m freshidx_tests.support.cluster_fixture``: a driver process of its own."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self._err: IO[bytes] = open(log, "wb")  # noqa: SIM115 - closed in result()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "freshidx_tests.support.cluster_fixture", *args], cwd=REPO, text=True,
            stdout=subprocess.PIPE, stderr=self._err, env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", **(env or {})},
            start_new_session=True,
        )
        self.phases: list[str] = []

    def wait_phase(self, name: str) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # blocks until the runner says something (or exits)
            if line.startswith("PHASE "):
                self.phases.append(line.split()[1])
                if self.phases[-1] == name:
                    return
        raise AssertionError(f"runner ended before phase {name}: {self.tail()}")

    def result(self, timeout: float = 420) -> dict[str, Any]:
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
            self._err.close()
        lines = [x for x in out.splitlines() if x.startswith("RESULT ")]
        assert self.proc.returncode == 0 and lines, f"runner failed ({self.proc.returncode}): {self.tail()}"
        return dict(json.loads(lines[-1][len("RESULT "):]))

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def test_delta_full_and_hourly_through_the_cluster_match_local_mode(
        cluster: StandaloneCluster, moto_endpoint: str, spark: Any, reference: dict[str, Any], tmp_path: Path) -> None:
    stores = {"search": store_fields(make_s3_config(moto_endpoint)),
              "hourly": store_fields(make_s3_config(moto_endpoint))}
    runner = Runner(["scenarios", "--master", cluster.url, "--store", json.dumps(stores),
                     "--cache", str(tmp_path / "cache")], tmp_path / "runner.log")
    ref = local_reference(reference, moto_endpoint, tmp_path)  # while the cluster driver starts and works
    got = runner.result()
    print(f"cluster runner: {got['seconds']}")
    assert got["master"] == cluster.url
    # executors imported freshidx from the zip the driver shipped (spark.submit.pyFiles equivalent)
    files = got["workers"]["freshidx_files"]
    assert files and all(".zip" in f and "freshidx-" in f for f in files), files
    assert got["search"] == ref["search"]
    assert got["hourly"] == ref["hourly"]
    assert sum(len(v) for v in got["hourly"].values()) > 0


def test_connect_server_attached_to_the_cluster_matches_local_mode(
        cluster: StandaloneCluster, moto_endpoint: str, spark: Any, reference: dict[str, Any], tmp_path: Path
) -> None:
    port, state = free_port(), tmp_path / "spark-server"
    env = {**daemon_env(tmp_path / "logs"), "SPARK_DAEMON_MEMORY": "1g"}
    with open(tmp_path / "supervisor.log", "wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "freshidx.cli", "spark-server", "--master", cluster.url, "--port", str(port),
             "--state-dir", str(state), "--driver-memory", "768m", "--no-cds-dump",
             # the cluster is on loopback: so is the server's driver (see the report on server.py)
             "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
             "--conf", "spark.executor.memory=768m",
             "--conf", f"spark.executor.extraJavaOptions={light_jvm()}"],
            cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        from freshidx.spark_server.server_state import read_state

        poll_until(lambda: server.poll() is not None or (read_state(state) or {}).get("status") == "up",
                   timeout=300, interval=0.5, what="spark-server up")
        assert server.poll() is None, (tmp_path / "supervisor.log").read_text()[-3000:]
        stores = {"search": store_fields(make_s3_config(moto_endpoint)),
                  "hourly": store_fields(make_s3_config(moto_endpoint))}
        runner = Runner(["scenarios", "--remote", f"sc://127.0.0.1:{port}", "--server-state", str(state),
                         "--store", json.dumps(stores), "--cache", str(tmp_path / "cache")], tmp_path / "runner.log")
        ref = local_reference(reference, moto_endpoint, tmp_path)
        got = runner.result()
        print(f"connect runner: {got['seconds']}")
        # the server's application ran on the cluster's workers, not in a local[...] JVM
        apps = cluster.master.json().get("activeapps", []) if cluster.master else []  # type: ignore[union-attr]
        assert any("Connect" in a.get("name", "") for a in apps), apps
        assert got["search"] == ref["search"]
        assert got["hourly"] == ref["hourly"]
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the supervisor stops its JVM's whole session
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(30)


def _busy_executor_worker_port(ui_port: int) -> int | None:
    """The web UI port of the worker whose executor is running tasks (from its log links), if any."""
    try:
        apps = requests.get(f"http://127.0.0.1:{ui_port}/api/v1/applications", timeout=5).json()
        execs = requests.get(f"http://127.0.0.1:{ui_port}/api/v1/applications/{apps[0]['id']}/executors",
                             timeout=5).json()
    except (requests.RequestException, ValueError, IndexError, KeyError):
        return None  # the driver UI is not up yet
    for e in execs:
        if e.get("id") != "driver" and e.get("activeTasks", 0) > 0:
            link = e.get("executorLogs", {}).get("stdout", "")
            return int(link.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    return None


def test_worker_killed_mid_build_retries_or_fails_cleanly(
        cluster: StandaloneCluster, moto_endpoint: str, spark: Any, tmp_path: Path) -> None:
    ref_cfg, cfg = store_fields(make_s3_config(moto_endpoint)), store_fields(make_s3_config(moto_endpoint))
    write_kill_data(ref_cfg)
    write_kill_data(cfg)
    ui = free_port()
    runner = Runner(["kill-build", "--master", cluster.url, "--ui-port", str(ui), "--store", json.dumps({"kill": cfg}),
                     "--cache", str(tmp_path / "cache")], tmp_path / "runner.log")
    runner.wait_phase("kill-window")
    port = poll_until(lambda: _busy_executor_worker_port(ui), timeout=300, interval=0.2,
                      what="an executor running the full build's tasks")
    victim = next(w for w in cluster.worker_daemons if w.webui_port == port)
    killed_at = time.monotonic()
    victim.kill()
    got = runner.result()
    # local reference while nothing else runs on the cluster
    assert full_build(ref_cfg)
    ref = full_answers(ref_cfg, tmp_path / "ref-cache")
    print(f"worker {victim.name} killed; build success={got['success']} in {got['build_seconds']} s "
          f"({time.monotonic() - killed_at:.1f} s after the kill)")
    if got["success"]:
        assert got["full"]["version"] is not None
        assert got["full"]["answers"] == ref["answers"]  # a complete version, same answers as local mode
    else:
        assert got["full"] == {"version": None}  # nothing published
    i = cluster.worker_daemons.index(victim)
    cluster.start_worker(i)  # leave the module's cluster as we found it
    cluster.wait_workers(2)
