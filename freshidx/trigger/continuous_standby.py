"""Continuous mode's hot standby: which live ``delta_continuous`` run is active, when a standby takes over,
and what the watchdog requests, without Dagster (docs/architecture.md#continuous-mode).

With ``FRESHIDX_CONTINUOUS_STANDBY`` on, the watchdog keeps two live runs of the job: the active one and
a standby that has imported everything, set up its resources and warmed its Spark session, then waits.
A run is active iff no OLDER live run of the job exists (:func:`role`): the oldest live run wins, by the
instance's creation order (creation time, then run id), which every observer reads the same way and which
never changes, so two runs can never both see themselves as the oldest. A run that has left its loop (it
carries ``freshidx/ended``: planned restart, stop request) no longer counts: only its teardown remains and
it publishes nothing more. The effects (instance queries, run tags, logs) are
``freshidx.defs.delta.standby_takeover`` and ``freshidx.defs.delta.watchdog``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from freshidx.trigger.continuous_rules import (
    JOB_NAME,
    MEMORY_HARD,
    RESTART_GRACE,
    Limits,
    Stop,
    StopReason,
    stop_reason,
)

#: The run tag saying a continuous run's role; a standby rewrites it when it takes over.
TAG_ROLE = "freshidx/role"
#: The tag a continuous run writes when it leaves its loop (its end's reason).
TAG_ENDED = "freshidx/ended"
#: How often a standby looks whether an older live run remains (and whether its worker is alive).
STANDBY_POLL_SECONDS = 0.5


class Role(StrEnum):
    ACTIVE = "active"  # evaluates the latest-only rule and publishes
    STANDBY = "standby"  # warmed up, waits for every older run to end


@dataclass(frozen=True)
class LiveRun:
    """A ``delta_continuous`` run that is not finished, as the instance lists it."""

    run_id: str
    created: float  # the instance's creation timestamp (epoch seconds)
    status: str
    ended: bool = False  # left its loop (TAG_ENDED): not a contender any more
    role: str | None = None  # its TAG_ROLE: None while it warms up

    @property
    def order(self) -> tuple[float, str]:
        return self.created, self.run_id


def contenders(runs: Iterable[LiveRun]) -> list[LiveRun]:
    """The live runs that still may publish, oldest first."""
    return sorted((r for r in runs if not r.ended), key=lambda r: r.order)


def older_than(run_id: str, runs: Sequence[LiveRun]) -> list[LiveRun]:
    """The contenders created before ``run_id``, oldest first. A run missing from ``runs`` (not listed yet)
    is younger than all of them."""
    me = next((r for r in runs if r.run_id == run_id), None)
    return [r for r in contenders(runs) if r.run_id != run_id and (me is None or r.order < me.order)]


def role(run_id: str, runs: Sequence[LiveRun]) -> Role:
    """Active iff no older contender exists."""
    return Role.STANDBY if older_than(run_id, runs) else Role.ACTIVE


def successor(run_id: str, runs: Sequence[LiveRun]) -> LiveRun | None:
    """The contender created after ``run_id`` that would take over from it (its standby, ready or warming up)."""
    me = next((r for r in runs if r.run_id == run_id), None)
    younger = [r for r in contenders(runs) if r.run_id != run_id and (me is None or r.order > me.order)]
    return younger[0] if younger else None


def restart_waits(stop: Stop, standby: bool, successor: LiveRun | None, overdue_seconds: float,
                  rss_mb: float | None, limits: Limits) -> bool:
    """Whether the active run's planned restart waits for its successor to finish warming up (so the restart
    costs nothing): only with the standby on and a successor that is live but not yet standing by, at most
    :data:`~freshidx.trigger.continuous_rules.RESTART_GRACE` past due, and for memory only below
    :data:`~freshidx.trigger.continuous_rules.MEMORY_HARD` × the bound. Without a successor it restarts at once
    (the watchdog starts the next run); a stop request never waits."""
    if not standby or successor is None or successor.role == Role.STANDBY.value:
        return False
    if stop.reason is StopReason.STOP_REQUESTED:
        return False
    if stop.reason is StopReason.MAX_MEMORY:
        return rss_mb is not None and rss_mb < limits.max_rss_mb * MEMORY_HARD
    return overdue_seconds < RESTART_GRACE.total_seconds()


def standby_stop_reason(limits: Limits, started_at: dt.datetime, now: dt.datetime, rss_mb: float | None,
                        stop_requested: str | None) -> Stop | None:
    """When a standby ends itself: a stop request, its memory bound, or half its planned runtime, so that a
    standby that takes over still has at least half a run's life ahead (an active run and its standby,
    started seconds apart, would otherwise reach their planned restarts together)."""
    half = Limits(limits.trigger_seconds, limits.max_runtime_seconds / 2, limits.max_rss_mb)
    return stop_reason(half, started_at, now, rss_mb, stop_requested)


def takeover_reason(before: Sequence[LiveRun], remaining: Sequence[LiveRun], why: dict[str, str]) -> str:
    """The log line's reason for a takeover: each older run that was there and is not any more, with the
    reason the caller knows (its worker found dead, its final status, its end tag)."""
    gone = [r for r in before if r.run_id not in {x.run_id for x in remaining}]
    return "; ".join(f"run {r.run_id[:8]} {why.get(r.run_id, 'ended')}" for r in gone) or "no older live run"


# ------------------------------------------------------------------------------------------ the watchdog


@dataclass(frozen=True)
class Request:
    """One run the watchdog requests: its key, why, and the role it will start in."""

    run_key: str
    why: str
    role: Role


@dataclass(frozen=True)
class Newest:
    """The newest run of the job, live or not (the previous one, for the key and the reason)."""

    run_id: str
    status: str
    ended: str | None = None  # its TAG_ENDED


def wanted(standby: bool) -> int:
    """How many live runs the watchdog keeps: the active one, and the standby if on."""
    return 2 if standby else 1


def watchdog_decision(live: Sequence[LiveRun], newest: Newest | None, standby: bool) -> Request | str:
    """A run to request, or why not. One successor per run: the key names the job's newest run, so a
    repeated tick (or two daemons) can never create a second one, and at most :func:`wanted` runs are
    live, counting a run that left its loop until it finished (a standby took over from it already)."""
    alive = contenders(live)
    if len(live) >= wanted(standby):
        names = ", ".join(f"{r.run_id[:8]} ({'ending' if r.ended else role(r.run_id, live).value}, {r.status})"
                          for r in sorted(live, key=lambda r: r.order))
        return f"continuous runs live: {names}"
    if newest is None:
        return Request(f"{JOB_NAME}:first", "none at start-up", Role.ACTIVE)
    key = f"{JOB_NAME}:after:{newest.run_id}"
    if alive:
        return Request(key, f"standby for active run {alive[0].run_id}", Role.STANDBY)
    why = f"previous ended: {newest.status}" + (f" ({newest.ended})" if newest.ended else "")
    return Request(key, why, Role.ACTIVE)


class SessionStep(StrEnum):
    """What a standby does with its Spark session on one check (``freshidx.defs.delta.continuous_session``)."""

    KEEP = "keep"
    RELEASE = "release"  # let go of the session and its lease
    ATTACH = "attach"  # attach again and warm up


def standby_session_step(*, answers: bool | None, server: str | None, attached_to: str | None, released: bool,
                         published_since: bool) -> SessionStep:
    """Let go of the session while the Connect server does not answer, or once another server serves than the
    one it was attached to (a warm spare promoted within a blink: the server never stops answering, yet the
    session the standby holds went with the old JVM and would fail its first micro-batch after a takeover).
    Attach again once a server answers and the active run has published since (it attached first)."""
    if not released and (answers is False or (None not in (server, attached_to) and server != attached_to)):
        return SessionStep.RELEASE
    if released and answers and published_since:
        return SessionStep.ATTACH
    return SessionStep.KEEP

