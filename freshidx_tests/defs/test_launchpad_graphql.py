"""Launchpad values and asset checks through a real ``dagster dev`` (webserver + daemon), by GraphQL as the UI does.

* The launchpad's ``launchRun`` with a future / non-existent / malformed ``source_partition``: the
  run FAILS once (no step retry), its failure headline is the refusal, the pointer does not move.
* "Materialize" with nothing new: the run is green, records no materialization, the asset page's
  latest event is an observation "nothing new: …", and the run carries ``freshidx/outcome``.
* The launchpad shows descriptions (with formats and examples) for the config fields.

No Spark: refusals happen before a session exists, and the serving pointers are published from
staged files in the test process (a full pointer too, so the SLA sensor does not remediate).
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from freshidx.publish.commit import read_pointer, utcnow
from freshidx.store import ObjectStore, StoreConfig, open_store
from freshidx.store.partitions import PartitionId
from freshidx.tools.devserver import DagsterDev, prepare_home
from freshidx.tools.generate import GeneratorConfig, write_partition
from freshidx_tests.defs.test_launchpad_validation import serve

pytestmark = pytest.mark.daemon

REPO = Path(__file__).resolve().parents[2]
GEN = GeneratorConfig(seed=5, ads=100, products=20, changes_per_partition=10)
# Recent partitions: the full cutoff must not be old enough for the SLA sensor to remediate.
T0 = PartitionId.from_datetime(dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).at.replace(minute=0)


def at(minutes: int) -> PartitionId:
    return PartitionId(T0 + dt.timedelta(minutes=minutes))


RUN_QUERY = """
query Run($runId: ID!) {
  runOrError(runId: $runId) {
    __typename
    ... on Run {
      status
      tags { key value }
      eventConnection(limit: 1000) {
        events {
          __typename
          ... on ExecutionStepFailureEvent { stepKey error { message } }
          ... on MaterializationEvent { assetKey { path } }
          ... on ObservationEvent { assetKey { path } description }
        }
      }
    }
  }
}
"""

ASSET_QUERY = """
query Asset($key: AssetKeyInput!) {
  assetNodeOrError(assetKey: $key) {
    ... on AssetNode {
      assetMaterializations(limit: 5) { runId }
      assetObservations(limit: 5) { runId description metadataEntries { label } }
      configField { configType { ... on CompositeConfigType { fields { name description } } } }
    }
  }
}
"""

SCHEMA_QUERY = """
query Schema($selector: PipelineSelector!) {
  runConfigSchemaOrError(selector: $selector) { __typename ... on RunConfigSchema { rootDefaultYaml } }
}
"""


@pytest.fixture
def dev(tmp_path: Path, local_store_config: StoreConfig,
        shared_spark_connect: dict[str, str]) -> Iterator[tuple[DagsterDev, ObjectStore]]:
    cfg = local_store_config
    store = open_store(cfg)
    for m in (0, 5, 10):
        write_partition(store, GEN, at(m))
    serve(store, "delta", at(10))  # the delta sensor has nothing to do
    serve(store, "full", at(10))  # nor does SLA remediation
    env = {"FRESHIDX_STORE": cfg.uri, "PYSPARK_PYTHON": sys.executable, "FRESHIDX_PARTITIONS_START": "2026-11-01",
           "FRESHIDX_CATCHUP_AUTOSTART": "false", **shared_spark_connect}
    with DagsterDev(home=prepare_home(tmp_path / "dagster_home", REPO / "dagster.yaml"),
                    module="freshidx.definitions", env=env, cwd=REPO) as d:  # started and ready
        yield d, store


def run_view(d: DagsterDev, run_id: str) -> dict[str, Any]:
    return d.graphql(RUN_QUERY, {"runId": run_id})["runOrError"]


def events(view: dict[str, Any], typename: str) -> list[dict[str, Any]]:
    return [e for e in view["eventConnection"]["events"] if e["__typename"] == typename]


@pytest.mark.timeout(1200)
def test_launchpad_values_and_nothing_new_through_the_webserver(dev: tuple[DagsterDev, ObjectStore]) -> None:
    d, store = dev
    serving = read_pointer(store, "delta")[0]
    future = PartitionId.from_datetime(utcnow() + dt.timedelta(minutes=27)).path  # a partition 27 minutes ahead
    cases = {future: "is in the future", at(7).path: "is not visible", "2026-11-24-02:13": "not a partition"}
    for value, expect in cases.items():
        run_id = d.materialize(["delta_index"], run_config={"ops": {"delta_index": {"config": {
            "source_partition": value}}}})
        assert d.wait_run(run_id, timeout=600) == "FAILURE"
        view = run_view(d, run_id)
        failures = events(view, "ExecutionStepFailureEvent")
        assert len(failures) == 1, failures  # once: the RetryPolicy did not retry it
        assert not events(view, "ExecutionStepUpForRetryEvent") and not events(view, "ExecutionStepRestartEvent")
        headline = failures[0]["error"]["message"]
        assert f"config source_partition={value!r} refused" in headline and expect in headline, headline
        # what a test that expected SUCCESS prints: the step's failure with its error
        assert any(line.startswith("ExecutionStepFailureEvent [delta_index]") and headline.strip() in line
                   for line in d.run_errors(run_id)), d.run_errors(run_id)
        assert read_pointer(store, "delta")[0] == serving

    # "Materialize" with nothing new (no config: the newest visible partition is already serving).
    run_id = d.materialize(["delta_index"])
    assert d.wait_run(run_id, timeout=600) == "SUCCESS", d.run_errors(run_id)
    view = run_view(d, run_id)
    assert {t["key"]: t["value"] for t in view["tags"]}["freshidx/outcome"] == "superseded"
    assert events(view, "MaterializationEvent") == []
    observed = events(view, "ObservationEvent")
    assert len(observed) == 1 and observed[0]["description"].startswith("nothing new: delta not published")
    asset = d.graphql(ASSET_QUERY, {"key": {"path": ["delta_index"]}})["assetNodeOrError"]
    assert asset["assetMaterializations"] == []  # no misleading "latest materialization"
    assert asset["assetObservations"][0]["runId"] == run_id
    assert asset["assetObservations"][0]["description"].startswith("nothing new")
    assert read_pointer(store, "delta")[0] == serving

    # Launchpad help: every config field has a description naming the forms and an example.
    fields = {f["name"]: f["description"] or "" for f in asset["configField"]["configType"]["fields"]}
    assert "2026-11-24-02:00" in fields["source_partition"] and "20261124T0213" in fields["source_partition"]
    assert "Example:" in fields["source_partition"] and "Example:" in fields["force"]
    selector = {"repositoryLocationName": d.location_name, "repositoryName": d.repository_name,
                "pipelineName": "__ASSET_JOB"}
    schema = d.graphql(SCHEMA_QUERY, {"selector": selector})["runConfigSchemaOrError"]
    yaml = schema["rootDefaultYaml"]
    # The IO managers' fixed values are no longer config (the settings resource still is: see report).
    assert "allow_empty" not in yaml and "bucket_io_manager" not in yaml, yaml
