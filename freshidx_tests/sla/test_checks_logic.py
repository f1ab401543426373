"""Asset checks explain themselves: pure evaluation logic, no Dagster instance."""

from __future__ import annotations

import dataclasses
import datetime as dt

from freshidx.defs.shared.assets import store_kind
from freshidx.defs.sla.checks import tick_summary
from freshidx.publish.commit import Pointer, iso
from freshidx.settings import Settings
from freshidx.sla import check_rules as sla
from freshidx.store import StoreConfig, open_store
from freshidx.store.partitions import PartitionId
from freshidx.tools.generate import write_partition
from freshidx_tests.support.harness import GEN

P0 = PartitionId(dt.datetime(2026, 11, 24, 2, 0, tzinfo=dt.UTC))
P1 = PartitionId(P0.at + dt.timedelta(minutes=20))  # the first partition after a 19-minute upstream gap


def delta_at(p: PartitionId) -> Pointer:
    return Pointer(index="delta", version="v1", seq=1, position=iso(p.at), manifest="m", doc_count=1,
                   published_at=iso(p.at), source_partition=p.path)


def test_publication_stuck_counts_from_when_data_became_visible_not_from_the_pointer() -> None:
    s = Settings.from_env({}, store="file:///tmp/unused", stuck_seconds=900)
    visible = P1.at + dt.timedelta(seconds=10)
    # 49 s after the first partition following the gap, its run in flight: 20 min past the pointer,
    # but it has waited 49 s; the old rule (newest − pointer) failed here.
    o = sla.Observed(visible + dt.timedelta(seconds=49), P1, delta_at(P0), None, 0, waiting_since=visible)
    out = sla.publication_stuck(o, s)
    assert out.passed, out.description
    assert out.metadata["waiting_seconds"] == 49.0
    late = sla.Observed(visible + dt.timedelta(seconds=900), P1, delta_at(P0), None, 2, waiting_since=visible)
    out = sla.publication_stuck(late, s)
    assert not out.passed and out.severity == "ERROR" and "2 consecutive failed" in out.description
    covered = sla.Observed(P1.at + dt.timedelta(hours=5), P1, delta_at(P1), None, 0, waiting_since=None)
    assert sla.publication_stuck(covered, s).passed  # a silent upstream is source_silence's business


def test_waiting_since_is_when_the_oldest_uncovered_partition_appeared(local_store_config: StoreConfig) -> None:
    store = open_store(local_store_config)
    s = Settings.from_env({}, store=local_store_config.uri)
    write_partition(store, GEN, P0)
    assert sla.waiting_since(store, s, P0, delta_at(P0)) is None  # delta covers the newest
    write_partition(store, GEN, P1)
    p2 = PartitionId(P1.at + dt.timedelta(minutes=5))
    write_partition(store, GEN, p2)
    since = sla.waiting_since(store, s, p2, delta_at(P0))
    objs = [o for o in store.list(f"raw/{s.source}/{P1.path}/").objects]
    assert objs and since == max(min(o.last_modified for o in objs), P1.at)
    # Without a delta everything visible is waiting.
    assert sla.waiting_since(store, s, p2, None) is not None
    observed = sla.observe(store, s, since + dt.timedelta(seconds=49))
    assert observed.waiting_since is not None


def test_every_check_has_a_paragraph_naming_its_settings_and_consequence() -> None:
    names = [n for names in sla.CHECK_NAMES.values() for n in names]
    assert sorted(sla.DESCRIPTIONS) == sorted(names)
    for name, text in sla.DESCRIPTIONS.items():
        assert text.endswith(".") and len(text) > 200, name
        assert "FRESHIDX_" in text and "freshidx_sla_sensor" in text, name
        assert "fail" in text.lower(), name


def test_sla_tick_skip_reason_is_always_specific() -> None:
    s = Settings.from_env({}, store="file:///tmp/unused")
    o = sla.Observed(P1.at, P1, delta_at(P1), delta_at(P0), 0, None)
    outcomes = sla.evaluate(o, s)
    text = tick_summary(outcomes, 0, [], None)
    assert "checks failing" in text and "0 evaluation(s) reported" in text
    failing = [x for x in outcomes if not x.passed]
    assert all(f"{x.asset}.{x.check}" in text for x in failing)
    assert tick_summary(outcomes, 2, ["delta_index.coverage PASS → FAIL_ERROR"], "full_index run abc is QUEUED"
                        ).startswith("full_index run abc is QUEUED; ")


def test_raw_asset_kind_follows_the_store() -> None:
    assert store_kind("file:///data/store") == "file"
    assert store_kind("s3://bucket/prefix") == "s3"


def test_coverage_launches_the_full_rebuild_before_the_cutoff_leaves_the_window() -> None:
    s = Settings.from_env({}, store="file:///tmp/unused", window_minutes=300, coverage_margin=0.2)  # 60 min
    delta = dataclasses.replace(delta_at(P0), window_start=iso(P0.at))

    def outcome(cutoff_after_window_start: dt.timedelta, settings: Settings = s) -> sla.CheckOutcome:
        full = dataclasses.replace(delta_at(P0), index="full", position=iso(P0.at + cutoff_after_window_start))
        return sla.coverage(sla.Observed(P0.at, P0, delta, full, 0, None), settings)

    far = outcome(dt.timedelta(minutes=90))
    assert far.passed and far.remediate is None and far.description.endswith("covered")
    near = outcome(dt.timedelta(minutes=30))
    assert near.passed and near.remediate == "full_index", near.description
    assert "leaves the window in 1800s" in near.description
    assert near.metadata["leaves_window_in_seconds"] == 1800.0
    gap = outcome(-dt.timedelta(minutes=10))
    assert not gap.passed and gap.remediate == "full_index" and "600s of updates" in gap.description
    off = Settings.from_env({}, store="file:///tmp/unused", window_minutes=300, coverage_margin=0)
    assert outcome(dt.timedelta(minutes=1), off).remediate is None
