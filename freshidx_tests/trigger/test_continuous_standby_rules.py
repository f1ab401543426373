"""Continuous mode's hot standby: the pure rules (who is active, what the watchdog requests) and the
watchdog sensor evaluated against a real test instance (no JVM, no ``dagster dev``).
The standby taking over in a real deployment: freshidx_tests/trigger/test_continuous_standby.py."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from typing import Any

import dagster as dg

from freshidx.defs.delta.sensor import DagsterDeltaRuns
from freshidx.trigger import ledger
from freshidx.trigger.continuous_rules import JOB_NAME, Limits, Stop, StopReason, server_lost
from freshidx.trigger.continuous_standby import (
    LiveRun,
    Newest,
    Request,
    Role,
    SessionStep,
    older_than,
    restart_waits,
    role,
    standby_session_step,
    standby_stop_reason,
    successor,
    takeover_reason,
    watchdog_decision,
)
from freshidx_tests.support.harness import Harness, at

A = LiveRun("aaaa0000", 100.0, "STARTED")
B = LiveRun("bbbb0000", 200.0, "STARTED")


def test_the_oldest_live_run_is_active_and_only_it() -> None:
    assert role(A.run_id, [B, A]) is Role.ACTIVE and role(B.run_id, [A, B]) is Role.STANDBY
    # The same creation time: the run id breaks the tie, the same way for every observer.
    twin = LiveRun("0000aaaa", 100.0, "STARTED")
    roles = [role(r.run_id, [A, twin]) for r in (A, twin)]
    assert sorted(roles) == [Role.ACTIVE, Role.STANDBY]
    # A run that left its loop (planned restart, stop) does not hold the standby back any more.
    ending = LiveRun(A.run_id, A.created, "STARTED", ended=True)
    assert role(B.run_id, [ending, B]) is Role.ACTIVE and older_than(B.run_id, [ending, B]) == []
    # Not listed yet (the instance answered before its own record): younger than every listed run.
    assert role("cccc0000", [A, B]) is Role.STANDBY and role("cccc0000", []) is Role.ACTIVE


def test_takeover_reason_names_the_runs_that_went() -> None:
    why = takeover_reason([A], [], {A.run_id: "failed: run worker (pid 7) is gone"})
    assert why == "run aaaa0000 failed: run worker (pid 7) is gone"
    assert takeover_reason([A], [], {}) == "run aaaa0000 ended"


def test_watchdog_keeps_an_active_and_a_standby_never_three() -> None:
    first = watchdog_decision([], None, standby=True)
    assert first == Request(f"{JOB_NAME}:first", "none at start-up", Role.ACTIVE)
    standby = watchdog_decision([A], Newest(A.run_id, "STARTED"), standby=True)
    assert isinstance(standby, Request) and standby.role is Role.STANDBY
    assert standby.run_key == f"{JOB_NAME}:after:{A.run_id}" and A.run_id in standby.why
    assert isinstance(full := watchdog_decision([A, B], Newest(B.run_id, "STARTED"), standby=True), str)
    assert "active" in full and "standby" in full
    # The active one died: B took over, the new standby is B's successor (one per run).
    again = watchdog_decision([B], Newest(B.run_id, "STARTED"), standby=True)
    assert isinstance(again, Request) and again.run_key == f"{JOB_NAME}:after:{B.run_id}"
    # A run that left its loop still counts until it finished: never more than two live runs.
    ending = LiveRun(A.run_id, A.created, "STARTED", ended=True)
    assert isinstance(watchdog_decision([ending, B], Newest(B.run_id, "STARTED"), standby=True), str)
    alone = watchdog_decision([ending], Newest(A.run_id, "STARTED", "max_runtime"), standby=True)
    assert isinstance(alone, Request) and alone.role is Role.ACTIVE and "max_runtime" in alone.why


def test_watchdog_without_standby_is_one_run() -> None:
    assert isinstance(watchdog_decision([A], Newest(A.run_id, "STARTED"), standby=False), str)
    after = watchdog_decision([], Newest(A.run_id, "FAILURE"), standby=False)
    assert after == Request(f"{JOB_NAME}:after:{A.run_id}", "previous ended: FAILURE", Role.ACTIVE)


def test_a_planned_restart_waits_only_for_a_standby_that_is_warming_up() -> None:
    limits = Limits(0.5, 3600, 1000)
    due = Stop(StopReason.MAX_RUNTIME, "ran 3600 s")
    warming, ready = LiveRun(B.run_id, B.created, "STARTED"), LiveRun(B.run_id, B.created, "STARTED", role="standby")
    assert successor(A.run_id, [A, warming]) == warming and successor(B.run_id, [A, warming]) is None
    assert restart_waits(due, True, warming, 10, 100, limits)  # its successor would not take over yet
    assert not restart_waits(due, True, ready, 10, 100, limits)  # it takes over at once: restart now
    assert not restart_waits(due, True, None, 10, 100, limits)  # none coming (in-process, watchdog off): now
    assert not restart_waits(due, False, warming, 10, 100, limits)
    assert not restart_waits(due, True, warming, 301, 100, limits)  # at most RESTART_GRACE late
    assert not restart_waits(Stop(StopReason.STOP_REQUESTED, "SIGTERM"), True, warming, 0, 100, limits)
    memory = Stop(StopReason.MAX_MEMORY, "RSS")
    assert restart_waits(memory, True, warming, 0, 1200, limits) and not restart_waits(memory, True, warming, 0,
                                                                                        1500, limits)


def test_a_standby_ends_at_half_its_runtime() -> None:
    limits, t0 = Limits(0.5, 3600, 1000), dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert standby_stop_reason(limits, t0, t0 + dt.timedelta(seconds=1700), 100, None) is None
    stop = standby_stop_reason(limits, t0, t0 + dt.timedelta(seconds=1800), 100, None)
    assert stop is not None and stop.reason is StopReason.MAX_RUNTIME
    assert standby_stop_reason(limits, t0, t0, 100, "SIGTERM") == Stop(StopReason.STOP_REQUESTED, "SIGTERM")


def test_server_lost_reads_connect_errors_only() -> None:
    assert server_lost("SparkConnectGrpcException: <_MultiThreadedRendezvous of RPC that terminated with: "
                       "status = StatusCode.UNAVAILABLE details = \"failed to connect to all addresses\">")
    assert server_lost("ServerUnavailable: Spark Connect server ... not available after 300s")
    assert not server_lost("PublishError: base changed")
    assert not server_lost("ValueError: bad record")


def test_watchdog_sensor_requests_the_standby_and_its_successor(make_harness: Any) -> None:
    h: Harness = make_harness(delta_mode="continuous")  # FRESHIDX_CONTINUOUS_STANDBY defaults to on
    job = h.defs.resolve_job_def(JOB_NAME)

    def tick() -> Any:
        return h.tick("delta_continuous_watchdog")

    def create(req: dg.RunRequest) -> dg.DagsterRun:
        return h.instance.create_run_for_job(job, tags={**req.tags, "dagster/run_key": req.run_key},
                                             status=dg.DagsterRunStatus.NOT_STARTED)

    (first,) = tick().run_requests
    assert first.run_key == f"{JOB_NAME}:first" and first.tags["freshidx/started_because"] == "none at start-up"
    active = create(first)
    (second,) = tick().run_requests
    assert second.run_key == f"{JOB_NAME}:after:{active.run_id}"
    assert second.tags["freshidx/started_because"] == f"standby for active run {active.run_id}"
    assert "freshidx/role" not in second.tags  # the run tags its role itself, once warmed up
    standby = create(second)
    full = tick()
    assert not full.run_requests and "standby" in (full.skip_message or "")
    h.instance.report_run_failed(active, message="killed")
    (third,) = tick().run_requests  # the standby is now the oldest live run: a new standby behind it
    assert third.run_key == f"{JOB_NAME}:after:{standby.run_id}"
    assert third.tags["freshidx/started_because"] == f"standby for active run {standby.run_id}"


def test_the_loop_fails_a_dead_delta_run_at_once_and_ignores_other_continuous_runs(make_harness: Any) -> None:
    # The continuous loop's view of in-flight delta runs (freshidx.defs.delta.sensor.DagsterDeltaRuns with
    # loop_job): a UI "Materialize" whose worker is gone no longer holds it back (reported failed, with the
    # ledger's reason), one whose worker lives does; a standby run of the loop's own job never does.
    h: Harness = make_harness(delta_mode="continuous")
    asset_job = h.defs.resolve_implicit_global_asset_job_def()

    def started(job: Any, tags: dict[str, str], pid: int, **kw: Any) -> dg.DagsterRun:
        run = h.instance.create_run_for_job(job, tags=tags, status=dg.DagsterRunStatus.STARTED, **kw)
        h.instance.report_engine_event(f"Started process for run (pid: {pid}).", run)
        return run

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    p = at(25)
    dead = started(asset_job, {"freshidx/pipeline": "delta", "freshidx/source_partition": p.path,
                               "freshidx/attempt": "1", "dagster/run_key": f"delta:{p.compact}:a1"}, gone.pid,
                   asset_selection={dg.AssetKey("delta_index")})
    continuous = h.defs.resolve_job_def(JOB_NAME)
    standby = started(continuous, dict(continuous.tags), os.getpid())  # the job's tags: freshidx/pipeline=delta
    view = DagsterDeltaRuns(h.instance, loop_job=JOB_NAME, store=h.store)
    assert view.in_flight() == []  # neither holds the loop back
    run = h.instance.get_run_by_id(dead.run_id)
    assert run is not None and run.status == dg.DagsterRunStatus.FAILURE
    assert f"pid {gone.pid}" in ledger.partition_entries(h.store, "delta", p)["a1.lost"]["reason"]
    assert h.instance.get_run_by_id(standby.run_id).status == dg.DagsterRunStatus.STARTED  # type: ignore[union-attr]
    live = started(asset_job, {"freshidx/pipeline": "delta"}, os.getpid(), asset_selection={dg.AssetKey("delta_index")})
    assert [r.run_id for r in view.in_flight()] == [live.run_id]
    # The sensor's view (no loop_job) is unchanged: every in-flight delta run counts, the continuous one too.
    assert {r.run_id for r in DagsterDeltaRuns(h.instance).in_flight()} == {live.run_id, standby.run_id}


def test_a_standby_lets_go_of_its_session_when_the_server_stops_answering_or_is_replaced() -> None:
    a, b = "sc://127.0.0.1:1#10", "sc://127.0.0.1:2#20"
    step = standby_session_step
    assert step(answers=True, server=a, attached_to=a, released=False, published_since=False) is SessionStep.KEEP
    assert step(answers=False, server=None, attached_to=a, released=False, published_since=False) is \
        SessionStep.RELEASE
    # A promoted spare: the server never stopped answering, but the session went with the old JVM.
    assert step(answers=True, server=b, attached_to=a, released=False, published_since=False) is SessionStep.RELEASE
    # Released: attach again only once a server answers and the active run has published on it.
    assert step(answers=True, server=b, attached_to=a, released=True, published_since=False) is SessionStep.KEEP
    assert step(answers=False, server=None, attached_to=a, released=True, published_since=True) is SessionStep.KEEP
    assert step(answers=True, server=b, attached_to=a, released=True, published_since=True) is SessionStep.ATTACH
    # Without a supervisor nothing names the server: only "not answering" counts.
    assert step(answers=True, server=None, attached_to=None, released=False, published_since=False) is \
        SessionStep.KEEP
