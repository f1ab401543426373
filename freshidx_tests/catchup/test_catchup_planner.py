"""The catch-up rule (:mod:`freshidx.catchup.planner`) without Dagster or Spark: a local store, a fake run list,
milliseconds per test. A "run" here publishes what the bucket IO manager would (an empty bucket whose
manifest lists the hour's inputs, and the ledger entry), so the planner sees the store it would see.
The same scenarios run through Dagster in test_catchup.py, test_overlap.py, test_run_health.py and
test_ledger_explains.py (a real instance, sensor evaluations and Spark runs)."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from freshidx.catchup import planner as catchup
from freshidx.catchup import readiness
from freshidx.catchup.planner import (
    ASSET,
    CatchupApplied,
    CatchupPlan,
    CatchupRequest,
    CatchupRun,
    HourRecord,
    apply,
    plan_tick,
)
from freshidx.catchup.readiness import list_hour
from freshidx.publish.commit import DraftManifest, iso, new_version, publish
from freshidx.settings import Settings
from freshidx.store import ObjectStore, StoreConfig, layout, open_store
from freshidx.store.partitions import PartitionId
from freshidx.trigger.lifecycle import Decision, Mark

H0 = dt.datetime(2026, 11, 20, 0, 0, tzinfo=dt.UTC)


def hour(i: int) -> dt.datetime:
    return H0 + dt.timedelta(hours=i)


def hid(i: int) -> str:
    return layout.hour_id(hour(i))


@dataclass
class FakeRuns:
    """Runs as the Dagster instance would answer for ``ads_hourly`` (run key → run)."""

    runs: dict[str, CatchupRun] = field(default_factory=dict)
    hours: dict[str, list[str]] = field(default_factory=dict)  # run id → hour ids it builds
    kinds: dict[str, str | None] = field(default_factory=dict)  # run id → catch-up kind (None: backfill/manual)
    cancelled: list[str] = field(default_factory=list)

    def launch(self, run_key: str, hours: list[str], kind: str | None, at: dt.datetime) -> CatchupRun:
        run = CatchupRun(f"run{len(self.runs):05d}", catchup.IN_FLIGHT, at.timestamp(), at.timestamp())
        self.runs[run_key], self.hours[run.run_id], self.kinds[run.run_id] = run, hours, kind
        return run

    def end(self, run_key: str, status: str = catchup.FAILURE, interrupted: bool = False) -> None:
        self.runs[run_key] = replace(self.runs[run_key], status=status, interrupted=interrupted)

    def by_run_key(self, run_key: str) -> CatchupRun | None:
        return self.runs.get(run_key)

    def busy_hours(self) -> dict[str, str]:
        return {h: r.run_id for r in self.runs.values() if r.status == catchup.IN_FLIGHT for h in self.hours[r.run_id]}

    def catchup_in_flight(self) -> int:
        return sum(1 for r in self.runs.values() if r.status == catchup.IN_FLIGHT and self.kinds[r.run_id])

    def cancel(self, run_id: str, reason: str) -> None:
        self.cancelled.append(run_id)
        key = next(k for k, r in self.runs.items() if r.run_id == run_id)
        self.end(key, catchup.CANCELED)


class Consumer:
    """observe → plan → apply, as the sensor does every tick; ``run`` does what a run would."""

    def __init__(self, cfg: StoreConfig, **overrides: Any) -> None:
        # A short lookahead: every empty hour after the data is examined (and found not ready) each tick.
        overrides = {"hourly_lookahead_hours": 8, **overrides}
        self.settings = Settings.from_env({}, store=cfg.uri, partitions_start="2026-11-01", **overrides)
        self.store: ObjectStore = open_store(cfg)
        self.runs = FakeRuns()
        self.now = dt.datetime.now(dt.UTC)  # claims carry the wall clock; the hours are long closed
        self.versions = 0

    def write(self, i: int, minute: int = 0) -> None:
        pid = PartitionId(hour(i) + dt.timedelta(minutes=minute))
        self.store.put(layout.raw_partition_prefix(self.settings.source, pid) + "part-0.jsonl", b'{"ad_id": "a1"}\n')

    def plan(self) -> CatchupPlan:
        return plan_tick(self.store, self.settings, self.runs, self.now)

    def tick(self) -> CatchupApplied:
        return apply(self.store, self.plan(), self.runs)

    def request(self) -> CatchupRequest:
        applied = self.tick()
        assert len(applied.requests) == 1, applied.skip_reason
        return applied.requests[0]

    def launch(self, req: CatchupRequest) -> CatchupRequest:
        self.runs.launch(req.run_key, [layout.hour_id(h) for h in req.hours], req.kind, self.now)
        return req

    def run(self, req: CatchupRequest) -> None:
        """The run succeeds: each hour published (create-once for catch-up) and recorded."""
        run = self.runs.by_run_key(req.run_key) or self.runs.launch(
            req.run_key, [layout.hour_id(h) for h in req.hours], req.kind, self.now)
        for c in req.claims:
            files = list_hour(self.store, self.settings.source, c.hour).files
            self.versions += 1
            position = iso(c.hour + dt.timedelta(seconds=self.versions))  # each version newer than the last
            draft = DraftManifest(layout.bucket_name(ASSET, c.hour), new_version(c.hour), position, run.run_id,
                                  [], 0, 0, inputs={"files": [{"key": f.key, "etag": f.etag} for f in files]})
            result = publish(self.store, draft, allow_empty=True, only_if_absent=req.kind == "catchup")
            assert result.outcome == "published", result.reason
            tid = catchup.trigger(c.hour) if req.kind == "catchup" else c.tid.then(Mark.DONE)
            decision = Decision.PROCESSED if req.kind == "catchup" else Decision.CORRECTED
            catchup.record(self.store, ASSET, c.hour, tid, decision, "published", run_id=run.run_id,
                           attempt=c.tid.attempt)
        self.runs.end(req.run_key, catchup.SUCCESS)

    def drain(self, max_rounds: int = 30) -> list[list[str]]:
        batches: list[list[str]] = []
        for _ in range(max_rounds):
            applied = self.tick()
            if not applied.requests:
                return batches
            for req in applied.requests:
                batches.append([layout.hour_id(h) for h in req.hours])
                self.run(req)
        raise AssertionError(f"still requesting runs after {max_rounds} rounds: {batches}")

    def entries(self, i: int) -> dict[str, dict[str, Any]]:
        return catchup.hour_entries(self.store, ASSET, hour(i))

    def keys(self) -> dict[str, str]:
        return {o.key: o.etag for o in self.store.iter_objects("")}


def claims(c: Consumer, i: int) -> list[str]:
    return sorted(k for k in c.entries(i) if k[:1] == "a" and k[1:].isdigit())


def claimed(req: CatchupRequest) -> dict[str, str]:
    return {layout.hour_id(cl.hour): cl.suffix for cl in req.claims}


def test_the_planner_needs_neither_dagster_nor_spark() -> None:
    code = ("import sys, freshidx.catchup.planner, freshidx.catchup.late; "
            "assert not {'dagster', 'pyspark'} & set(sys.modules), sorted(m for m in sys.modules if 'dag' in m)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --------------------------------------------------------------------------- exactly once, capped, outage


def test_each_hour_exactly_once_oldest_first_in_capped_runs(local_store_config: StoreConfig) -> None:
    c = Consumer(local_store_config, hourly_max_hours_per_run=4, hourly_late_checks_per_tick=0)
    for i in range(3):  # live: one hour at a time, an hour per run
        c.write(i)
        assert c.drain() == [[hid(i)]]
    for i in range(3, 9):  # an outage: a backlog of 6 hours
        c.write(i)
    backlog: list[list[str]] = []
    for i in range(9, 12):  # new hours keep arriving, one per tick: they queue behind the backlog
        c.write(i)
        req = c.request()
        backlog.append([layout.hour_id(h) for h in req.hours])
        c.run(req)
    backlog += c.drain()
    assert backlog[0] == [hid(i) for i in range(3, 7)], "backlog first, a full capped run"
    assert [h for b in backlog for h in b] == [hid(i) for i in range(3, 12)], "oldest first, each once"
    assert all(1 <= len(b) <= 4 for b in backlog)
    for i in range(12):
        assert claims(c, i) == ["a1"], f"{hid(i)}: one claim"
        assert c.entries(i)[""]["decision"] == "processed"
    idle = c.tick()
    assert not idle.requests and idle.skip_reason.startswith(f"nothing to do (frontier {hid(12)}); waiting: ")
    assert "no data files" in idle.skip_reason  # later hours are empty: not closed while nothing newer is visible
    assert catchup.CatchupState.load(c.store, ASSET)[0].frontier == hid(12)


def test_a_batch_is_contiguous_and_claimed_hour_by_hour(local_store_config: StoreConfig) -> None:
    c = Consumer(local_store_config, hourly_max_hours_per_run=4, hourly_late_checks_per_tick=0,
                 readiness="marker")
    for i in range(4):
        c.write(i)
        if i != 2:
            readiness.write_marker(c.store, c.settings.source, hour(i))
    plan = c.plan()
    assert plan.request is not None and [layout.hour_id(h) for h in plan.request.hours] == [hid(0), hid(1)]
    assert [r.tid.suffix for r in plan.claims] == ["a1", "a1"]
    assert plan.claims[0].fields["extra"] == {"kind": "catchup", "batch": [hid(0), hid(1)]}
    assert "waiting for marker" in plan.waiting[hid(2)]


def test_the_planner_writes_nothing_and_apply_writes_the_plan(local_store_config: StoreConfig) -> None:
    c = Consumer(local_store_config, hourly_timeout_seconds=60, hourly_late_checks_per_tick=0, readiness="marker")
    c.write(0)
    c.write(1)
    readiness.write_marker(c.store, c.settings.source, hour(0))
    c.launch(c.request())
    c.now += dt.timedelta(minutes=5)  # hour 0's run is stuck; hour 1 is not ready
    assert "notready" in c.entries(1)  # marked by the tick that requested hour 0
    before = c.keys()
    plan = c.plan()
    assert c.keys() == before and not c.runs.cancelled, "planning only reads"
    # hour 1's mark is not planned again: one durable entry, no write per waiting hour per tick
    assert [type(e).__name__ for e in plan.effects] == ["HourRecord", "Cancel"]
    assert [(r.tid.suffix, r.decision) for r in plan.effects if isinstance(r, HourRecord)] == [
        ("a1.expired", Decision.EXPIRED)]
    assert plan.request is None, "the stuck run still holds its hour in what this tick observed"
    applied = apply(c.store, plan, c.runs)
    assert c.runs.cancelled == ["run00000"]
    assert [(h, d) for h, d, _ in applied.actions] == [(hid(0), "expired")]
    assert "a1.expired" in c.entries(0) and "notready" in c.entries(1)
    assert claimed(c.request()) == {hid(0): "a2"}


def test_a_racing_evaluation_loses_the_claim(local_store_config: StoreConfig) -> None:
    c = Consumer(local_store_config, hourly_late_checks_per_tick=0)
    c.write(0)
    first, second = c.plan(), c.plan()
    assert len(apply(c.store, first, c.runs).requests) == 1
    lost = apply(c.store, second, c.runs)
    assert not lost.requests and "already claimed by another evaluation" in lost.skip_reason
    assert claims(c, 0) == ["a1"]
    waiting = c.tick()  # the winner's claim holds the hour until its run appears (or the grace ends)
    assert not waiting.requests and "requested, waiting for its run" in waiting.skip_reason


# --------------------------------------------------------------------------- overlap


@pytest.mark.parametrize("policy", ["serialize", "skip", "queue"])
def test_hourly_overlap_policy(local_store_config: StoreConfig, policy: str) -> None:
    c = Consumer(local_store_config, hourly_overlap=policy, hourly_max_hours_per_run=1, hourly_late_checks_per_tick=0)
    for i in range(3):
        c.write(i)
    c.runs.launch("backfill-1", [hid(2)], None, c.now)  # a UI backfill of hour 2 is in flight
    first = c.tick()
    if policy == "skip":
        assert not first.requests and "1 run(s) of ads_hourly in flight (overlap policy skip)" in first.skip_reason
        return
    assert [claimed(r) for r in first.requests] == [{hid(0): "a1"}]
    c.launch(first.requests[0])
    second = c.tick()
    if policy == "serialize":
        assert not second.requests and "1 catch-up run(s) in flight (overlap policy serialize)" in second.skip_reason
    else:
        assert [claimed(r) for r in second.requests] == [{hid(1): "a1"}]  # never hour 2: the backfill holds it
        c.launch(second.requests[0])
        third = c.plan()
        assert third.request is None and "backfill or manual" in third.waiting[hid(2)]


# --------------------------------------------------------------------------- stuck / lost / failed / parked


def test_a_stuck_run_is_expired_cancelled_and_its_hour_processed_once(local_store_config: StoreConfig) -> None:
    c = Consumer(local_store_config, hourly_timeout_seconds=3, hourly_late_checks_per_tick=0)
    c.write(0)
    first = c.launch(c.request())
    held = c.tick()
    assert not held.requests and "attempt 1 running in run00000" in held.skip_reason
    c.now += dt.timedelta(seconds=10)
    expired = c.tick()  # expired and cancelled; the next tick observes it ended
    assert not expired.requests and [d for _, d, _ in expired.actions] == ["expired"]
    retry = c.request()
    assert claimed(retry) == {hid(0): "a2"}
    assert c.runs.by_run_key(first.run_key).status == catchup.CANCELED  # type: ignore[union-attr]
    c.run(retry)
    entries = c.entries(0)
    assert {"a1", "a1.expired", "a2", ""} <= set(entries) and "stuck" in entries["a1.expired"]["reason"]
    assert entries[""]["attempt"] == 2
    assert c.drain() == []


def test_a_lost_request_is_retried_after_the_grace(local_store_config: StoreConfig) -> None:
    c = Consumer(local_store_config, hourly_late_checks_per_tick=0)
    c.write(0)
    assert claimed(c.request()) == {hid(0): "a1"}  # ... but no run was ever created for it
    waiting = c.tick()
    assert not waiting.requests and "attempt 1 requested, waiting for its run" in waiting.skip_reason
    # The claim carries the wall clock: on a loaded box it can be seconds past the consumer's start, so the
    # grace is counted from now, not from that start.
    c.now = max(c.now, dt.datetime.now(dt.UTC)) + catchup.LOST_REQUEST_GRACE + dt.timedelta(seconds=1)
    later = c.tick()
    assert [claimed(r) for r in later.requests] == [{hid(0): "a2"}]
    assert [(h, d, r) for h, d, r in later.actions] == [(hid(0), "expired", "a1: request lost")]


def test_a_failing_hour_is_retried_then_parked_until_a_grant(local_store_config: StoreConfig) -> None:
    c = Consumer(local_store_config, hourly_max_attempts=2, hourly_max_hours_per_run=1,
                 hourly_late_checks_per_tick=0)
    c.write(0)
    c.write(1)
    for attempt in (1, 2):
        req = c.launch(c.request())
        assert claimed(req) == {hid(0): f"a{attempt}"}
        c.runs.end(req.run_key)
    parked = c.tick()
    assert {"a1.failed", "a2.failed", "parked-2"} <= set(c.entries(0))
    assert (hid(0), "parked", "2 attempts did not publish") in parked.actions
    # The frontier moves past the parked hour: the next one is not held back by it.
    assert [claimed(r) for r in parked.requests] == [{hid(1): "a1"}]
    c.run(parked.requests[0])
    assert not c.tick().requests  # parked stays parked
    assert catchup.CatchupState.load(c.store, ASSET)[0].parked == [hid(0)]
    trigger = catchup.trigger(hour(0))
    catchup.record(c.store, ASSET, hour(0), trigger.then(Mark.GRANT, 1), Decision.RETRY_GRANTED, "operator")
    granted = c.request()
    assert claimed(granted) == {hid(0): "a3"}
    c.run(granted)
    assert c.entries(0)[""]["attempt"] == 3
    c.tick()
    assert catchup.CatchupState.load(c.store, ASSET)[0].parked == []


def test_hours_interrupted_by_shutdown_are_never_parked(local_store_config: StoreConfig) -> None:
    c = Consumer(local_store_config, hourly_max_attempts=2, hourly_late_checks_per_tick=0)
    c.write(0)
    for attempt in range(1, 5):  # four stops while the hour's run is in flight
        req = c.launch(c.request())
        assert claimed(req) == {hid(0): f"a{attempt}"}
        c.runs.end(req.run_key, catchup.CANCELED, interrupted=True)
    entries = c.entries(0)
    assert {"a1.interrupted", "a2.interrupted", "a3.interrupted"} <= set(entries)
    assert not [k for k in entries if k.startswith("parked")]
    assert "interrupted by shutdown" in entries["a1.interrupted"]["reason"]
    for _ in range(2):  # genuine failures still count
        c.runs.end(c.launch(c.request()).run_key)
    assert not c.tick().requests
    entries = c.entries(0)
    assert [k for k in entries if k.startswith("parked")] == ["parked-6"]
    assert entries["parked-6"]["reason"].startswith("2 attempts did not publish")


# --------------------------------------------------------------------------- readiness, terminal entry


def test_a_not_ready_hour_waits_with_a_durable_reason(local_store_config: StoreConfig) -> None:
    c = Consumer(local_store_config, readiness="marker", hourly_late_checks_per_tick=0)
    c.write(0)
    for _ in range(2):
        waiting = c.tick()
        assert not waiting.requests and "waiting for marker" in waiting.skip_reason
    assert c.entries(0)["notready"]["decision"] == "not_ready"
    readiness.write_marker(c.store, c.settings.source, hour(0))
    assert claimed(c.request()) == {hid(0): "a1"}


def test_a_missing_terminal_entry_is_healed_from_current(local_store_config: StoreConfig) -> None:
    c = Consumer(local_store_config, hourly_late_checks_per_tick=0)
    c.write(0)
    req = c.request()
    c.run(req)
    c.store.delete(catchup.entry_key(ASSET, hour(0)))  # a crash between the publish and the ledger
    plan = c.plan()
    healed = [r for r in plan.effects if isinstance(r, HourRecord) and r.decision == Decision.PROCESSED]
    assert [r.tid.suffix for r in healed] == [""] and healed[0].hour == hour(0)
    apply(c.store, plan, c.runs)
    assert "recorded from CURRENT" in c.entries(0)[""]["reason"]


# --------------------------------------------------------------------------- late data


def test_late_data_for_a_processed_hour_yields_exactly_one_correction(local_store_config: StoreConfig) -> None:
    c = Consumer(local_store_config, hourly_late_checks_per_tick=4, hourly_late_lookback_hours=4)
    c.write(0)
    c.write(1)
    assert c.drain() == [[hid(0), hid(1)]]
    c.write(0, minute=47)  # a late batch lands in the closed hour 0
    plan = c.plan()
    assert plan.request is not None and plan.request.kind == "correction"
    assert claimed(plan.request) == {hid(0): "c2.a1"}
    assert [(r.tid.suffix, r.decision) for r in plan.after_claim] == [("c2", Decision.LATE_DATA)]
    assert "c2" not in c.entries(0), "the correction is opened only by the claim that wins"
    applied = apply(c.store, plan, c.runs)
    assert c.entries(0)["c2"]["extra"]["new"] and c.entries(0)["c2.a1"]["decision"] == "accepted"
    c.run(applied.requests[0])
    assert c.entries(0)["c2.a1.done"]["decision"] == "corrected"
    assert claims(c, 0) == ["a1"], "the correction is not a second processing"
    for _ in range(3):
        assert not c.tick().requests


def test_late_hour_behind_the_start_is_processed_or_out_of_range(local_store_config: StoreConfig) -> None:
    c = Consumer(local_store_config, hourly_late_checks_per_tick=24, hourly_max_hours_per_run=4)
    c.settings = c.settings.model_copy(update={"partitions_start": "2026-11-20"})
    c.write(3)
    c.write(4)
    assert c.drain() == [[hid(3), hid(4)]]
    c.write(1)  # after the partitions start, before the consumer's first hour
    c.write(-1)  # 2026-11-19T23: before FRESHIDX_PARTITIONS_START
    first = c.tick()
    assert [(h, d) for h, d, _ in first.actions] == [(hid(-1), "out_of_range")]
    assert [claimed(r) for r in first.requests] == [{hid(1): "a1"}]
    c.run(first.requests[0])
    assert catchup.processed(c.store, ASSET, hour(1))
    assert "FRESHIDX_PARTITIONS_START" in c.entries(-1)["out_of_range"]["reason"]
    again = c.tick()
    assert not again.requests and not again.actions, "recorded and reported once"
    assert list(c.entries(-1)) == ["out_of_range"]
    assert not catchup.processed(c.store, ASSET, hour(-1))
