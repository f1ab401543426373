"""Continuous mode: the loop's pure decisions, and one real ``delta_continuous`` run in-process.

The in-process run uses the code location's resources on a local store and the test session's local
Spark: partitions written before it starts are folded into one micro-batch for the newest, a partition
written while it runs is published by the next tick, every publication is a materialization of
``delta_index``, and the run ends itself on its (tiny) planned-restart runtime.
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import dagster as dg
import pytest

from freshidx.publish.commit import read_pointer
from freshidx.settings import Settings, SettingsError
from freshidx.settings_values import parse_duration
from freshidx.store import layout
from freshidx.trigger import continuous_rules, ledger
from freshidx.trigger.continuous_rules import BatchStatus, Limits, LoopRuns, StopReason, TickKind
from freshidx.trigger.latest_only import DeltaApplied, DeltaRequest, DeltaRun
from freshidx_tests.support.harness import Harness, at
from freshidx_tests.support.polling import poll_until

T = dt.datetime(2026, 11, 24, 12, 0, tzinfo=dt.UTC)
LIMITS = Limits(trigger_seconds=1.0, max_runtime_seconds=600, max_rss_mb=1000)


# ------------------------------------------------------------------------------------------ pure


def test_settings_mode_and_durations() -> None:
    s = Settings.from_env({})
    assert (s.delta_mode, s.continuous_trigger_seconds, s.continuous_max_runtime) == ("sensor", 0.5, 86400.0)
    s = Settings.from_env({"FRESHIDX_DELTA_MODE": "continuous", "FRESHIDX_CONTINUOUS_MAX_RUNTIME": "1h30m",
                           "FRESHIDX_CONTINUOUS_TRIGGER_SECONDS": "0.5", "FRESHIDX_CONTINUOUS_MAX_RSS_MB": "512"})
    assert (s.delta_mode, s.continuous_max_runtime, s.continuous_trigger_seconds, s.continuous_max_rss_mb) == \
        ("continuous", 5400.0, 0.5, 512)
    assert parse_duration("24h") == 86400 and parse_duration("90s") == 90 and parse_duration("120") == 120
    for env, var in [({"FRESHIDX_DELTA_MODE": "stream"}, "FRESHIDX_DELTA_MODE"),
                     ({"FRESHIDX_CONTINUOUS_TRIGGER_SECONDS": "0"}, "FRESHIDX_CONTINUOUS_TRIGGER_SECONDS"),
                     ({"FRESHIDX_CONTINUOUS_MAX_RUNTIME": "1 day"}, "FRESHIDX_CONTINUOUS_MAX_RUNTIME"),
                     ({"FRESHIDX_CONTINUOUS_MAX_RSS_MB": "1"}, "FRESHIDX_CONTINUOUS_MAX_RSS_MB")]:
        with pytest.raises(SettingsError, match=var):
            Settings.from_env(env)


def test_stop_reasons() -> None:
    assert continuous_rules.stop_reason(LIMITS, T, T + dt.timedelta(seconds=599), 999) is None
    stop = continuous_rules.stop_reason(LIMITS, T, T + dt.timedelta(seconds=600), 10)
    assert stop is not None and stop.reason is StopReason.MAX_RUNTIME and "planned restart" in stop.message
    stop = continuous_rules.stop_reason(LIMITS, T, T + dt.timedelta(seconds=5), 1000.5)
    assert stop is not None and stop.reason is StopReason.MAX_MEMORY and "1000 MiB" in stop.detail
    stop = continuous_rules.stop_reason(LIMITS, T, T + dt.timedelta(seconds=900), 5000, "received SIGTERM")
    assert stop is not None and stop.reason is StopReason.STOP_REQUESTED  # a request wins
    assert continuous_rules.stop_reason(LIMITS, T, T, None) is None  # memory unknown: no memory stop
    # A planned restart waits for an idle tick (a pending micro-batch runs first), within a grace.
    due = T + dt.timedelta(seconds=601)
    assert continuous_rules.stop_reason(LIMITS, T, due, 10, pending=True) is None
    late = due + continuous_rules.RESTART_GRACE
    assert continuous_rules.stop_reason(LIMITS, T, late, 10, pending=True).reason is StopReason.MAX_RUNTIME  # type: ignore[union-attr]
    assert continuous_rules.stop_reason(LIMITS, T, T, 1200, pending=True) is None
    assert continuous_rules.stop_reason(LIMITS, T, T, 1500, pending=True).reason is StopReason.MAX_MEMORY  # type: ignore[union-attr]
    assert continuous_rules.stop_reason(LIMITS, T, T, 10, "stop", pending=True).reason is StopReason.STOP_REQUESTED  # type: ignore[union-attr]
    assert LIMITS.restart_at(T) == T + dt.timedelta(minutes=10)


def test_tick_decision_and_attempt_accounting() -> None:
    req = DeltaRequest(at(25), attempt=1, skipped=5)
    action = continuous_rules.decide(DeltaApplied([], req, None))
    assert action.kind is TickKind.MICRO_BATCH and action.request == req and "folded 5" in action.reason
    idle = continuous_rules.decide(DeltaApplied([], None, "no partition newer than year=2026/…"))
    assert idle.kind is TickKind.IDLE and idle.reason.startswith("no partition newer")

    assert continuous_rules.batch_status("published", "published") is BatchStatus.SUCCESS
    assert continuous_rules.batch_status("superseded", "superseded: …") is BatchStatus.SUCCESS
    assert continuous_rules.batch_status("invalid", "validation failed: base changed: built on …") is BatchStatus.RETRY
    assert continuous_rules.batch_status("invalid", "validation failed: doc count collapsed") is BatchStatus.FAILURE

    class Others:
        def in_flight(self) -> list[DeltaRun]:
            return [DeltaRun("me", "STARTED", True), DeltaRun("ui-run", "STARTED", True)]

        def by_run_key(self, run_key: str) -> DeltaRun | None:
            return DeltaRun("old", "FAILURE", False) if run_key == "delta:old:a1" else None

        def ended_how(self, run_key: str) -> str | None:
            return "sensor-mode failure" if run_key == "delta:old:a1" else None

    runs = LoopRuns("me", Others())
    assert [r.run_id for r in runs.in_flight()] == ["ui-run"]  # never waits for itself
    runs.record(req.run_key, BatchStatus.RETRY)
    view = runs.by_run_key(req.run_key)
    assert view is not None and not view.in_flight and view.interrupted  # not a failed attempt
    runs.record("delta:x:a2", BatchStatus.FAILURE, "Boom: no")
    assert "failed: Boom: no" in (runs.ended_how("delta:x:a2") or "")
    assert runs.ended_how(req.run_key) is None
    assert runs.ended_how("delta:old:a1") == "sensor-mode failure"
    assert runs.by_run_key("delta:old:a1") == DeltaRun("old", "FAILURE", False)
    lost = runs.by_run_key("delta:dead-continuous-run:a1")  # its run died mid-batch: an ended attempt at once
    assert lost is not None and not lost.in_flight and lost.status == continuous_rules.LOST and not lost.interrupted


def test_when_the_idle_loop_warms_its_workers() -> None:
    w = continuous_rules.Warmth()
    state = ("full-1", "delta-1")
    assert w.look_due(T, published=False) and w.warm_due(T, state)  # never looked, never warmed
    w.checked_at, w.state, w.warmed_at = T, state, T
    soon = T + dt.timedelta(seconds=1)
    assert not w.look_due(soon, published=False)
    # A publication: once readers have had their turn, even if no later tick says so again.
    assert not w.look_due(soon, published=True)
    assert not w.look_due(soon + continuous_rules.READERS_FIRST / 2, published=False)
    assert w.look_due(soon + continuous_rules.READERS_FIRST, published=False)
    w.checked_at = soon + continuous_rules.READERS_FIRST
    assert not w.look_due(soon + continuous_rules.READERS_FIRST, published=False)  # looked: once only
    w.checked_at = T
    assert w.look_due(T + continuous_rules.WARM_CHECK, published=False)
    assert not w.warm_due(soon, state)  # nothing changed, the workers were busy a second ago
    assert w.warm_due(soon, ("full-1", "delta-2")) and w.warm_due(soon, ("full-2", "delta-1"))
    assert w.warm_due(T + continuous_rules.KEEP_WARM, state)  # before Spark stops an idle worker (a minute)
    newer = ("full-2", "delta-1")
    w.warmed(soon, newer, complete=False)  # the budget ran out: go on at the next idle tick
    assert w.look_due(soon, published=False) and w.warm_due(soon, newer) and w.state == state
    w.warmed(soon, newer, complete=True)
    assert not w.look_due(soon, published=False) and not w.warm_due(soon, newer) and w.state == newer
    assert continuous_rules.WARM_BUDGET < continuous_rules.WARM_CHECK
    assert continuous_rules.READERS_FIRST < continuous_rules.WARM_CHECK
    assert dt.timedelta(minutes=1) > continuous_rules.KEEP_WARM
    assert Settings.from_env({}).continuous_keep_warm
    assert not Settings.from_env({"FRESHIDX_CONTINUOUS_KEEP_WARM": "false"}).continuous_keep_warm


def test_heartbeat_roundtrip() -> None:
    state = continuous_rules.LoopState("run-1", T, LIMITS, ticks=3, batches=1, published=1, last_tick=T)
    assert continuous_rules.heartbeat_due(state, T, acted=False)  # never written yet
    hb = continuous_rules.heartbeat(state, T + dt.timedelta(seconds=2))
    state.heartbeat_at = T
    assert not continuous_rules.heartbeat_due(state, T + dt.timedelta(seconds=2), acted=False)
    assert continuous_rules.heartbeat_due(state, T + dt.timedelta(seconds=2), acted=True)
    seen = continuous_rules.describe_heartbeat(hb, T + dt.timedelta(seconds=5))
    assert seen is not None and seen["state"] == "live" and seen["run_id"] == "run-1"
    assert str(seen["planned_restart_at"]).startswith("2026-11-24T12:10")
    assert continuous_rules.describe_heartbeat(hb, T + dt.timedelta(hours=1))["state"] == "silent"  # type: ignore[index]
    ended = continuous_rules.heartbeat(state, T, ended=continuous_rules.Stop(StopReason.MAX_RUNTIME, "ran 600 s"))
    assert continuous_rules.describe_heartbeat(ended, T)["state"] == "ended"  # type: ignore[index]


# ------------------------------------------------------------------------------------------ Dagster


def test_sensor_skips_in_continuous_mode(make_harness: Any) -> None:
    h: Harness = make_harness(delta_mode="continuous")
    h.write(0)
    data = h.tick()
    assert not data.run_requests and "continuous" in (data.skip_message or "")
    assert ledger.decision(h.store, "delta", at(0)) is None  # nothing decided: the continuous run decides


def _watchdog(h: Harness) -> Any:
    return h.tick("delta_continuous_watchdog")


def test_watchdog_requests_one_run(make_harness: Any) -> None:
    # One run (standby off): the watchdog's single-run rule; the standby: test_continuous_standby_rules.py.
    h: Harness = make_harness(delta_mode="continuous", continuous_standby=False)
    assert h.defs.resolve_sensor_def("delta_continuous_watchdog").default_status is dg.DefaultSensorStatus.RUNNING
    first = _watchdog(h)
    (req,) = first.run_requests
    assert req.run_key == "delta_continuous:first" and req.tags["freshidx/started_because"] == "none at start-up"
    run = h.instance.create_run_for_job(h.defs.resolve_job_def("delta_continuous"), tags=req.tags,
                                        status=dg.DagsterRunStatus.NOT_STARTED)
    again = _watchdog(h)
    assert not again.run_requests and "NOT_STARTED" in (again.skip_message or "")  # never two
    h.instance.report_run_failed(run, message="killed")
    after = _watchdog(h)
    (req2,) = after.run_requests
    assert req2.run_key == f"delta_continuous:after:{run.run_id}"
    assert req2.tags["freshidx/started_because"] == "previous ended: FAILURE"
    sensor_mode: Harness = make_harness()
    assert sensor_mode.defs.resolve_sensor_def("delta_continuous_watchdog").default_status \
        is dg.DefaultSensorStatus.STOPPED
    assert "sensor" in (_watchdog(sensor_mode).skip_message or "")


def test_continuous_run_publishes_folds_and_restarts(make_harness: Any, spark: Any) -> None:
    # Due at once: the planned restart waits for the first idle tick, after both micro-batches.
    h: Harness = make_harness(delta_mode="continuous", continuous_max_runtime=1,
                              continuous_trigger_seconds=0.5)
    for m in range(0, 30, 5):
        h.write(m)  # before the run: 0..20 are folded into the micro-batch for 25
    errors: list[BaseException] = []

    def upstream() -> None:  # while the run is live: a new partition after the first publication
        try:
            # During the first micro-batch (its started entry is written): the next tick finds 30.
            poll_until(lambda: any(e["decision"] == "started" for e in
                                   ledger.partition_entries(h.store, "delta", at(25)).values()),
                       timeout=40, what="the micro-batch for 25 to start")
            h.write(30)
        except BaseException as exc:  # re-raised in the test thread
            errors.append(exc)

    writer = threading.Thread(target=upstream, daemon=True)
    writer.start()
    result = h.defs.resolve_job_def("delta_continuous").execute_in_process(instance=h.instance)
    writer.join(timeout=5)
    assert not errors, errors
    assert result.success
    assert _serving(h) == at(30).path  # pointer moved by the loop, twice
    for m in range(0, 25, 5):
        d = ledger.decision(h.store, "delta", at(m))
        assert d is not None and d["decision"] == "folded", (m, d)
    for m in (25, 30):
        d = ledger.decision(h.store, "delta", at(m))
        assert d is not None and d["decision"] == "published", (m, d)
    entries = ledger.partition_entries(h.store, "delta", at(25))
    assert any(e["decision"] == "accepted" for e in entries.values())  # claimed like a sensor attempt
    assert any(e["decision"] == "started" and e.get("run_id") == result.run_id for e in entries.values())
    mats = result.get_asset_materialization_events()
    published = [m for m in mats if m.asset_key == dg.AssetKey("delta_index")
                 and m.materialization.metadata["outcome"].value == "published"]
    assert len(published) == 2
    meta = published[0].materialization.metadata
    assert meta["trigger"].value == "continuous" and meta["source_partition"].value == at(25).path
    assert meta["skipped_partitions"].value == 5 and "lag_seconds" in meta
    assert str(meta["spark_app_id"].value).startswith("local-")  # the Spark application that built it
    run = h.instance.get_run_by_id(result.run_id)
    assert run is not None and run.tags["freshidx/ended"] == StopReason.MAX_RUNTIME.value
    hb, _ = h.store.get_json(layout.continuous_heartbeat_key())
    assert hb["run_id"] == result.run_id and hb["ended"]["reason"] == "max_runtime" and hb["published"] == 2
    logs = [e.message for e in h.instance.all_logs(result.run_id) if e.message]
    assert any("planned restart (max_runtime)" in m for m in logs)


def _serving(h: Harness) -> str | None:
    ptr, _ = read_pointer(h.store, "delta")
    return ptr.source_partition if ptr else None


def test_status_shows_mode_and_live_run(local_store_config: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from freshidx.serve import status
    from freshidx.store import open_store

    st = open_store(local_store_config)
    now = dt.datetime.now(dt.UTC)
    # The mode comes from the store, never from this shell's FRESHIDX_DELTA_MODE.
    monkeypatch.setenv("FRESHIDX_DELTA_MODE", "sensor")
    assert status.collect(st, "ad_updates", now)["delta_mode"] is None  # nothing published, no run
    state = continuous_rules.LoopState("abcdef12-run", now - dt.timedelta(seconds=30), LIMITS, ticks=30, batches=2,
                                 published=2, last_tick=now)
    st.put_json(layout.continuous_heartbeat_key(), continuous_rules.heartbeat(state, now))
    s = status.collect(st, "ad_updates", now)
    assert s["continuous"]["state"] == "live" and s["continuous"]["run_id"] == "abcdef12-run"
    assert s["delta_mode"] == "continuous"
    text = status.render(s)
    assert "mode    continuous (from a live continuous run)  continuous run abcdef12 live" in text
    assert "next planned restart" in text and "published 2" in text


def test_status_mode_follows_the_serving_delta_when_no_run_is_live() -> None:
    from freshidx.serve import status

    ended = {"state": "ended", "run_id": "x"}
    assert status.trigger_mode({"trigger": "sensor"}, ended) == ("sensor", "the serving delta's run")
    assert status.trigger_mode({"trigger": "continuous"}, None) == ("continuous", "the serving delta's run")
    assert status.trigger_mode({"trigger": "ui"}, None)[0] is None
    assert status.trigger_mode({"trigger": "sensor"}, {"state": "live"})[0] == "continuous"


def test_sigterm_ends_the_trigger_wait_at_once() -> None:
    import os
    import signal
    import time

    from freshidx.defs.delta.continuous_job import _Stopper

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach only the main thread")  # the handler would not be installed
    stopper = _Stopper()
    with stopper.installed():
        timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM))
        timer.start()
        t0 = time.monotonic()
        stopper.wait(30)
        timer.join()
        assert time.monotonic() - t0 < 10 and stopper.requested == "received SIGTERM"
        stopper.wait(30)  # a stop is pending: no more waiting
    assert signal.getsignal(signal.SIGTERM) != stopper.handler  # restored


def test_failed_micro_batches_count_as_attempts_and_park(make_harness: Any, spark: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import freshidx.defs.delta.continuous_job as defs_continuous

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("executor lost\nstack…")

    monkeypatch.setattr(defs_continuous, "build_delta", broken)
    monkeypatch.setattr(defs_continuous, "FAILURE_BACKOFF_SECONDS", 0.2)
    # The planned restart must come after the tick that parks (two failed attempts and their back-offs, then a
    # tick with nothing to run): a restart due earlier ends the loop instead of that tick, as it should, and the
    # next run's first tick would park. 15 s leaves room for a loaded box.
    h: Harness = make_harness(delta_mode="continuous", continuous_max_runtime=15, continuous_trigger_seconds=0.2,
                              max_attempts=2)
    h.write(0)
    h.write(5)
    result = h.defs.resolve_job_def("delta_continuous").execute_in_process(instance=h.instance)
    assert result.success  # failed micro-batches are attempts, not a failed run
    assert read_pointer(h.store, "delta")[0] is None
    entries = ledger.partition_entries(h.store, "delta", at(5))
    started = sorted(e["attempt"] for e in entries.values() if e["decision"] == "started")
    assert started == [1, 2]  # attempt numbers as the sensor gives them
    d = ledger.decision(h.store, "delta", at(0))
    assert d is not None and d["decision"] == "folded"
    parked = [e for e in entries.values() if e["decision"] == "parked"]
    assert parked and "2 attempts failed" in parked[0]["reason"], entries
    assert not result.get_asset_materialization_events()
    logs = [e.message for e in h.instance.all_logs(result.run_id) if e.message]
    assert any("failed: RuntimeError: executor lost" in m for m in logs)


def test_a_continuous_run_checks_the_stores_conditional_writes_before_it_waits_as_standby(
        s3_store_config: Any) -> None:
    from freshidx.defs.delta import continuous_job
    from freshidx.store import open_store, s3

    st = open_store(s3_store_config)
    ident = (s3_store_config.endpoint_url, s3_store_config.bucket, s3_store_config.prefix)
    assert ident not in s3._verdicts  # a fresh bucket: not checked yet in this process
    with dg.build_op_context() as context:
        continuous_job._probe_writes(context, st)
    assert s3._verdicts[ident] is None  # checked, and enforced: the first write after a takeover skips it


def test_a_failed_check_of_conditional_writes_does_not_end_the_run() -> None:
    from freshidx.defs.delta import continuous_job

    class Unreachable:
        def check_conditional_writes(self) -> None:
            raise OSError("connection refused")

    with dg.build_op_context() as context:
        continuous_job._probe_writes(context, Unreachable())  # type: ignore[arg-type]
