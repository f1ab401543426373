"""generate → sensor → run → pointer, under a real Dagster instance, on moto S3 (the local store's
end-to-end path: test_incremental_equivalence, test_search_e2e, the ``dagster dev`` tests; both stores
meet the same contract, test_store_contract).

The sensor is evaluated with ``build_sensor_context`` against a real (temporary, SQLite-backed)
``DagsterInstance``; its run requests are executed in-process on that instance with the same
resources the code location uses, and real local Spark.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import dagster as dg
import pytest

from freshidx.publish.commit import read_manifest, read_pointer
from freshidx.raw_record import STATUSES
from freshidx.serve import status
from freshidx.store import StoreConfig, layout
from freshidx.store.partitions import PartitionId
from freshidx.tools.generate import partition_records
from freshidx.trigger import ledger
from freshidx_tests.conftest import s3_env
from freshidx_tests.support.harness import GEN, Harness, at


def expected_index(partitions: list[PartitionId]) -> tuple[int, int, dict[str, int]]:
    """Independent reference: (active docs, covered ids, reasons) computed in plain Python."""
    latest: dict[str, tuple[int, str]] = {}
    for p in partitions:
        lines, _ = partition_records(GEN, p)
        for line in lines:
            try:
                r = json.loads(line)
                ok = (isinstance(r, dict) and all(r.get(f) is not None for f in
                      ("ad_id", "campaign_id", "product_id", "title", "bid", "status", "updated_at", "version"))
                      and r["status"] in STATUSES and isinstance(r["bid"], int | float) and r["bid"] >= 0
                      and isinstance(r["version"], int) and dt.datetime.fromisoformat(r["updated_at"]))
            except ValueError:
                ok = False
            if ok and r["version"] > latest.get(r["ad_id"], (-1, ""))[0]:
                latest[r["ad_id"]] = (r["version"], r["status"])
    active = sum(1 for _, status in latest.values() if status == "active")
    return active, len(latest), {}


@pytest.fixture
def harness(s3_store_config: StoreConfig) -> Iterator[Harness]:
    with dg.instance_for_test() as instance:
        h = Harness(s3_store_config, instance)
        yield h
        h.close()


def test_latest_only_end_to_end(harness: Harness, spark: Any) -> None:
    h = harness
    # History: the window reaches back over several partitions.
    written = {m: h.write(m) for m in range(0, 30, 5)}
    # Upstream also wrote under a malformed partition name inside the window.
    bad_key = "raw/ad_updates/year=2026/month=11/day=20/hour=09/minute=7/part-00000.jsonl"
    h.store.put(bad_key, b'{"ad_id": "ad-x"}\n')
    first = h.tick()
    assert len(first.run_requests) == 1
    req = first.run_requests[0]
    assert req.tags["freshidx/source_partition"] == at(25).path  # restart = jump to latest
    assert req.tags["freshidx/skipped_count"] == "5"  # the rest of the scan window, recorded:
    for m in range(0, 25, 5):
        assert ledger.decision(h.store, "delta", at(m))["decision"] == "folded"  # type: ignore[index]
    result = h.run(req)
    assert result.success
    ptr, _ = read_pointer(h.store, "delta")
    assert ptr is not None and ptr.source_partition == at(25).path

    # The published documents equal an independent computation over the window's valid records.
    manifest = read_manifest(h.store, "delta", ptr.version)
    assert manifest["invalid"]["count"] == sum(w.malformed for w in written.values())
    assert manifest["doc_count"] > 0 and ptr.doc_count == manifest["doc_count"]
    active, covered, _ = expected_index([at(m) for m in range(0, 30, 5)])
    assert (manifest["doc_count"], manifest["covered_count"]) == (active, covered)
    reasons: dict[str, int] = {}
    for w in written.values():
        for k, v in w.reasons.items():
            reasons[k] = reasons.get(k, 0) + v
    assert sum(manifest["invalid"]["reasons"].values()) == sum(reasons.values())
    assert manifest["inputs"]["partitions"] == [at(m).path for m in range(0, 30, 5)]
    assert bad_key in [i["key"] for i in manifest["inputs"]["ignored"]]  # reported, never read
    mat = result.asset_materializations_for_node("delta_index")[0]
    assert mat.metadata["ignored_keys"].value >= 1
    assert mat.metadata["outcome"].value == "published"
    assert mat.metadata["invalid_records"].value == manifest["invalid"]["count"] > 0

    # Three partitions land between two ticks → exactly one run, for the newest.
    for m in (30, 35, 40):
        h.write(m)
    second = h.tick()
    assert [r.tags["freshidx/source_partition"] for r in second.run_requests] == [at(40).path]
    assert second.run_requests[0].tags["freshidx/skipped_count"] == "2"
    for m in (30, 35):
        entry = ledger.decision(h.store, "delta", at(m))
        assert entry is not None and entry["decision"] == "folded"
        assert entry["reason"] == f"folded into the micro-batch for {at(40).path}"
    observed = [e.metadata.get("decision") for e in second.asset_events]
    assert observed.count(dg.TextMetadataValue("folded")) + observed.count("folded") == 2
    assert h.run(second.run_requests[0]).success
    ptr2, _ = read_pointer(h.store, "delta")
    assert ptr2 is not None and ptr2.source_partition == at(40).path and ptr2.previous_version == ptr.version
    assert ledger.decision(h.store, "delta", at(40))["decision"] == "published"  # type: ignore[index]

    # `freshidx status --json` reports the serving delta and the partitions it skipped, with reasons.
    st = status.collect(h.store, "ad_updates", now=at(40).at + dt.timedelta(seconds=90))
    assert st["delta"]["version"] == ptr2.version and st["delta"]["source_partition"] == at(40).path
    assert st["delta"]["doc_count"] == ptr2.doc_count and st["delta"]["lag_seconds"] == 90
    assert st["newest_visible_partition"] == at(40).path and st["seconds_behind_newest"] == 0
    skipped = {e["partition"]: e["reason"] for e in st["recent_skipped"]}
    assert skipped[at(35).path] == skipped[at(30).path] == f"folded into the micro-batch for {at(40).path}"
    json.dumps(st)  # what --json prints

    # Nothing new → no run; the same skips are not recorded twice.
    third = h.tick()
    assert not third.run_requests and "no partition newer" in (third.skip_message or "")


def test_failed_partition_is_retried_as_a_new_attempt(harness: Harness, spark: Any) -> None:
    h = harness
    # A window whose every record is malformed → empty document set → validation gate fails.
    bad = dataclasses.replace(GEN, malformed_rate=1.0, duplicate_rate=0.0)
    h.write(0, bad)
    r1 = h.tick().run_requests[0]
    assert r1.run_key == f"delta:{at(0).compact}:a1"
    res = h.run(r1, raise_on_error=False)
    assert not res.success
    assert read_pointer(h.store, "delta")[0] is None  # nothing was published
    entries = ledger.partition_entries(h.store, "delta", at(0))
    assert ledger.decision(h.store, "delta", at(0)) is None  # a failure is not a final decision
    assert [e["decision"] for k, e in entries.items() if k.startswith("invalid-")] == ["validation_failed"]
    r2 = h.tick().run_requests[0]
    assert r2.run_key == f"delta:{at(0).compact}:a2"  # explicit retry, not swallowed by run-key dedup
    # A newer, good partition supersedes the broken one.
    h.write(5)
    h.run(r2, raise_on_error=False)
    r3 = h.tick().run_requests[0]
    assert r3.tags["freshidx/source_partition"] == at(5).path
    assert h.run(r3).success
    assert read_pointer(h.store, "delta")[0].source_partition == at(5).path  # type: ignore[union-attr]


def test_parked_after_max_attempts(s3_store_config: StoreConfig, spark: Any) -> None:
    with dg.instance_for_test() as instance:
        h = Harness(s3_store_config, instance, max_attempts=2)
        try:
            h.write(0, dataclasses.replace(GEN, malformed_rate=1.0, duplicate_rate=0.0))
            for _ in range(2):
                assert not h.run(h.tick().run_requests[0], raise_on_error=False).success
            parked = h.tick()
            assert not parked.run_requests and "parked" in (parked.skip_message or "")
            assert "parked-2" in ledger.partition_entries(h.store, "delta", at(0))
            assert not h.tick().run_requests  # stays parked
            # An operator grants an explicit retry: a new attempt number, a new run.
            env = {**os.environ, "FRESHIDX_STORE": h.settings.store, **s3_env(s3_store_config)}
            subprocess.run([sys.executable, "-m", "freshidx.cli", "ledger", "retry", "--partition", at(0).path],
                           env=env, check=True, capture_output=True, timeout=120)
            retried = h.tick().run_requests
            assert [r.run_key for r in retried] == [f"delta:{at(0).compact}:a3"]
        finally:
            h.close()


def test_no_new_run_while_one_is_in_flight(harness: Harness) -> None:
    h = harness
    h.write(0)
    req = h.tick().run_requests[0]
    # Register a run that is executing (as the run worker would while Spark builds).
    job = h.defs.resolve_implicit_global_asset_job_def()
    h.instance.create_run_for_job(job_def=job, run_config=req.run_config,
                                  tags={**req.tags, "dagster/run_key": req.run_key},
                                  status=dg.DagsterRunStatus.STARTED,
                                  asset_selection=frozenset({dg.AssetKey("delta_index")}))
    h.write(5)
    data = h.tick()
    assert not data.run_requests
    assert "will jump to the newest" in (data.skip_message or "")
    # Nothing was recorded as superseded while we wait: the decision is taken when we can act.
    assert ledger.decision(h.store, "delta", at(0)) is None


def test_quarantine_holds_rejected_records(harness: Harness, spark: Any) -> None:
    h = harness
    w = h.write(0)
    run_id = h.run(h.tick().run_requests[0]).run_id
    keys = [o.key for o in h.store.list(layout.quarantine_prefix("ad_updates", at(0), run_id)).objects]
    assert keys, "no quarantine files written"
    lines = [ln for k in keys for ln in h.store.get(k).data.decode().splitlines() if ln.strip()]
    assert len(lines) == w.malformed
