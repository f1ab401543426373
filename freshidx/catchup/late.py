"""Late data for closed hours (the catch-up consumer's sweep, :func:`freshidx.catchup.planner.plan_tick`
calls it; it plans with :mod:`freshidx.catchup.hour_plan`, never with the planner's module).

A few hours per tick, round robin over ``FRESHIDX_HOURLY_LATE_LOOKBACK_HOURS`` behind the frontier:
a processed hour whose objects changed gets a correction; an hour with data but no bucket (its data
arrived after the frontier had passed it, e.g. before the consumer's first hour) is claimed like any
hour; an hour before ``FRESHIDX_PARTITIONS_START`` is recorded once as ``out_of_range``. So late data
for any closed hour inside the lookback is processed or explicitly recorded
(docs/architecture.md#nothing-visible-is-lost).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from freshidx.catchup.hour_plan import (
    CatchupPlan,
    CatchupRunIndex,
    Claim,
    HourRecord,
    not_ready,
    park,
    request_claims,
    settle_attempts,
)
from freshidx.catchup.readiness import check_ready, list_hour
from freshidx.catchup.state import HOUR, CatchupState, hour_entries, parse_hour_id, processed, trigger
from freshidx.publish.commit import read_manifest, read_pointer
from freshidx.settings import Settings
from freshidx.store import NotFound, ObjectStore, layout
from freshidx.trigger.lifecycle import Decision, Mark, attempt_state
from freshidx.trigger.listing import newest_partition


def input_fingerprint(files: Iterable[Any]) -> dict[str, str]:
    return {f.key: f.etag for f in files}


def late_data_sweep(store: ObjectStore, settings: Settings, runs: CatchupRunIndex, now: dt.datetime,
                    state: CatchupState, last_closed: dt.datetime, busy_hours: dict[str, str],
                    plan: CatchupPlan) -> None:
    """Re-list a few processed hours per tick (round robin over the lookback) for late data; plan a
    run for the first hour that needs one (``plan.request``) and stop there.

    Cost per tick is ``hourly_late_checks_per_tick`` listings, whatever the history; each of the
    ``hourly_late_lookback_hours`` hours behind the frontier is re-checked every ``lookback / checks`` ticks.
    """
    if settings.hourly_late_checks_per_tick == 0 or settings.hourly_late_lookback_hours == 0 or state.frontier is None:
        return
    # The lookback ends at the frontier, not the clock: in steady state that is the last closed
    # hour; while draining a backlog it is where the consumer is, which is where late data matters.
    frontier = parse_hour_id(state.frontier)
    newest = min(last_closed, frontier - HOUR)
    oldest = newest - (settings.hourly_late_lookback_hours - 1) * HOUR
    if newest < oldest:
        return
    span = int((newest - oldest) / HOUR) + 1
    cursor = parse_hour_id(state.late_cursor) if state.late_cursor else newest
    for _ in range(min(settings.hourly_late_checks_per_tick, span)):
        hour = cursor + HOUR
        if hour > newest or hour < oldest:
            hour = oldest
        cursor = hour
        if layout.hour_id(hour) in busy_hours:
            continue
        if processed(store, plan.asset, hour):
            _late_processed_hour(store, settings, runs, now, hour, plan)
        else:
            _late_unprocessed_hour(store, settings, runs, now, state, hour, plan)
        if plan.request is not None:
            break
    state.late_cursor = layout.hour_id(cursor)


def _late_processed_hour(store: ObjectStore, settings: Settings, runs: CatchupRunIndex, now: dt.datetime,
                         hour: dt.datetime, plan: CatchupPlan) -> None:
    """A processed hour whose objects changed since its version: a correction (its own attempts)."""
    hid = layout.hour_id(hour)
    pointer, _ = read_pointer(store, layout.bucket_name(plan.asset, hour))
    if pointer is None:
        return
    try:
        manifest = read_manifest(store, layout.bucket_name(plan.asset, hour), pointer.version)
    except NotFound:
        return
    published = manifest.input_etags()
    current = input_fingerprint(list_hour(store, settings.source, hour).files)
    if current == published:
        return
    new = sorted(set(current) - set(published))
    changed = sorted(k for k in set(current) & set(published) if current[k] != published[k])
    seq = pointer.seq + 1
    correction = trigger(hour).in_correction(seq)
    timeout = dt.timedelta(seconds=settings.hourly_timeout_seconds)
    att = settle_attempts(plan, hour, hour_entries(store, plan.asset, hour), seq, runs, now, timeout)
    if att.busy:
        plan.waiting[hid] = f"correction {seq}: {att.why_busy}"
        return
    if att.failures >= settings.hourly_max_attempts:
        plan.effects.append(HourRecord(hour, correction.then(Mark.PARKED), Decision.PARKED,
                                       f"correction {seq}: {att.failures} attempts did not publish"))
        return
    reason = (f"late data for closed hour {hid}: {len(new)} new, {len(changed)} changed object(s) "
              f"since version {pointer.version}")
    request_claims(plan, "correction", [Claim(hour, correction.claim(att.next_attempt).suffix)], reason)
    # The correction is opened only by the evaluation whose claim wins.
    plan.after_claim.append(HourRecord(hour, correction, Decision.LATE_DATA, reason, {
        "extra": {"new": new[:50], "changed": changed[:50], "replaces": pointer.version}}))


def _late_unprocessed_hour(store: ObjectStore, settings: Settings, runs: CatchupRunIndex, now: dt.datetime,
                           state: CatchupState, hour: dt.datetime, plan: CatchupPlan) -> None:
    """A closed hour behind the frontier, inside the lookback, that has data but no bucket: its data
    arrived after the frontier had passed it (typically before the consumer's first hour). It is
    claimed like any hour (attempts, readiness, parking), or, before ``FRESHIDX_PARTITIONS_START``
    (not an ``ads_hourly`` partition), recorded once as ``out_of_range``. Parked hours are explained
    already and wait for a grant."""
    hid = layout.hour_id(hour)
    if hid in state.parked:
        return
    listing = list_hour(store, settings.source, hour)
    if not listing.files:
        return  # nothing there: nothing to process or explain
    start = settings.partitions_start_at
    if hour < start:
        why = (f"late data ({len(listing.files)} object(s)) for closed hour {hid}, before FRESHIDX_PARTITIONS_START "
               f"{settings.partitions_start}: not an {plan.asset} partition, never bucketed; the full index reads it")
        plan.effects.append(HourRecord(hour, trigger(hour).then(Mark.OUT_OF_RANGE), Decision.OUT_OF_RANGE, why,
                                       {"extra": {"objects": [f.key for f in listing.files][:50]}},
                                       report=why, report_always=False))
        return
    entries = hour_entries(store, plan.asset, hour)
    timeout = dt.timedelta(seconds=settings.hourly_timeout_seconds)
    att = settle_attempts(plan, hour, entries, None, runs, now, timeout)
    if att.busy:
        plan.waiting[hid] = att.why_busy
        return
    if att.failures >= attempt_state(entries, hid).allowed(settings.hourly_max_attempts):
        park(plan, hour, att)
        state.parked = sorted({*state.parked, hid})
        return
    newest, _ = newest_partition(store, settings.source)
    ready = check_ready(store, listing, settings.readiness_for(settings.source), now=now,
                        quiet_seconds=settings.quiet_seconds, close_grace_seconds=settings.close_grace_seconds,
                        newer_data_visible=newest is not None and newest.at >= hour + HOUR)
    if not ready.ready:
        plan.waiting[hid] = f"late data, not ready: {ready.reason}"
        not_ready(plan, hour, ready.reason, now, entries)
        return
    reason = (f"late data for closed hour {hid} behind the frontier {state.frontier} "
              f"({len(listing.files)} object(s), never processed)")
    request_claims(plan, "catchup", [Claim(hour, trigger(hour).claim(att.next_attempt).suffix)], reason)
