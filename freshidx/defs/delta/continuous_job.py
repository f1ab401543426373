"""Continuous mode in Dagster (docs/architecture.md#continuous-mode): the ``delta_continuous`` job and its watchdog.

``delta_continuous`` is one long-lived run (one op) that holds ONE Spark session and, every
``FRESHIDX_CONTINUOUS_TRIGGER_SECONDS``, evaluates the latest-only rule of the sensor
(:func:`freshidx.trigger.latest_only.plan_tick`/``apply``: the same ledger entries, folded partitions,
attempts and parking; ``apply`` also writes the start of the attempt this run claims and runs itself).
On something new it runs one micro-batch with the code a sensor-triggered
``delta_index`` run uses: :func:`freshidx.delta.delta_build.build_delta`, then the step after the build that the
publishing IO manager takes too (:func:`freshidx.delta.after_build.after_build`: the early compare, gate →
manifest → compare-and-swap → ledger, which settles the folded partitions), and
:func:`~freshidx.defs.shared.io_manager.outcome_metadata`, reported as an ``AssetMaterialization`` of
``delta_index`` so the asset page, its plots and checks look the same.
The decisions (when to stop, what a tick means, how an attempt counts) are :mod:`freshidx.trigger.continuous_rules`.

The run ends itself on a planned restart (runtime, memory: on the first idle tick once due, see
:func:`freshidx.trigger.continuous_rules.stop_reason`) or a stop request (SIGTERM, the run tag
``freshidx/stop_requested``: after the micro-batch in progress); a Dagster terminate interrupts it at once (the
compare-and-swap publication keeps that safe). ``delta_continuous_watchdog`` keeps the active run and a
hot standby live (``FRESHIDX_CONTINUOUS_STANDBY``; a run whose worker died is reported failed first, so a
``kill -9`` is noticed in one tick), never more (deterministic run keys). A run that finds an older live run
of the job after its warm-up is the standby and waits, warm, until it is the oldest
(:mod:`freshidx.defs.delta.standby_takeover`); then its loop ticks at once. Every run
carries its own run monitoring limit, ``dagster/max_runtime`` = the planned restart plus a grace
(:func:`freshidx.trigger.continuous_rules.max_runtime_tags`): the instance's default for ordinary runs would cancel
it long before its planned restart, and a run that really hangs is still cancelled.
"""
# No `from __future__ import annotations`: Dagster inspects the op's and sensor's annotations.

import datetime as dt
import functools
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dagster as dg
import psutil

from freshidx.defs.delta.continuous_session import StandbySession, back_off, release_if_draining, warm_up
from freshidx.defs.delta.keep_warm import keep_warm
from freshidx.defs.delta.sensor import DagsterDeltaRuns, partition_observation
from freshidx.defs.delta.standby_takeover import live_runs, wait_until_active
from freshidx.defs.shared.assets import TAG_PIPELINE, TAG_TRIGGER, code_version, hourly_partitions
from freshidx.defs.shared.io_manager import outcome_metadata, outcome_tags
from freshidx.defs.shared.lanes import PRIORITY_DELTA, priority_tag
from freshidx.defs.shared.publishing_io_manager import PublishPolicy
from freshidx.defs.shared.resources import FreshidxSettings, ObjectStoreResource, SparkResource
from freshidx.delta.after_build import after_build
from freshidx.delta.delta_build import DeltaPlan, build_delta
from freshidx.publish.commit import read_pointer, utcnow
from freshidx.settings import PipelineSettings, Settings
from freshidx.store import ObjectStore
from freshidx.store.partitions import PartitionId
from freshidx.trigger import continuous_rules
from freshidx.trigger.continuous_rules import (
    JOB_NAME,
    TAG_MODE,
    TRIGGER,
    BatchStatus,
    Limits,
    LoopRuns,
    LoopState,
    Stop,
    StopReason,
    TickKind,
)
from freshidx.trigger.continuous_standby import TAG_ENDED, restart_waits, standby_stop_reason, successor
from freshidx.trigger.latest_only import PIPELINE, DeltaRequest, apply, plan_tick
from freshidx.trigger.listing import Ignored

TAG_STOP = "freshidx/stop_requested"
#: After a failed micro-batch the loop waits this long before the next attempt (the asset's retry delay), or
#: less when the Spark Connect server went away and answers again (continuous_session.back_off).
FAILURE_BACKOFF_SECONDS = 10.0
#: How often the loop reads its own run's tags for a stop request.
STOP_TAG_EVERY_SECONDS = 5.0


class _WakeUp(Exception):
    """Raised by the SIGTERM handler to end the trigger wait at once."""


class _Stopper:
    """SIGTERM → a stop request: honoured at once while the loop waits, after the micro-batch otherwise."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self.waiting = False

    def handler(self, signum: int, frame: Any) -> None:
        self.requested = f"received {signal.Signals(signum).name}"
        if self.waiting:
            raise _WakeUp()

    @contextmanager
    def installed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield  # signals are only delivered to the main thread; Dagster's terminate still works
            return
        previous = signal.signal(signal.SIGTERM, self.handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)

    def wait(self, seconds: float) -> None:
        if self.requested or seconds <= 0:
            return
        self.waiting = True
        try:
            time.sleep(seconds)  # a Dagster terminate (KeyboardInterrupt-style interrupt) ends it too
        except _WakeUp:
            pass
        finally:
            self.waiting = False


def rss_mb() -> float | None:
    """Resident memory of this run process (the driver; a local Spark JVM is a child and not counted)."""
    try:
        return psutil.Process().memory_info().rss / 2**20
    except psutil.Error:
        return None


@dg.op(
    name="delta_continuous_loop",
    description="Holds one Spark session and evaluates the latest-only rule every "
    "FRESHIDX_CONTINUOUS_TRIGGER_SECONDS; each new partition becomes one micro-batch published like a "
    "delta_index run and reported as its materialization. A standby run waits, warm, until no older run of "
    "the job is live. Ends itself on a planned restart.",
    tags={"freshidx/lane": "delta"},
    # No pool: this run lives for hours, and in the delta pool it would hold a UI "Materialize" of
    # delta_index in the queue all that time. The loop's planner waits instead while any delta_index
    # run is queued or running (the sensor's overlap rule) and starts no micro-batch meanwhile.
)
def delta_continuous_loop(context: dg.OpExecutionContext, store: ObjectStoreResource, spark: SparkResource,
                          freshidx: FreshidxSettings) -> None:
    settings = freshidx.settings(store.uri, store.endpoint_url)
    st = store.open()
    limits = Limits.from_settings(settings)
    state = LoopState(context.run_id, utcnow(), limits)
    stopper = _Stopper()
    context.log.info(f"continuous delta: trigger every {limits.trigger_seconds} s, planned restart at "
                     f"{limits.restart_at(state.started_at).isoformat()} or at {limits.max_rss_mb} MiB RSS")
    if (unguarded := continuous_rules.max_runtime_tag_problem(context.run.tags, limits)) is not None:
        context.log.warning(unguarded)
    warm_up(context, spark)
    _probe_writes(context, st)
    with stopper.installed():
        # A standby (an older run is live) waits here, warm, until it is the oldest live run.
        stop = wait_until_active(context, stop_check=lambda: _standby_stop(context, limits, state, stopper),
                                 wait=stopper.wait,
                                 idle=StandbySession(context, spark, lambda: _serving_version(st)))
        if stop is not None:
            _ended(context, st, state, stop, active=False)
            return
        stop = _loop(context, st, store, spark, settings, state, stopper)
    _ended(context, st, state, stop)


def _probe_writes(context: dg.OpExecutionContext, st: ObjectStore) -> None:
    """Check now, once per process, that the store enforces conditional writes: otherwise a standby's first
    write after its takeover does it, a few store round trips on the way to the first publication."""
    try:
        st.check_conditional_writes()
    except Exception as exc:  # the first write checks again and fails the micro-batch, with this reason
        context.log.warning(f"checking the store's conditional writes failed ({exc}); the first write checks again")


def _serving_version(st: ObjectStore) -> str | None:
    pointer, _ = read_pointer(st, PIPELINE)
    return pointer.version if pointer else None


def _standby_stop(context: dg.OpExecutionContext, limits: Limits, state: LoopState, stopper: "_Stopper") -> Stop | None:
    """A standby ends on a stop request, its memory bound or half its planned runtime (its age counts from its
    start, as run monitoring's limit does); the watchdog then starts another."""
    t = time.monotonic()
    if t - state.stop_checked >= STOP_TAG_EVERY_SECONDS:
        state.stop_checked = t
        stopper.requested = stopper.requested or _stop_tag(context)
    state.rss_mb = rss_mb()
    return standby_stop_reason(limits, state.started_at, utcnow(), state.rss_mb, stopper.requested)


def _loop(context: dg.OpExecutionContext, st: ObjectStore, store: ObjectStoreResource, spark: SparkResource,
          settings: Settings, state: LoopState, stopper: "_Stopper") -> Stop:
    """The active run's loop: one evaluation of the latest-only rule per tick, until a stop."""
    limits = state.limits
    # Other continuous runs (a standby) are not delta runs to wait for; a dead delta run is failed at once.
    runs = LoopRuns(context.run_id, DagsterDeltaRuns(context.instance, loop_job=JOB_NAME, store=st))
    partitions_def = hourly_partitions(settings)
    warmth = continuous_rules.Warmth()
    published = state.published
    cursor: dict[str, Any] = {}
    released = False
    while True:
        t0 = time.monotonic()
        if t0 - state.stop_checked >= STOP_TAG_EVERY_SECONDS:
            state.stop_checked = t0
            stopper.requested = stopper.requested or _stop_tag(context)
        now = utcnow()
        state.rss_mb = rss_mb()
        plan = plan_tick(st, settings, runs, now, cursor)  # reads only: apply() writes the decisions
        stop = continuous_rules.stop_reason(limits, state.started_at, now, state.rss_mb, stopper.requested,
                                            pending=plan.request is not None)
        if stop is not None and not _restart_waits(context, settings, state, stop, now):
            return stop
        _report_ignored(context, plan.ignored)
        applied = apply(st, plan, run_by=context.run_id)  # this run executes what it claims: started with it
        cursor = plan.cursor
        for p, meta in applied.observations:
            context.log_event(partition_observation(partitions_def, p, meta))
        action = continuous_rules.decide(applied)
        state.ticks += 1
        state.last_tick, state.last_action = now, action.reason
        failed = False
        if action.kind is TickKind.MICRO_BATCH and action.request is not None:
            context.log.info(action.reason)
            state.batches += 1
            status = _micro_batch(context, st, store, spark, settings, runs, action.request, state)
            failed = status is BatchStatus.FAILURE
        if action.kind is TickKind.MICRO_BATCH:
            released = False  # the micro-batch leased and connected again
        elif not released:
            released = release_if_draining(context, spark)
        if action.kind is TickKind.IDLE and not released:
            keep_warm(context, st, store, spark, settings, warmth, now, published=state.published > published)
            published = state.published
        if continuous_rules.heartbeat_due(state, now, action.kind is TickKind.MICRO_BATCH):
            _write_heartbeat(context, st, state, utcnow())
        if failed:
            back_off(context, spark, stopper.wait, t0 + FAILURE_BACKOFF_SECONDS, state.last_failure,
                     lambda: bool(stopper.requested))
        else:
            stopper.wait(limits.trigger_seconds - (time.monotonic() - t0))


def _restart_waits(context: dg.OpExecutionContext, settings: Settings, state: LoopState, stop: Stop,
                   now: dt.datetime) -> bool:
    """A planned restart that is due waits (logged once) while its standby is still warming up."""
    after = successor(context.run_id, live_runs(context.instance)) if settings.continuous_standby else None
    overdue = (now - state.limits.restart_at(state.started_at)).total_seconds()
    waits = restart_waits(stop, settings.continuous_standby, after, overdue, state.rss_mb, state.limits)
    if waits and after is not None and not state.restart_waiting:
        context.log.info(f"{stop.message}: waiting for the standby {after.run_id} to finish warming up first")
    state.restart_waiting = waits
    return waits


def _report_ignored(context: dg.OpExecutionContext, ignored: list[Ignored]) -> None:
    """Malformed partition keys the tick's listing ignored, as the sensor reports them: once per changed set."""
    if not ignored:
        return
    for i in ignored[:20]:
        context.log.warning(f"ignored malformed partition key {i.key!r}: {i.reason}")
    context.log_event(dg.AssetObservation(
        asset_key="raw_ad_updates",
        metadata={"ignored_keys": len(ignored), "examples": dg.MetadataValue.json([i.__dict__ for i in ignored[:20]])}))


def _ended(context: dg.OpExecutionContext, st: ObjectStore, state: LoopState, stop: Stop, *,
           active: bool = True) -> None:
    """The loop's last heartbeat (the active run's only: a standby's would overwrite the active one's), log line
    and run tag: why it ended. The tag also tells a standby that this run publishes no more."""
    if active:
        _write_heartbeat(context, st, state, utcnow(), ended=stop)
    context.log.info(f"continuous delta ends{'' if active else ' (standby)'}: {stop.message}; {state.batches} "
                     f"micro-batches, {state.published} published in {state.ticks} ticks")
    context.instance.add_run_tags(context.run_id, {TAG_ENDED: stop.reason.value})


def _stop_tag(context: dg.OpExecutionContext) -> str | None:
    run = context.instance.get_run_by_id(context.run_id)
    value = run.tags.get(TAG_STOP) if run is not None else None
    return f"run tag {TAG_STOP}={value}" if value else None


def _run_info(context: dg.OpExecutionContext, settings: Settings, req: DeltaRequest,
              policy: PublishPolicy) -> dict[str, Any]:
    """The draft's run record, as ``delta_index`` writes it (:func:`freshidx.defs.shared.assets.run_info`),
    for this micro-batch."""
    return {
        "run_id": context.run_id, "trigger": TRIGGER, "run_key": req.run_key, "attempt": str(req.attempt),
        "sensor": context.run.tags.get("dagster/sensor_name"), "schedule": None, "code_version": code_version(),
        "settings": {"window_minutes": settings.window_minutes, "delta_shards": settings.delta_shards,
                     "full_shards": settings.full_shards, "source": settings.source},
        **policy.run_record(),
    }


def _micro_batch(context: dg.OpExecutionContext, st: ObjectStore, store: ObjectStoreResource,
                 spark: SparkResource, settings: Settings, runs: LoopRuns, req: DeltaRequest,
                 state: LoopState) -> BatchStatus:
    """One accepted attempt, built and published as a sensor-triggered ``delta_index`` run does it (its claim
    and start are in the ledger already: :func:`freshidx.trigger.latest_only.apply`)."""
    p = req.partition
    state.last_failure = ""
    pointer, _ = read_pointer(st, PIPELINE)
    watermark = PartitionId.parse(pointer.source_partition) if pointer and pointer.source_partition else None
    policy = PublishPolicy(max_drop_fraction=settings.delta_max_drop_fraction)
    # The same log lines as delta_index (the freshness bench reads them per stage).
    context.log.info(f"building delta for {p.path} (watermark {watermark.path if watermark else None})")
    try:
        with spark.session(keep_as=PIPELINE) as session:
            draft = build_delta(
                session, st, store.store_config(), settings,
                DeltaPlan(partition=p, watermark=watermark, run_id=context.run_id,
                          run_info=_run_info(context, settings, req, policy)),
                on_stage=lambda name, s: context.log.info(f"{name}: {s:.2f}s"),
            )
    except Exception as exc:  # a failed attempt, as a failed run is in sensor mode; the planner retries/parks
        state.last_failure = f"{type(exc).__name__}: {exc}"
        return failed_attempt(context, runs, req, exc)
    try:  # what delta_index's body and its IO manager do with the draft: the same step after the build
        done = after_build(st, draft, context.run_id)
    except Exception as exc:  # e.g. PublishError (CAS contention), a store error: the attempt failed
        state.last_failure = f"{type(exc).__name__}: {exc}"
        return failed_attempt(context, runs, req, exc)
    result = done.result
    status = continuous_rules.batch_status(result.outcome, result.reason)
    runs.record(req.run_key, status, result.reason)
    meta = outcome_metadata(st, draft, result, skipped=str(req.skipped), manifest_written=done.manifest_written)
    state.last_version = draft.version if result.outcome == "published" else state.last_version
    if done.manifest_written:
        # A materialization per publication attempt that reached the CAS, as the IO manager reports it.
        state.published += result.outcome == "published"
        context.log_event(dg.AssetMaterialization(asset_key="delta_index", metadata={**meta, **spark.spark_metadata()},
                                                  description=f"{result.outcome}: {draft.version} for {p.path}"))
        context.instance.add_run_tags(context.run_id, outcome_tags(draft, result))
        context.log.info(f"{result.outcome} delta {draft.version} for {p.path} ({result.reason})")
    else:
        headline = f"nothing new: delta not published: {result.reason}" if result.outcome != "invalid" else \
            f"delta {draft.version} not published: {result.reason}"
        context.log_event(dg.AssetObservation(asset_key="delta_index", description=headline, metadata=meta))
        context.log.warning(headline + ("; retried on the next tick" if status is BatchStatus.RETRY else ""))
    return status


def failed_attempt(context: dg.OpExecutionContext, runs: LoopRuns, req: DeltaRequest, exc: Exception) -> BatchStatus:
    """A failed micro-batch attempt: its error line (``micro-batch for <P> (attempt N) failed: …``, the
    line ``freshidx bench soak --mode continuous`` counts) and the attempt recorded as a failure."""
    text = str(exc).strip()
    how = f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:300]
    context.log.error(f"micro-batch for {req.partition.path} (attempt {req.attempt}) failed: {how}")
    runs.record(req.run_key, BatchStatus.FAILURE, how)
    return BatchStatus.FAILURE


def _write_heartbeat(context: dg.OpExecutionContext, st: ObjectStore, state: LoopState, now: dt.datetime,
                     ended: Stop | None = None) -> None:
    try:
        continuous_rules.heartbeat(state, now, ended=ended).write(st, PIPELINE)
        state.heartbeat_at = now
    except Exception as exc:  # status only: never a reason to stop publishing
        context.log.warning(f"heartbeat not written: {exc}")


@functools.cache
def _continuous_job(max_runtime_seconds: float) -> dg.JobDefinition:
    # One definition per planned restart: the job the location lists and the one its watchdog targets are
    # the same object (Dagster refuses two different jobs of one name).
    @dg.job(
        name=JOB_NAME,
        description="Continuous mode (FRESHIDX_DELTA_MODE=continuous): one long-lived run that keeps a Spark "
        "session warm and publishes each new partition as a delta_index micro-batch; started and restarted by "
        "delta_continuous_watchdog.",
        tags={TAG_PIPELINE: PIPELINE, TAG_MODE: "continuous", TAG_TRIGGER: TRIGGER, **priority_tag(PRIORITY_DELTA),
              **continuous_rules.max_runtime_tags(max_runtime_seconds)},
    )
    def delta_continuous() -> None:
        delta_continuous_loop()

    return delta_continuous


def make_delta_continuous(settings: PipelineSettings) -> dg.JobDefinition:
    """The ``delta_continuous`` job. Its runs, however launched (the watchdog, the UI), carry their own
    run monitoring limit: the planned restart (``FRESHIDX_CONTINUOUS_MAX_RUNTIME``) plus a grace
    (:func:`freshidx.trigger.continuous_rules.max_runtime_tags`), not the instance's default for ordinary runs."""
    return _continuous_job(float(settings.continuous_max_runtime))


#: The job for the default settings (imports of earlier releases); the code location builds its own from
#: its settings (:func:`make_delta_continuous`), which is this object when they keep the default.
delta_continuous = _continuous_job(float(PipelineSettings.model_fields["continuous_max_runtime"].default))


__all__ = ["StopReason", "delta_continuous", "make_delta_continuous"]
