"""A run that publishes nothing records no materialization, with real Spark builds in
a real Dagster instance (in-process harness).

The asset's output is optional: when its draft is not newer than what is serving (the one rule,
``compare_to_serving``), it yields none, so Dagster records no materialization and the asset's
latest materialization stays the one that is serving. The run is green (nothing to do is not a
failure, and a red run would count as a failed attempt for the sensor), tagged
``freshidx/outcome``, and the asset shows an observation "nothing new: …".
"""

from __future__ import annotations

from typing import Any

import dagster as dg

from freshidx.publish.commit import read_pointer
from freshidx.store import layout
from freshidx.trigger import ledger
from freshidx_tests.support.harness import Harness, at

FULL = [dg.AssetKey("full_index")]
DELTA = [dg.AssetKey("delta_index")]


def nothing_new(h: Harness, result: dg.ExecuteInProcessResult, index: str, outcome: str) -> dg.AssetObservation:
    assert result.success
    assert result.get_asset_materialization_events() == []
    observed = result.get_asset_observation_events()
    assert len(observed) == 1, observed
    obs = observed[0].asset_observation_data.asset_observation
    assert obs.asset_key == dg.AssetKey(f"{index}_index")
    assert (obs.description or "").startswith(f"nothing new: {index} not published: {outcome}")
    assert obs.metadata["outcome"] == dg.TextMetadataValue(outcome)
    run = h.instance.get_run_by_id(result.run_id)
    assert run is not None and run.tags["freshidx/outcome"] == outcome
    return obs


def assert_spark_application(result: dg.ExecuteInProcessResult) -> None:
    """The materialization says which Spark application built it (the suite's local session)."""
    (event,) = result.get_asset_materialization_events()
    metadata = event.materialization.metadata
    assert str(metadata["spark_app_id"].value).startswith("local-"), metadata


def latest_materialization_run(h: Harness, asset: str) -> str | None:
    event = h.instance.get_latest_materialization_event(dg.AssetKey(asset))
    return event.run_id if event else None


def test_unchanged_full_rebuild_and_delta_materialize_record_no_materialization(make_harness: Any, spark: Any) -> None:
    h: Harness = make_harness(full_max_age_seconds=10**9)
    for m in range(0, 15, 5):
        h.write(m)

    # Full: built, then rebuilt from exactly the same inputs (decided after the build).
    first = h.run(dg.RunRequest(asset_selection=FULL))
    assert first.success and len(first.get_asset_materialization_events()) == 1
    assert_spark_application(first)
    serving = read_pointer(h.store, "full")[0]
    again = h.run(dg.RunRequest(asset_selection=FULL))
    obs = nothing_new(h, again, "full", "unchanged")
    assert obs.metadata["serving_version"] == dg.TextMetadataValue(serving.version)  # type: ignore[union-attr]
    assert "manifest" not in obs.metadata  # nothing of this run was published
    assert latest_materialization_run(h, "full_index") == first.run_id
    assert read_pointer(h.store, "full")[0] == serving
    run = h.instance.get_run_by_id(again.run_id)
    version = run.tags["freshidx/version"]  # type: ignore[union-attr]
    refusal = h.store.get_json(layout.refusal_key("full", version))[0]
    assert refusal["outcome"] == "unchanged" and refusal["current_version"] == serving.version  # type: ignore[union-attr]
    cut = serving.cutoff.replace("-", "").replace(":", "")[:13]  # type: ignore[union-attr]
    entry = h.store.get_json(layout.ledger_key("full", serving.cutoff[:10], f"{cut}-{version}"))[0]  # type: ignore[index]
    assert entry["decision"] == ledger.REFUSED and entry["reason"].startswith("unchanged:")

    # Delta: published, then "Materialize" with no config and nothing new (decided before building).
    built = h.run(dg.RunRequest(asset_selection=DELTA))
    assert built.success and len(built.get_asset_materialization_events()) == 1
    assert_spark_application(built)
    delta = read_pointer(h.store, "delta")[0]
    assert delta is not None and delta.source_partition == at(10).path
    noop = h.run(dg.RunRequest(asset_selection=DELTA))
    nothing_new(h, noop, "delta", "superseded")
    assert latest_materialization_run(h, "delta_index") == built.run_id
    assert read_pointer(h.store, "delta")[0] == delta
    assert not any(e.event_type_value == "STEP_FAILURE" for e in noop.all_events)
