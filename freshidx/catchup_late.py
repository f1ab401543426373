"""Late data for closed hours (the catch-up consumer's sweep, :func:`freshidx.catchup.plan_tick`).

A few hours per tick, round robin over ``FRESHIDX_HOURLY_LATE_LOOKBACK_HOURS`` behind the frontier:
a processed hour whose objects changed gets a correction; an hour with data but no bucket (its data
arrived after the frontier had passed it, e.g. before the consumer's first hour) is claimed like any
hour; an hour before ``FRESHIDX_PARTITIONS_START`` is recorded once as ``out_of_range``. So late data
for any closed hour inside the lookback is processed or explicitly recorded (issue 18.5).
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterable
from typing import Any

from freshidx import layout
from freshidx.catchup import (
    HOUR,
    CatchupState,
    Claim,
    Request,
    RunIndex,
    TickPlan,
    _attempt_state,
    _claim,
    _park,
    hour_entries,
    parse_hour_id,
    processed,
    record,
    trigger,
)
from freshidx.lifecycle import Decision, Mark, attempt_state
from freshidx.listing import newest_partition
from freshidx.publish import iso, read_manifest, read_pointer
from freshidx.readiness import check_ready, list_hour
from freshidx.settings import Settings
from freshidx.store import NotFound, ObjectStore, PreconditionFailed


def input_fingerprint(files: Iterable[Any]) -> dict[str, str]:
    return {f.key: f.etag for f in files}


def late_data_sweep(store: ObjectStore, settings: Settings, asset: str, runs: RunIndex, now: dt.datetime,
                     state: CatchupState, last_closed: dt.datetime, busy_hours: dict[str, str],
                     plan: TickPlan) -> Request | None:
    """Re-list a few processed hours per tick (round robin over the lookback) for late data.

    Cost per tick is ``hourly_late_checks_per_tick`` listings, whatever the history; each of the
    ``hourly_late_lookback_hours`` hours behind the frontier is re-checked every ``lookback / checks`` ticks.
    """
    if settings.hourly_late_checks_per_tick == 0 or settings.hourly_late_lookback_hours == 0 or state.frontier is None:
        return None
    # The lookback ends at the frontier, not the clock: in steady state that is the last closed
    # hour; while draining a backlog it is where the consumer is, which is where late data matters.
    frontier = parse_hour_id(state.frontier)
    newest = min(last_closed, frontier - HOUR)
    oldest = newest - (settings.hourly_late_lookback_hours - 1) * HOUR
    if newest < oldest:
        return None
    span = int((newest - oldest) / HOUR) + 1
    cursor = parse_hour_id(state.late_cursor) if state.late_cursor else newest
    timeout = dt.timedelta(seconds=settings.hourly_timeout_seconds)
    for _ in range(min(settings.hourly_late_checks_per_tick, span)):
        hour = cursor + HOUR
        if hour > newest or hour < oldest:
            hour = oldest
        cursor = hour
        hid = layout.hour_id(hour)
        if hid in busy_hours:
            continue
        if not processed(store, asset, hour):
            req = _late_unprocessed_hour(store, settings, asset, runs, now, state, hour, plan)
            if req is not None:
                state.late_cursor = layout.hour_id(cursor)
                return req
            continue
        pointer, _ = read_pointer(store, layout.bucket_name(asset, hour))
        if pointer is None:
            continue
        try:
            manifest = read_manifest(store, layout.bucket_name(asset, hour), pointer.version)
        except NotFound:
            continue
        published = {f["key"]: f["etag"] for f in manifest.get("inputs", {}).get("files", [])}
        listing = list_hour(store, settings.source, hour)
        current = input_fingerprint(listing.files)
        if current == published:
            continue
        new = sorted(set(current) - set(published))
        changed = sorted(k for k in set(current) & set(published) if current[k] != published[k])
        seq = pointer.seq + 1
        correction = trigger(hour).in_correction(seq)
        entries = hour_entries(store, asset, hour)
        att = _attempt_state(store, asset, hour, entries, seq, runs, now, timeout, plan)
        if att.busy:
            plan.waiting[hid] = f"correction {seq}: {att.why_busy}"
            continue
        if att.failures >= settings.hourly_max_attempts:
            with contextlib.suppress(PreconditionFailed):
                record(store, asset, hour, correction.then(Mark.PARKED), Decision.PARKED,
                       f"correction {seq}: {att.failures} attempts did not publish")
            continue
        reason = (f"late data for closed hour {hid}: {len(new)} new, {len(changed)} changed object(s) "
                  f"since version {pointer.version}")
        req = _claim(store, asset, "correction", [Claim(hour, correction.claim(att.next_attempt).suffix)], reason)
        if req is not None:
            record(store, asset, hour, correction, Decision.LATE_DATA, reason,
                   extra={"new": new[:50], "changed": changed[:50], "replaces": pointer.version})
            state.late_cursor = layout.hour_id(cursor)
            return req
    state.late_cursor = layout.hour_id(cursor)
    return None


def _late_unprocessed_hour(store: ObjectStore, settings: Settings, asset: str, runs: RunIndex, now: dt.datetime,
                           state: CatchupState, hour: dt.datetime, plan: TickPlan) -> Request | None:
    """A closed hour behind the frontier, inside the lookback, that has data but no bucket: its data
    arrived after the frontier had passed it (typically before the consumer's first hour). It is
    claimed like any hour (attempts, readiness, parking), or, before ``FRESHIDX_PARTITIONS_START``
    (not an ``ads_hourly`` partition), recorded once as ``out_of_range``. Parked hours are explained
    already and wait for a grant."""
    hid = layout.hour_id(hour)
    if hid in state.parked:
        return None
    listing = list_hour(store, settings.source, hour)
    if not listing.files:
        return None  # nothing there: nothing to process or explain
    start = dt.datetime.fromisoformat(settings.partitions_start).replace(tzinfo=dt.UTC)
    if hour < start:
        why = (f"late data ({len(listing.files)} object(s)) for closed hour {hid}, before FRESHIDX_PARTITIONS_START "
               f"{settings.partitions_start}: not an {asset} partition, never bucketed; the full index reads it")
        if record(store, asset, hour, trigger(hour).then(Mark.OUT_OF_RANGE), Decision.OUT_OF_RANGE, why,
                  extra={"objects": [f.key for f in listing.files][:50]}):
            plan.actions.append((hid, Decision.OUT_OF_RANGE.value, why))
        return None
    entries = hour_entries(store, asset, hour)
    timeout = dt.timedelta(seconds=settings.hourly_timeout_seconds)
    att = _attempt_state(store, asset, hour, entries, None, runs, now, timeout, plan)
    if att.busy:
        plan.waiting[hid] = att.why_busy
        return None
    allowed = attempt_state(entries, hid).allowed(settings.hourly_max_attempts)
    if att.failures >= allowed:
        _park(store, asset, hour, att, plan)
        state.parked = sorted({*state.parked, hid})
        return None
    newest, _ = newest_partition(store, settings.source)
    ready = check_ready(store, listing, settings.readiness_for(settings.source), now=now,
                        quiet_seconds=settings.quiet_seconds, close_grace_seconds=settings.close_grace_seconds,
                        newer_data_visible=newest is not None and newest.at >= hour + HOUR)
    if not ready.ready:
        plan.waiting[hid] = f"late data, not ready: {ready.reason}"
        record(store, asset, hour, trigger(hour).then(Mark.NOT_READY), Decision.NOT_READY, ready.reason,
               extra={"first_seen": iso(now)})
        return None
    reason = (f"late data for closed hour {hid} behind the frontier {state.frontier} "
              f"({len(listing.files)} object(s), never processed)")
    return _claim(store, asset, "catchup", [Claim(hour, trigger(hour).claim(att.next_attempt).suffix)], reason)
