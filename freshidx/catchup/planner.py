"""Catch-up progress (DESIGN §7 ``catch_up``): every closed hour exactly once, oldest first, capped.

Where every interval matters, freshness-first skipping is wrong; this is the other mode, built from
the same parts (ledger, create-once, compare-and-swap). No Dagster here, and decisions apart from
effects: :func:`plan_tick` reads the store and a :class:`RunIndex` that answers questions about runs
and returns a :class:`TickPlan` (ledger entries, cancels, at most one run with its claims, the new
frontier state); :func:`apply` carries it out. ``defs/hourly.py`` only adapts both to Dagster.

What the catch-up keeps per hour (its ledger entries and their grammar, the processed test, the
frontier ``STATE``) is :mod:`freshidx.catchup.state`; late data is :mod:`freshidx.catchup.late`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from freshidx.catchup.readiness import check_ready, list_hour
from freshidx.catchup.state import (
    HOUR,
    CatchupState,
    dagster_key,
    entry_key,
    floor_hour,
    hour_entries,
    hour_from_dagster_key,
    oldest_hour,
    parse_hour_id,
    processed,
    record,
    trigger,
)
from freshidx.publish.commit import iso, parse_iso, read_pointer
from freshidx.settings import Settings
from freshidx.store import ObjectStore, layout
from freshidx.trigger.lifecycle import LOST_REQUEST_GRACE, Decision, Mark, TriggerId, attempt_state
from freshidx.trigger.listing import newest_partition

ASSET = "ads_hourly"
# Part of this module's API though defined elsewhere: the grace with the lifecycle, the hour ledger
# and frontier state in catchup_ledger (the Dagster adapters and the tests reach them through here).
__all__ = [
    "HOUR",
    "LOST_REQUEST_GRACE",
    "CatchupState",
    "dagster_key",
    "entry_key",
    "floor_hour",
    "hour_entries",
    "hour_from_dagster_key",
    "parse_hour_id",
    "processed",
    "record",
    "trigger",
]

IN_FLIGHT = "in_flight"
SUCCESS = "success"
FAILURE = "failure"
CANCELED = "canceled"

# Dagster run tags the catch-up path uses (kept here so the sensor, asset and IO manager agree).
TAG_CLAIMS = "freshidx/claims"  # JSON {hour_id: claim suffix, e.g. "a1" or "c2.a1"}
TAG_KIND = "freshidx/kind"  # catchup | correction


# ------------------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class RunView:
    run_id: str
    status: str  # IN_FLIGHT | SUCCESS | FAILURE | CANCELED
    created_at: float  # epoch seconds
    started_at: float | None = None
    interrupted: bool = False  # ended by a shutdown of the system, not by its own failure


class RunIndex(Protocol):
    """What the planner needs to know about runs (the sensor answers from the Dagster instance).
    Questions only: cancelling a stuck run is an effect, :func:`apply`'s (:class:`Canceller`)."""

    def by_run_key(self, run_key: str) -> RunView | None: ...

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
class Request:
    """One run to request: contiguous hours (catch-up) or one hour (correction)."""

    kind: str  # catchup | correction
    claims: list[Claim]
    run_key: str
    reason: str

    @property
    def hours(self) -> list[dt.datetime]:
        return [c.hour for c in self.claims]


@dataclass(frozen=True)
class Record:
    """A create-once ledger entry of an hour to write. ``report`` is the line the tick reports for it
    (as ``(hour id, decision, report)``); ``report_always=False`` reports it only if this evaluation
    created it (``out_of_range`` is reported once, not every time it is seen again)."""

    hour: dt.datetime
    tid: TriggerId
    decision: Decision
    reason: str
    fields: Mapping[str, Any] = field(default_factory=dict)  # run_id, run_key, attempt, extra
    report: str | None = None
    report_always: bool = True


@dataclass(frozen=True)
class Cancel:
    """Cancel a stuck run (its hours were handed to a new attempt)."""

    run_id: str
    reason: str


@dataclass
class TickPlan:
    """What one evaluation decided; :func:`apply` carries it out, in this order."""

    asset: str = ASSET
    effects: list[Record | Cancel] = field(default_factory=list)  # whatever becomes of the request
    request: Request | None = None  # stands only if every one of its claims is created
    claims: list[Record] = field(default_factory=list)  # the create-once ``accepted`` entries
    after_claim: list[Record] = field(default_factory=list)  # written once the claims are ours
    state: CatchupState | None = None  # the new frontier state, CAS'd against ``etag``; None: unchanged
    etag: str | None = None
    waiting: dict[str, str] = field(default_factory=dict)  # hour id → why it is not ready yet
    frontier: str | None = None
    skip_reason: str = ""


@dataclass
class Applied:
    # (hour id, decision, reason) recorded; plain strings: they become Dagster metadata, whose
    # serializer refuses enums it does not know.
    actions: list[tuple[str, str, str]]
    requests: list[Request]
    skip_reason: str


@dataclass
class Attempts:
    busy: bool
    next_attempt: int
    failures: int  # ended attempts that count towards parking (interrupted ones do not)
    why_busy: str = ""


def settle_attempts(plan: TickPlan, hour: dt.datetime, entries: dict[str, dict[str, Any]], correction: int | None,
                    runs: RunIndex, now: dt.datetime, timeout: dt.timedelta) -> Attempts:
    """Attempts of the hour (or of its correction): plan to settle the last one (failed / stuck / lost)
    if it ended; the planning goes on as if it were settled (apply writes it first)."""
    hid = layout.hour_id(hour)
    state = attempt_state(entries, hid, correction)
    interrupted, ended = set(state.interrupted), set(state.ended)
    n = state.open
    if n is not None:
        tid = TriggerId(hid, correction, n)
        claim = state.claims[n]
        run = runs.by_run_key(claim["run_key"])
        fields: dict[str, Any] = {"run_key": claim["run_key"], "attempt": n}
        if run is None:
            if now - parse_iso(claim["at"]) < LOST_REQUEST_GRACE:
                return Attempts(True, n + 1, len(ended - interrupted), f"attempt {n} requested, waiting for its run")
            plan.effects.append(Record(
                hour, tid.then(Mark.EXPIRED), Decision.EXPIRED,
                f"no run was created for {claim['run_key']} within {LOST_REQUEST_GRACE.seconds} s", fields,
                f"{tid.suffix}: request lost"))
        elif run.status == IN_FLIGHT:
            age = now.timestamp() - (run.started_at or run.created_at)
            if age <= timeout.total_seconds():
                return Attempts(True, n + 1, len(ended - interrupted), f"attempt {n} running in {run.run_id[:8]}")
            reason = (f"stuck: run {run.run_id} in flight for {age:.0f} s (timeout "
                      f"{timeout.total_seconds():.0f} s); its hours are handed to a new attempt")
            plan.effects += [Record(hour, tid.then(Mark.EXPIRED), Decision.EXPIRED, reason,
                                    {"run_id": run.run_id, **fields}, f"{tid.suffix}: {reason}"),
                             Cancel(run.run_id, reason)]
        elif run.interrupted and run.status != SUCCESS:
            # The operator stopped the system: not the hour's fault, so it never leads to parking.
            why = f"run {run.status}: interrupted by shutdown; not counted as a failed attempt"
            plan.effects.append(Record(hour, tid.then(Mark.INTERRUPTED), Decision.INTERRUPTED, why,
                                       {"run_id": run.run_id, **fields}, f"{tid.suffix}: {why}"))
            interrupted.add(n)
        else:
            why = "run succeeded without publishing the hour" if run.status == SUCCESS else f"run {run.status}"
            plan.effects.append(Record(hour, tid.then(Mark.FAILED), Decision.FAILED, why,
                                       {"run_id": run.run_id, **fields}, f"{tid.suffix}: {why}"))
        ended.add(n)
    return Attempts(False, state.next_attempt, len(ended - interrupted))


def park(plan: TickPlan, hour: dt.datetime, att: Attempts) -> None:
    hid = layout.hour_id(hour)
    plan.effects.append(Record(
        hour, trigger(hour).then(Mark.PARKED, att.next_attempt - 1), Decision.PARKED,
        f"{att.failures} attempts did not publish; "
        f"`freshidx ledger retry --pipeline {plan.asset} --hour {hid}` grants another",
        report=f"{att.failures} attempts did not publish"))


def not_ready(plan: TickPlan, hour: dt.datetime, reason: str, now: dt.datetime,
              entries: dict[str, dict[str, Any]]) -> None:
    """Durable (once, at the first time seen) so ``freshidx ledger`` explains a waiting hour. ``entries``:
    the hour's ledger entries as listed this tick; an hour already marked is not written again (on S3 a
    refused conditional PUT per waiting hour per tick, up to ``hourly_lookahead_hours`` of them)."""
    tid = trigger(hour).then(Mark.NOT_READY)
    if tid.suffix not in entries:
        plan.effects.append(Record(hour, tid, Decision.NOT_READY, reason, {"extra": {"first_seen": iso(now)}}))


def request_claims(plan: TickPlan, kind: str, claims: list[Claim], reason: str) -> Request:
    """Plan one run for ``claims``: its create-once claims, one per hour (apply writes them)."""
    run_key = _run_key(kind, claims)
    batch = [layout.hour_id(c.hour) for c in claims]
    plan.claims = [Record(c.hour, c.tid, Decision.ACCEPTED, reason,
                          {"run_key": run_key, "attempt": c.tid.attempt, "extra": {"kind": kind, "batch": batch}})
                   for c in claims]
    plan.request = Request(kind, claims, run_key, reason)
    return plan.request


def _run_key(kind: str, claims: Iterable[Claim]) -> str:
    claims = list(claims)
    ident = ",".join(f"{layout.hour_id(c.hour)}:{c.suffix}" for c in claims)
    digest = hashlib.sha1(ident.encode()).hexdigest()[:10]
    return f"{ASSET}:{kind}:{layout.hour_id(claims[0].hour)}-{layout.hour_id(claims[-1].hour)}:{digest}"


def _heal_terminal(store: ObjectStore, plan: TickPlan, hour: dt.datetime) -> None:
    """The terminal ``H`` entry follows ``CURRENT``; write it if a crash (or a backfill) left it out."""
    if store.exists(entry_key(plan.asset, hour)):
        return
    pointer, _ = read_pointer(store, layout.bucket_name(plan.asset, hour))
    if pointer is None:
        return
    plan.effects.append(Record(hour, trigger(hour), Decision.PROCESSED,
                               f"version {pointer.version} published (recorded from CURRENT)",
                               {"run_id": pointer.run_id, "extra": {"version": pointer.version}}))


# ------------------------------------------------------------------------------------- planning


def plan_tick(store: ObjectStore, settings: Settings, runs: RunIndex, now: dt.datetime,
              asset: str = ASSET) -> TickPlan:
    """One evaluation of the catch-up sensor. Reads only (store, ledger, runs); :func:`apply` writes."""
    plan = TickPlan(asset)
    state, etag = CatchupState.load(store, asset)
    before = (state.frontier, sorted(state.parked), state.late_cursor)
    if state.frontier is None:
        first = oldest_hour(store, settings.source)
        if first is None:
            plan.skip_reason = f"no raw hours under raw/{settings.source}/ yet"
            return plan
        # Nothing before the first Dagster partition (FRESHIDX_PARTITIONS_START) is caught up.
        start = settings.partitions_start_at
        state.frontier = layout.hour_id(max(first, start))
    last_closed = floor_hour(now) - HOUR  # hours whose end is <= now
    busy_hours = runs.busy_hours()
    available = _scan_window(store, settings, runs, now, plan, state, last_closed, busy_hours)
    plan.frontier = state.frontier

    in_flight = runs.catchup_in_flight()
    lane = "catch-up run(s)"
    if settings.hourly_overlap == "skip":
        # skip if running: any run of the asset (catch-up, UI backfill, manual) holds the tick back;
        # serialize only waits for its own catch-up runs (backfills run alongside, on other hours).
        in_flight, lane = max(in_flight, len(set(busy_hours.values()))), f"run(s) of {asset}"
    may_request = settings.hourly_overlap == "queue" or in_flight == 0
    if available and may_request:
        batch = [available[0]]
        for c in available[1:]:
            if len(batch) >= settings.hourly_max_hours_per_run or c.hour != batch[-1].hour + HOUR:
                break
            batch.append(c)
        request_claims(plan, "catchup", batch,
                       f"oldest ready hours ({len(available)} ready, frontier {state.frontier})")
    elif available:
        plan.skip_reason = (f"{len(available)} hour(s) ready, oldest {layout.hour_id(available[0].hour)}; "
                            f"{in_flight} {lane} in flight (overlap policy {settings.hourly_overlap})")
    elif may_request:
        from freshidx.catchup.late import late_data_sweep  # here: that module builds on this one

        late_data_sweep(store, settings, runs, now, state, last_closed, busy_hours, plan)

    if (state.frontier, sorted(state.parked), state.late_cursor) != before:
        plan.state, plan.etag = state, etag
    if plan.request is None and not plan.skip_reason:
        plan.skip_reason = _nothing_to_do(plan)
    return plan


def _nothing_to_do(plan: TickPlan) -> str:
    waiting = "; ".join(f"{h}: {r}" for h, r in list(plan.waiting.items())[:3])
    return f"nothing to do (frontier {plan.frontier})" + (f"; waiting: {waiting}" if waiting else "")


def _scan_window(store: ObjectStore, settings: Settings, runs: RunIndex, now: dt.datetime, plan: TickPlan,
                 state: CatchupState, last_closed: dt.datetime, busy_hours: dict[str, str]) -> list[Claim]:
    """Decide each hour of the window (and each parked hour): processed, parked, busy, not ready or
    claimable (returned, oldest first); move the frontier past the leading hours that are done."""
    assert state.frontier is not None
    frontier = parse_hour_id(state.frontier)
    policy = settings.readiness_for(settings.source)
    timeout = dt.timedelta(seconds=settings.hourly_timeout_seconds)
    newest, _ = newest_partition(store, settings.source)
    parked = set(state.parked)
    hours = [frontier + i * HOUR for i in range(settings.hourly_lookahead_hours)
             if frontier + i * HOUR <= last_closed]
    available: list[Claim] = []
    # Parked hours come back when an operator grants a retry; they are few, so check each tick.
    revisit = sorted({parse_hour_id(h) for h in parked} - set(hours))
    advancing = True
    new_frontier = frontier
    for hour in [*revisit, *hours]:
        hid = layout.hour_id(hour)
        in_window = hour >= frontier
        if processed(store, plan.asset, hour):
            _heal_terminal(store, plan, hour)
            parked.discard(hid)
            if advancing and in_window:
                new_frontier = hour + HOUR
            continue
        entries = hour_entries(store, plan.asset, hour)
        att = settle_attempts(plan, hour, entries, None, runs, now, timeout)
        if not att.busy and att.failures >= attempt_state(entries, hid).allowed(settings.hourly_max_attempts):
            if hid not in parked:
                park(plan, hour, att)
            parked.add(hid)
            if advancing and in_window:
                new_frontier = hour + HOUR
            continue
        parked.discard(hid)
        if in_window:
            advancing = False
        if att.busy:
            plan.waiting[hid] = att.why_busy
            continue
        if hid in busy_hours:
            plan.waiting[hid] = f"run {busy_hours[hid][:8]} (backfill or manual) is processing it"
            continue
        listing = list_hour(store, settings.source, hour)
        ready = check_ready(store, listing, policy, now=now, quiet_seconds=settings.quiet_seconds,
                            close_grace_seconds=settings.close_grace_seconds,
                            newer_data_visible=newest is not None and newest.at >= hour + HOUR)
        if not ready.ready:
            plan.waiting[hid] = f"not ready ({policy}): {ready.reason}"
            not_ready(plan, hour, f"{policy}: {ready.reason}", now, entries)
            continue
        available.append(Claim(hour, trigger(hour).claim(att.next_attempt).suffix))
    state.frontier = layout.hour_id(new_frontier)
    state.parked = sorted(parked)
    return sorted(available, key=lambda c: c.hour)


# ------------------------------------------------------------------------------------- apply


class Canceller(Protocol):
    def cancel(self, run_id: str, reason: str) -> None: ...


def apply(store: ObjectStore, plan: TickPlan, runs: Canceller) -> Applied:
    """Carry out the plan: ledger entries (create-once), cancels, the claims, then the frontier state.

    A claim already created means another evaluation won the race: the request is abandoned (that
    evaluation's run, or the lost-request grace, settles the hours), never requested twice; this tick
    requests nothing else, the next one plans around that claim."""
    actions: list[tuple[str, str, str]] = []
    for effect in plan.effects:
        if isinstance(effect, Cancel):
            runs.cancel(effect.run_id, effect.reason)
            continue
        created = _write(store, plan.asset, effect)
        if effect.report is not None and (created or effect.report_always):
            actions.append((layout.hour_id(effect.hour), effect.decision.value, effect.report))
    requests: list[Request] = []
    skip_reason = plan.skip_reason
    if plan.request is not None:
        if all(_write(store, plan.asset, c) for c in plan.claims):  # stops at the first one lost
            for r in plan.after_claim:
                _write(store, plan.asset, r)
            requests.append(plan.request)
        else:
            skip_reason = (f"{plan.request.run_key} already claimed by another evaluation; "
                           + _nothing_to_do(plan))
    if plan.state is not None:
        plan.state.save(store, plan.asset, plan.etag)
    return Applied(actions, requests, skip_reason)


def _write(store: ObjectStore, asset: str, r: Record) -> bool:
    return record(store, asset, r.hour, r.tid, r.decision, r.reason, **r.fields)
