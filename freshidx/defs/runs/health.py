"""Dagster side of run health: notice dead run workers fast, and end runs cleanly on shutdown.

* :func:`reap_dead_runs` (called every ~5 s by ``freshidx_run_health_sensor``): for each run of
  this instance that is STARTING/STARTED/CANCELING, read the worker pid the launcher recorded and
  report the run failed (or canceled) if that process is gone, with a message saying so. For a
  delta run it first writes ``P.aN.lost`` in the ledger, so the jump to the newest partition that
  the delta sensor makes on its next tick has a durable reason. Decisions: :mod:`freshidx.trigger.run_health`.
* :func:`interrupt_runs`: what ``freshidx demo`` does to runs it leaves behind on a stop, and to runs
  a previous demo left behind: tag them :data:`~freshidx.trigger.run_health.TAG_INTERRUPTED` (never counted as
  a failed attempt) and mark them canceled/failed "interrupted by shutdown".

Only public Dagster APIs: ``get_runs``/``get_records_for_run``/``report_run_failed``/
``report_run_canceled``/``add_run_tags``.
"""
# No `from __future__ import annotations`: Dagster inspects the sensor's annotations.

import contextlib

import dagster as dg

from freshidx import procs
from freshidx.defs.runs.run_status import IN_FLIGHT, RUNNING
from freshidx.defs.shared.assets import TAG_ATTEMPT, TAG_PARTITION, TAG_PIPELINE
from freshidx.defs.shared.resources import ObjectStoreResource
from freshidx.store import ObjectStore
from freshidx.store.partitions import PartitionError, PartitionId
from freshidx.trigger import ledger, run_health
from freshidx.trigger.lifecycle import Decision, Mark, TriggerId

NOT_FINISHED = IN_FLIGHT  # the name this module's callers (the demo, its tests) use
__all__ = ["NOT_FINISHED", "RUNNING", "end_if_worker_dead"]
_MAX_RUNS = 100
_PID_EVENTS = 20  # the pid event is among a run's first engine events


def run_facts(instance: dg.DagsterInstance, run: dg.DagsterRun, location: str | None = None) -> run_health.RunFacts:
    """What the run-health judge needs about ``run``: status, the worker pid it logged, the worker's
    identity tag, and whether code location ``location`` (the judging sensor's; None = unknown) launched it."""
    conn = instance.get_records_for_run(run.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT,
                                        limit=_PID_EVENTS, ascending=True)
    pid, at, exited = run_health.worker_pid(
        (r.event_log_entry.message or "", r.event_log_entry.timestamp) for r in conn.records)
    origin = run.remote_job_origin
    launched_here = location is None or origin is None or origin.location_name == location
    return run_health.RunFacts(run.run_id, run.status.value, pid, at, exited,
                               worker=run.tags.get(run_health.TAG_WORKER), launched_here=launched_here)


def checks_worker_pids(instance: dg.DagsterInstance) -> bool:
    # Only the default launcher starts run workers as local processes of the code server that
    # also evaluates this sensor; with another launcher a pid means nothing here.
    try:
        return isinstance(instance.run_launcher, dg.DefaultRunLauncher)
    except Exception:
        return False


def reap_dead_runs(instance: dg.DagsterInstance, store: ObjectStore | None = None,  # type: ignore[no-untyped-def]
                   alive=run_health.pid_alive, location: str | None = None,
                   place: str | None = None) -> list[run_health.Verdict]:
    """Report every in-flight run whose worker is gone; return what was decided. ``location`` is the
    judging code location's name, ``place`` where its pids are (default :func:`run_health.here`)."""
    if not checks_worker_pids(instance):
        return []
    runs = instance.get_runs(dg.RunsFilter(statuses=RUNNING), limit=_MAX_RUNS)
    verdicts = run_health.judge([run_facts(instance, r, location) for r in runs], alive, place)
    done: list[run_health.Verdict] = []
    # A store that cannot be written still lets every dead run end; the sensor's tick then fails loudly.
    unwritten: list[Exception] = []
    for v in verdicts:
        if _end_dead_run(instance, v, store, unwritten):
            done.append(v)
    if unwritten:
        raise unwritten[0]
    return done


def end_if_worker_dead(instance: dg.DagsterInstance, run: dg.DagsterRun,
                       store: ObjectStore | None = None) -> str | None:
    """Why ``run``'s worker is gone, after reporting the run failed (canceled if it was canceling); None while
    it lives or cannot be judged here. One run's share of :func:`reap_dead_runs`, for those that must not wait
    for the run-health sensor's tick: the continuous watchdog, a standby watching the active run, the
    continuous loop finding a delta run in flight (docs/architecture.md#continuous-mode)."""
    if run.status not in RUNNING:
        return None
    verdicts = run_health.judge([run_facts(instance, run)], run_health.pid_alive)
    if not verdicts:
        return None
    unwritten: list[Exception] = []
    if not _end_dead_run(instance, verdicts[0], store, unwritten):
        return None
    if unwritten:
        raise unwritten[0]
    return verdicts[0].reason


def _end_dead_run(instance: dg.DagsterInstance, v: run_health.Verdict, store: ObjectStore | None,
                  unwritten: list[Exception]) -> bool:
    """Report the run of verdict ``v`` ended (False if it finished meanwhile); a ledger write that fails is
    appended to ``unwritten`` (the run still ends)."""
    run = instance.get_run_by_id(v.run_id)  # re-read: a worker writes its outcome before it exits
    if run is None or run.status not in RUNNING:
        return False
    # The ledger's reason first: whoever sees the run ended (the delta sensor jumping on, an
    # operator, a test) must find why, never a finished run without its ``P.aN.lost``.
    if store is not None:
        try:
            _record_lost_delta(store, run, v.reason)
        except Exception as e:
            unwritten.append(e)
    if v.action == "cancel":
        instance.report_run_canceled(run, message=v.reason)
    else:
        instance.report_run_failed(run, message=v.reason)
    return True


def _record_lost_delta(store: ObjectStore, run: dg.DagsterRun, reason: str) -> None:
    if run.tags.get(TAG_PIPELINE) != "delta" or not run.tags.get(TAG_ATTEMPT):
        return
    try:
        p = PartitionId.parse(run.tags.get(TAG_PARTITION, ""))
    except PartitionError:
        return
    attempt = run.tags[TAG_ATTEMPT]
    why = f"{reason}; the delta sensor retries it or jumps to the newest partition"
    kw = {"run_id": run.run_id, "run_key": run.tags.get("dagster/run_key")}
    if attempt.isdigit():  # what the sensor writes
        ledger.record_partition(store, "delta", p, Decision.FAILED, why, attempt=int(attempt),
                                tid=TriggerId(p.compact).claim(int(attempt)).then(Mark.LOST), **kw)
    else:  # a hand-set tag: recorded under the id it spells, as before
        trigger_id = f"{p.compact}.a{attempt}.{Mark.LOST}"
        ledger.record(store, ledger.partition_key("delta", p, trigger_id.removeprefix(p.compact)),
                      ledger.Entry("delta", trigger_id, Decision.FAILED, why, partition=p.path, **kw))


def tag_interrupted(instance: dg.DagsterInstance, run_ids: list[str]) -> None:
    for run_id in run_ids:
        with contextlib.suppress(Exception):  # a run deleted meanwhile
            instance.add_run_tags(run_id, {run_health.TAG_INTERRUPTED: run_health.INTERRUPTED_BY_SHUTDOWN})


def interrupt_runs(instance: dg.DagsterInstance, reason: str = run_health.SHUTDOWN_REASON,
                   kill_workers: bool = False) -> list[str]:
    """Tag every unfinished run as interrupted and end it: queued ones canceled, running ones failed
    with ``reason`` (canceling ones canceled). With ``kill_workers`` a still-live recorded worker is
    killed first (a run left by a demo that was itself killed). Returns the run ids ended."""
    runs = instance.get_runs(dg.RunsFilter(statuses=NOT_FINISHED), limit=_MAX_RUNS)
    tag_interrupted(instance, [r.run_id for r in runs])
    ended: list[str] = []
    for r in runs:
        if kill_workers and r.status in RUNNING:
            f = run_facts(instance, r)
            if (f.pid is not None and f.pid_recorded_at is not None and run_health.judged_here(f, run_health.here())
                    and run_health.pid_alive(f.pid, f.pid_recorded_at)):
                procs.kill_all([f.pid])
        run = instance.get_run_by_id(r.run_id)
        if run is None or run.is_finished:
            continue
        if run.status == dg.DagsterRunStatus.STARTED or run.status == dg.DagsterRunStatus.STARTING:
            instance.report_run_failed(run, message=f"{reason} (freshidx demo)")
        else:
            instance.report_run_canceled(run, message=f"{reason} (freshidx demo)")
        ended.append(run.run_id)
    return ended


_GENERIC_FAILURE = "from outside the execution context"  # report_run_failed's default message


def failure_reason(instance: dg.DagsterInstance, run_id: str, limit: int = 240) -> str:
    """One line saying why a run failed or was canceled: the failing step's error, else the run
    failure message, else (for Dagster's generic message) the crash explanation the code server
    logged as an engine event ("... was terminated by signal 9 (SIGKILL)")."""
    types = {dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.RUN_FAILURE,
             dg.DagsterEventType.RUN_CANCELED, dg.DagsterEventType.ENGINE_EVENT}
    conn = instance.get_records_for_run(run_id, of_type=types, ascending=False, limit=10)
    run_message = engine = ""
    for r in conn.records:
        entry = r.event_log_entry
        ev = entry.dagster_event
        if ev is None:
            continue
        if ev.is_step_failure and ev.step_failure_data.error is not None:
            return _first_line(ev.step_failure_data.error.message, limit)
        if ev.event_type in (dg.DagsterEventType.RUN_FAILURE, dg.DagsterEventType.RUN_CANCELED):
            run_message = run_message or entry.message or ""
        elif not engine and any(w in (entry.message or "") for w in ("terminated by signal", "unexpectedly exited")):
            engine = entry.message or ""
    if engine and (not run_message or _GENERIC_FAILURE in run_message):
        return _first_line(engine, limit)
    return _first_line(run_message, limit) or "(no failure message recorded)"


def _first_line(text: str, limit: int) -> str:
    line = next((ln.strip() for ln in (text or "").splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def make_run_health_sensor(interval_seconds: int = 5) -> dg.SensorDefinition:
    @dg.sensor(
        name="freshidx_run_health_sensor",
        minimum_interval_seconds=max(1, interval_seconds - 1),
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Marks runs whose worker process is gone as failed within seconds (the default run "
        "launcher has no health check), so latest-only and catch-up triggers move on.",
    )
    def freshidx_run_health_sensor(context: dg.SensorEvaluationContext,
                                   store: ObjectStoreResource) -> dg.SkipReason:
        origin = context.code_location_origin
        done = reap_dead_runs(context.instance, store.open(), location=origin.location_name if origin else None)
        for v in done:
            context.log.warning(f"run {v.run_id}: {v.reason}")
        return dg.SkipReason("; ".join(f"{v.run_id[:8]}: {v.reason}" for v in done) or "all in-flight runs alive")

    return freshidx_run_health_sensor
