"""The compose deployment (docker/docker-compose.yml) run as processes on loopback, used as a user would.

The test parses the compose file and runs each service's ``command`` with its ``environment`` (YAML
anchors merged, ``${VAR:-default}`` interpolated: :mod:`freshidx_tests.support.compose_file`) through one
explicit rewrite to this machine (:class:`~freshidx_tests.support.compose_file.Loopback`: service host names ->
127.0.0.1, every container port -> a free loopback port, container paths -> a directory per service and
per named volume, the image's interpreter -> the project's virtualenv): the Spark master, worker and
Connect server, the code location's gRPC server, and dagster-webserver, dagster-daemon and the one-shot
that sets the pools' limits (``dagster instance concurrency set``) from a virtualenv that has dagster,
dagster-webserver, dagster-postgres and dagster-aws but not freshidx (the instance,
docker/dagster.postgres.yaml, is stock). Three images hold what cannot run here and have
stand-ins: PostgreSQL (pg_fixture's initdb server, with the service's user and database), MinIO (moto's
S3 server) and the mc init container (its buckets, read from its command). Services start in
``depends_on`` order, each gated by its compose health check, run the same way.

Spark: the Dagster scenarios run on the compose file's own cluster: every run leases the supervised
Connect server attached to the master and its worker over its control endpoint
(``FRESHIDX_SPARK_SERVER_URL``), as in the containers (no local Spark, and not the suite's shared Connect
server). Every service has its own HOME and temporary directory: nothing is shared but PostgreSQL, the S3
server and the network (:func:`assert_nothing_shared_but_the_network`).

What a user of the deployment sees:

* the catch-up sensor processes 2 closed ``ads_hourly`` hours once each, and the delta sensor publishes
  the newest partition with no click (sensor -> run -> publish);
* a backfill of those 2 hours launched with GraphQL ``launchPartitionBackfill`` (the UI's partition
  dialog) while upstream keeps writing: the hours are rebuilt (a second version each, recorded in the
  ledger as a backfill rebuild, never claimed again by catch-up), the backfill's runs are queued behind
  live work (lower priority), the delta sensor keeps publishing meanwhile, and the delta pointer only
  ever moves forward;
* in continuous mode (a second deployment), the continuous run publishes, holds its lease over the
  control endpoint, lets go of it when a planned restart of the Connect server (SIGHUP) drains, and
  publishes again on the restarted server;
* runs, events and sensor ticks are in PostgreSQL (no SQLite in any DAGSTER_HOME), and a run's logs are
  in the store: the compute log manager's objects exist there, and the webserver, which has its own
  staging directory, serves them through GraphQL ``capturedLogs``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import boto3
import dagster as dg
import pytest
import requests

from freshidx.catchup import planner as catchup
from freshidx.publish.commit import read_pointer
from freshidx.spark_server.control_client import EndpointControl
from freshidx.store import ObjectStore, StoreConfig, layout, open_store
from freshidx.store.partitions import PartitionId
from freshidx.store.records.progress import Heartbeat
from freshidx.tools.devserver import BACKFILL_TERMINAL_STATUSES
from freshidx.tools.devserver_graphql import WebserverClient
from freshidx.tools.generate import GeneratorConfig, write_partition
from freshidx_tests.conftest import free_port, wait_for_port
from freshidx_tests.support.compose_file import IMAGE_PYTHON, command, environment, load_compose, loopback_for, service
from freshidx_tests.support.compose_processes import Deployment, instance_venv, run_in
from freshidx_tests.support.pg_fixture import PostgresServer, make_server
from freshidx_tests.support.polling import poll_until
from freshidx_tests.trigger.test_daemon_e2e import SLA_OFF, SLA_SENSOR

pytestmark = [pytest.mark.daemon, pytest.mark.heavy, pytest.mark.s3]

POSTGRES, STORE, STORE_INIT = "freshidx-postgresql", "freshidx-store", "freshidx-store-init"
USER_CODE, WEBSERVER, DAEMON = "freshidx-user-code", "freshidx-webserver", "freshidx-daemon"
#: The services that load only the Dagster instance: they run from the virtualenv without freshidx.
INSTANCE_ONLY = (WEBSERVER, DAEMON, "freshidx-instance-init")
GEN = GeneratorConfig(seed=9, ads=200, products=40, changes_per_partition=20)
# Hours 0-1 are the closed hours to process and rebuild; hour 2 is the previous hour, where live batches land.
H0 = catchup.floor_hour(dt.datetime.now(dt.UTC)) - dt.timedelta(hours=3)
#: Hours 0-1 ended over an hour ago, so they are closed; the live hour 2 ended less than an hour ago and
#: stays open, so the catch-up sensor processes exactly the 2 hours under test (no empty hours, no live
#: hour and its late-data corrections queued in the one heavy slot before the backfill).
CLOSE_GRACE_S = 3600
#: The test's settings for the code location, beside the compose file's. SLA sensor off: its full-index
#: remediation would only compete with the runs under test.
SCENARIO_ENV = {**SLA_OFF, "FRESHIDX_PARTITIONS_START": "2026-11-01", "FRESHIDX_CATCHUP_AUTOSTART": "true",
                "FRESHIDX_HOURLY_SENSOR_INTERVAL_SECONDS": "5", "FRESHIDX_CLOSE_GRACE_SECONDS": str(CLOSE_GRACE_S),
                # one hour per run: the backfill is 2 runs, long enough for live publications to land inside it
                "FRESHIDX_HOURLY_MAX_HOURS_PER_RUN": "1"}
#: The second scenario: continuous mode, no catch-up, no SLA sensor.
CONTINUOUS_ENV = {**SLA_OFF, "FRESHIDX_PARTITIONS_START": "2026-11-01", "FRESHIDX_CATCHUP_AUTOSTART": "false",
                  "FRESHIDX_DELTA_MODE": "continuous"}
CONNECT = "spark-connect"
CAPTURED_LOGS_QUERY = """
query RunLogs($runId: ID!) {
  logsForRun(runId: $runId, limit: 5000) {
    __typename
    ... on EventConnection { events { __typename ... on LogsCapturedEvent { fileKey stepKeys } } }
  }
}"""
CAPTURED_LOG_QUERY = "query Log($key: [String!]!) { capturedLogs(logKey: $key) { stdout stderr } }"


def hour(i: int) -> dt.datetime:
    return H0 + dt.timedelta(hours=i)


def delta_history(store: ObjectStore) -> list[dict[str, Any]]:
    out = [store.get_json(o.key)[0] for o in store.list(layout.index_root("delta") + "history/").objects]
    return sorted(out, key=lambda p: p["seq"])


def start_order(compose: dict[str, Any]) -> list[str]:
    """The services, each after everything it ``depends_on``."""
    order: list[str] = []

    def visit(name: str) -> None:
        if name not in order:
            for dep in compose["services"][name].get("depends_on") or {}:
                visit(dep)
            order.append(name)

    for name in compose["services"]:
        visit(name)
    return order


def url_port(url: str) -> int:
    port = urlparse(url).port
    assert port is not None, url
    return port


def store_client(d: Deployment) -> Any:
    """An S3 client of the store as the init container reaches it (MinIO's root credentials)."""
    init = environment(service(d.compose, STORE_INIT))
    alias = re.search(r"mc alias set \w+ (\S+)", " ".join(command(service(d.compose, STORE_INIT))))
    assert alias, "the init container names the store"
    return boto3.client("s3", endpoint_url=d.loopback.apply(STORE_INIT, alias[1]), region_name="us-east-1",
                        aws_access_key_id=init["MINIO_ROOT_USER"], aws_secret_access_key=init["MINIO_ROOT_PASSWORD"])


def start_stand_ins(d: Deployment, name: str, pg: PostgresServer) -> None:
    """The services whose images cannot run here: PostgreSQL, MinIO (moto) and the mc init container."""
    dagster_env = environment(service(d.compose, USER_CODE))
    if name == POSTGRES:
        pg.start(port=d.loopback.port(url_port(dagster_env["DAGSTER_POSTGRES_URL"])))
        d.extra_env[POSTGRES] = {"PGHOST": "127.0.0.1", "PGPORT": str(pg.port)}  # where pg_isready looks
        d.wait_healthy(POSTGRES, 120)
    elif name == STORE:
        port = d.loopback.port(url_port(dagster_env["FRESHIDX_S3_ENDPOINT_URL"]))
        proc = d.spawn(STORE, ["moto_server", "-H", "127.0.0.1", "-p", str(port)])
        wait_for_port(port, 60, proc)
        d.healthy.add(STORE)
    else:
        buckets = re.findall(r"mc mb (?:-p )?\w+/([\w.-]+)", " ".join(command(service(d.compose, STORE_INIT))))
        assert buckets
        for bucket in buckets:
            store_client(d).create_bucket(Bucket=bucket)
        d.healthy.add(STORE_INIT)  # completed successfully


@pytest.fixture(scope="module")
def instance_python() -> Path:
    return instance_venv()


@contextlib.contextmanager
def started(tmp_path: Path, instance_python: Path,
            code_env: dict[str, str]) -> Iterator[tuple[Deployment, PostgresServer]]:
    """Every service of the compose file started (the code location with ``code_env`` besides its own)."""
    compose = load_compose()
    pg_env = environment(service(compose, POSTGRES))
    pg = make_server(pg_env["POSTGRES_USER"], pg_env["POSTGRES_DB"])
    if pg is None:
        pytest.skip("no PostgreSQL server binaries (initdb); run scripts/bootstrap.sh as root or "
                    "apt-get install postgresql")
    d = Deployment(compose, loopback_for(compose, tmp_path / "compose", free_port, {IMAGE_PYTHON: sys.executable}),
                   venvs=dict.fromkeys(INSTANCE_ONLY, instance_python), extra_env={USER_CODE: code_env})
    try:
        for name in start_order(compose):
            if name in (POSTGRES, STORE, STORE_INIT):
                start_stand_ins(d, name, pg)
            else:
                d.start(name)
        yield d, pg
    finally:
        d.stop()
        pg.stop()
        shutil.rmtree(pg.root, ignore_errors=True)


@pytest.fixture
def deployment(tmp_path: Path, instance_python: Path) -> Iterator[tuple[Deployment, PostgresServer]]:
    with started(tmp_path, instance_python, SCENARIO_ENV) as d:
        yield d


@pytest.fixture
def continuous_deployment(tmp_path: Path, instance_python: Path) -> Iterator[tuple[Deployment, PostgresServer]]:
    with started(tmp_path, instance_python, CONTINUOUS_ENV) as d:
        yield d


def assert_nothing_shared_but_the_network(d: Deployment) -> None:
    """Each service runs with its own HOME and TMPDIR, no environment value or argument points into another
    service's directory, and the runs reach the Connect server's supervisor by its endpoint, not a state dir."""
    homes = {d.env(name)["HOME"] for name in d.procs}
    assert len(homes) == len(d.procs) and len({d.env(name)["TMPDIR"] for name in d.procs}) == len(d.procs)
    for name in d.procs:
        assert not d.foreign_paths(name), (name, d.foreign_paths(name))
    code_env = d.env(USER_CODE)
    assert "FRESHIDX_SPARK_SERVER_STATE" not in code_env
    assert code_env["FRESHIDX_SPARK_SERVER_URL"] == control_url(d)


def control_url(d: Deployment) -> str:
    argv = d.argv(CONNECT, command(service(d.compose, CONNECT)))
    return f"http://127.0.0.1:{argv[argv.index('--control-port') + 1]}"


def ready_ui(d: Deployment) -> WebserverClient:
    """The webserver once its health check passes, the code location is loaded and the daemons are healthy."""
    d.wait_healthy(WEBSERVER, 300)
    argv = d.argv(WEBSERVER, command(service(d.compose, WEBSERVER)))
    ui = WebserverClient("127.0.0.1", int(argv[argv.index("-p") + 1]))

    def ready() -> bool:
        if d.procs[DAEMON].poll() is not None:
            raise RuntimeError(f"dagster-daemon exited: {d.tail(DAEMON)}")
        return not ui.refresh_workspace() and not ui.unhealthy_daemons()

    poll_until(ready, timeout=300, interval=1, what="code location loaded and daemons healthy")
    return ui


def assert_stock_instance_services(d: Deployment) -> None:
    """The webserver and daemon run without freshidx, and every runnable compose health check passes."""
    probe = run_in(d.env(WEBSERVER), d.cwd(WEBSERVER), "python", "-c", "import freshidx")
    assert probe.returncode != 0 and "No module named 'freshidx'" in probe.stderr, probe
    for name in [POSTGRES, *d.procs]:
        if name != STORE and name not in d.one_shots():  # MinIO's check (mc) has no stand-in
            # Compose retries a health check before it calls a service unhealthy; one probe that timed out on a
            # loaded box is not a failure: poll it the same way.
            checks: list[Any] = []
            with contextlib.suppress(TimeoutError):
                poll_until(lambda n=name, seen=checks: seen.append(d.check(n)) or seen[-1].returncode == 0,
                           timeout=180, interval=2, what=f"{name}'s compose health check")
            assert checks[-1].returncode == 0, (name, checks[-1].stdout, checks[-1].stderr)


def assert_connect_server_on_the_cluster(d: Deployment) -> None:
    """The runs' Spark Connect server is an application of the compose file's master, with an ALIVE worker."""
    argv = d.argv("spark-master", command(service(d.compose, "spark-master")))
    state = requests.get(f"http://127.0.0.1:{argv[argv.index('--webui-port') + 1]}/json/", timeout=10).json()
    assert any(w["state"] == "ALIVE" for w in state["workers"]), state["workers"]
    assert any("Connect" in a["name"] for a in state["activeapps"]), state["activeapps"]


def captured_log(ui: WebserverClient, run_id: str) -> tuple[list[str], str]:
    """A step's captured stdout+stderr of ``run_id`` as the UI reads it, and that step's keys."""
    events = ui.graphql(CAPTURED_LOGS_QUERY, {"runId": run_id})["logsForRun"]["events"]
    captured = [e for e in events if e["__typename"] == "LogsCapturedEvent"]
    assert captured, f"no LogsCapturedEvent in run {run_id}"
    logs = ui.graphql(CAPTURED_LOG_QUERY, {"key": [run_id, "compute_logs", captured[0]["fileKey"]]})
    out = logs["capturedLogs"]
    return captured[0]["stepKeys"] or [], (out["stdout"] or "") + (out["stderr"] or "")


def assert_run_logs_in_the_store(d: Deployment, ui: WebserverClient, run_id: str) -> None:
    env = d.env(WEBSERVER)
    bucket, prefix = env["DAGSTER_COMPUTE_LOGS_BUCKET"], env["DAGSTER_COMPUTE_LOGS_PREFIX"]
    listed = store_client(d).list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/storage/{run_id}/compute_logs/")
    keys = [o["Key"] for o in listed.get("Contents", [])]
    assert keys, f"no compute logs of run {run_id} in s3://{bucket}/{prefix}"
    steps, text = captured_log(ui, run_id)
    assert steps and any(step in text for step in steps), text[-2000:]
    # the webserver read them from the store into its own staging directory, not the code location's
    staged = Path(env["DAGSTER_COMPUTE_LOGS_LOCAL_DIR"])
    assert staged != Path(d.env(USER_CODE)["DAGSTER_COMPUTE_LOGS_LOCAL_DIR"])
    assert list((staged / run_id).rglob("*.err")), staged


def pg_count(url: str, table: str) -> int:
    import psycopg2

    conn = psycopg2.connect(url.replace("+psycopg2", ""))
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT count(*) FROM {table}")  # table names are ours, not input
            row: Any = cur.fetchone()
            return int(row[0])
    finally:
        conn.close()


@pytest.mark.timeout(2400)  # generous: a loaded 2-core box (under cpu_load every run takes minutes)
def test_compose_deployment_catchup_delta_and_ui_backfill_with_a_stock_instance(
        cpu_load: list[Any], deployment: tuple[Deployment, PostgresServer], monkeypatch: pytest.MonkeyPatch) -> None:
    d, postgres = deployment
    ui = ready_ui(d)
    assert_nothing_shared_but_the_network(d)
    assert_stock_instance_services(d)
    assert_connect_server_on_the_cluster(d)
    assert ui.location_name == "freshidx"  # loaded from the gRPC server of the workspace
    sla = ui.sensor_state(SLA_SENSOR)
    assert sla["status"] == "STOPPED" and not sla["ticks"], sla
    code_env = d.env(USER_CODE)
    store = open_store(StoreConfig.from_env(code_env["FRESHIDX_STORE"], code_env))
    for i in range(2):  # two closed hours (a range, as the UI selects it), two batches each
        for m in (10, 40):
            write_partition(store, GEN, PartitionId(hour(i) + dt.timedelta(minutes=m)))
    live = [PartitionId(hour(2) + dt.timedelta(minutes=m)) for m in range(0, 60, 3)]
    write_partition(store, GEN, live.pop(0))

    # The catch-up sensor processes the closed hours once; the delta sensor publishes the newest, no click.
    names = [layout.bucket_name(catchup.ASSET, hour(i)) for i in range(2)]
    poll_until(lambda: all(read_pointer(store, n)[0] is not None for n in names), timeout=900, interval=1,
               what="catch-up sensor to process hours 0-1")
    first = {n: read_pointer(store, n)[0] for n in names}
    assert all(p is not None and p.seq == 1 for p in first.values())
    poll_until(lambda: read_pointer(store, "delta")[0] is not None, timeout=900, interval=1,
               what="first delta publish")

    # The UI's partition backfill of hours 0..1 (one range), while new batches keep arriving.
    keys = [catchup.dagster_key(hour(i)) for i in range(2)]
    launched_at = dt.datetime.now(dt.UTC)
    backfill_id = ui.launch_partition_backfill("ads_hourly", range=(keys[0], keys[-1]), title="compose e2e")
    delta_before = read_pointer(store, "delta")[0].seq  # type: ignore[union-attr]
    last_write = [time.monotonic()]

    def backfill_done() -> dict[str, Any] | None:
        # Meanwhile the upstream simulator drops a batch every ~4 s, so the delta sensor keeps publishing.
        if live and time.monotonic() - last_write[0] >= 4:
            write_partition(store, GEN, live.pop(0))
            last_write[0] = time.monotonic()
        st = ui.backfill_status(backfill_id)
        return st if st["status"] in BACKFILL_TERMINAL_STATUSES else None

    status = poll_until(backfill_done, timeout=1200, interval=1, what="the backfill to finish")
    done_at = dt.datetime.now(dt.UTC)
    assert status.get("status") == "COMPLETED_SUCCESS", status
    # The delta sensor kept publishing while the backfill ran: live runs are not held behind it.
    assert read_pointer(store, "delta")[0].seq > delta_before  # type: ignore[union-attr]
    during = [h for h in delta_history(store)
              if launched_at <= dt.datetime.fromisoformat(h["published_at"]) <= done_at]
    assert during, f"no delta publication between {launched_at} and {done_at}"

    assert_hours_rebuilt(store, names, first)
    assert_runs_in_postgres(d, postgres, backfill_id, monkeypatch)
    assert_run_logs_in_the_store(d, ui, status["runs"][0]["runId"])

    # The delta pointer only ever moved forward: every publication's position is newer than the last.
    hist = delta_history(store)
    assert len(hist) >= 2
    positions = [h["position"] for h in hist]
    assert positions == sorted(positions) and len(set(positions)) == len(positions), positions
    assert [h["seq"] for h in hist] == list(range(1, len(hist) + 1))


def assert_hours_rebuilt(store: ObjectStore, names: list[str], first: dict[str, Any]) -> None:
    """A second version of each hour, recorded as a backfill rebuild; catch-up processed each hour once."""
    for i, n in enumerate(names):
        ptr = read_pointer(store, n)[0]
        assert ptr is not None and ptr.seq == 2 and ptr.version != first[n].version, n
        entries = catchup.hour_entries(store, catchup.ASSET, hour(i))
        rebuilt = [e for k, e in entries.items() if k.startswith("backfill-")]
        assert len(rebuilt) == 1 and rebuilt[0]["decision"] == "rebuilt", entries.keys()
        assert [k for k in entries if k[:1] == "a" and k[1:].isdigit()] == ["a1"], "processed once by catch-up"


def assert_runs_in_postgres(d: Deployment, postgres: PostgresServer, backfill_id: str,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The backfill's runs, queued behind live work, as the instance (PostgreSQL) records them."""
    env = d.env(WEBSERVER)
    for var, value in env.items():  # what docker/dagster.postgres.yaml reads
        if var.startswith(("DAGSTER_", "AWS_")):
            monkeypatch.setenv(var, value)
    instance = dg.DagsterInstance.from_config(env["DAGSTER_HOME"])
    try:
        runs = instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
        assert len(runs) == 2 and all(r.tags.get(catchup.TAG_KIND) is None for r in runs)  # not catch-up claims
        assert all(r.status.value == "SUCCESS" for r in runs)
        # Lower priority than live work: the run queue dequeues the live delta runs first.
        live_runs = instance.get_runs(dg.RunsFilter(tags={"freshidx/pipeline": "delta"}))
        assert live_runs and all(int(r.tags.get("dagster/priority", 0)) > 0 for r in live_runs)
        assert all(int(r.tags.get("dagster/priority", 0)) < min(int(x.tags["dagster/priority"]) for x in live_runs)
                   for r in runs)
    finally:
        instance.dispose()
    # the instance really is PostgreSQL: runs and events there, no SQLite storage in any DAGSTER_HOME
    assert pg_count(postgres.url, "runs") >= 5
    assert pg_count(postgres.url, "event_logs") > 0
    assert pg_count(postgres.url, "job_ticks") > 0  # sensor ticks: schedule storage
    for name in (USER_CODE, WEBSERVER, DAEMON):
        home = Path(d.env(name)["DAGSTER_HOME"])
        assert (home / "dagster.yaml").is_file() and not list(home.rglob("*.db")), list(home.rglob("*.db"))


def run_messages(d: Deployment, run_id: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The log messages of ``run_id`` as the instance (PostgreSQL) records them."""
    env = d.env(WEBSERVER)
    for var, value in env.items():  # what docker/dagster.postgres.yaml reads
        if var.startswith(("DAGSTER_", "AWS_")):
            monkeypatch.setenv(var, value)
    instance = dg.DagsterInstance.from_config(env["DAGSTER_HOME"])
    try:
        return [r.event_log_entry.message or "" for r in instance.get_records_for_run(run_id, limit=5000).records]
    finally:
        instance.dispose()


@pytest.mark.timeout(1800)
def test_compose_continuous_mode_and_a_planned_connect_restart_over_the_control_endpoint(
        continuous_deployment: tuple[Deployment, PostgresServer], monkeypatch: pytest.MonkeyPatch) -> None:
    """Continuous mode publishes; its run holds a lease over the Connect server's control endpoint; a planned
    restart (SIGHUP: ``planned-manual``) drains it (the run lets go of its lease, the drain does not time
    out) and the run publishes again on the new server. Nothing shared but PostgreSQL, S3 and the network."""
    d, _ = continuous_deployment
    ready_ui(d)
    assert_nothing_shared_but_the_network(d)
    control = EndpointControl(control_url(d))
    code_env = d.env(USER_CODE)
    store = open_store(StoreConfig.from_env(code_env["FRESHIDX_STORE"], code_env))
    write_partition(store, GEN, PartitionId(hour(2) + dt.timedelta(minutes=5)))
    first = poll_until(lambda: read_pointer(store, "delta")[0], timeout=900, interval=1,
                       what="continuous mode's first publish")
    # The loop writes its heartbeat in the tick that published, after the swap: a run whose first tick already
    # found the partition has none when the pointer moves.
    heartbeat = poll_until(lambda: Heartbeat.latest(store, "delta"), timeout=300, interval=0.5,
                           what="the continuous run's heartbeat")
    assert first.run_id == heartbeat.run_id  # published by the continuous run
    run_id = heartbeat.run_id

    def lease_of_the_run() -> list[dict[str, Any]]:
        return [lease for lease in control.call("GET", "/leases")[1]["leases"] if lease["run_id"] == run_id]

    held = poll_until(lease_of_the_run, timeout=300, interval=0.5, what="the continuous run's endpoint lease")
    assert held[0]["via"] == "endpoint"
    before = control.state()
    assert before is not None and before["status"] == "up"

    os.kill(d.procs[CONNECT].pid, signal.SIGHUP)  # a planned restart: drained first

    def restarted() -> dict[str, Any] | None:
        state = control.state()
        return state if state and state.get("restarts", 0) > before.get("restarts", 0) and state["status"] == "up" \
            else None

    after = poll_until(restarted, timeout=900, interval=1, what="the drained restart of the Connect server")
    assert after["last_restart_reason"] == "planned-manual" and after["pid"] != before["pid"], after
    assert after["drain_timed_out_leases"] == [], after  # the drain ended because the lease was released
    messages = run_messages(d, run_id, monkeypatch)
    assert any("draining for a restart: session and lease released" in m for m in messages), messages[-20:]

    # The same continuous run leases the new server and publishes the next partition.
    write_partition(store, GEN, PartitionId(hour(2) + dt.timedelta(minutes=8)))
    again = poll_until(lambda: (p := read_pointer(store, "delta")[0]) is not None and p.seq > first.seq and p,
                       timeout=900, interval=1, what="a publication after the restart")
    assert again.run_id == run_id
    assert lease_of_the_run(), "the run leased the restarted server over the endpoint"
