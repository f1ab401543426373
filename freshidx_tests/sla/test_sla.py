"""SLA checks that act, and the trigger ledger."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import dagster as dg
import pytest

from freshidx.full.full_build import files_up_to, inputs_digest
from freshidx.publish.commit import read_manifest, read_pointer
from freshidx.settings import Settings
from freshidx.sla import check_rules as sla
from freshidx.store import StoreConfig, open_store
from freshidx.store.partitions import PartitionId
from freshidx.tools.generate import write_partition
from freshidx.trigger import ledger
from freshidx_tests.support.harness import GEN, Harness, at


def test_source_silence_warns_then_fails_then_recovers(local_store_config: StoreConfig) -> None:
    store = open_store(local_store_config)
    s = Settings.from_env({}, store=local_store_config.uri, silence_warn_seconds=300, silence_fail_seconds=900)
    write_partition(store, GEN, at(0))
    t = at(0).at

    def state(after_s: int) -> str:
        return sla.source_silence(sla.observe(store, s, t + dt.timedelta(seconds=after_s)), s).state

    assert state(60) == "PASS"
    assert state(400) == "FAIL_WARN"  # generator stopped past the warn threshold
    assert state(1000) == "FAIL_ERROR"  # ... and past the fail threshold
    write_partition(store, GEN, at(17))  # generator restarted
    assert state(17 * 60 + 30) == "PASS"


@pytest.fixture
def harness(local_store_config: StoreConfig) -> Iterator[Harness]:
    with dg.instance_for_test() as instance:
        # Test partitions are dated in the past: keep the full-age rule out of the coverage story.
        h = Harness(local_store_config, instance, full_max_age_seconds=10**9)
        yield h
        h.close()


def check_events(data: Any) -> dict[str, bool]:
    return {e.check_name: e.passed for e in data.asset_events if isinstance(e, dg.AssetCheckEvaluation)}


def test_coverage_gap_launches_exactly_one_full_rebuild(harness: Harness, spark: Any) -> None:
    h = harness
    for m in range(0, 30, 5):
        h.write(m)
    assert h.run(h.tick().run_requests[0]).success  # delta published, no full index yet

    first = h.tick("freshidx_sla_sensor")
    assert check_events(first)["coverage"] is False
    assert len(first.run_requests) == 1
    req = first.run_requests[0]
    assert list(req.asset_selection) == [dg.AssetKey("full_index")]
    assert req.tags["freshidx/trigger"] == "sla_remediation"
    again = h.tick("freshidx_sla_sensor")  # same condition, next tick: no second run
    assert again.run_requests == []
    remediations = [e for e in ledger.read(h.store, "sla") if e["decision"] == "remediation_launched"]
    assert len(remediations) == 1 and "coverage" in remediations[0]["reason"]

    assert h.run(req).success
    full, _ = read_pointer(h.store, "full")
    assert full is not None and full.cutoff is not None
    after = h.tick("freshidx_sla_sensor")
    assert check_events(after).get("coverage") is True  # state changed → reported
    assert after.run_requests == []

    # The delta moves more than a window past the full cutoff → coverage fails again → one rebuild.
    h.write(6 * 60)
    assert h.run(h.tick().run_requests[0]).success
    gap = h.tick("freshidx_sla_sensor")
    assert check_events(gap)["coverage"] is False
    assert [r.tags["freshidx/remediation_of"] for r in gap.run_requests] == [full.version]
    assert h.tick("freshidx_sla_sensor").run_requests == []  # one, not two
    assert h.run(gap.run_requests[0]).success
    full2, _ = read_pointer(h.store, "full")
    assert full2 is not None and full2.cutoff is not None and full2.cutoff > full.cutoff
    assert check_events(h.tick("freshidx_sla_sensor")).get("coverage") is True  # remediated
    # The run manifest says why the run exists and exactly what it read.
    manifest = read_manifest(h.store, "full", full2.version)
    assert manifest["run"]["trigger"] == "sla_remediation" and manifest["run"]["run_id"] == full2.run_id
    assert manifest["run"]["code_version"] and manifest["run"]["settings"]["source"] == "ad_updates"
    files, _ = files_up_to(h.store, "ad_updates", PartitionId.parse(manifest["inputs"]["cutoff_partition"]))
    assert manifest["inputs"]["files"] == sum(len(v) for v in files.values()) > 0
    assert manifest["inputs"]["files_sha256"] == inputs_digest(files.values())
    launched = [e for e in ledger.read(h.store, "sla") if e["decision"] == "remediation_launched"]
    assert len(launched) == 2

    # The source-silence check goes through the same sensor: these partitions are days old, so the
    # upstream is silent past the fail threshold (the thresholds themselves: the test above).
    silence = [e for e in first.asset_events
               if isinstance(e, dg.AssetCheckEvaluation) and e.check_name == "source_silence"]
    assert len(silence) == 1 and silence[0].passed is False
    assert silence[0].severity == dg.AssetCheckSeverity.ERROR


def _reported(data: Any, asset: str) -> set[str]:
    return {e.check_name for e in data.asset_events
            if isinstance(e, dg.AssetCheckEvaluation) and e.asset_key == dg.AssetKey(asset)}


def test_checks_skipped_by_a_run_with_nothing_new_are_reported_again_at_once(harness: Harness, spark: Any) -> None:
    """A UI Materialize of delta_index with nothing new skips the asset's check steps (no output), and
    the UI then shows "Skipped" as the checks' latest execution; the SLA sensor's next tick re-reports
    them, instead of leaving "Skipped" until the heartbeat."""
    h = harness
    h.write(0)
    assert h.run(h.tick().run_requests[0]).success
    h.tick("freshidx_sla_sensor")
    assert _reported(h.tick("freshidx_sla_sensor"), "delta_index") == set()  # nothing changed: quiet

    nothing_new = h.run(dg.RunRequest(run_config={"ops": {"delta_index": {"config": {"source_partition": at(0).path}}}},
                                      asset_selection=[dg.AssetKey("delta_index")]))
    assert nothing_new.success
    skipped = [e for e in nothing_new.all_events if e.event_type_value == "STEP_SKIPPED"]
    assert skipped, "the checks' steps are skipped when delta_index yields no output"
    again = h.tick("freshidx_sla_sensor")
    assert _reported(again, "delta_index") == set(sla.CHECK_NAMES["delta_index"])
    assert _reported(again, "full_index") == set()  # its checks were not in that run
    assert _reported(h.tick("freshidx_sla_sensor"), "delta_index") == set()


def test_every_partition_is_in_the_ledger_exactly_once(harness: Harness, spark: Any, tmp_path: Any) -> None:
    """Every partition of a ≥30-partition run is explained once (processed, folded or late),
    with the run that consumed it."""
    h = harness
    minute = 0
    produced: list[PartitionId] = []
    late: list[PartitionId] = []
    for batch in (4, 1, 7, 3, 6, 9):  # 30 partitions, 1–9 landing between ticks
        if produced:  # upstream delivers, late, a partition just before the watermark
            h.write(minute - 7)
            late.append(at(minute - 7))
        for _ in range(batch):
            h.write(minute)
            produced.append(at(minute))
            minute += 5
        data = h.tick()
        assert len(data.run_requests) == 1
        dup = h.tick()  # a duplicate evaluation of the same trigger creates no second run
        assert dup.run_requests == [] and "waiting for its run" in (dup.skip_message or "")
        assert h.run(data.run_requests[0]).success

    env = {**os.environ, "FRESHIDX_STORE": h.settings.store}
    out = subprocess.run([sys.executable, "-m", "freshidx.cli", "ledger", "--pipeline", "delta", "--json"],
                         env=env, capture_output=True, text=True, timeout=120, check=True).stdout
    entries = json.loads(out)
    final = [e for e in entries if e["decision"] in {"published", "superseded", "folded", "not_ready"}]
    counts = Counter(e["partition"] for e in final)
    assert set(counts) == {p.path for p in produced + late}
    assert all(n == 1 for n in counts.values()), counts
    for e in entries:
        assert {"pipeline", "decision", "reason", "at"} <= set(e) and (e.get("partition") or e.get("scope"))
    published = {e["partition"]: e for e in final if e["decision"] == "published"}
    assert len(published) == 6 and all(e["run_id"] for e in published.values())
    accepted = [e for e in entries if e["decision"] == "accepted"]
    assert len(accepted) == 6 and all(e["run_id"] for e in accepted)  # linked to the run that ran it
    folded = [e for e in final if e["decision"] == "folded"]
    assert len(folded) == len(produced) - 6 + len(late)
    for e in folded:  # each names the micro-batch that read it, and that one names its run
        into = (e.get("extra") or {}).get("folded_into") or e.get("folded_into")
        assert into in published, e
    by_partition = {e["partition"]: e for e in folded}
    for p in late:
        e = by_partition[p.path]
        assert "late" in e["reason"] and e["run_id"] == published[(e.get("extra") or e)["folded_into"]]["run_id"]
