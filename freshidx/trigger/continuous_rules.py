"""Continuous mode: the decisions of the long-lived micro-batch loop, without Dagster
(docs/architecture.md#continuous-mode).

One run holds a warm Spark session and, every ``continuous_trigger_seconds``, evaluates the same
latest-only rule the sensor evaluates (:func:`freshidx.trigger.latest_only.plan_tick`/``apply``: nothing newer
than the watermark → idle; newer → ONE micro-batch for the newest, the partitions in between folded).
This module decides what a tick means (:func:`decide`), when the run ends itself
(:func:`stop_reason`: a planned restart on runtime or memory, or a stop request), what the loop knows
about the micro-batches it ran (:class:`LoopRuns`, the ``DeltaRunIndex`` the planner asks, so attempts,
retries and parking count exactly as for sensor runs), what its heartbeat says
(:func:`heartbeat`) and how long run monitoring lets it live (:func:`max_runtime_tags`). The effects
(store reads/writes, Spark, Dagster events) are ``freshidx.defs.delta.continuous_job``.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from freshidx.publish.commit import iso, parse_iso
from freshidx.settings import PipelineSettings
from freshidx.store.records import Heartbeat
from freshidx.trigger.latest_only import DeltaApplied, DeltaRequest, DeltaRun, DeltaRunIndex

#: Tags of continuous runs (the watchdog's requests, and how the sensor tells them apart).
TAG_MODE = "freshidx/delta_mode"
TAG_WHY = "freshidx/started_because"
JOB_NAME = "delta_continuous"
TRIGGER = "continuous"  # the manifest's run.trigger and the materialization's "trigger"
#: A refusal that says another publisher moved the delta under this micro-batch: retried next tick.
BASE_CHANGED = "base changed"


class StopReason(StrEnum):
    """Why a continuous run ends itself (all planned: the watchdog starts the next run)."""

    MAX_RUNTIME = "max_runtime"  # planned restart: FRESHIDX_CONTINUOUS_MAX_RUNTIME passed
    MAX_MEMORY = "max_memory"  # planned restart: the run process's RSS passed FRESHIDX_CONTINUOUS_MAX_RSS_MB
    STOP_REQUESTED = "stop_requested"  # the mode was switched off, or the caller asked


@dataclass(frozen=True)
class Limits:
    trigger_seconds: float
    max_runtime_seconds: float
    max_rss_mb: int

    @classmethod
    def from_settings(cls, settings: PipelineSettings) -> Limits:
        return cls(settings.continuous_trigger_seconds, settings.continuous_max_runtime,
                   settings.continuous_max_rss_mb)

    def restart_at(self, started_at: dt.datetime) -> dt.datetime:
        return started_at + dt.timedelta(seconds=self.max_runtime_seconds)


@dataclass(frozen=True)
class Stop:
    reason: StopReason
    detail: str

    @property
    def message(self) -> str:
        return f"planned restart ({self.reason.value}): {self.detail}" if self.reason is not StopReason.STOP_REQUESTED \
            else f"stopping ({self.reason.value}): {self.detail}"


#: A planned restart waits for an idle tick (a restart costs the next micro-batch a session start), but
#: at most this long past its due time: a loop that is never idle still restarts.
RESTART_GRACE = dt.timedelta(minutes=5)
#: Past this multiple of the memory bound the loop stops even with a micro-batch pending.
MEMORY_HARD = 1.5


def stop_reason(limits: Limits, started_at: dt.datetime, now: dt.datetime, rss_mb: float | None,
                stop_requested: str | None = None, *, pending: bool = False) -> Stop | None:
    """Should the loop end instead of this tick? A stop request ends it at once (between micro-batches).
    A planned restart (runtime, then memory) is due from the limit on, and is taken on the first tick
    with nothing ``pending`` (no micro-batch to run), or regardless once :data:`RESTART_GRACE` passed."""
    if stop_requested:
        return Stop(StopReason.STOP_REQUESTED, stop_requested)
    age = (now - started_at).total_seconds()
    stop: Stop | None = None
    if age >= limits.max_runtime_seconds:
        stop = Stop(StopReason.MAX_RUNTIME, f"ran {age:.0f} s, limit {limits.max_runtime_seconds:.0f} s")
    elif rss_mb is not None and rss_mb >= limits.max_rss_mb:
        stop = Stop(StopReason.MAX_MEMORY, f"run process RSS {rss_mb:.0f} MiB, limit {limits.max_rss_mb} MiB")
    if stop is None or not pending:
        return stop
    overdue = age - limits.max_runtime_seconds if stop.reason is StopReason.MAX_RUNTIME else 0.0
    if stop.reason is StopReason.MAX_MEMORY and rss_mb is not None and rss_mb >= limits.max_rss_mb * MEMORY_HARD:
        return stop  # far past the bound: no more micro-batches in this process
    return stop if overdue >= RESTART_GRACE.total_seconds() else None


# ------------------------------------------------------------------------------------------ run monitoring

#: Dagster's per-run limit (seconds) for run monitoring; it wins over the instance's
#: ``run_monitoring.max_runtime_seconds``, which is sized for ordinary runs and would cancel this one.
MAX_RUNTIME_TAG = "dagster/max_runtime"
#: How long a continuous run may legitimately outlive its planned restart, measured from Dagster's start
#: time. The restart is taken on the first idle tick once due, but at most :data:`RESTART_GRACE` late
#: while micro-batches keep coming; the micro-batch begun just before that must finish (it may be a
#: window rebuild, the slow path of docs/benchmarks.md, stretched by a loaded box and a larger window:
#: 20 minutes); and the worker's start before the loop's clock starts (code load, resources) and the
#: shutdown after it (last heartbeat, Spark session release, run end events) take a few minutes at most
#: (5). Past that the run is hung, and run monitoring cancels it: the limit stays finite.
RUNTIME_TAG_GRACE = RESTART_GRACE + dt.timedelta(minutes=20) + dt.timedelta(minutes=5)


def monitoring_max_runtime(max_runtime_seconds: float) -> int:
    """Run monitoring's limit for a continuous run planned to restart after ``max_runtime_seconds``:
    that plus :data:`RUNTIME_TAG_GRACE`, in whole seconds rounded up (never below the plan)."""
    return math.ceil(max_runtime_seconds + RUNTIME_TAG_GRACE.total_seconds())


def max_runtime_tags(max_runtime_seconds: float) -> dict[str, str]:
    """The run tag every continuous run carries (the job's tags and the watchdog's requests)."""
    return {MAX_RUNTIME_TAG: str(monitoring_max_runtime(max_runtime_seconds))}


def max_runtime_tag_problem(tags: Mapping[str, str], limits: Limits) -> str | None:
    """Why run monitoring would end this run other than by its planned restart (a tag changed in the
    launchpad, a run launched without the job's tags), as the warning the run logs at its start; else None.
    Dagster reads ``dagster/max_runtime``, then ``dagster/max_runtime_seconds``, else the instance default;
    an unparsable value or 0 means no limit."""
    value = tags.get(MAX_RUNTIME_TAG, tags.get("dagster/max_runtime_seconds"))
    need = monitoring_max_runtime(limits.max_runtime_seconds)
    if value is None:
        return (f"no {MAX_RUNTIME_TAG} tag: the instance's run_monitoring.max_runtime_seconds applies and may "
                f"cancel this run before its planned restart (set {MAX_RUNTIME_TAG}={need})")
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if seconds == 0:
        return f"{MAX_RUNTIME_TAG}={value!r} sets no limit: a hung run is never cancelled (set it to {need})"
    if seconds < need:
        return (f"{MAX_RUNTIME_TAG}={value} is below this run's planned restart plus its grace ({need} s): run "
                f"monitoring may cancel it before it restarts itself")
    return None


# ------------------------------------------------------------------------------------------ a tick


class TickKind(StrEnum):
    IDLE = "idle"  # nothing newer than the watermark, or the rule skipped (in flight, parked, …)
    MICRO_BATCH = "micro_batch"


@dataclass(frozen=True)
class TickAction:
    kind: TickKind
    reason: str
    request: DeltaRequest | None = None


def decide(applied: DeltaApplied) -> TickAction:
    """What the loop does with one applied evaluation of the latest-only rule."""
    if applied.request is not None:
        r = applied.request
        return TickAction(TickKind.MICRO_BATCH, f"micro-batch for {r.partition.path} (attempt {r.attempt}, "
                                                f"folded {r.skipped})", r)
    return TickAction(TickKind.IDLE, applied.skip_reason or "nothing to do")


#: Words of an error that says the Spark Connect server went away (gRPC's, pyspark's, the lease's).
SERVER_LOST_MARKERS = ("UNAVAILABLE", "Connection refused", "failed to connect", "Socket closed",
                       "Connection reset", "SESSION_CLOSED", "NO_ACTIVE_SESSION", "ServerUnavailable",
                       "ControlUnreachable")


def server_lost(error: str) -> bool:
    """Whether a failed micro-batch's error says the Spark Connect server went away (so the loop retries as
    soon as the server answers again, not after the back-off)."""
    return any(m.lower() in error.lower() for m in SERVER_LOST_MARKERS)


#: The status :class:`LoopRuns` reports for a claimed run key that no run carries.
LOST = "LOST"


class BatchStatus(StrEnum):
    """How one micro-batch of the loop ended, as the planner's run statuses spell it."""

    SUCCESS = "SUCCESS"  # published, or refused as not newer (a green run in sensor mode)
    FAILURE = "FAILURE"  # the build raised, or the gate refused the version: a failed attempt
    RETRY = "RETRY"  # refused because another publisher moved the delta meanwhile: not a failed attempt


def batch_status(outcome: str, reason: str) -> BatchStatus:
    """A publication outcome → how the attempt counts (sensor mode: ``invalid`` fails the run)."""
    if outcome == "invalid":
        return BatchStatus.RETRY if BASE_CHANGED in reason else BatchStatus.FAILURE
    return BatchStatus.SUCCESS


@dataclass
class LoopRuns:
    """The ``DeltaRunIndex`` the loop gives the latest-only planner.

    The micro-batches of this loop are attempts like sensor runs, answered from memory under the
    same run keys (``delta:<P>:aN``); anything else (a sensor run from before the switch, a UI
    "Materialize") is asked of ``others`` with this run excluded, so such a run in flight is waited
    for (overlap policy) and a continuous run never publishes concurrently with it.
    """

    run_id: str
    others: DeltaRunIndex
    batches: dict[str, DeltaRun] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)

    def record(self, run_key: str, status: BatchStatus, how: str = "") -> None:
        # RETRY is reported like a run a shutdown interrupted: ended, not a failed attempt.
        self.batches[run_key] = DeltaRun(self.run_id, status.value, False, None,
                                        interrupted=status is BatchStatus.RETRY)
        if status is BatchStatus.FAILURE:
            self.failures[run_key] = how

    def in_flight(self) -> list[DeltaRun]:
        return [r for r in self.others.in_flight() if r.run_id != self.run_id]

    def by_run_key(self, run_key: str) -> DeltaRun | None:
        # No run carries a claimed key: the claim was a micro-batch of a continuous run that ended (killed,
        # planned restart) before finishing it. Sensor runs exist as soon as they are requested, so it is
        # not a request still on its way: an ended attempt at once, not after LOST_REQUEST_GRACE.
        return (self.batches.get(run_key) or self.others.by_run_key(run_key)
                or DeltaRun("", LOST, False))

    def ended_how(self, run_key: str) -> str | None:
        if run_key in self.batches:
            how = self.failures.get(run_key)
            return f"its micro-batch in continuous run {self.run_id[:8]} ({run_key}) failed: {how}" if how else None
        return self.others.ended_how(run_key)

    def last_requested(self) -> str | None:
        return None  # the loop's own cursor lives in this process: it always has the newest request


# ------------------------------------------------------------------------------------------ warm state

#: While idle, the loop looks this often whether the state the next micro-batch reads has changed ...
WARM_CHECK = dt.timedelta(seconds=5)
#: ... and warms its Python workers at least this often: Spark stops a worker idle for a minute.
KEEP_WARM = dt.timedelta(seconds=30)
#: ... but not within this long of a publication: readers fetch the new version then, and on a box they share
#: with Spark the warm-up's job would take the cores from them (the new segment's state waits a moment).
READERS_FIRST = dt.timedelta(seconds=2)
#: A warm-up's tasks stop decoding after this long (the next idle tick goes on): a partition that arrives
#: while the workers decode a new full version's state (many seconds through a slow store) waits no longer.
WARM_BUDGET = dt.timedelta(seconds=1)


@dataclass
class Warmth:
    """What the loop last warmed (``freshidx.delta.executor.warm_state``): the state's name (its full and delta
    versions) and when; and when it last looked."""

    state: tuple[str, str | None] | None = None
    warmed_at: dt.datetime | None = None
    checked_at: dt.datetime | None = None
    unfinished: bool = False  # the last warm-up ran out of its budget (:data:`WARM_BUDGET`)
    published_at: dt.datetime | None = None  # a publication not looked at yet

    def look_due(self, now: dt.datetime, published: bool) -> bool:
        """Read the serving versions now? :data:`READERS_FIRST` after a publication, after an unfinished
        warm-up at once, else every :data:`WARM_CHECK`."""
        if published:
            self.published_at = now
        if self.published_at is not None:
            if now - self.published_at < READERS_FIRST:
                return False
            self.published_at = None
            return True
        return self.unfinished or self.checked_at is None or now - self.checked_at >= WARM_CHECK

    def warm_due(self, now: dt.datetime, state: tuple[str, str | None]) -> bool:
        """Warm for ``state`` now: it changed, or the workers were last kept busy :data:`KEEP_WARM` ago."""
        return state != self.state or self.warmed_at is None or now - self.warmed_at >= KEEP_WARM

    def warmed(self, now: dt.datetime, state: tuple[str, str | None], *, complete: bool) -> None:
        """A warm-up for ``state`` ran (the workers were busy now); only a complete one warmed ``state``."""
        self.warmed_at, self.unfinished = now, not complete
        if complete:
            self.state = state


# ------------------------------------------------------------------------------------------ heartbeat


@dataclass
class LoopState:
    """What the loop has done so far (for its heartbeat, log lines and the run's end)."""

    run_id: str
    started_at: dt.datetime
    limits: Limits
    ticks: int = 0
    batches: int = 0
    published: int = 0
    last_tick: dt.datetime | None = None
    last_action: str = ""
    last_version: str | None = None
    rss_mb: float | None = None
    heartbeat_at: dt.datetime | None = None
    stop_checked: float = 0.0  # monotonic time the run's stop tag was last read
    last_failure: str = ""  # the last failed micro-batch's error ("" after one that did not raise)
    restart_waiting: bool = False  # a planned restart is due and waits for a warmed-up standby


#: The heartbeat is rewritten at most this often while idle (every micro-batch writes it too).
HEARTBEAT_EVERY = dt.timedelta(seconds=10)


def heartbeat_due(state: LoopState, now: dt.datetime, acted: bool) -> bool:
    return acted or state.heartbeat_at is None or now - state.heartbeat_at >= HEARTBEAT_EVERY


def heartbeat(state: LoopState, now: dt.datetime, *, ended: Stop | None = None) -> Heartbeat:
    """The small object ``freshidx status`` reads (overwritten in place; not history)."""
    return Heartbeat(
        run_id=state.run_id,
        started_at=iso(state.started_at),
        planned_restart_at=iso(state.limits.restart_at(state.started_at)),
        trigger_seconds=state.limits.trigger_seconds,
        max_rss_mb=state.limits.max_rss_mb,
        last_tick=iso(state.last_tick or now),
        written_at=iso(now),
        ticks=state.ticks,
        micro_batches=state.batches,
        published=state.published,
        last_action=state.last_action,
        last_version=state.last_version,
        rss_mb=None if state.rss_mb is None else round(state.rss_mb, 1),
        ended=None if ended is None else {"reason": ended.reason.value, "detail": ended.detail},
    )


def describe_heartbeat(hb: Heartbeat | None, now: dt.datetime) -> dict[str, Any] | None:
    """``freshidx status``'s view of a heartbeat: the live run, its age, its next planned restart, and
    whether it looks alive (its last write is recent; an ended run says why it ended)."""
    if hb is None:
        return None
    try:
        started = parse_iso(hb.started_at)
        written = parse_iso(hb.written_at or hb.last_tick)
    except ValueError:
        return None
    silent = (now - written).total_seconds()
    state = "ended" if hb.ended else "live" if silent <= HEARTBEAT_EVERY.total_seconds() * 3 + 30 else "silent"
    return {
        "run_id": hb.run_id,
        "state": state,
        "age_seconds": round((now - started).total_seconds(), 1),
        "planned_restart_at": hb.planned_restart_at,
        "last_tick": hb.last_tick,
        "seconds_since_heartbeat": round(silent, 1),
        "micro_batches": hb.micro_batches,
        "published": hb.published,
        "rss_mb": hb.rss_mb,
        "ended": hb.ended,
    }
