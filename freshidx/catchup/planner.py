"""Catch-up progress (docs/architecture.md#catch-up-ads_hourly): every closed hour exactly once, oldest first, capped.

Where every interval matters, freshness-first skipping is wrong; this is the other mode, built from
the same parts (ledger, create-once, compare-and-swap). No Dagster here, and decisions apart from
effects: :func:`plan_tick` reads the store and a :class:`CatchupRunIndex` that answers questions about
runs and returns a :class:`CatchupPlan` (ledger entries, cancels, at most one run with its claims, the new
frontier state); :func:`apply` carries it out. :mod:`freshidx.defs.catchup.assets` only adapts both to Dagster.

What the catch-up keeps per hour (its ledger entries and their grammar, the processed test, the
frontier ``STATE``) is :mod:`freshidx.catchup.state`; late data is :mod:`freshidx.catchup.late`; the plan's
types (the planners' vocabulary, :mod:`freshidx.trigger.tick_plan`) and the steps that plan one hour, which
the late-data sweep takes too, are :mod:`freshidx.catchup.hour_plan`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Protocol

from freshidx.catchup.hour_plan import (
    ASSET,
    CANCELED,
    FAILURE,
    IN_FLIGHT,
    SUCCESS,
    Attempts,
    Cancel,
    CatchupPlan,
    CatchupRequest,
    CatchupRun,
    CatchupRunIndex,
    Claim,
    HourRecord,
    not_ready,
    park,
    request_claims,
    settle_attempts,
)
from freshidx.catchup.late import late_data_sweep
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
from freshidx.publish.commit import read_pointer
from freshidx.settings import Settings
from freshidx.store import ObjectStore, layout
from freshidx.trigger.lifecycle import LOST_REQUEST_GRACE, Decision, attempt_state
from freshidx.trigger.listing import newest_partition
from freshidx.trigger.tick_plan import claims_won

# Part of this module's API though defined elsewhere: the plan's types and the steps that plan one hour in
# hour_plan, the grace with the lifecycle, the hour ledger and frontier state in catchup.state (the Dagster
# adapters and the tests reach them through here).
__all__ = [
    "ASSET",
    "CANCELED",
    "FAILURE",
    "HOUR",
    "IN_FLIGHT",
    "LOST_REQUEST_GRACE",
    "SUCCESS",
    "Attempts",
    "Cancel",
    "CatchupPlan",
    "CatchupRequest",
    "CatchupRun",
    "CatchupRunIndex",
    "CatchupState",
    "Claim",
    "HourRecord",
    "dagster_key",
    "entry_key",
    "floor_hour",
    "hour_entries",
    "hour_from_dagster_key",
    "not_ready",
    "park",
    "parse_hour_id",
    "processed",
    "record",
    "request_claims",
    "settle_attempts",
    "trigger",
]

# Dagster run tags the catch-up path uses (kept here so the sensor, asset and IO manager agree).
TAG_CLAIMS = "freshidx/claims"  # JSON {hour_id: claim suffix, e.g. "a1" or "c2.a1"}
TAG_KIND = "freshidx/kind"  # catchup | correction


# ------------------------------------------------------------------------------------- planning


def _heal_terminal(store: ObjectStore, plan: CatchupPlan, hour: dt.datetime) -> None:
    """The terminal ``H`` entry follows ``CURRENT``; write it if a crash (or a backfill) left it out."""
    if store.exists(entry_key(plan.asset, hour)):
        return
    pointer, _ = read_pointer(store, layout.bucket_name(plan.asset, hour))
    if pointer is None:
        return
    plan.effects.append(HourRecord(hour, trigger(hour), Decision.PROCESSED,
                                   f"version {pointer.version} published (recorded from CURRENT)",
                                   {"run_id": pointer.run_id, "extra": {"version": pointer.version}}))


def plan_tick(store: ObjectStore, settings: Settings, runs: CatchupRunIndex, now: dt.datetime,
              asset: str = ASSET) -> CatchupPlan:
    """One evaluation of the catch-up sensor. Reads only (store, ledger, runs); :func:`apply` writes."""
    plan = CatchupPlan(asset)
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
        late_data_sweep(store, settings, runs, now, state, last_closed, busy_hours, plan)

    if (state.frontier, sorted(state.parked), state.late_cursor) != before:
        plan.state, plan.etag = state, etag
    if plan.request is None and not plan.skip_reason:
        plan.skip_reason = _nothing_to_do(plan)
    return plan


def _nothing_to_do(plan: CatchupPlan) -> str:
    waiting = "; ".join(f"{h}: {r}" for h, r in list(plan.waiting.items())[:3])
    return f"nothing to do (frontier {plan.frontier})" + (f"; waiting: {waiting}" if waiting else "")


def _scan_window(store: ObjectStore, settings: Settings, runs: CatchupRunIndex, now: dt.datetime, plan: CatchupPlan,
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


@dataclass
class CatchupApplied:
    # (hour id, decision, reason) recorded; plain strings: they become Dagster metadata, whose
    # serializer refuses enums it does not know.
    actions: list[tuple[str, str, str]]
    requests: list[CatchupRequest]
    skip_reason: str


class Canceller(Protocol):
    def cancel(self, run_id: str, reason: str) -> None: ...


def apply(store: ObjectStore, plan: CatchupPlan, runs: Canceller) -> CatchupApplied:
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
    requests: list[CatchupRequest] = []
    skip_reason = plan.skip_reason or ""
    if plan.request is not None:
        if claims_won(plan, lambda c: _write(store, plan.asset, c)):  # stops at the first one lost
            for r in plan.after_claim:
                _write(store, plan.asset, r)
            requests.append(plan.request)
        else:
            skip_reason = (f"{plan.request.run_key} already claimed by another evaluation; "
                           + _nothing_to_do(plan))
    if plan.state is not None:
        plan.state.save(store, plan.asset, plan.etag)
    return CatchupApplied(actions, requests, skip_reason)


def _write(store: ObjectStore, asset: str, r: HourRecord) -> bool:
    return record(store, asset, r.hour, r.tid, r.decision, r.reason, **r.fields)
