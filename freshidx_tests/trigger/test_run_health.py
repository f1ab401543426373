"""Run health and shutdown accounting, on a real Dagster instance, without Spark.

* the pure decision (:func:`freshidx.trigger.run_health.judge`) and the ``/proc`` probes (dead, zombie-free,
  reused pid);
* :func:`freshidx.defs.runs.health.reap_dead_runs`: a STARTED run whose recorded worker pid is gone
  is reported failed with a message saying why (and its delta attempt gets a ``.lost`` ledger
  entry); a run whose worker is alive, or that has no recorded pid, is left alone;
* :func:`interrupt_runs`: unfinished runs are tagged and ended "interrupted by shutdown";
* attempts interrupted by a shutdown are never counted: neither a delta partition nor an
  ``ads_hourly`` hour is parked because the operator stopped the system; genuine failures still are.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import dagster as dg
import pytest

from freshidx.catchup import planner as catchup
from freshidx.defs.runs.health import interrupt_runs, reap_dead_runs
from freshidx.store import layout
from freshidx.store.partitions import PartitionId
from freshidx.tools.generate import write_partition
from freshidx.trigger import ledger, run_health
from freshidx_tests.catchup.test_catchup import GEN as HOURLY_GEN
from freshidx_tests.catchup.test_catchup import hour
from freshidx_tests.support.harness import Harness, at

STARTED = dg.DagsterRunStatus.STARTED


def _dead_pid() -> tuple[int, float]:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid, time.time()


def test_judge_and_proc_probes() -> None:
    pid, at_ = _dead_pid()
    assert not run_health.pid_alive(pid, at_)
    assert run_health.pid_alive(1, time.time()) or not run_health.pid_alive(1, 0.0)
    # This process started before now, so it is "the same process" for a recent record...
    import os

    me = os.getpid()
    assert run_health.pid_alive(me, time.time())
    # ...but not for a record made long before it started (the pid was reused).
    assert not run_health.pid_alive(me, time.time() - 10 * 365 * 86400)
    facts = [
        run_health.RunFacts("dead", "STARTED", pid, at_),
        run_health.RunFacts("alive", "STARTED", me, time.time()),
        run_health.RunFacts("no-pid", "STARTING", None, None),
        run_health.RunFacts("canceling", "CANCELING", pid, at_),
    ]
    verdicts = {v.run_id: v for v in run_health.judge(facts, run_health.pid_alive)}
    assert set(verdicts) == {"dead", "canceling"}
    assert verdicts["dead"].action == "fail" and f"pid {pid}" in verdicts["dead"].reason
    assert verdicts["canceling"].action == "cancel"
    assert run_health.worker_pid([("Started process for run (pid: 42).", 5.0), ("x", 6.0)]) == (42, 5.0, False)


def _run(h: Harness, tags: dict[str, str], status: dg.DagsterRunStatus = STARTED,
         asset: str = "delta_index") -> dg.DagsterRun:
    job = h.defs.resolve_implicit_global_asset_job_def()
    return h.instance.create_run_for_job(job, tags=tags, status=status, asset_selection={dg.AssetKey(asset)})


def test_reap_dead_runs_marks_failed_and_records_the_lost_delta_attempt(make_harness: Any,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    h = make_harness()
    p = at(25)
    dead = _run(h, {"freshidx/pipeline": "delta", "freshidx/source_partition": p.path, "freshidx/attempt": "1",
                    "dagster/run_key": f"delta:{p.compact}:a1"})
    pid, _ = _dead_pid()
    h.instance.report_engine_event(f"Started process for run (pid: {pid}).", dead)
    alive = _run(h, {})
    import os

    h.instance.report_engine_event(f"Started process for run (pid: {os.getpid()}).", alive)
    no_pid = _run(h, {})

    # Whoever sees the run ended must find why: the ledger entry exists before the run is reported
    # (a reader between the two once found a FAILURE run without its ``a1.lost``).
    entries_when_reported: list[set[str]] = []
    report = h.instance.report_run_failed

    def report_seeing_the_ledger(run: dg.DagsterRun, message: str | None = None) -> Any:
        entries_when_reported.append(set(ledger.partition_entries(h.store, "delta", p)))
        return report(run, message=message)

    monkeypatch.setattr(h.instance, "report_run_failed", report_seeing_the_ledger)
    done = reap_dead_runs(h.instance, h.store)
    assert [v.run_id for v in done] == [dead.run_id]
    assert len(entries_when_reported) == 1 and "a1.lost" in entries_when_reported[0], entries_when_reported
    run = h.instance.get_run_by_id(dead.run_id)
    assert run is not None and run.status == dg.DagsterRunStatus.FAILURE
    assert h.instance.get_run_by_id(alive.run_id).status == STARTED  # type: ignore[union-attr]
    assert h.instance.get_run_by_id(no_pid.run_id).status == STARTED  # type: ignore[union-attr]
    lost = ledger.partition_entries(h.store, "delta", p)["a1.lost"]
    assert lost["run_id"] == dead.run_id and f"pid {pid}" in lost["reason"]
    assert not reap_dead_runs(h.instance, h.store)  # reported once


def test_a_store_that_cannot_take_the_ledger_entry_still_lets_every_dead_run_end(
        make_harness: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    h = make_harness()
    dead = []
    for m in (25, 30):
        p = at(m)
        run = _run(h, {"freshidx/pipeline": "delta", "freshidx/source_partition": p.path, "freshidx/attempt": "1",
                       "dagster/run_key": f"delta:{p.compact}:a1"})
        h.instance.report_engine_event(f"Started process for run (pid: {_dead_pid()[0]}).", run)
        dead.append(run)

    def refused(key: str, data: bytes) -> str:
        raise OSError(f"store down: {key}")

    monkeypatch.setattr(h.store, "create", refused)
    with pytest.raises(OSError, match="store down"):  # the sensor's tick fails and says why
        reap_dead_runs(h.instance, h.store)
    for run in dead:  # ...yet neither run is left STARTED behind a store outage
        ended = h.instance.get_run_by_id(run.run_id)
        assert ended is not None and ended.status == dg.DagsterRunStatus.FAILURE


def test_interrupt_runs_tags_and_ends_unfinished_runs(make_harness: Any) -> None:
    h = make_harness()
    started = _run(h, {})
    queued = _run(h, {}, status=dg.DagsterRunStatus.NOT_STARTED)  # QUEUED needs a code origin
    done = _run(h, {}, status=dg.DagsterRunStatus.SUCCESS)
    ended = interrupt_runs(h.instance)
    assert set(ended) == {started.run_id, queued.run_id}
    s, q, d = (h.instance.get_run_by_id(r.run_id) for r in (started, queued, done))
    assert s is not None and s.status == dg.DagsterRunStatus.FAILURE and run_health.is_interrupted(s.tags)
    assert q is not None and q.status == dg.DagsterRunStatus.CANCELED and run_health.is_interrupted(q.tags)
    assert d is not None and d.status == dg.DagsterRunStatus.SUCCESS and not run_health.is_interrupted(d.tags)


def _end(h: Harness, req: dg.RunRequest, interrupted: bool, asset: str = "delta_index") -> None:
    run = _run(h, {**req.tags, "dagster/run_key": str(req.run_key)}, asset=asset)
    if interrupted:  # what the demo does on a stop: tag, then end the run
        interrupt_runs(h.instance)
    else:
        h.instance.report_run_failed(run, message="genuine failure")


def test_delta_attempts_interrupted_by_shutdown_never_park_the_partition(make_harness: Any) -> None:
    h = make_harness(max_attempts=2)
    for m in (0, 5):
        h.write(m)
    for attempt in range(1, 6):  # five stops in a row while the same partition is in flight
        (req,) = h.tick().run_requests
        assert req.run_key == f"delta:{at(5).compact}:a{attempt}"
        _end(h, req, interrupted=True)
    entries = ledger.partition_entries(h.store, "delta", at(5))
    assert not [k for k in entries if k.startswith("parked")]
    # Genuine failures still count: two of them park the partition.
    for _ in range(2):
        (req,) = h.tick().run_requests
        _end(h, req, interrupted=False)
    data = h.tick()
    assert not data.run_requests and "parked after 2 failed attempts" in str(data.skip_message)


def test_hours_interrupted_by_shutdown_are_never_parked(make_harness: Any) -> None:
    h = make_harness(hourly_max_attempts=2, hourly_max_hours_per_run=1, hourly_late_checks_per_tick=0,
                     close_grace_seconds=0)
    write_partition(h.store, HOURLY_GEN, PartitionId(hour(0)))
    write_partition(h.store, HOURLY_GEN, PartitionId(hour(1)))  # newer data closes hour 0
    hid = layout.hour_id(hour(0))
    for attempt in range(1, 5):  # four stops of the demo while the hour's run is in flight
        (req,) = h.tick("ads_hourly_sensor").run_requests
        assert json.loads(req.tags[catchup.TAG_CLAIMS]) == {hid: f"a{attempt}"}
        _end(h, req, interrupted=True, asset="ads_hourly")
    entries = catchup.hour_entries(h.store, "ads_hourly", hour(0))
    assert {"a1.interrupted", "a2.interrupted", "a3.interrupted"} <= set(entries)
    assert not [k for k in entries if k.startswith("parked")]
    assert "interrupted by shutdown" in entries["a1.interrupted"]["reason"]
    # Genuine failures still count: two of them park the hour.
    for _ in range(2):
        (req,) = h.tick("ads_hourly_sensor").run_requests
        _end(h, req, interrupted=False, asset="ads_hourly")
    data = h.tick("ads_hourly_sensor")
    assert all(hid not in json.loads(r.tags[catchup.TAG_CLAIMS]) for r in data.run_requests)  # parked
    entries = catchup.hour_entries(h.store, "ads_hourly", hour(0))
    assert [k for k in entries if k.startswith("parked")] == ["parked-6"]
    assert entries["parked-6"]["reason"].startswith("2 attempts did not publish")


def test_remediation_never_doubles_a_full_build(make_harness: Any) -> None:
    h = make_harness()
    h.write(0)
    # The schedule and the remediation launch the same job (the heavy pool: freshidx_tests/defs/test_lanes.py).
    assert h.defs.resolve_schedule_def("full_index_schedule").job_name == "full_index_job"
    assert h.defs.resolve_sensor_def("freshidx_sla_sensor").job_name == "full_index_job"

    (req,) = h.tick("freshidx_sla_sensor").run_requests  # no full index yet: remediation
    assert req.run_key == "sla-full:none:a1"
    full = _run(h, {**req.tags, "dagster/run_key": str(req.run_key)}, asset="full_index",
                status=dg.DagsterRunStatus.NOT_STARTED)
    data = h.tick("freshidx_sla_sensor")
    assert not data.run_requests and full.run_id[:8] in str(data.skip_message)
    # Stops of the demo do not use up the remediation attempts.
    for attempt in range(2, 6):
        interrupt_runs(h.instance)
        (req,) = h.tick("freshidx_sla_sensor").run_requests
        assert req.run_key == f"sla-full:none:a{attempt}"
        _run(h, {**req.tags, "dagster/run_key": str(req.run_key)}, asset="full_index")
