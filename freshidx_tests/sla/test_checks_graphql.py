"""Check descriptions and states as the Dagster UI reads them, through a real `dagster dev`.

No run is launched (the run queue is paused): the checks are evaluated by freshidx_sla_sensor in the
real daemon and reported as runless evaluations; a materialization reported through the UI's own
mutation must not turn them back to "Not Evaluated".
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from freshidx.sla import check_rules as sla
from freshidx.store import StoreConfig, open_store
from freshidx.store.partitions import PartitionId
from freshidx.tools.devserver import DagsterDev, prepare_home
from freshidx.tools.generate import GeneratorConfig, write_partition
from freshidx_tests.support.polling import poll_until

REPO = Path(__file__).resolve().parents[2]
GEN = GeneratorConfig(seed=5, ads=50, products=10, changes_per_partition=5)

# The UI's asset "Checks" tab: a check with no executionForLatestMaterialization is "Not Evaluated".
CHECKS_QUERY = """
{ assetNodes { assetKey { path }
    assetChecksOrError { ... on AssetChecks { checks { name description
        executionForLatestMaterialization { status timestamp } } } } } }
"""
REPORT_MUTATION = """
mutation($params: ReportRunlessAssetEventsParams!) {
  reportRunlessAssetEvents(eventParams: $params) { __typename ... on PythonError { message } } }
"""
TICKS_QUERY = """
query($sel: SensorSelector!) { sensorOrError(sensorSelector: $sel) {
  ... on Sensor { sensorState { ticks(limit: 20) { status skipReason timestamp } } } } }
"""
# A paused run queue: the SLA sensor may request a full_index rebuild, but no Spark run starts.
PAUSED_YAML = """telemetry: {enabled: false}
nux: {enabled: false}
concurrency: {runs: {max_concurrent_runs: 0}}
"""


@pytest.fixture
def dev(tmp_path: Path, local_store_config: StoreConfig) -> Iterator[DagsterDev]:
    yaml = tmp_path / "dagster.yaml"
    yaml.write_text(PAUSED_YAML)
    store = open_store(local_store_config)
    now = PartitionId.from_datetime(dt.datetime.now(dt.UTC) - dt.timedelta(minutes=10))
    write_partition(store, GEN, now)
    env = {"FRESHIDX_STORE": local_store_config.uri, "PYSPARK_PYTHON": sys.executable,
           "FRESHIDX_PARTITIONS_START": "2026-11-01", "FRESHIDX_CATCHUP_AUTOSTART": "false",
           "FRESHIDX_SLA_INTERVAL_SECONDS": "2"}
    d = DagsterDev(home=prepare_home(tmp_path / "home", yaml), module="freshidx.definitions", env=env, cwd=REPO)
    d.start()
    try:
        d.wait_ready(timeout=180)
        yield d
    finally:
        d.stop()


def checks(d: DagsterDev) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for node in d.graphql(CHECKS_QUERY)["assetNodes"]:
        for c in (node["assetChecksOrError"] or {}).get("checks", []):
            out[c["name"]] = c
    return out


def all_evaluated_after(d: DagsterDev, t: float) -> bool:
    cs = checks(d)
    return len(cs) == 6 and all((c["executionForLatestMaterialization"] or {}).get("timestamp", 0) > t
                                for c in cs.values())


@pytest.mark.timeout(420)
def test_checks_have_descriptions_and_show_their_latest_evaluation(dev: DagsterDev) -> None:
    d = dev
    poll_until(lambda: all_evaluated_after(d, 0), timeout=150, interval=1, what="first SLA evaluations")
    cs = checks(d)
    for name, c in cs.items():
        assert c["description"] == sla.DESCRIPTIONS[name]
        # IN_PROGRESS: a queued run (the SLA's full_index rebuild, a delta run) plans the check.
        assert c["executionForLatestMaterialization"]["status"] in {"SUCCEEDED", "FAILED", "IN_PROGRESS"}, c

    # A new materialization of each checked asset, reported the way the UI's "Report event" does.
    t = dt.datetime.now(dt.UTC).timestamp()
    for asset in ("delta_index", "full_index", "raw_ad_updates"):
        res = d.graphql(REPORT_MUTATION, {"params": {"eventType": "ASSET_MATERIALIZATION",
                                                     "assetKey": {"path": [asset]}, "description": "test"}})
        assert res["reportRunlessAssetEvents"]["__typename"] == "ReportRunlessAssetEventsSuccess", res
    # Without re-reporting, these would stay "Not Evaluated" until a state change or the heartbeat.
    poll_until(lambda: all_evaluated_after(d, t), timeout=120, interval=1, what="re-evaluation after materialization")
    # IN_PROGRESS as above: on a slow box the queued delta run can be re-requested (lost-request
    # grace) after t, and the new queued run plans the checks again.
    after = {n: c["executionForLatestMaterialization"]["status"] for n, c in checks(d).items()}
    assert set(after.values()) <= {"SUCCEEDED", "FAILED", "IN_PROGRESS"}, after

    sel = {"repositoryLocationName": d.location_name, "repositoryName": d.repository_name,
           "sensorName": "freshidx_sla_sensor"}

    def skipped_ticks() -> list[dict] | None:
        # A tick with nothing to re-report (the one after the re-evaluation at the latest) is skipped;
        # on a busy box the re-evaluation above may still be the newest tick.
        ticks = d.graphql(TICKS_QUERY, {"sel": sel})["sensorOrError"]["sensorState"]["ticks"]
        return [tk for tk in ticks if tk["status"] == "SKIPPED"] or None

    skipped = poll_until(skipped_ticks, timeout=120, interval=1, what="a skipped SLA sensor tick")
    assert all(tk["skipReason"] and "empty result" not in tk["skipReason"] for tk in skipped), skipped
