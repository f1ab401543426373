"""The latest-only rule (:mod:`freshidx.trigger.latest_only`) without Dagster or Spark: a local store, a fake
run list, milliseconds per test. The same scenarios run through Dagster in test_sensor_e2e.py and
test_overlap.py (a real instance and sensor evaluation)."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest

from freshidx.settings import Settings
from freshidx.store import ObjectStore, StoreConfig, layout, open_store
from freshidx.store.partitions import PartitionId
from freshidx.trigger import ledger
from freshidx.trigger.latest_only import DeltaApplied, DeltaPlan, DeltaRun, apply, plan_tick

T0 = dt.datetime(2026, 11, 20, 9, 0, tzinfo=dt.UTC)
NOW = T0 + dt.timedelta(hours=1)
IN_FLIGHT = {"NOT_STARTED", "QUEUED", "STARTING", "STARTED", "CANCELING"}


def at(minutes: int) -> PartitionId:
    return PartitionId(T0 + dt.timedelta(minutes=minutes))


@dataclass
class FakeRuns:
    """A run list as the Dagster instance would answer it (run key → run)."""

    runs: dict[str, DeltaRun] = field(default_factory=dict)

    def launch(self, run_key: str, target: str | None, status: str = "STARTED", interrupted: bool = False) -> None:
        self.runs[run_key] = DeltaRun(f"run{len(self.runs):05d}-{run_key}", status, status in IN_FLIGHT, target,
                                     interrupted)

    def end(self, run_key: str, status: str = "FAILURE", interrupted: bool = False) -> None:
        old = self.runs[run_key]
        self.runs[run_key] = DeltaRun(old.run_id, status, False, old.target, interrupted)

    def in_flight(self) -> list[DeltaRun]:
        return [r for r in reversed(self.runs.values()) if r.in_flight]

    def by_run_key(self, run_key: str) -> DeltaRun | None:
        return self.runs.get(run_key)

    def ended_how(self, run_key: str) -> str | None:
        run = self.runs.get(run_key)
        if run is None or run.status not in ("FAILURE", "CANCELED"):
            return None
        return f"its run {run.run_id[:8]} ({run_key}) ended {run.status}: boom"

    def last_requested(self) -> str | None:  # the newest sensor run (the instance filters on the trigger tag)
        return next((k for k in reversed(self.runs) if k.startswith("delta:")), None)


class Sensor:
    """plan → apply with a cursor, as the sensor does every tick."""

    def __init__(self, store: ObjectStore, settings: Settings) -> None:
        self.store, self.settings, self.runs = store, settings, FakeRuns()
        self.cursor: dict[str, Any] = {}
        self.now = NOW

    def write(self, minutes: int) -> None:
        key = layout.raw_partition_prefix(self.settings.source, at(minutes)) + "part-0.jsonl"
        self.store.put(key, b'{"ad_id": "a1"}\n')

    def plan(self) -> DeltaPlan:
        return plan_tick(self.store, self.settings, self.runs, self.now, self.cursor)

    def tick(self) -> DeltaApplied:
        plan = self.plan()
        applied = apply(self.store, plan)
        self.cursor = plan.cursor
        return applied

    def launch(self, applied: DeltaApplied) -> str:
        assert applied.request is not None, applied.skip_reason
        self.runs.launch(applied.request.run_key, applied.request.partition.path)
        return applied.request.run_key


def make(cfg: StoreConfig, **overrides: Any) -> Sensor:
    settings = Settings.from_env({}, store=cfg.uri, partitions_start="2026-11-01", **overrides)
    return Sensor(open_store(cfg), settings)


def decision(s: Sensor, minutes: int) -> dict[str, Any] | None:
    return ledger.decision(s.store, "delta", at(minutes))


def test_the_planner_needs_neither_dagster_nor_spark() -> None:
    code = ("import sys, freshidx.trigger.latest_only; "
            "assert not {'dagster', 'pyspark'} & set(sys.modules), sorted(m for m in sys.modules if 'dag' in m)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_newest_only_every_skipped_partition_explained(local_store_config: StoreConfig) -> None:
    s = make(local_store_config)
    for m in (0, 5, 10):
        s.write(m)
    applied = s.tick()
    assert applied.request is not None and applied.request.partition == at(10)
    assert applied.request.run_key == f"delta:{at(10).compact}:a1" and applied.request.skipped == 2
    for m in (0, 5):
        entry = decision(s, m)
        assert entry is not None and entry["decision"] == "folded"
        assert entry["reason"].startswith(f"folded into the micro-batch for {at(10).path} (no watermark")
    decisions = [(p, meta["decision"]) for p, meta in applied.observations]
    assert decisions == [(at(0), "folded"), (at(5), "folded"), (at(10), "accepted")]
    entries = ledger.partition_entries(s.store, "delta", at(10))
    assert entries["a1"]["decision"] == "accepted" and entries["a1"]["run_key"] == applied.request.run_key
    assert s.cursor["last_requested"] == applied.request.run_key
    # The same plan applied twice (a racing evaluation) requests nothing the second time.
    again = apply(s.store, s.plan())
    assert again.request is None and "waiting for its run" in (again.skip_reason or "")


def test_a_racing_evaluation_loses_the_claim(local_store_config: StoreConfig) -> None:
    s = make(local_store_config)
    s.write(0)
    first, second = s.plan(), s.plan()
    assert apply(s.store, first).request is not None
    lost = apply(s.store, second)
    assert lost.request is None and "already accepted by another evaluation" in (lost.skip_reason or "")


def test_a_loop_that_runs_its_claim_starts_it_with_the_claim(local_store_config: StoreConfig) -> None:
    """The continuous loop (``run_by``) writes the attempt's start right after the claim it wins, as a
    sensor-requested run writes it when it begins; the sensor's apply and a lost claim write none."""
    s = make(local_store_config)
    s.write(0)
    first, second = s.plan(), s.plan()
    won = apply(s.store, first, run_by="loop-run-1")
    assert won.request is not None and won.request.attempt == 1
    lost = apply(s.store, second, run_by="loop-run-2")
    assert lost.request is None
    entries = ledger.partition_entries(s.store, "delta", at(0))
    assert sorted(entries) == ["a1", "a1.run"]
    run = entries["a1.run"]
    assert (run["decision"], run["run_id"], run["run_key"], run["attempt"]) == (
        "started", "loop-run-1", won.request.run_key, 1)
    assert run["reason"] == "micro-batch started for accepted trigger (continuous run)"
    s.write(5)
    requested = s.tick().request  # the sensor's apply: the run it requests starts itself, when it begins
    assert requested is not None and sorted(ledger.partition_entries(s.store, "delta", at(5))) == ["a1"]
    assert ledger.start_attempt(s.store, "delta", at(5), 1, run_id="sensor-run", run_key=requested.run_key)
    assert not ledger.start_attempt(s.store, "delta", at(5), 1, run_id="another-run", run_key=requested.run_key)
    run = ledger.partition_entries(s.store, "delta", at(5))["a1.run"]
    assert (run["decision"], run["run_id"], run["reason"]) == (
        "started", "sensor-run", "run started for accepted trigger")


def test_nothing_new(local_store_config: StoreConfig) -> None:
    s = make(local_store_config)
    assert s.tick().skip_reason == "no partition newer than (none)"


def test_failed_partition_is_retried_as_a_new_attempt(local_store_config: StoreConfig) -> None:
    s = make(local_store_config)
    s.write(0)
    key = s.launch(s.tick())
    assert key == f"delta:{at(0).compact}:a1"
    s.runs.end(key)
    assert decision(s, 0) is None  # a failure is not a final decision
    retry = s.tick()
    assert retry.request is not None and retry.request.run_key == f"delta:{at(0).compact}:a2"
    s.runs.launch(retry.request.run_key, at(0).path)
    s.runs.end(retry.request.run_key)
    s.write(5)  # a newer partition supersedes the broken one, saying how its run ended
    newer = s.tick()
    assert newer.request is not None and newer.request.partition == at(5)
    entry = decision(s, 0)
    assert entry is not None and entry["reason"].endswith("ended FAILURE: boom")


def test_a_cursor_the_daemon_never_saved_still_says_how_the_last_run_ended(local_store_config: StoreConfig) -> None:
    s = make(local_store_config)
    s.write(0)
    before = dict(s.cursor)
    key = s.launch(s.tick())
    s.cursor = before  # the daemon died while the requesting tick was still open (a direct launch waits ~2 s)
    s.runs.end(key)
    s.write(5)
    newer = s.tick()
    assert newer.request is not None and newer.request.partition == at(5)
    entry = decision(s, 0)
    assert entry is not None and entry["decision"] == "folded", entry
    assert f"its run run00000 ({key}) ended FAILURE: boom" in entry["reason"], entry


def test_parked_after_max_attempts_until_a_grant(local_store_config: StoreConfig) -> None:
    s = make(local_store_config, max_attempts=2)
    s.write(0)
    for _ in range(2):
        s.runs.end(s.launch(s.tick()))
    parked = s.tick()
    assert parked.request is None and "parked" in (parked.skip_reason or "")
    assert "parked-2" in ledger.partition_entries(s.store, "delta", at(0))
    assert [meta["decision"] for _, meta in parked.observations] == ["parked"]
    assert s.tick().request is None  # stays parked
    assert ledger.grant_retry(s.store, "delta", at(0), "test") == f"{at(0).compact}.grant-1"
    retried = s.tick()
    assert retried.request is not None and retried.request.run_key == f"delta:{at(0).compact}:a3"


def test_an_interrupted_attempt_does_not_count_towards_parking(local_store_config: StoreConfig) -> None:
    s = make(local_store_config, max_attempts=1)
    s.write(0)
    s.runs.end(s.launch(s.tick()), "CANCELED", interrupted=True)
    again = s.tick()
    assert again.request is not None and again.request.attempt == 2


def test_a_lost_request_is_retried_after_the_grace(local_store_config: StoreConfig) -> None:
    s = make(local_store_config)
    s.write(0)
    s.now = dt.datetime.now(dt.UTC)
    assert s.tick().request is not None  # ... but the daemon never created the run
    waiting = s.tick()
    assert waiting.request is None and "requested, waiting for its run" in (waiting.skip_reason or "")
    s.now += dt.timedelta(minutes=5)
    later = s.tick()
    assert later.request is not None and later.request.attempt == 2


def test_no_new_run_while_one_is_in_flight(local_store_config: StoreConfig) -> None:
    s = make(local_store_config)
    s.write(0)
    s.launch(s.tick())
    s.write(5)
    waiting = s.tick()
    assert waiting.request is None and "will jump to the newest" in (waiting.skip_reason or "")
    assert decision(s, 0) is None  # nothing recorded while we wait: decided when we can act
    assert decision(s, 5) is None


@pytest.mark.parametrize("policy", ["serialize", "skip", "queue"])
def test_delta_overlap_policy(local_store_config: StoreConfig, policy: str) -> None:
    s = make(local_store_config, delta_overlap=policy)
    s.write(0)
    s.launch(s.tick())
    s.write(5)
    s.write(10)
    second = s.tick()
    if policy == "serialize":
        assert second.request is None and "will jump to the newest" in (second.skip_reason or "")
        assert decision(s, 5) is None
    elif policy == "skip":
        assert second.request is None and "overlap policy skip" in (second.skip_reason or "")
        for m in (5, 10):
            entry = decision(s, m)
            assert entry is not None and entry["decision"] == "superseded" and "overlap policy skip" in entry["reason"]
        assert [meta["decision"] for _, meta in second.observations] == ["skipped_overlap"] * 2
    else:
        assert second.request is not None and second.request.partition == at(10)
        assert decision(s, 0) is None  # its in-flight run decides it
        s.launch(second)
        third = s.tick()
        assert third.request is None and "is started" in (third.skip_reason or "").lower()


def test_skipped_partition_is_never_revisited(local_store_config: StoreConfig) -> None:
    s = make(local_store_config, delta_overlap="skip")
    s.write(0)
    key = s.launch(s.tick())
    s.write(5)
    assert s.tick().request is None
    s.runs.end(key)
    again = s.tick()
    assert again.request is None and "already decided" in (again.skip_reason or "")
    s.write(10)
    newer = s.tick()
    assert newer.request is not None and newer.request.partition == at(10)


def test_a_ui_run_without_a_target_is_not_skipped_over(local_store_config: StoreConfig) -> None:
    s = make(local_store_config, delta_overlap="skip")
    s.write(0)
    s.runs.launch("ui-run", None)  # a UI materialize: builds the newest partition it sees
    data = s.tick()
    assert data.request is None and "not skipped yet" in (data.skip_reason or "")
    assert decision(s, 0) is None


def test_entries_are_read_once_per_listed_version(store: ObjectStore) -> None:
    # Create-once entries: a sensor re-listing a waiting trigger every tick GETs each entry once; an
    # entry deleted and created again (retention, then a new decision) is read afresh.
    p = PartitionId.parse("year=2026/month=11/day=20/hour=10/minute=05")
    gets: list[str] = []
    real_get_json = store.get_json

    def counting_get_json(key: str) -> Any:
        gets.append(key)
        return real_get_json(key)

    store.get_json = counting_get_json  # type: ignore[method-assign]
    ledger.record_partition(store, "delta", p, "folded", "first", tid=ledger.TriggerId(f"{p.compact}.a1"))
    first = ledger.partition_entries(store, "delta", p)
    assert set(first) == {"a1"} and len(gets) == 1
    assert ledger.partition_entries(store, "delta", p) == first and len(gets) == 1  # not read again
    ledger.record_partition(store, "delta", p, "published", "final")
    both = ledger.partition_entries(store, "delta", p)
    assert set(both) == {"", "a1"} and both[""]["reason"] == "final" and len(gets) == 2
    store.delete(ledger.partition_key("delta", p))
    ledger.record_partition(store, "delta", p, "superseded", "recreated with other content")
    assert ledger.partition_entries(store, "delta", p)[""]["reason"] == "recreated with other content"
    assert len(gets) == 3
