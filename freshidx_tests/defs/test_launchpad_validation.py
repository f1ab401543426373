"""Launchpad values are validated before anything is built, through a real Dagster
instance (in-process harness; the same run config the launchpad sends, see
test_launchpad_graphql.py for the webserver path).

A refused value fails the run once (no step retry despite the asset's RetryPolicy), the reason is
the step failure's headline, and the pointer does not move. No Spark here: a refused run never
starts a session, and the serving pointer is published from staged files directly.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import dagster as dg
import pytest

from freshidx.defs.shared.assets import PARTITION_FORMS_TEXT
from freshidx.publish.commit import DraftManifest, Pointer, iso, new_version, publish, read_pointer, utcnow
from freshidx.store import ObjectStore, layout
from freshidx.store.partitions import PartitionId
from freshidx.trigger import ledger
from freshidx_tests.support.harness import Harness, at


def staged_draft(store: ObjectStore, index: str, p: PartitionId, docs: int = 10) -> DraftManifest:
    """A draft whose shard files really exist (what a build would have staged), without Spark."""
    version = new_version(p.at)
    shards = []
    for shard in range(2):
        key = layout.shard_prefix(index, version, shard, 0) + "docs.parquet"
        body = b"x" * (100 + shard)
        store.put(key, body)
        shards.append({"shard": shard, "attempt": 0, "doc_count": docs // 2, "covered_count": docs // 2,
                       "files": [{"key": key, "bytes": len(body), "sha256": "-", "rows": docs // 2}]})
    delta = index == "delta"
    return DraftManifest(
        index=index, version=version, position=iso(p.at), run_id=f"seed-{index}", shards=shards,
        doc_count=docs, num_shards=2, source_partition=p.path if delta else None,
        window_start=iso(p.at - dt.timedelta(hours=5)) if delta else None, window_end=iso(p.at) if delta else None,
        cutoff=None if delta else iso(p.at),
    )


def serve(store: ObjectStore, index: str, p: PartitionId) -> Pointer:
    result = publish(store, staged_draft(store, index, p))
    assert result.outcome == "published" and result.pointer is not None, result
    return result.pointer


def launch(h: Harness, asset: str, config: dict[str, Any]) -> dg.ExecuteInProcessResult:
    """A run of one asset with launchpad config (``ops: {<asset>: {config: ...}}``, what the UI sends)."""
    return h.run(dg.RunRequest(asset_selection=[dg.AssetKey(asset)],
                               run_config={"ops": {asset: {"config": config}}}), raise_on_error=False)


def failed_once(result: dg.ExecuteInProcessResult) -> str:
    """The run failed in one attempt (no retry); returns the step failure's headline."""
    kinds = [e.event_type_value for e in result.all_events]
    assert not result.success
    assert kinds.count("STEP_FAILURE") == 1, kinds
    assert "STEP_UP_FOR_RETRY" not in kinds and "STEP_RESTARTED" not in kinds, kinds
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert failure.step_failure_data is not None and failure.step_failure_data.error is not None
    return failure.step_failure_data.error.message


@pytest.fixture
def h(make_harness: Any) -> Harness:
    harness: Harness = make_harness()
    for m in (0, 5, 10):
        harness.write(m)
    return harness


def future_minute() -> PartitionId:
    return PartitionId.from_datetime(utcnow() + dt.timedelta(minutes=30))


@pytest.mark.parametrize(("value", "expect"), [
    pytest.param(lambda: future_minute().path, "is in the future", id="future-path"),
    pytest.param(lambda: future_minute().compact, "is in the future", id="future-compact"),
    pytest.param(lambda: (utcnow() + dt.timedelta(hours=2)).strftime("%Y-%m-%d-%H:00"), "is in the future",
                 id="future-hour-key"),
    pytest.param(lambda: at(7).path, "is not visible", id="missing-minute"),  # between 5 and 10
    pytest.param(lambda: at(7).compact, "is not visible", id="missing-compact"),
    pytest.param(lambda: "2026-11-20-11:00", "no visible partition in hour", id="empty-hour"),
    pytest.param(lambda: "2026-11-24-02:13", "not a partition", id="hour-key-with-minutes"),
    pytest.param(lambda: "year=2026/month=11/day=20/hour=09/minute=7", "not a partition", id="unpadded"),
    pytest.param(lambda: "latest", "not a partition", id="word"),
])
def test_refused_source_partition_fails_once_and_the_pointer_stays(h: Harness, value: Any, expect: str) -> None:
    before = serve(h.store, "delta", at(5))
    text = value()
    headline = failed_once(launch(h, "delta_index", {"source_partition": text}))
    assert f"config source_partition={text!r} refused" in headline and expect in headline, headline
    assert "the pointer did not move" in headline
    if expect == "not a partition":  # the message names every accepted form
        assert PARTITION_FORMS_TEXT in headline
    if expect == "is not visible":
        assert f"the newest visible partition is {at(10).path}" in headline
    assert read_pointer(h.store, "delta")[0] == before
    assert not h.store.list("indexes/delta/versions/").prefixes[1:]  # nothing staged besides the seed


def test_refused_cutoff_partition_fails_once(h: Harness) -> None:
    headline = failed_once(launch(h, "full_index", {"cutoff_partition": future_minute().compact}))
    assert "config cutoff_partition=" in headline and "is in the future" in headline
    assert read_pointer(h.store, "full")[0] is None


def test_the_hourly_key_the_ui_shows_means_the_newest_partition_of_that_hour(h: Harness) -> None:
    """``2026-11-20-09:00`` resolves to ``…hour=09/minute=10``; that is already serving, so the run
    is green and says "nothing new" without building (and without a materialization)."""
    serving = serve(h.store, "delta", at(10))
    result = launch(h, "delta_index", {"source_partition": at(0).dagster_hour_key})
    assert result.success
    assert result.get_asset_materialization_events() == []
    run = h.instance.get_run_by_id(result.run_id)
    assert run is not None
    assert run.tags["freshidx/outcome"] == "superseded" and run.tags["freshidx/source_partition"] == at(10).path
    assert read_pointer(h.store, "delta")[0] == serving
    entries = ledger.partition_entries(h.store, "delta", at(10))
    refused = entries[f"refused-{result.run_id[:8]}"]
    assert refused["decision"] == ledger.REFUSED and "not built" in refused["reason"]
