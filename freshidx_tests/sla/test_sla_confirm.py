"""``delta_index``'s freshness policy does not turn red merely because upstream was quiet.

While the serving delta covers the newest visible partition, the SLA sensor records a materialization of
the same version (an unchanged data version) once the last one is older than half the warn window; it
records none while newer data waits, so the policy still goes red when the delta falls behind data that
exists. The pure rule (:func:`freshidx.sla.check_rules.still_current`) first, then the real sensor on a real instance.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import dagster as dg
import pytest

from freshidx.publish.commit import Pointer, iso, utcnow
from freshidx.settings import Settings
from freshidx.sla import check_rules as sla
from freshidx.store import ObjectStore, layout
from freshidx.store.partitions import PartitionId
from freshidx_tests.trigger.test_latest_only_planner import at

NOW = dt.datetime(2026, 11, 24, 12, 0, tzinfo=dt.UTC)
SETTINGS = Settings.from_env({}, store="file:///tmp/unused", lag_warn_seconds=600, lag_fail_seconds=1800)


def _pointer(p: PartitionId) -> Pointer:
    return Pointer(index="delta", version=f"v{p.compact}", seq=1, position=iso(p.at), manifest="m", doc_count=1,
                   published_at=iso(NOW), source_partition=p.path)


def _observed(newest: PartitionId | None, delta: PartitionId | None, waiting: bool = False) -> sla.Observed:
    return sla.Observed(now=NOW, newest=newest, delta=_pointer(delta) if delta else None, full=None,
                        waiting_since=NOW if waiting else None)


def test_quiet_upstream_is_confirmed_after_half_the_warn_window() -> None:
    o = _observed(at(5), at(5))
    assert sla.still_current(o, SETTINGS, None) is None  # never materialized: not red, nothing to confirm
    assert sla.still_current(o, SETTINGS, NOW - dt.timedelta(seconds=299)) is None
    why = sla.still_current(o, SETTINGS, NOW - dt.timedelta(seconds=300))
    assert why is not None and at(5).path in why and "unchanged" in why


def test_nothing_is_confirmed_while_data_waits_or_nothing_is_served() -> None:
    old = NOW - dt.timedelta(hours=1)
    assert sla.still_current(_observed(at(10), at(5), waiting=True), SETTINGS, old) is None
    assert sla.still_current(_observed(at(10), at(5)), SETTINGS, old) is None
    assert sla.still_current(_observed(at(5), None), SETTINGS, old) is None
    assert sla.still_current(_observed(None, at(5)), SETTINGS, old) is None


def _point_at(store: ObjectStore, p: PartitionId) -> None:
    store.put_json(layout.pointer_key("delta"), Pointer(
        index="delta", version=f"v{p.compact}", seq=1, position=iso(p.at), manifest="m", doc_count=1,
        published_at=iso(utcnow()), source_partition=p.path).to_dict())


def _confirmations(result: Any) -> list[dg.AssetMaterialization]:
    return [e for e in result.asset_events if isinstance(e, dg.AssetMaterialization)]


def test_the_sla_sensor_confirms_once_then_waits(make_harness: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from freshidx.defs.sla import checks as sla_defs

    h = make_harness(lag_warn_seconds=600, lag_fail_seconds=1800)
    h.write(0)
    _point_at(h.store, at(0))
    assert not _confirmations(h.tick("freshidx_sla_sensor"))  # never materialized: nothing to confirm
    h.instance.report_runless_asset_event(dg.AssetMaterialization("delta_index"))  # what a publication records
    assert not _confirmations(h.tick("freshidx_sla_sensor"))  # recent
    later = utcnow() + dt.timedelta(seconds=301)  # the sensor's clock, half the warn window on
    monkeypatch.setattr(sla_defs, "utcnow", lambda: later)
    (mat,) = _confirmations(h.tick("freshidx_sla_sensor"))
    assert mat.asset_key == dg.AssetKey("delta_index")
    assert mat.metadata["confirmed_current"].value is True and mat.tags["dagster/data_version"] == f"v{at(0).compact}"
    h.instance.report_runless_asset_event(mat)  # what the daemon stores from the tick
    monkeypatch.setattr(sla_defs, "utcnow", utcnow)  # the clock of the stored confirmation again
    assert not _confirmations(h.tick("freshidx_sla_sensor"))  # the last materialization is recent now
    policy = h.defs.get_repository_def().asset_graph.get(dg.AssetKey("delta_index")).freshness_policy
    assert policy is not None  # the policy this keeps honest is attached to the asset itself


def test_no_confirmation_while_a_newer_partition_waits(make_harness: Any) -> None:
    h = make_harness()
    h.write(0)
    h.write(5)
    _point_at(h.store, at(0))
    assert not _confirmations(h.tick("freshidx_sla_sensor"))


def test_the_demo_partitions_begin_with_its_data(local_store_config: Any) -> None:
    from freshidx.store import open_store
    from freshidx.tools.demo import data_start
    from freshidx.tools.generate import GeneratorConfig, write_partition

    store = open_store(local_store_config)
    now = dt.datetime(2026, 11, 28, 14, 37, tzinfo=dt.UTC)
    assert data_start(store, "ad_updates", 90, now) == "2026-11-28T13:00"  # empty store: the history's hour
    write_partition(store, GeneratorConfig(seed=1, ads=10, products=3, changes_per_partition=2),
                    PartitionId(dt.datetime(2026, 11, 27, 22, 5, tzinfo=dt.UTC)))
    start = data_start(store, "ad_updates", 90, now)
    assert start == "2026-11-27T22:00"  # older data already in the store
    assert Settings.from_env({"FRESHIDX_PARTITIONS_START": start}).partitions_start_at.hour == 22
