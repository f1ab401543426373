"""Dagster on PostgreSQL, deployed as in docker/: a real PostgreSQL server, the instance configured by
docker/dagster.postgres.yaml (runs, event log, schedules in PostgreSQL), the code location served by
``dagster api grpc`` and loaded through a workspace with a ``grpc_server`` entry, ``dagster dev``
(webserver + daemon) on top; the runs and events are in PostgreSQL and no SQLite storage appears in
DAGSTER_HOME. What a user of that deployment does, as the UI does it:

* the catch-up sensor processes 2 closed ``ads_hourly`` hours once each, and the delta sensor publishes
  the newest partition with no click;
* a backfill of those 2 hours launched with GraphQL ``launchPartitionBackfill`` (the UI's partition
  dialog) while upstream keeps writing: the hours are rebuilt (a second version each, recorded in the
  ledger as a backfill rebuild, never claimed again by catch-up), the backfill's runs are queued behind
  live work (lower priority), the delta sensor keeps publishing meanwhile, and the delta pointer only
  ever moves forward.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from freshidx import catchup, layout
from freshidx.partitions import PartitionId
from freshidx.publish import read_pointer
from freshidx.store import ObjectStore, StoreConfig, open_store
from freshidx.tools.devserver import BACKFILL_TERMINAL_STATUSES, DagsterDev, prepare_home
from freshidx.tools.generate import GeneratorConfig, write_partition
from freshidx_tests.conftest import free_port, wait_for_port
from freshidx_tests.pg_fixture import PostgresServer, make_server
from freshidx_tests.polling import poll_until
from freshidx_tests.test_daemon_e2e import SLA_OFF, SLA_SENSOR, assert_stopped_before_start, env_for

REPO = Path(__file__).resolve().parents[1]
GEN = GeneratorConfig(seed=9, ads=200, products=40, changes_per_partition=20)
# Hours 0-1 are the closed hours to process and rebuild; hour 2 is the previous hour, where live batches land.
H0 = catchup.floor_hour(dt.datetime.now(dt.UTC)) - dt.timedelta(hours=3)
#: Hours 0-1 ended over an hour ago, so they are closed; the live hour 2 ended less than an hour ago and
#: stays open, so the catch-up sensor processes exactly the 2 hours under test (no empty hours, no live
#: hour and its late-data corrections queued in the one heavy slot before the backfill).
CLOSE_GRACE_S = 3600


def hour(i: int) -> dt.datetime:
    return H0 + dt.timedelta(hours=i)


def delta_history(store: ObjectStore) -> list[dict[str, Any]]:
    out = [store.get_json(o.key)[0] for o in store.list(layout.index_root("delta") + "history/").objects]
    return sorted(out, key=lambda p: p["seq"])


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
    # SLA sensor off: its full-index remediation would only compete with the runs under test.
    env = {**env_for(local_store_config, shared_spark_connect), **SLA_OFF, "DAGSTER_POSTGRES_URL": postgres.url,
           "DAGSTER_HOME": str(home), "FRESHIDX_CATCHUP_AUTOSTART": "true",
           "FRESHIDX_HOURLY_SENSOR_INTERVAL_SECONDS": "5", "FRESHIDX_CLOSE_GRACE_SECONDS": str(CLOSE_GRACE_S),
           # one hour per run: the backfill is 2 runs, long enough for live publications to land inside it
           "FRESHIDX_HOURLY_MAX_HOURS_PER_RUN": "1"}
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
        assert_stopped_before_start(d, SLA_SENSOR)
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
@pytest.mark.timeout(2400)  # generous: a loaded 2-core box (under cpu_load every run takes minutes)
def test_catchup_sensor_and_ui_backfill_on_postgres_while_delta_only_moves_forward(
        cpu_load: list[Any], deployment: tuple[DagsterDev, StoreConfig], postgres: PostgresServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # cpu_load first: with FRESHIDX_TEST_LOAD_PER_CORE the box is busy from before dagster dev starts.
    d, cfg = deployment
    store = open_store(cfg)
    assert d.location_name == "freshidx"  # loaded from the gRPC server, not a `dagster dev` code server
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

    def pointer() -> str | None:
        p, _ = read_pointer(store, "delta")
        return p.source_partition if p else None

    poll_until(lambda: pointer() is not None, timeout=900, interval=1, what="first delta publish")

    # The UI's partition backfill of hours 0..1 (one range), while new batches keep arriving.
    keys = [catchup.dagster_key(hour(i)) for i in range(2)]
    launched_at = dt.datetime.now(dt.UTC)
    backfill_id = d.launch_partition_backfill("ads_hourly", range=(keys[0], keys[-1]), title="postgres e2e")
    delta_before = read_pointer(store, "delta")[0].seq  # type: ignore[union-attr]
    last_write = [time.monotonic()]

    def backfill_done() -> dict[str, Any] | None:
        # Meanwhile the upstream simulator drops a batch every ~4 s, so the delta sensor keeps publishing.
        if live and time.monotonic() - last_write[0] >= 4:
            write_partition(store, GEN, live.pop(0))
            last_write[0] = time.monotonic()
        st = d.backfill_status(backfill_id)
        return st if st["status"] in BACKFILL_TERMINAL_STATUSES else None

    status = poll_until(backfill_done, timeout=1200, interval=1, what="the backfill to finish")
    done_at = dt.datetime.now(dt.UTC)
    assert status.get("status") == "COMPLETED_SUCCESS", status
    # The delta sensor kept publishing while the backfill ran: live runs are not held behind it.
    assert read_pointer(store, "delta")[0].seq > delta_before  # type: ignore[union-attr]
    during = [h for h in delta_history(store)
              if launched_at <= dt.datetime.fromisoformat(h["published_at"]) <= done_at]
    assert during, f"no delta publication between {launched_at} and {done_at}"

    # Rebuilt: a second version of each hour, recorded as a backfill rebuild, in runs of one hour.
    for i, n in enumerate(names):
        ptr = read_pointer(store, n)[0]
        assert ptr is not None and ptr.seq == 2 and ptr.version != first[n].version, n  # type: ignore[union-attr]
        entries = catchup.hour_entries(store, catchup.ASSET, hour(i))
        rebuilt = [e for k, e in entries.items() if k.startswith("backfill-")]
        assert len(rebuilt) == 1 and rebuilt[0]["decision"] == "rebuilt", entries.keys()
        assert [k for k in entries if k[:1] == "a" and k[1:].isdigit()] == ["a1"], "processed once by catch-up"
    monkeypatch.setenv("DAGSTER_POSTGRES_URL", postgres.url)  # what docker/dagster.postgres.yaml reads
    instance = dg.DagsterInstance.from_config(str(d.home))
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

    # The delta pointer only ever moved forward: every publication's position is newer than the last.
    hist = delta_history(store)
    assert len(hist) >= 2
    positions = [h["position"] for h in hist]
    assert positions == sorted(positions) and len(set(positions)) == len(positions), positions
    assert [h["seq"] for h in hist] == list(range(1, len(hist) + 1))

    # the instance really is PostgreSQL: runs and events there, no SQLite storage in DAGSTER_HOME
    assert pg_count(postgres.url, "runs") >= 5
    assert pg_count(postgres.url, "event_logs") > 0
    assert pg_count(postgres.url, "job_ticks") > 0  # sensor ticks: schedule storage
    assert not list(d.home.rglob("*.db")), list(d.home.rglob("*.db"))
