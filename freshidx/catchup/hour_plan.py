"""One catch-up tick's plan, and what it plans for one hour: settle the hour's attempts, park it, mark it
not ready, claim it for a run. Both the window scan (:mod:`freshidx.catchup.planner`) and the late-data
sweep (:mod:`freshidx.catchup.late`) plan with these, so neither imports the other's module: the planner
builds on the sweep, the sweep on this.

The types are the planners' shared vocabulary (:mod:`freshidx.trigger.tick_plan`) with what only the catch-up
needs: a run's start time (its stuck timeout), the hours a request claims, cancels, the frontier state.
No Dagster here.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from freshidx.catchup.state import CatchupState, trigger
from freshidx.publish.commit import iso, parse_iso
from freshidx.store import layout
from freshidx.trigger.lifecycle import LOST_REQUEST_GRACE, Decision, Mark, TriggerId, attempt_state
from freshidx.trigger.tick_plan import Record, RunIndex, TickPlan

ASSET = "ads_hourly"

IN_FLIGHT = "in_flight"
SUCCESS = "success"
FAILURE = "failure"
CANCELED = "canceled"


# ------------------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class CatchupRun:
    """What the planner needs of one run of the asset (a :class:`freshidx.trigger.tick_plan.RunView`; the sensor
    answers from the Dagster instance)."""

    run_id: str
    status: str  # IN_FLIGHT | SUCCESS | FAILURE | CANCELED
    created_at: float  # epoch seconds
    started_at: float | None = None
    interrupted: bool = False  # ended by a shutdown of the system, not by its own failure

    @property
    def in_flight(self) -> bool:
        return self.status == IN_FLIGHT


class CatchupRunIndex(RunIndex[CatchupRun], Protocol):
    """What the planner needs to know about runs (the sensor answers from the Dagster instance).
    Questions only: cancelling a stuck run is an effect, :func:`freshidx.catchup.planner.apply`'s
    (:class:`freshidx.catchup.planner.Canceller`)."""

    def busy_hours(self) -> dict[str, str]:
        """hour id → run id for every in-flight run of the asset (catch-up, backfill, manual)."""
        ...

    def catchup_in_flight(self) -> int:
        """Number of in-flight runs requested by the catch-up sensor."""
        ...


# ------------------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class Claim:
    hour: dt.datetime
    suffix: str  # "a2" (catch-up attempt) or "c3.a1" (correction 3, attempt 1): TriggerId.suffix

    @property
    def tid(self) -> TriggerId:
        return TriggerId.from_suffix(layout.hour_id(self.hour), self.suffix)


@dataclass
class CatchupRequest:
    """One run to request: contiguous hours (catch-up) or one hour (correction)."""

    kind: str  # catchup | correction
    claims: list[Claim]
    run_key: str
    reason: str

    @property
    def hours(self) -> list[dt.datetime]:
        return [c.hour for c in self.claims]


@dataclass(frozen=True)
class HourRecord(Record[dt.datetime]):
    """A create-once ledger entry of an hour to write. ``report`` is the line the tick reports for it
    (as ``(hour id, decision, report)``); ``report_always=False`` reports it only if this evaluation
    created it (``out_of_range`` is reported once, not every time it is seen again)."""

    report: str | None = None
    report_always: bool = True

    @property
    def hour(self) -> dt.datetime:
        return self.subject


@dataclass(frozen=True)
class Cancel:
    """Cancel a stuck run (its hours were handed to a new attempt)."""

    run_id: str
    reason: str


@dataclass
class CatchupPlan(TickPlan[HourRecord, CatchupRequest]):
    """What one evaluation decided; :func:`freshidx.catchup.planner.apply` carries it out, in this order:
    ``effects``, the ``claims`` (the create-once ``accepted`` entries of the request, which stands only if
    every one is created), ``after_claim``, the frontier ``state``."""

    asset: str = ASSET
    effects: list[HourRecord | Cancel] = field(default_factory=list)  # whatever becomes of the request
    after_claim: list[HourRecord] = field(default_factory=list)  # written once the claims are ours
    state: CatchupState | None = None  # the new frontier state, CAS'd against ``etag``; None: unchanged
    etag: str | None = None
    waiting: dict[str, str] = field(default_factory=dict)  # hour id → why it is not ready yet
    frontier: str | None = None


@dataclass
class Attempts:
    busy: bool
    next_attempt: int
    failures: int  # ended attempts that count towards parking (interrupted ones do not)
    why_busy: str = ""


def settle_attempts(plan: CatchupPlan, hour: dt.datetime, entries: dict[str, dict[str, Any]], correction: int | None,
                    runs: CatchupRunIndex, now: dt.datetime, timeout: dt.timedelta) -> Attempts:
    """Attempts of the hour (or of its correction): plan to settle the last one (failed / stuck / lost)
    if it ended; the planning goes on as if it were settled (apply writes it first)."""
    hid = layout.hour_id(hour)
    state = attempt_state(entries, hid, correction)
    interrupted, ended = set(state.interrupted), set(state.ended)
    n = state.open
    if n is not None:
        tid = TriggerId(hid, correction, n)
        claim = state.claims[n]
        run = runs.by_run_key(claim.run_key or "")
        fields: dict[str, Any] = {"run_key": claim.run_key, "attempt": n}
        if run is None:
            if now - parse_iso(claim.at) < LOST_REQUEST_GRACE:
                return Attempts(True, n + 1, len(ended - interrupted), f"attempt {n} requested, waiting for its run")
            plan.effects.append(HourRecord(
                hour, tid.then(Mark.EXPIRED), Decision.EXPIRED,
                f"no run was created for {claim.run_key} within {LOST_REQUEST_GRACE.seconds} s", fields,
                f"{tid.suffix}: request lost"))
        elif run.in_flight:
            age = now.timestamp() - (run.started_at or run.created_at)
            if age <= timeout.total_seconds():
                return Attempts(True, n + 1, len(ended - interrupted), f"attempt {n} running in {run.run_id[:8]}")
            reason = (f"stuck: run {run.run_id} in flight for {age:.0f} s (timeout "
                      f"{timeout.total_seconds():.0f} s); its hours are handed to a new attempt")
            plan.effects += [HourRecord(hour, tid.then(Mark.EXPIRED), Decision.EXPIRED, reason,
                                        {"run_id": run.run_id, **fields}, f"{tid.suffix}: {reason}"),
                             Cancel(run.run_id, reason)]
        elif run.interrupted and run.status != SUCCESS:
            # The operator stopped the system: not the hour's fault, so it never leads to parking.
            why = f"run {run.status}: interrupted by shutdown; not counted as a failed attempt"
            plan.effects.append(HourRecord(hour, tid.then(Mark.INTERRUPTED), Decision.INTERRUPTED, why,
                                           {"run_id": run.run_id, **fields}, f"{tid.suffix}: {why}"))
            interrupted.add(n)
        else:
            why = "run succeeded without publishing the hour" if run.status == SUCCESS else f"run {run.status}"
            plan.effects.append(HourRecord(hour, tid.then(Mark.FAILED), Decision.FAILED, why,
                                           {"run_id": run.run_id, **fields}, f"{tid.suffix}: {why}"))
        ended.add(n)
    return Attempts(False, state.next_attempt, len(ended - interrupted))


def park(plan: CatchupPlan, hour: dt.datetime, att: Attempts) -> None:
    hid = layout.hour_id(hour)
    plan.effects.append(HourRecord(
        hour, trigger(hour).then(Mark.PARKED, att.next_attempt - 1), Decision.PARKED,
        f"{att.failures} attempts did not publish; "
        f"`freshidx ledger retry --pipeline {plan.asset} --hour {hid}` grants another",
        report=f"{att.failures} attempts did not publish"))


def not_ready(plan: CatchupPlan, hour: dt.datetime, reason: str, now: dt.datetime,
              entries: dict[str, dict[str, Any]]) -> None:
    """Durable (once, at the first time seen) so ``freshidx ledger`` explains a waiting hour. ``entries``:
    the hour's ledger entries as listed this tick; an hour already marked is not written again (on S3 a
    refused conditional PUT per waiting hour per tick, up to ``hourly_lookahead_hours`` of them)."""
    tid = trigger(hour).then(Mark.NOT_READY)
    if tid.suffix not in entries:
        plan.effects.append(HourRecord(hour, tid, Decision.NOT_READY, reason, {"extra": {"first_seen": iso(now)}}))


def request_claims(plan: CatchupPlan, kind: str, claims: list[Claim], reason: str) -> CatchupRequest:
    """Plan one run for ``claims``: its create-once claims, one per hour (apply writes them)."""
    run_key = _run_key(kind, claims)
    batch = [layout.hour_id(c.hour) for c in claims]
    plan.claims = [HourRecord(c.hour, c.tid, Decision.ACCEPTED, reason,
                              {"run_key": run_key, "attempt": c.tid.attempt, "extra": {"kind": kind, "batch": batch}})
                   for c in claims]
    plan.request = CatchupRequest(kind, claims, run_key, reason)
    return plan.request


def _run_key(kind: str, claims: Iterable[Claim]) -> str:
    claims = list(claims)
    ident = ",".join(f"{layout.hour_id(c.hour)}:{c.suffix}" for c in claims)
    digest = hashlib.sha1(ident.encode()).hexdigest()[:10]
    return f"{ASSET}:{kind}:{layout.hour_id(claims[0].hour)}-{layout.hour_id(claims[-1].hour)}:{digest}"
