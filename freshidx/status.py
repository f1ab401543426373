"""What is serving and how fresh it is: the data behind ``freshidx status``."""

from __future__ import annotations

import datetime as dt
from typing import Any

from freshidx.listing import newest_partition
from freshidx.partitions import PartitionId
from freshidx.publish import parse_iso, read_pointer, utcnow
from freshidx.store import NotFound, ObjectStore

RECENT_DAYS = 2
RECENT_LIMIT = 10


def index_status(store: ObjectStore, index: str, now: dt.datetime) -> dict[str, Any] | None:
    pointer, _ = read_pointer(store, index)
    if pointer is None:
        return None
    out = pointer.to_dict()
    out["lag_seconds"] = round((now - parse_iso(pointer.position)).total_seconds(), 3)
    out["age_seconds"] = round((now - parse_iso(pointer.published_at)).total_seconds(), 3)
    return out


def recent_decisions(store: ObjectStore, pipeline: str, now: dt.datetime,
                     decisions: set[str], limit: int = RECENT_LIMIT) -> list[dict[str, Any]]:
    """Newest ledger decisions of the given kinds from the last few days (bounded reads)."""
    found: list[dict[str, Any]] = []
    for back in range(RECENT_DAYS):
        day = (now - dt.timedelta(days=back)).strftime("%Y-%m-%d")
        keys = sorted((o.key for o in store.list(f"ledger/{pipeline}/{day}/").objects), reverse=True)
        for key in keys:
            name = key.rsplit("/", 1)[1].removesuffix(".json")
            if "." in name and not name.endswith(".gap"):  # attempts (P.aN…) are not partition decisions
                continue
            try:
                entry = store.get_json(key)[0]
            except NotFound:
                continue
            if entry.get("decision") in decisions:
                found.append(entry)
                if len(found) >= limit:
                    return found
    return found


def spark_server(state_dir: str | None) -> dict[str, Any] | None:
    if not state_dir:
        return None
    from freshidx.spark.server import read_state

    state = read_state(state_dir)
    if state is None:
        return {"status": "not running", "state_dir": state_dir}
    keep = ("status", "url", "pid", "started_at", "last_restart_at", "last_restart_reason", "restarts",
            "heap_used_bytes", "heap_max_bytes", "rss_bytes", "session_processes", "consecutive_health_failures",
            "health_busy_since", "health_busy_failures", "supervisor_alive", "updated_at")
    return {k: state.get(k) for k in keep}


def collect(store: ObjectStore, source: str, now: dt.datetime | None = None,
            spark_server_state: str | None = None) -> dict[str, Any]:
    now = now or utcnow()
    newest, ignored = newest_partition(store, source)
    delta = index_status(store, "delta", now)
    behind = None
    if newest is not None and delta and delta.get("source_partition"):
        behind = round((newest.at - PartitionId.parse(delta["source_partition"]).at).total_seconds(), 3)
    return {
        "store": store.uri,
        "source": source,
        "now": now.isoformat(),
        "newest_visible_partition": newest.path if newest else None,
        "ignored_prefixes": len(ignored),
        "seconds_behind_newest": behind,
        "delta": delta,
        "full": index_status(store, "full", now),
        "recent_skipped": recent_decisions(store, "delta", now, {"superseded", "not_listed"}),
        "recent_refused": recent_decisions(store, "delta", now, {"refused"}),
        "spark_server": spark_server(spark_server_state),
        "ads_hourly": catchup_status(store),
    }


def catchup_status(store: ObjectStore) -> dict[str, Any] | None:
    """The catch-up frontier (every hour before it is processed or parked) and the parked hours."""
    from freshidx.catchup import ASSET, CatchupState

    state, etag = CatchupState.load(store, ASSET)
    if etag is None:
        return None
    return {"frontier": state.frontier, "parked": state.parked, "late_cursor": state.late_cursor}


def render(s: dict[str, Any]) -> str:
    lines = [f"store   {s['store']}", f"source  raw/{s['source']}/  newest visible: {s['newest_visible_partition']}"]
    for name in ("delta", "full"):
        idx = s[name]
        if idx is None:
            lines.append(f"{name:6}  (nothing published yet)")
            continue
        where = idx.get("source_partition") or idx.get("cutoff")
        lines.append(
            f"{name:6}  version {idx['version']}  seq {idx['seq']}  docs {idx['doc_count']}  "
            f"covers {where}  lag {idx['lag_seconds']:.0f}s  published {idx['published_at']}"
        )
        if idx.get("window_start"):
            lines.append(f"        window ({idx['window_start']}, {idx['window_end']}]")
    if s["seconds_behind_newest"] is not None:
        lines.append(f"delta is {s['seconds_behind_newest']:.0f}s of partitions behind the newest visible one")
    srv = s.get("spark_server")
    if srv:
        lines.append(f"spark   connect server {srv.get('status')}  {srv.get('url') or ''}  restarts "
                     f"{srv.get('restarts', 0)}  last restart {srv.get('last_restart_at')} "
                     f"({srv.get('last_restart_reason')})")
        if srv.get("health_busy_since"):
            lines.append(f"        health probes failing since {srv['health_busy_since']} while runs keep it busy "
                         f"({srv.get('health_busy_failures')} probes; not restarted within the busy grace)")
    hourly = s.get("ads_hourly")
    if hourly:
        lines.append(f"hourly  ads_hourly frontier {hourly['frontier']} (every hour before it is processed or "
                     f"parked)  parked: {', '.join(hourly['parked']) or 'none'}")
    if s["recent_skipped"]:
        lines.append("recently skipped:")
        lines += [f"  {e['partition'] or e.get('scope')}: {e['reason']}" for e in s["recent_skipped"]]
    if s["recent_refused"]:
        lines.append("recently refused:")
        lines += [f"  {e['partition']}: {e['decision']}: {e['reason']}" for e in s["recent_refused"]]
    return "\n".join(lines)


