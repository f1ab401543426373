"""Per-hour metadata of a multi-hour ``ads_hourly`` run is per hour."""

from __future__ import annotations

import json
from typing import Any

import dagster as dg

from freshidx.catchup import planner as catchup
from freshidx.publish.commit import read_manifest, read_pointer
from freshidx.store import layout
from freshidx_tests.catchup.test_catchup import HOURLY_KEY, hour, tick, write_hours


def test_multi_hour_run_records_each_hours_own_metadata(make_harness: Any) -> None:
    h = make_harness(hourly_max_hours_per_run=3, hourly_late_checks_per_tick=0)
    write_hours(h, range(0, 3), per_hour=2)
    data = tick(h)
    assert len(data.run_requests or []) == 1, data.skip_reason
    req = data.run_requests[0]
    hids = sorted(json.loads(req.tags[catchup.TAG_CLAIMS]))
    assert hids == [layout.hour_id(hour(i)) for i in range(3)]
    result = h.run(req, raise_on_error=False)
    assert result.success, [e.message for e in result.all_events if e.is_failure]

    for i in range(3):
        key = catchup.dagster_key(hour(i))
        recs = h.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=HOURLY_KEY, asset_partitions=[key]), limit=1).records
        assert recs, key
        meta = recs[0].asset_materialization.metadata
        hid = layout.hour_id(hour(i))
        pointer, _ = read_pointer(h.store, layout.bucket_name("ads_hourly", hour(i)))
        assert pointer is not None
        manifest = read_manifest(h.store, layout.bucket_name("ads_hourly", hour(i)), pointer.version)
        assert meta["hour"].value == hid
        assert meta["outcome"].value == "published"
        assert meta["version"].value == pointer.version
        assert meta["rows"].value == pointer.doc_count  # this hour's, not the run's total
        assert meta["invalid_records"].value == int(manifest["invalid"]["count"])
        assert meta["run"].value == result.run_id  # links the run, whatever job name it has
        assert meta["run_hours"].value == 3  # the run's totals say so
        assert meta["run_rows"].value == sum(
            read_pointer(h.store, layout.bucket_name("ads_hourly", hour(j)))[0].doc_count for j in range(3))
    assert "rows" in meta and "outcomes" not in meta  # no run-wide map under a per-hour name
