"""What the catch-up keeps in the store about each hour: its ledger entries, whether it is processed,
and the frontier ``STATE`` (the planner that reads and writes them is :mod:`freshidx.catchup.planner`).

What proves that an hour was processed is its bucket's ``CURRENT`` pointer, created **once**
(``publish(only_if_absent=True)``): a stuck run that comes back to life after its hour was handed to
another run loses that create and is recorded as superseded, so an hour never gets two first
versions. The ledger explains every step (``ledger/<asset>/<date>/<hour-id>[.suffix].json``; the id
grammar and decisions are :mod:`freshidx.trigger.lifecycle`):

``H.aN``         attempt N claimed for a run (run key, batch)    ``H.aN.run``  the run executing it
``H.aN.failed``  that run failed / succeeded without publishing  ``H.aN.expired``  stuck past the timeout or lost
``H.aN.interrupted``  its run was ended by a shutdown (run tag ``freshidx/interrupted``): not counted
``H.parked-N``   attempts exhausted (``freshidx ledger retry --pipeline ads_hourly --hour H`` writes
                 ``H.grant-K``: one more attempt)
``H``            terminal: processed (version, run)              ``H.notready``  first time seen not ready
``H.cK``         late data: correction K opened    ``H.cK.aN``  its attempt N; ``H.cK.aN.done`` when it ends
``H.cK.parked``  the correction's attempts are exhausted   ``H.aN.done``  a claim that did not publish
``H.backfill-R`` a UI backfill / manual run R rebuilt the hour (``H.manual-R``; ``H.invalid-R`` /
                 ``H.refused-R`` a run whose bucket failed validation / was not ready)
``H.out_of_range``  late data for an hour before ``FRESHIDX_PARTITIONS_START`` (never bucketed)

A small CAS'd ``catchup/<asset>/STATE`` keeps the frontier (oldest hour not yet processed or parked)
so a tick examines at most ``hourly_lookahead_hours`` hours after it: cost does not grow with history.
No Dagster or Spark here.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from freshidx.store import NotFound, ObjectStore, layout
from freshidx.store.records import CatchupState as CatchupState
from freshidx.trigger import ledger
from freshidx.trigger.lifecycle import TriggerId

HOUR = dt.timedelta(hours=1)


# ------------------------------------------------------------------------------------- hour ids and keys


def floor_hour(t: dt.datetime) -> dt.datetime:
    return t.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)


def parse_hour_id(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, "%Y%m%dT%H").replace(tzinfo=dt.UTC)


def hour_from_dagster_key(key: str) -> dt.datetime:
    """Dagster hourly partition key ``2026-11-21-14:00`` → UTC hour."""
    return dt.datetime.strptime(key, "%Y-%m-%d-%H:%M").replace(tzinfo=dt.UTC)


def dagster_key(hour: dt.datetime) -> str:
    return hour.astimezone(dt.UTC).strftime("%Y-%m-%d-%H:00")


def hour_path(hour: dt.datetime) -> str:
    return hour.strftime("year=%Y/month=%m/day=%d/hour=%H")


# ------------------------------------------------------------------------------------- ledger


def trigger(hour: dt.datetime) -> TriggerId:
    """The hour's trigger id (its final decision ``H``; the other entries derive from it)."""
    return TriggerId(layout.hour_id(hour))


def entry_key(asset: str, hour: dt.datetime, tid: TriggerId | None = None) -> str:
    return layout.ledger_key(asset, hour.strftime("%Y-%m-%d"), str(tid or trigger(hour)))


def hour_entries(store: ObjectStore, asset: str, hour: dt.datetime) -> dict[str, ledger.Entry]:
    return ledger.trigger_entries(store, asset, hour.strftime("%Y-%m-%d"), layout.hour_id(hour))


def record(store: ObjectStore, asset: str, hour: dt.datetime, tid: TriggerId, decision: str, reason: str,
           **kw: Any) -> bool:
    """Create-once ledger entry ``tid`` of the hour (``trigger(hour)`` = the terminal decision)."""
    return ledger.record(store, entry_key(asset, hour, tid), ledger.Entry(
        asset, str(tid), decision, reason, partition=hour_path(hour), **kw))


def processed(store: ObjectStore, asset: str, hour: dt.datetime) -> bool:
    try:
        store.head(layout.pointer_key(layout.bucket_name(asset, hour)))
    except NotFound:
        return False
    return True


# ------------------------------------------------------------------------------------- raw hours


def oldest_hour(store: ObjectStore, source: str) -> dt.datetime | None:
    """Oldest visible raw hour: descend ``year=/month=/day=/hour=`` taking the first valid prefix."""
    prefix, values = layout.raw_root(source), []
    for name, width in (("year", 4), ("month", 2), ("day", 2), ("hour", 2)):
        for p in sorted(store.list(prefix, delimiter="/").prefixes):
            key, _, val = p[len(prefix):].rstrip("/").partition("=")
            if key == name and val.isdigit() and len(val) == width:
                prefix = p
                values.append(int(val))
                break
        else:
            return None
    try:
        return dt.datetime(*values, tzinfo=dt.UTC)
    except ValueError:
        return None
