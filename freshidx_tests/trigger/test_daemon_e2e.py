"""Through real Dagster processes: `dagster dev` (webserver + daemon) and `dagster asset materialize`."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from freshidx.publish.commit import read_pointer
from freshidx.store import StoreConfig, open_store
from freshidx.store.partitions import PartitionId
from freshidx.tools.devserver import DagsterDev, prepare_home
from freshidx.tools.generate import GeneratorConfig, write_partition
from freshidx.trigger import ledger
from freshidx_tests.conftest import s3_env
from freshidx_tests.support.polling import poll_until

REPO = Path(__file__).resolve().parents[2]
GEN = GeneratorConfig(seed=3, ads=300, products=50, changes_per_partition=30)
T0 = PartitionId.from_datetime(dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)).at


def at(minutes: int) -> PartitionId:
    return PartitionId(T0 + dt.timedelta(minutes=minutes))


FRESHNESS_QUERY = """
{ assetNodes { assetKey { path }
    freshnessStatusInfo { freshnessStatus }
    internalFreshnessPolicy { ... on TimeWindowFreshnessPolicy { failWindowSeconds warnWindowSeconds } } } }
"""


def env_for(cfg: StoreConfig, spark: dict[str, str] | None = None) -> dict[str, str]:
    """``spark``: the ``shared_spark_connect`` fixture's environment (runs lease the shared server instead
    of starting a local JVM each); None = local Spark per run."""
    # The catch-up sensor is off here: its Spark runs would compete with the delta runs under test
    # (test_compose_deployment.py runs both).
    env = {"FRESHIDX_STORE": cfg.uri, "PYSPARK_PYTHON": sys.executable, "FRESHIDX_PARTITIONS_START": "2026-11-01",
           "FRESHIDX_CATCHUP_AUTOSTART": "false",
           "FRESHNESS_DAEMON_INTERVAL_SECONDS": "5"}
    if cfg.is_s3:
        env.update(s3_env(cfg))
    env.update(spark or {})
    return env


#: The SLA sensor (RUNNING by default) remediates the missing full index with a full_index build as
#: soon as the daemon starts. Tests that do not check the SLA sensor start the location with it stopped
#: (:data:`SLA_OFF`, the operator's ``FRESHIDX_SLA_AUTOSTART=false``): on 2 cores that build (60-90 s on
#: the shared Connect server, one heavy slot) slowed every run under test. The SLA sensor is tested in
#: test_sla.py, test_checks_graphql.py and test_run_health.py.
SLA_SENSOR = "freshidx_sla_sensor"
SLA_OFF = {"FRESHIDX_SLA_AUTOSTART": "false"}


def assert_stopped_before_start(d: DagsterDev, *names: str) -> None:
    """Sensors the location started with ``default_status`` STOPPED: stopped, never ticked."""
    for name in names:
        st = d.sensor_state(name)
        assert st["status"] == "STOPPED" and not st["ticks"], st


def enqueued(instance: dg.DagsterInstance, run_id: str) -> bool:
    """Whether the run waited in the run queue (Dagster's RUN_ENQUEUED event)."""
    return bool(instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.RUN_ENQUEUED).records)


def pointer_at(cfg: StoreConfig) -> str | None:
    ptr, _ = read_pointer(open_store(cfg), "delta")
    return ptr.source_partition if ptr else None


@pytest.fixture
def dev(tmp_path: Path, local_store_config: StoreConfig,
        shared_spark_connect: dict[str, str]) -> Iterator[tuple[DagsterDev, StoreConfig]]:
    # One store kind here (every run is a Dagster run process, so this test is slow); the same flow
    # runs against both local files and moto S3 in test_sensor_e2e.py.
    store_config = local_store_config
    home = prepare_home(tmp_path / "dagster_home", REPO / "dagster.yaml")
    # SLA sensor off: the full index is materialized from the UI below
    d = DagsterDev(home=home, module="freshidx.definitions",
                   env={**env_for(store_config, shared_spark_connect), **SLA_OFF}, cwd=REPO)
    d.start()
    try:
        d.wait_ready(timeout=300)
        assert_stopped_before_start(d, SLA_SENSOR)
        yield d, store_config
    finally:
        d.stop()


@pytest.mark.daemon
@pytest.mark.timeout(2400)  # under cpu_load every local-Spark run takes minutes
def test_daemon_latest_only_and_ui_materialize(cpu_load: list, dev: tuple[DagsterDev, StoreConfig]) -> None:
    # cpu_load first: the box is busy (CPU hogs, see conftest) from before dagster dev starts.
    d, cfg = dev
    store = open_store(cfg)
    for m in range(0, 30, 5):
        write_partition(store, GEN, at(m))
    # The sensor runs by default: the pointer moves with no click.
    poll_until(lambda: pointer_at(cfg) == at(25).path, timeout=420, interval=1, what="first publish")

    # Three partitions land between two ticks: stop the sensor so they are all visible at once.
    d.stop_sensor("delta_index_sensor", settle_with="freshidx_run_health_sensor")
    for m in (30, 35, 40):
        write_partition(store, GEN, at(m))
    d.start_sensor("delta_index_sensor")
    poll_until(lambda: pointer_at(cfg) == at(40).path, timeout=420, interval=1, what="jump to newest")

    instance = dg.DagsterInstance.from_config(str(d.home))
    try:
        tagged = {
            r.tags.get("freshidx/source_partition")
            for r in instance.get_runs(dg.RunsFilter(tags={"freshidx/pipeline": "delta"}))
        }
        assert at(40).path in tagged
        assert at(30).path not in tagged and at(35).path not in tagged
        for m in (30, 35):
            entry = poll_until(lambda m=m: ledger.decision(store, "delta", at(m)), timeout=120, interval=0.1,
                               what=f"the ledger's decision on {m}")  # written right after the swap
            assert entry is not None and entry["decision"] == "folded"
            assert entry["reason"] == f"folded into the micro-batch for {at(40).path}"
        # Observations on raw_ad_updates record every decision (runless events in the instance).
        obs = instance.fetch_observations(dg.AssetKey("raw_ad_updates"), limit=100).records
        decisions = {
            (o.asset_observation.metadata["partition"].value, o.asset_observation.metadata["decision"].value)
            for o in obs if o.asset_observation and "decision" in o.asset_observation.metadata
        }
        assert {(at(30).path, "folded"), (at(35).path, "folded"), (at(40).path, "accepted")} <= decisions
        # The sensor's runs go through Dagster's own run queue, like every other run (a stock instance),
        # as runs of delta_index_job with its priority.
        sensor_runs = instance.get_runs(
            dg.RunsFilter(tags={"freshidx/pipeline": "delta", "freshidx/trigger": "sensor"}))
        assert sensor_runs and all(enqueued(instance, r.run_id) for r in sensor_runs)
        assert {r.job_name for r in sensor_runs} == {"delta_index_job"}
        assert all(r.tags.get("dagster/priority") == "10" for r in sensor_runs)
    finally:
        instance.dispose()

    # The UI's view of freshness policies: both index assets carry one; delta's state is evaluated.
    def freshness() -> dict[str, dict]:
        nodes = d.graphql(FRESHNESS_QUERY)["assetNodes"]
        return {"/".join(n["assetKey"]["path"]): n for n in nodes}

    nodes = freshness()
    for name, fail_s in (("delta_index", 1800), ("full_index", 6 * 3600)):
        assert nodes[name]["internalFreshnessPolicy"]["failWindowSeconds"] == fail_s
    healthy = poll_until(
        lambda: (freshness()["delta_index"]["freshnessStatusInfo"] or {}).get("freshnessStatus") == "HEALTHY",
        timeout=90, interval=2, what="delta_index freshness HEALTHY")
    assert healthy
    assert (freshness()["full_index"]["freshnessStatusInfo"] or {}).get("freshnessStatus") in {
        None, "HEALTHY", "WARNING", "DEGRADED", "UNKNOWN"}  # evaluated below, once it has been built

    # UI "Materialize" with no config builds for the newest visible partition.
    d.stop_sensor("delta_index_sensor", settle_with="freshidx_run_health_sensor")
    write_partition(store, GEN, at(45))
    run_id = d.materialize(["delta_index"])
    assert d.wait_run(run_id, timeout=420) == "SUCCESS", d.run_errors(run_id)
    assert pointer_at(cfg) == at(45).path
    instance = dg.DagsterInstance.from_config(str(d.home))
    try:
        assert enqueued(instance, run_id)  # a UI launch goes through the queue
    finally:
        instance.dispose()

    # The full index, materialized from the UI as well: its freshness state is evaluated and shown,
    # like the delta's.
    run_id = d.materialize(["full_index"])
    assert d.wait_run(run_id, timeout=600) == "SUCCESS", d.run_errors(run_id)
    poll_until(
        lambda: (freshness()["full_index"]["freshnessStatusInfo"] or {}).get("freshnessStatus") == "HEALTHY",
        timeout=90, interval=2, what="full_index freshness HEALTHY")


@pytest.mark.daemon
def test_cli_asset_materialize_publishes_newest(tmp_path: Path, local_store_config: StoreConfig,
                                               shared_spark_connect: dict[str, str]) -> None:
    store = open_store(local_store_config)
    for m in (0, 5, 10):
        write_partition(store, GEN, at(m))
    home = prepare_home(tmp_path / "home", REPO / "dagster.yaml")
    env = {**os.environ, **env_for(local_store_config, shared_spark_connect), "DAGSTER_HOME": str(home)}
    proc = subprocess.run(
        [sys.executable, "-m", "dagster", "asset", "materialize", "-m", "freshidx.definitions",
         "--select", "delta_index"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert pointer_at(local_store_config) == at(10).path


def test_bad_setting_fails_location_load_naming_the_field(tmp_path: Path) -> None:
    env = {**os.environ, "FRESHIDX_WINDOW_MINUTES": "-5", "FRESHIDX_STORE": (tmp_path / "s").as_uri()}
    proc = subprocess.run([sys.executable, "-c", "import freshidx.definitions"], env=env,
                          capture_output=True, text=True, timeout=600)  # an import on a loaded 2-core box
    assert proc.returncode != 0
    assert "FRESHIDX_WINDOW_MINUTES (window_minutes)" in proc.stderr
