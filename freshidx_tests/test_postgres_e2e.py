"""Dagster on PostgreSQL, deployed as in docker/: a real PostgreSQL server, the instance configured by
docker/dagster.postgres.yaml (runs, event log, schedules in PostgreSQL), the code location served by
``dagster api grpc`` and loaded through a workspace with a ``grpc_server`` entry, ``dagster dev``
(webserver + daemon) on top. The sensor → run → publish path moves the delta pointer, and a backfill
of 2 ``ads_hourly`` partitions launched through GraphQL (as the UI does) completes; the runs and events
are in PostgreSQL and no SQLite storage appears in DAGSTER_HOME.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from freshidx import catchup, layout
from freshidx.partitions import PartitionId
from freshidx.publish import read_pointer
from freshidx.store import StoreConfig, open_store
from freshidx.tools.devserver import BACKFILL_TERMINAL_STATUSES, DagsterDev, prepare_home
from freshidx.tools.generate import GeneratorConfig, write_partition
from freshidx_tests.conftest import free_port, wait_for_port
from freshidx_tests.pg_fixture import PostgresServer, make_server
from freshidx_tests.polling import poll_until
from freshidx_tests.test_daemon_e2e import env_for

REPO = Path(__file__).resolve().parents[1]
GEN = GeneratorConfig(seed=9, ads=200, products=40, changes_per_partition=20)
NOW = dt.datetime.now(dt.UTC)
T0 = PartitionId.from_datetime(NOW - dt.timedelta(hours=1)).at
H0 = catchup.floor_hour(NOW) - dt.timedelta(hours=4)


def grpc_command(port: int) -> list[str]:
    """What the code-location container runs (docker/docker-compose.yml), on loopback."""
    return [sys.executable, "-m", "dagster", "api", "grpc", "--module-name", "freshidx.definitions",
            "--host", "127.0.0.1", "--port", str(port)]


@pytest.fixture
def postgres() -> Iterator[PostgresServer]:
    server = make_server()
    if server is None:
        pytest.skip("no PostgreSQL server binaries (initdb); run scripts/bootstrap.sh as root or "
                    "apt-get install postgresql")
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.root, ignore_errors=True)


@pytest.fixture
def deployment(tmp_path: Path, postgres: PostgresServer, local_store_config: StoreConfig,
               shared_spark_connect: dict[str, str]) -> Iterator[tuple[DagsterDev, StoreConfig]]:
    home = prepare_home(tmp_path / "dagster_home", REPO / "docker" / "dagster.postgres.yaml")
    # Runs lease a supervised Spark Connect server, as the code location of docker/docker-compose.yml does
    # (FRESHIDX_SPARK_REMOTE + FRESHIDX_SPARK_SERVER_STATE), instead of starting a local JVM each.
    env = {**env_for(local_store_config, shared_spark_connect), "DAGSTER_POSTGRES_URL": postgres.url,
           "DAGSTER_HOME": str(home), "FRESHIDX_HOURLY_MAX_HOURS_PER_RUN": "1"}
    port = free_port()
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text("load_from:\n  - grpc_server:\n      host: 127.0.0.1\n"
                         f"      port: {port}\n      location_name: freshidx\n")
    with open(tmp_path / "grpc.log", "wb") as log:
        grpc = subprocess.Popen(grpc_command(port), env={**os.environ, **env}, cwd=REPO, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    d = DagsterDev(home=home, workspace=workspace, env=env, cwd=REPO)
    try:
        wait_for_port(port, 240, grpc)
        d.start()
        d.wait_ready(timeout=300)
        yield d, local_store_config
    finally:
        d.stop()
        grpc.terminate()
        try:
            grpc.wait(30)
        except subprocess.TimeoutExpired:
            grpc.kill()
            grpc.wait(30)


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


@pytest.mark.daemon
@pytest.mark.heavy
@pytest.mark.timeout(2400)  # generous: a loaded 2-core box (as test_daemon_e2e)
def test_sensor_publish_and_ui_backfill_on_postgres_with_grpc_code_server(
        deployment: tuple[DagsterDev, StoreConfig], postgres: PostgresServer) -> None:
    d, cfg = deployment
    store = open_store(cfg)
    assert d.location_name == "freshidx"  # loaded from the gRPC server, not a `dagster dev` code server
    # Stopped (as from the UI) while the store is still empty: its full-index remediation run would only
    # compete with the runs under test on a loaded 2-core box.
    d.stop_sensor("freshidx_sla_sensor")

    # sensor → run → publish: the delta pointer follows the newest partition, with no click
    hours = [H0, H0 + dt.timedelta(hours=1)]  # for the backfill below; written now, so one delta covers all
    for h in hours:
        write_partition(store, GEN, PartitionId(h + dt.timedelta(minutes=20)))
    for m in (0, 5):
        write_partition(store, GEN, PartitionId(T0 + dt.timedelta(minutes=m)))

    def pointer() -> str | None:
        p, _ = read_pointer(store, "delta")
        return p.source_partition if p else None

    poll_until(lambda: pointer() == PartitionId(T0 + dt.timedelta(minutes=5)).path, timeout=900, interval=1,
               what="first delta publish")
    write_partition(store, GEN, PartitionId(T0 + dt.timedelta(minutes=10)))
    poll_until(lambda: pointer() == PartitionId(T0 + dt.timedelta(minutes=10)).path, timeout=900, interval=1,
               what="the pointer to advance to the new partition")

    # a backfill of 2 ads_hourly hours, launched through GraphQL as the UI's partition dialog does
    backfill_id = d.launch_partition_backfill("ads_hourly", partition_keys=[catchup.dagster_key(h) for h in hours],
                                              title="postgres e2e")
    status = poll_until(lambda: (st := d.backfill_status(backfill_id))["status"] in BACKFILL_TERMINAL_STATUSES and st,
                        timeout=1200, interval=1, what="the backfill to finish")
    assert status["status"] == "COMPLETED_SUCCESS", status
    for h in hours:
        assert read_pointer(store, layout.bucket_name(catchup.ASSET, h))[0] is not None

    # the instance really is PostgreSQL: runs and events there, no SQLite storage in DAGSTER_HOME
    assert pg_count(postgres.url, "runs") >= 3
    assert pg_count(postgres.url, "event_logs") > 0
    assert pg_count(postgres.url, "job_ticks") > 0  # sensor ticks: schedule storage
    assert not list(d.home.rglob("*.db")), list(d.home.rglob("*.db"))
