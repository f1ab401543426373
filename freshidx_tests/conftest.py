"""Shared fixtures: a real moto S3 server on a free loopback port, stores of both kinds, local Spark."""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from freshidx.store import StoreConfig, open_store

MOTO_ACCESS_KEY = "freshidx-test"
MOTO_SECRET_KEY = "freshidx-test-secret"


#: Fixtures that start a JVM (in-process Spark, a Connect server): their tests are ``slow``.
SLOW_FIXTURES = frozenset({"spark", "shared_spark_connect", "make_harness"})
#: Modules whose tests start JVMs or Dagster runs as subprocesses (or through in-process Dagster runs)
#: without asking for one of those fixtures.
SLOW_MODULES = frozenset({
    "test_bench", "test_bench_freshness", "test_catchup", "test_checks_graphql", "test_checks_hourly_metadata",
    "test_cluster",
    "test_connect_retry", "test_delta_versions", "test_demo_stop", "test_full_late_inputs", "test_hourly_build",
    "test_index_shards", "test_launchpad_validation", "test_no_green_noop", "test_overlap", "test_product_features",
    "test_quarantine_replay", "test_retention", "test_run_health", "test_search_e2e", "test_sensor_e2e",
    "test_serving", "test_shards", "test_sla", "test_spark_server", "test_spark_source", "test_supervisor_stop",
    "test_transform",
})


#: Seconds per module in a full run (``--durations=0`` of ``scripts/test.sh``'s pytest command, 3 workers,
#: quiet 2-core box; the deployment modules measured beside each other the same day, the
#: cluster's Connect case estimated). ``scripts/test.sh`` runs with ``--dist loadfile
#: --no-loadscope-reorder`` and the modules are handed out longest first, so the workers end together
#: instead of one running a 5-minute end-to-end module alone at the end (xdist's default order puts
#: single-test modules last). Modules not listed take a few seconds and go last. Relative sizes are what
#: matter: this VM's speed varies up to ~2x from day to day (the same suite took 871 and 1632 CPU-s).
MODULE_SECONDS = {
    "test_bench_chaos": 700, "test_compose_deployment": 540, "test_continuous_monitoring": 340,
    "test_demo_supervision": 260,
    "test_cluster": 350, "test_browser_ui": 306, "test_spark_server": 277,
    "test_daemon_e2e": 173, "test_limits_e2e": 200, "test_ledger_explains": 158, "test_supervisor_stop": 127,
    "test_catchup": 120, "test_connect_retry": 102, "test_version_conflicts": 93, "test_sla": 92,
    "test_devserver": 91, "test_run_health_e2e": 86, "test_sensor_e2e": 76, "test_delta_versions": 72,
    "test_demo_stop": 65, "test_micro_batch_crash": 64, "test_continuous_e2e": 63, "test_continuous_standby": 100,
    "test_spark_spare": 100,
    "test_incremental_equivalence": 62, "test_launchpad_graphql": 48, "test_quarantine_replay": 44,
    "test_full_from_state": 45, "test_search_e2e": 36, "test_compaction": 35, "test_listing": 35,
    "test_hourly_build": 33,
    "test_checks_graphql": 26, "test_local_cds": 25, "test_bench": 18, "test_continuous": 18, "test_run_health": 15,
    "test_launchpad_validation": 13, "test_no_green_noop": 13, "test_overlap": 12, "test_serving": 11,
    "test_transform": 10, "test_ambiguous_commit": 10, "test_shards": 9, "test_generate": 8,
    "test_full_late_inputs": 8, "test_simulation": 60, "test_dg_project": 20, "test_spark_control": 12,
    "test_warnings": 8,
}


def _module(item: pytest.Item) -> str:
    return item.module.__name__.rsplit(".", 1)[-1] if item.module is not None else ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks ``slow`` every test that starts a JVM or ``dagster dev`` (the fast lane, ``scripts/test.sh
    --fast``, deselects them). Tests marked ``heavy`` (the deployment tests: standalone cluster, PostgreSQL,
    the browser) are part of the suite; ``-m "not heavy"`` leaves them out of a quick local run."""
    items.sort(key=lambda item: -MODULE_SECONDS.get(_module(item), 0))  # stable: a module stays in order
    for item in items:
        module = _module(item)
        if (SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) or module in SLOW_MODULES
                or "daemon" in item.keywords or "heavy" in item.keywords):
            item.add_marker(pytest.mark.slow)


#: Set process-wide by a Spark Connect client session; they switch later ``pyspark.sql.functions``
#: calls in the same xdist worker to Connect columns, so every test leaves them as it found them.
CONNECT_ENV = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")


@pytest.fixture(autouse=True)
def _restore_spark_mode() -> Iterator[None]:
    saved = {var: os.environ.get(var) for var in CONNECT_ENV}
    yield
    for var, value in saved.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port free now and never handed out before in this test process, picked below the
    kernel's ephemeral range (above it with ``FRESHIDX_TEST_PORTS=high``), from this xdist worker's own
    slice of it.

    A port the kernel hands out for port 0 comes from the ephemeral range, and so do the source ports of
    outgoing connections and every other process's port-0 binds: a server started a minute later found
    one such port taken. Two picks in a row can also be the same port (a webserver once lost its port to
    the PostgreSQL picked just before it), and so can two workers' picks: hence the set and the slices."""
    low, high = _worker_slice(*_port_range())
    pick = random.SystemRandom()
    for _ in range(500):
        port = pick.randrange(low, high) if high - low > 1_000 else 0
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            port = int(s.getsockname()[1])
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError("no free loopback port")


#: ``high``: pick ports above the kernel's ephemeral range instead of below it (the version lanes'
#: tests, which run beside the main suite's: two pytest sessions must not share a range).
PORTS_ENV = "FRESHIDX_TEST_PORTS"


def _worker_slice(low: int, high: int) -> tuple[int, int]:
    """This xdist worker's part of [low, high): gw0 the first, gw1 the second, and so on."""
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) if worker.isdigit() else 0
    width = max(0, high - low) // max(count, 1)
    return low + index * width, low + (index + 1) * width


def _port_range() -> tuple[int, int]:
    """Below the kernel's ephemeral range ([10000, its start)), or above it with ``FRESHIDX_TEST_PORTS=high``."""
    try:
        first, last = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2])
    except (OSError, ValueError):
        first, last = 32768, 60999  # Linux's default
    return (last + 1, 65536) if os.environ.get(PORTS_ENV) == "high" else (10_000, first)


def wait_for_port(port: int, deadline_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server process exited with {proc.returncode}")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {deadline_s}s")


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real S3-protocol HTTP server (moto) in its own process, on a free loopback port."""
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    for _ in range(3):  # the free port can be taken between probe and bind; retry on a new one
        port = free_port()
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        try:
            wait_for_port(port, 30, proc)
        except (RuntimeError, TimeoutError):
            proc.kill()
            continue
        break
    else:
        raise RuntimeError(f"could not start moto server; see {log}")
    endpoint = f"http://127.0.0.1:{port}"
    yield endpoint
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def make_s3_config(endpoint: str, prefix: str = "root") -> StoreConfig:
    bucket = f"fx-{uuid.uuid4().hex[:16]}"
    cfg = StoreConfig(
        uri=f"s3://{bucket}/{prefix}", endpoint_url=endpoint, region="us-east-1",
        access_key_id=MOTO_ACCESS_KEY, secret_access_key=MOTO_SECRET_KEY,
    )
    cfg.boto3_client().create_bucket(Bucket=bucket)
    return cfg


def s3_env(cfg: StoreConfig) -> dict[str, str]:
    """Environment that makes every freshidx entry point (CLI, dagster) see this S3 store."""
    return {
        "FRESHIDX_STORE": cfg.uri,
        "FRESHIDX_S3_ENDPOINT_URL": cfg.endpoint_url or "",
        "AWS_ACCESS_KEY_ID": cfg.access_key_id or "",
        "AWS_SECRET_ACCESS_KEY": cfg.secret_access_key or "",
        "AWS_REGION": cfg.region or "us-east-1",
    }


@pytest.fixture
def local_store_config(tmp_path: Path) -> StoreConfig:
    return StoreConfig(uri=(tmp_path / "store").as_uri())


@pytest.fixture
def s3_store_config(moto_endpoint: str) -> StoreConfig:
    return make_s3_config(moto_endpoint)


@pytest.fixture(params=["local", "s3"])
def store_config(request: pytest.FixtureRequest, tmp_path: Path) -> StoreConfig:
    """Runs a test once against a temp directory and once against the moto S3 server."""
    if request.param == "local":
        return StoreConfig(uri=(tmp_path / "store").as_uri())
    return make_s3_config(request.getfixturevalue("moto_endpoint"))


@pytest.fixture
def store(store_config: StoreConfig):  # type: ignore[no-untyped-def]
    return open_store(store_config)


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    """One local SparkSession for the whole test session (start-up costs ~8 s)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from freshidx.spark.session import build_local_session

    session = build_local_session("local[2]")
    yield session
    session.stop()


#: A busy process that ends by itself (never outlives a forgotten fixture by more than this).
_HOG = "import time\nend = time.monotonic() + {limit}\nwhile time.monotonic() < end:\n    pass\n"


@pytest.fixture
def cpu_load() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Bounded CPU hogs for the end-to-end tests that must work on a loaded box:
    ``FRESHIDX_TEST_LOAD_PER_CORE`` busy processes per core; 2 is the load they are accepted at.
    Off (0) by default: with the hogs the e2e tests that start a JVM per run took 7+ minutes to a
    first publication on 2 cores and timed out, so the default suite would neither fit its budget nor
    pass reliably. Each hog exits by itself after ``FRESHIDX_TEST_LOAD_LIMIT`` s (default 1800)."""
    per_core = int(os.environ.get("FRESHIDX_TEST_LOAD_PER_CORE", "0"))
    if per_core <= 0:
        yield []
        return
    limit = float(os.environ.get("FRESHIDX_TEST_LOAD_LIMIT", "1800"))
    hogs = [
        subprocess.Popen([sys.executable, "-c", _HOG.format(limit=limit)], start_new_session=True)
        for _ in range(per_core * (os.cpu_count() or 1))
    ]
    try:
        yield hogs
    finally:
        for h in hogs:
            h.kill()
        for h in hogs:
            h.wait(30)


#: Driver JVM options of the Spark Connect servers the tests start: C1 only. Those JVMs live for
#: minutes and run small jobs, where C2 compiler threads cost more CPU than they save (measured on the
#: 2-core box: start to ready 29 → 15 CPU-s, a delta micro-batch 9-15 → 6-8 CPU-s on the server), the
#: reason the local session's defaults do the same (freshidx.spark.session.LOCAL_DEFAULTS). GC, heap
#: sampling and everything else stay as in production. Prepended to the supervisor's own (CDS) options.
TEST_JVM_CONF = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}
#: The same as ``freshidx spark-server`` arguments.
TEST_JVM_ARGS = [arg for key, value in TEST_JVM_CONF.items() for arg in ("--conf", f"{key}={value}")]


def stop_spark_server(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM a ``freshidx spark-server`` started in its own session (it drains and stops its JVM);
    SIGKILL its whole session if it is not gone within 90 s."""
    if proc.poll() is not None:
        return  # gone (and reaped): its pid may belong to another process by now
    stop_spark_server_group(proc.pid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)  # reaped already by the wait above; this sets proc.returncode


#: Set by the controller (the xdist controller, or the one process without xdist) in ``pytest_configure``:
#: where the suite's one shared Spark Connect server keeps its pid, environment and logs. Workers inherit it.
SHARED_CONNECT_DIR_VAR = "PYTEST_FRESHIDX_SHARED_CONNECT_DIR"
#: Heap of the shared server: every xdist worker's Dagster runs lease it, so a few runs overlap; 2g keeps
#: their builds clear of a heap-triggered planned restart (which would drain every worker's runs).
SHARED_CONNECT_HEAP = "2g"


def _is_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    if _is_controller(config) and SHARED_CONNECT_DIR_VAR not in os.environ:
        import tempfile

        os.environ[SHARED_CONNECT_DIR_VAR] = tempfile.mkdtemp(prefix="freshidx-tests-connect-")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The controller stops the shared server once every worker is done (a worker that finishes early
    must not stop it under the others), and removes its directory unless the run failed."""
    if not _is_controller(session.config) or not (shared := os.environ.get(SHARED_CONNECT_DIR_VAR)):
        return
    root = Path(shared)
    pid_file = root / "pid"
    if pid_file.exists():
        stop_spark_server_group(int(pid_file.read_text()))
    if exitstatus == 0 or not any(root.iterdir()):  # a failed run keeps the server's log
        import shutil

        shutil.rmtree(root, ignore_errors=True)


def stop_spark_server_group(pid: int, grace_s: float = 90.0) -> None:
    """SIGTERM a ``freshidx spark-server`` that leads its own session (it drains and stops its JVM); SIGKILL
    the whole session if it is still there after ``grace_s``. Works for a server this process did not
    start (the shared one, stopped by the xdist controller)."""
    import signal

    import psutil

    try:
        proc = psutil.Process(pid)
        if "freshidx.spark_server.server" not in " ".join(proc.cmdline()):
            return  # not ours: the server is gone and its pid was reused
        proc.send_signal(signal.SIGTERM)
        proc.wait(grace_s)
    except psutil.NoSuchProcess:
        return
    except psutil.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(psutil.Error):
            proc.wait(10)


@pytest.fixture(scope="session")
def shared_spark_connect() -> Iterator[dict[str, str]]:
    """One supervised Spark Connect server (``freshidx spark-server``) for the whole suite, shared by the
    Dagster runs of the end-to-end tests of every xdist worker, as the demo shares one: a local JVM per
    run costs 10-60 s of start-up each on a busy 2-core box, and one server per worker cost a JVM start,
    its JIT warm-up and its health probes four times over. The first worker that asks starts it (under
    a file lock; the others wait and reuse it); the controller stops it at the end of the session
    (:func:`pytest_sessionfinish`). Yields the environment a run needs to use it.
    Tests that restart, drain or kill a server start their own (test_connect_retry.py,
    test_spark_server.py)."""
    import fcntl
    import json

    from freshidx.spark_server.server_state import read_state
    from freshidx_tests.support.polling import poll_until

    root = Path(os.environ[SHARED_CONNECT_DIR_VAR])
    state_dir = root / "state"
    env_file = root / "env.json"
    with open(root / "start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held while one worker starts it; the others block here
        if not env_file.exists():
            port = free_port()
            with open(root / "spark-server.out", "ab") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "freshidx.spark_server.server", "--port", str(port), "--state-dir",
                     str(state_dir), "--driver-memory", SHARED_CONNECT_HEAP, "--no-cds-dump",
                     *TEST_JVM_ARGS],
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                    env={**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON") or sys.executable},
                )
            (root / "pid").write_text(str(proc.pid))

            def up() -> bool:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"freshidx spark-server exited with {proc.returncode}; see {root / 'spark-server.out'}")
                return (read_state(state_dir) or {}).get("status") == "up"

            try:
                # Start-up and warm-up are polled with a generous deadline (a JVM start on a loaded box).
                poll_until(up, timeout=600, interval=0.5, what=f"shared Spark Connect server on port {port} up")
            except BaseException:
                stop_spark_server(proc)  # the next worker that asks starts a new one
                (root / "pid").unlink(missing_ok=True)
                raise
            env_file.write_text(json.dumps(
                {"FRESHIDX_SPARK_REMOTE": f"sc://127.0.0.1:{port}", "FRESHIDX_SPARK_SERVER_STATE": str(state_dir)}))
    yield json.loads(env_file.read_text())


@pytest.fixture
def make_harness(local_store_config: StoreConfig) -> Iterator[Any]:
    """``make_harness(**settings_overrides)``: a :class:`Harness` on the local store with a fresh Dagster
    instance each call (two calls = a consumer restarted without its instance); all closed at the end."""
    import dagster as dg

    from freshidx_tests.support.harness import Harness

    made: list[tuple[Harness, Any]] = []

    def make(**overrides: Any) -> Harness:
        cm = dg.instance_for_test()
        h = Harness(local_store_config, cm.__enter__(), **overrides)
        made.append((h, cm))
        return h

    yield make
    for h, cm in made:
        h.close()
        cm.__exit__(None, None, None)
