"""Catch-up consumer (ads_hourly) through a real Dagster instance, real sensor ticks and real Spark runs.

Every hour of generated data is processed exactly once (bucket CURRENT created once, one claim, one
``processed`` ledger entry), oldest first, in runs of at most N hours, also after an outage; a run
killed mid-hour is expired after the timeout and its hour processed by a later run, once; each
readiness policy shows why an hour is not ready, then lets it through; late data yields exactly one
correction version.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow.parquet as pq

from freshidx.catchup import planner as catchup
from freshidx.catchup import readiness
from freshidx.publish.commit import read_manifest, read_pointer
from freshidx.store import ObjectStore, StoreConfig, layout
from freshidx.store.partitions import PartitionId
from freshidx.tools.generate import GeneratorConfig, partition_base_version, partition_records, write_partition
from freshidx_tests.support.harness import Harness
from freshidx_tests.support.polling import poll_until

H0 = dt.datetime(2026, 11, 20, 0, 0, tzinfo=dt.UTC)
GEN = GeneratorConfig(seed=11, ads=200, products=40, changes_per_partition=20, malformed_rate=0.05)
HOURLY_KEY = dg.AssetKey("ads_hourly")


def hour(i: int) -> dt.datetime:
    return H0 + dt.timedelta(hours=i)


def write_hours(h: Harness, hours: range, per_hour: int = 2) -> None:
    for i in hours:
        for k in range(per_hour):
            write_partition(h.store, GEN, PartitionId(hour(i) + dt.timedelta(minutes=k * 60 // per_hour)))


def tick(h: Harness) -> Any:
    return h.tick("ads_hourly_sensor")


def run_all(h: Harness, data: Any) -> list[dg.ExecuteInProcessResult]:
    return [h.run(r, raise_on_error=False) for r in data.run_requests or []]


def drain(h: Harness, max_rounds: int = 30) -> list[list[str]]:
    """Tick and run until a tick requests nothing; returns the hour ids of each run, in order."""
    batches: list[list[str]] = []
    for _ in range(max_rounds):
        data = tick(h)
        if not data.run_requests:
            return batches
        for r in data.run_requests:
            batches.append(sorted(json.loads(r.tags[catchup.TAG_CLAIMS])))
            result = h.run(r, raise_on_error=False)
            assert result.success, [e.message for e in result.all_events if e.is_failure]
    raise AssertionError(f"still requesting runs after {max_rounds} rounds: {batches}")


def history(store: ObjectStore, hid: str) -> list[str]:
    name = f"buckets/ads_hourly/{hid}"
    return [o.key for o in store.list(layout.index_root(name) + "history/").objects]


def claims(store: ObjectStore, hid: str) -> list[str]:
    entries = catchup.hour_entries(store, "ads_hourly", catchup.parse_hour_id(hid))
    return sorted(k for k in entries if k[:1] == "a" and k[1:].isdigit())


def bucket_rows(store: ObjectStore, cfg: StoreConfig, hid: str) -> list[dict[str, Any]]:
    name = f"buckets/ads_hourly/{hid}"
    pointer, _ = read_pointer(store, name)
    assert pointer is not None
    manifest = read_manifest(store, name, pointer.version)
    rows: list[dict[str, Any]] = []
    fs = cfg.arrow_fs()
    for shard in manifest["shards"]:
        for f in shard["files"]:
            with fs.open_input_file(cfg.arrow_path(f["key"])) as src:
                rows += pq.read_table(src).to_pylist()
    return rows


# --------------------------------------------------------------------------- exactly once, capped, outage


#: Live hours before the outage, hours written during it, hours arriving one per tick after it. The
#: outage is longer than a run's cap (the backlog needs more than one capped run); the other phases
#: only need a few hours each (every run is a real Spark pass).
LIVE, OUTAGE, ARRIVING = 3, 6, 3


def test_hours_with_outage_each_hour_exactly_once_in_capped_runs(make_harness: Any) -> None:
    n = 4
    assert n < OUTAGE  # the backlog needs more than one capped run
    total = LIVE + OUTAGE + ARRIVING
    h = make_harness(hourly_max_hours_per_run=n, hourly_late_checks_per_tick=0)
    # Live: the first hours arrive one at a time and the consumer keeps up, an hour per run.
    before: list[list[str]] = []
    for i in range(0, LIVE):
        write_hours(h, range(i, i + 1))
        before += drain(h)
    assert before == [[layout.hour_id(hour(i))] for i in range(LIVE)]
    meta = h.instance.get_latest_materialization_event(HOURLY_KEY).asset_materialization.metadata
    assert meta["build_seconds"].value > 0 and meta["publish_seconds"].value > 0
    assert meta["lag_seconds"].value > 0  # the hours are days old: plotted, large

    # A 6-hour outage in the middle: the consumer is down (no ticks, its Dagster instance lost)
    # while upstream writes the next hours.
    write_hours(h, range(LIVE, LIVE + OUTAGE))
    h2 = make_harness(hourly_max_hours_per_run=n, hourly_late_checks_per_tick=0)
    # Restarted, it drains the backlog in capped runs, oldest first, while later hours keep
    # arriving, one per tick: new hours queue behind the backlog, never ahead of it.
    after: list[list[str]] = []
    for i in range(LIVE + OUTAGE, total):
        write_hours(h2, range(i, i + 1))
        data = tick(h2)
        assert len(data.run_requests or []) == 1, data.skip_reason
        req = data.run_requests[0]
        after.append(sorted(json.loads(req.tags[catchup.TAG_CLAIMS])))
        assert h2.run(req, raise_on_error=False).success
    after += drain(h2)
    assert after[0] == [layout.hour_id(hour(i)) for i in range(LIVE, LIVE + n)], "backlog first, a full capped run"
    # ... built in one Spark pass: every bucket of that run carries the time of the same pass
    passes = {read_manifest(h2.store, name, read_pointer(h2.store, name)[0].version)["stats"]["build_seconds"]
              for name in (f"buckets/ads_hourly/{hid}" for hid in after[0])}
    assert len(passes) == 1, passes
    assert [b for bs in after for b in bs] == [layout.hour_id(hour(i)) for i in range(LIVE, total)], "oldest first"
    assert len(after) >= (total - LIVE + n - 1) // n

    for batch in before + after:
        assert 1 <= len(batch) <= n, batch
    for i in range(total):
        hid = layout.hour_id(hour(i))
        assert len(history(h.store, hid)) == 1, f"{hid}: one published version"
        assert claims(h.store, hid) == ["a1"], f"{hid}: one claim"
        terminal = catchup.hour_entries(h.store, "ads_hourly", hour(i))[""]
        assert terminal["decision"] == "processed" and terminal["run_id"]
    # Dagster agrees: every run targeted at most n hours, and every hour was materialized once.
    runs = [r for inst in (h.instance, h2.instance) for r in inst.get_runs(dg.RunsFilter())
            if HOURLY_KEY in (r.asset_selection or ())]
    assert len(runs) == len(before) + len(after)
    assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
    # Idle afterwards: nothing more to do, and a tick lists only around the frontier.
    h2.store.stats.list_calls = 0
    data = tick(h2)
    assert not data.run_requests
    assert h2.store.stats.list_calls < 20
    # Contents: one row per (ad_id, version) and invalid records counted, never fatal.
    rows = bucket_rows(h.store, h.settings.store_config(), layout.hour_id(hour(3)))
    assert rows and len({(r["ad_id"], r["version"]) for r in rows}) == len(rows)
    name = f"buckets/ads_hourly/{layout.hour_id(hour(3))}"
    manifest = read_manifest(h.store, name, read_pointer(h.store, name)[0].version)
    assert manifest["invalid"]["count"] > 0


# --------------------------------------------------------------------------- killed run → timeout → once


_CRASH_RUN = r"""
import json, os, sys
import dagster as dg
from freshidx.definitions import build_definitions
from freshidx.settings import Settings

req = json.loads(sys.argv[2])
# The test's instance, by its directory: the same run and event storage (SQLite files in it).
with dg.DagsterInstance.from_config(sys.argv[1]) as instance:
    defs = build_definitions(Settings.from_env())
    job = defs.resolve_implicit_global_asset_job_def()
    job.execute_in_process(instance=instance, tags=req["tags"], partition_key=req["partition_key"],
                           asset_selection=[dg.AssetKey("ads_hourly")])
"""


def test_run_killed_mid_hour_is_expired_and_processed_once_by_a_later_run(make_harness: Any, tmp_path: Path) -> None:
    h = make_harness(hourly_max_hours_per_run=1, hourly_timeout_seconds=3, hourly_late_checks_per_tick=0)
    write_hours(h, range(0, 1))
    data = tick(h)
    (req,) = data.run_requests
    hid = layout.hour_id(hour(0))
    env = {**os.environ, "FRESHIDX_CRASH_AT": "bucket_build",
           **{h.settings.env_name(k): str(v) for k, v in h.settings.model_dump().items() if v is not None}}
    proc = subprocess.run(
        [sys.executable, "-c", _CRASH_RUN, h.instance.root_directory,
         json.dumps({"tags": {**req.tags, "dagster/run_key": req.run_key}, "partition_key": req.partition_key})],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 86, proc.stderr[-3000:]  # died at the crash point, like a kill -9
    (killed,) = h.instance.get_runs(dg.RunsFilter(tags={"dagster/run_key": req.run_key}))
    assert killed.status == dg.DagsterRunStatus.STARTED  # nobody told Dagster
    assert read_pointer(h.store, f"buckets/ads_hourly/{hid}")[0] is None

    # Until the timeout the hour stays with its run; then a tick expires it and hands it on.
    def next_request() -> Any:
        d = tick(h)
        return d.run_requests[0] if d.run_requests else None

    retry = poll_until(next_request, timeout=60, what="the stuck run to be expired")
    assert json.loads(retry.tags[catchup.TAG_CLAIMS]) == {hid: "a2"}
    assert h.instance.get_run_by_id(killed.run_id).status == dg.DagsterRunStatus.CANCELED
    assert h.run(retry).success
    entries = catchup.hour_entries(h.store, "ads_hourly", hour(0))
    assert {"a1", "a1.run", "a1.expired", "a2", "a2.run", ""} <= set(entries)
    assert "stuck" in entries["a1.expired"]["reason"]
    assert entries[""]["attempt"] == 2
    assert len(history(h.store, hid)) == 1
    assert not tick(h).run_requests


# --------------------------------------------------------------------------- readiness policies


def _waiting(h: Harness, hid: str) -> str:
    data = tick(h)
    assert not data.run_requests, "not ready: no run"
    entries = catchup.hour_entries(h.store, "ads_hourly", catchup.parse_hour_id(hid))
    assert entries["notready"]["decision"] == "not_ready"  # durable, in `freshidx ledger`
    return str(data.skip_message or "")


def test_readiness_marker(make_harness: Any) -> None:
    h = make_harness(readiness="marker", hourly_late_checks_per_tick=0)
    write_hours(h, range(0, 1))
    hid = layout.hour_id(hour(0))
    assert "waiting for marker" in _waiting(h, hid) and "_SUCCESS" in _waiting(h, hid)
    readiness.write_marker(h.store, h.settings.source, hour(0))
    (req,) = tick(h).run_requests
    assert json.loads(req.tags[catchup.TAG_CLAIMS]) == {hid: "a1"}


def test_readiness_manifest(make_harness: Any) -> None:
    h = make_harness(readiness="manifest", hourly_late_checks_per_tick=0)
    hid = layout.hour_id(hour(0))
    first = write_partition(h.store, GEN, PartitionId(hour(0)))
    assert "manifest" in _waiting(h, hid)
    # The manifest promises a second batch that has not landed yet.
    second_pid = PartitionId(hour(0) + dt.timedelta(minutes=30))
    lines, _ = partition_records(GEN, second_pid)
    second_key = f"{layout.raw_partition_prefix(h.settings.source, second_pid)}part-00000.jsonl"
    promised = {k: len(h.store.get(k).data.decode().splitlines()) for k in first.keys}
    promised[second_key] = len(lines)
    hour_prefix = layout.raw_hour_prefix(h.settings.source, PartitionId(hour(0)).hour_path)
    h.store.put_json(hour_prefix + readiness.MANIFEST,
                     {"files": [{"name": k[len(hour_prefix):], "rows": n} for k, n in sorted(promised.items())]})
    assert "waiting for 1 of 2 files" in _waiting(h, hid)
    h.store.put(second_key, ("\n".join(lines) + "\n").encode())
    (req,) = tick(h).run_requests
    assert h.run(req).success
    name = f"buckets/ads_hourly/{hid}"
    manifest = read_manifest(h.store, name, read_pointer(h.store, name)[0].version)
    assert {f["key"] for f in manifest["inputs"]["files"]} == set(promised)


def test_readiness_quiet_period(make_harness: Any) -> None:
    # The first tick must come within the quiet period of the write: 2 s was not enough on a loaded box
    # (a clean clone's suite saw the hour ready, and a run requested, at its first tick).
    h = make_harness(readiness="quiet_period", quiet_seconds=10, hourly_late_checks_per_tick=0)
    write_hours(h, range(0, 1))
    hid = layout.hour_id(hour(0))
    assert "quiet" in _waiting(h, hid)

    def requested() -> Any:
        return tick(h).run_requests or None

    (req,) = poll_until(requested, timeout=120, what="the quiet period to pass")
    assert json.loads(req.tags[catchup.TAG_CLAIMS]) == {hid: "a1"}


def test_readiness_visible_closes_an_empty_hour_only_when_newer_data_is_visible(make_harness: Any) -> None:
    h = make_harness(readiness="visible", close_grace_seconds=0, hourly_late_checks_per_tick=0)
    write_hours(h, range(0, 1))
    assert drain(h) == [[layout.hour_id(hour(0))]]
    # Hour 1 stays empty. With nothing newer visible it is not closed (upstream may be late)…
    # (the frontier is hour 1 now, and hour 1 is in the past: only the data decides)
    hid1 = layout.hour_id(hour(1))
    msg = _waiting(h, hid1)
    assert "no data" in msg or "nothing newer" in msg
    # …and once upstream writes hour 2, hour 1 is closed as empty and processed.
    write_hours(h, range(2, 3))
    batches = drain(h)
    assert batches == [[hid1, layout.hour_id(hour(2))]]
    name = f"buckets/ads_hourly/{hid1}"
    assert read_pointer(h.store, name)[0].doc_count == 0


# --------------------------------------------------------------------------- late data → one correction


def test_late_record_for_a_closed_hour_yields_exactly_one_correction(make_harness: Any) -> None:
    h = make_harness(hourly_late_checks_per_tick=4, hourly_late_lookback_hours=4)
    write_hours(h, range(0, 2))
    drain(h)
    hid = layout.hour_id(hour(0))
    name = f"buckets/ads_hourly/{hid}"
    first = read_pointer(h.store, name)[0]
    # A late batch lands in the closed hour 0 (a minute no earlier batch used).
    late = PartitionId(hour(0) + dt.timedelta(minutes=47))
    written = write_partition(h.store, GEN, late)
    assert written.ad_ids

    batches = drain(h)
    assert batches == [[hid]], "exactly one correction run"
    second = read_pointer(h.store, name)[0]
    assert second.seq == first.seq + 1 and second.version != first.version
    rows = bucket_rows(h.store, h.settings.store_config(), hid)
    late_rows = {r["ad_id"] for r in rows if r["version"] >= partition_base_version(late)}
    assert late_rows == set(written.ad_ids), "every late record is in the correction"
    entries = catchup.hour_entries(h.store, "ads_hourly", hour(0))
    assert entries[f"c{second.seq}"]["decision"] == "late_data"
    assert entries[f"c{second.seq}.a1.done"]["decision"] == "corrected"
    assert claims(h.store, hid) == ["a1"], "the correction is not a second processing"
    # More ticks: nothing changed, no second correction.
    for _ in range(3):
        assert not tick(h).run_requests
    assert read_pointer(h.store, name)[0].seq == second.seq


# --------------------------------------------------------------------------- failures → parked → retry


def test_failing_hour_is_retried_then_parked_and_an_operator_retry_processes_it(make_harness: Any) -> None:
    from freshidx.cli import main as cli

    h = make_harness(readiness="manifest", hourly_max_attempts=2, hourly_late_checks_per_tick=0)
    hid = layout.hour_id(hour(0))
    written = write_partition(h.store, GEN, PartitionId(hour(0)))
    rows = {k: len(h.store.get(k).data.decode().splitlines()) for k in written.keys}
    hour_prefix = layout.raw_hour_prefix(h.settings.source, PartitionId(hour(0)).hour_path)

    def promise(extra: int) -> None:  # upstream's manifest: all files present, row counts (wrong by `extra`)
        h.store.put_json(hour_prefix + readiness.MANIFEST, {"files": [
            {"name": k[len(hour_prefix):], "rows": n + extra} for k, n in sorted(rows.items())]})

    promise(extra=1)
    for attempt in (1, 2):  # each run fails its hour (rows do not match the manifest) and is retried
        (req,) = tick(h).run_requests
        assert json.loads(req.tags[catchup.TAG_CLAIMS]) == {hid: f"a{attempt}"}
        result = h.run(req, raise_on_error=False)
        assert not result.success
        # A refused hour fails the run once (the sensor retries it as a new attempt): no step retry.
        assert not [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    data = tick(h)
    assert not data.run_requests
    entries = catchup.hour_entries(h.store, "ads_hourly", hour(0))
    assert {"a1.failed", "a2.failed", "parked-2"} <= set(entries)
    assert "manifest rows" in next(e for k, e in entries.items() if k.startswith("refused-"))["reason"]
    parked_events = [e for e in data.asset_events if e.metadata.get("catchup") and
                     e.metadata["catchup"].value == "parked"]
    assert parked_events, "the parked hour is visible on raw_ad_updates in the UI"
    assert read_pointer(h.store, f"buckets/ads_hourly/{hid}")[0] is None
    assert not tick(h).run_requests  # parked stays parked

    # Upstream fixes its manifest; an operator grants one more attempt.
    promise(extra=0)
    assert cli(["ledger", "retry", "--store", h.settings.store, "--pipeline", "ads_hourly", "--hour", hid]) == 0
    (req,) = tick(h).run_requests
    assert json.loads(req.tags[catchup.TAG_CLAIMS]) == {hid: "a3"}
    assert h.run(req).success
    assert catchup.hour_entries(h.store, "ads_hourly", hour(0))[""]["attempt"] == 3
    assert len(history(h.store, hid)) == 1
