"""What is serving and how fresh it is: the data behind ``freshidx status``."""

from __future__ import annotations

import datetime as dt
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from freshidx.publish.commit import iso, parse_iso, read_pointer, utcnow
from freshidx.store import NotFound, ObjectStore
from freshidx.store.partitions import PartitionId
from freshidx.store.records import Heartbeat, LedgerEntry, RecordError, RuntimeRecord
from freshidx.trigger.lifecycle import Decision, Mark
from freshidx.trigger.listing import newest_partition

RECENT_DAYS = 2
RECENT_LIMIT = 10


def index_status(store: ObjectStore, index: str, now: dt.datetime) -> dict[str, Any] | None:
    pointer, _ = read_pointer(store, index)
    if pointer is None:
        return None
    out = dict(pointer)
    out["lag_seconds"] = round((now - parse_iso(pointer.position)).total_seconds(), 3)
    out["age_seconds"] = round((now - parse_iso(pointer.published_at)).total_seconds(), 3)
    if index == "delta":
        out.update(delta_segments(store, pointer.version))
    else:
        out.update(full_build(store, pointer.version))
    return out


def full_build(store: ObjectStore, version: str) -> dict[str, Any]:
    """How the serving full version was built: from state (over which full version, with how many
    segments, how many state builds in a row) or from every raw partition (and why)."""
    from freshidx.publish.commit import read_manifest

    try:
        manifest = read_manifest(store, "full", version)
    except NotFound:
        return {"build": None}
    return {"build": manifest.build or "raw", "raw_reason": manifest.raw_reason,
            "base_full_version": manifest.base_full_version,
            "segments_used": len(manifest.segments_used), "state_chain": manifest.state_chain}


def delta_segments(store: ObjectStore, version: str) -> dict[str, Any]:
    """How the serving delta version was built and what it serves: its segments, oldest first."""
    from freshidx.publish.commit import read_manifest

    try:
        manifest = read_manifest(store, "delta", version)
    except NotFound:
        return {"build": None, "segments": None}
    segs = manifest.segment_list()
    return {
        "build": manifest.build or "window",
        "trigger": manifest.trigger,
        "rebuild_reason": manifest.rebuild_reason,
        "full_version": manifest.full_version,
        "segments": None if segs is None else [
            {"version": g.version, "position": g.position, "kind": g.kind, "docs": g.doc_count,
             "kill_list": g.covered_count, "files": len(g.files)} for g in segs],
    }


def recent_decisions(store: ObjectStore, pipeline: str, now: dt.datetime,
                     decisions: set[str], limit: int = RECENT_LIMIT) -> list[dict[str, Any]]:
    """Newest ledger decisions of the given kinds from the last few days (bounded reads)."""
    found: list[dict[str, Any]] = []
    for back in range(RECENT_DAYS):
        day = (now - dt.timedelta(days=back)).strftime("%Y-%m-%d")
        keys = sorted((o.key for o in store.list(f"ledger/{pipeline}/{day}/").objects), reverse=True)
        for key in keys:
            name = key.rsplit("/", 1)[1].removesuffix(".json")
            if "." in name and not name.endswith(f".{Mark.GAP}"):  # attempts (P.aN…) are not partition decisions
                continue
            try:
                entry = LedgerEntry.read(store, key)[0]
            except NotFound:
                continue
            if entry.decision in decisions:
                found.append(dict(entry))
                if len(found) >= limit:
                    return found
    return found


SERVER_RECORD = "spark-server"
NOT_KNOWN = "–"  # printed for a missing value: never "None"


@dataclass(frozen=True)
class ServerStateLocation:
    """Which Spark server state dir describes this store, and how it was found (shown to the user)."""

    state_dir: str | None
    found_by: str


def record_spark_server_state(store: ObjectStore, state_dir: str | os.PathLike[str]) -> None:
    """Called by whoever starts a supervised server for this store (``freshidx demo``): records the
    host-local state dir in the store so ``status --store`` finds it wherever it is run from."""
    RuntimeRecord(state_dir=str(Path(state_dir).resolve()), hostname=socket.gethostname(), pid=os.getpid(),
                  written_at=iso(utcnow())).write(store, SERVER_RECORD)


def locate_spark_server_state(store: ObjectStore, explicit: str | None = None,
                              configured: str | None = None, configured_url: str | None = None) -> ServerStateLocation:
    """The state dir (or control endpoint URL) of the Spark server that serves ``store``; never a CWD-relative
    guess.

    Order: ``--spark-server-state`` (a directory, or an ``http://host:port`` control endpoint);
    ``FRESHIDX_SPARK_SERVER_URL``; ``FRESHIDX_SPARK_SERVER_STATE``; the record a demo left in the
    store (same host only: the path is local); for a ``file://`` store, ``<parent>/spark-server``
    when the parent is a demo home (``freshidx demo`` keeps ``<home>/store`` and
    ``<home>/spark-server`` side by side). Otherwise none: the store has no known server.
    """
    if explicit:
        return ServerStateLocation(explicit, "--spark-server-state")
    if configured_url:
        return ServerStateLocation(configured_url, "FRESHIDX_SPARK_SERVER_URL")
    if configured:
        return ServerStateLocation(configured, "FRESHIDX_SPARK_SERVER_STATE")
    try:
        rec = RuntimeRecord.of(store, SERVER_RECORD)
    except RecordError:
        rec = None  # not a record this freshidx reads: as if there were none
    if rec is not None and rec.state_dir and rec.hostname == socket.gethostname():
        return ServerStateLocation(rec.state_dir, "recorded in the store by the demo")
    if store.uri.startswith("file://"):
        home = Path(store.uri.removeprefix("file://")).parent
        if (home / "spark-server").is_dir():
            return ServerStateLocation(str(home / "spark-server"), f"demo home {home}")
    return ServerStateLocation(None, "none")


def spark_server(state_dir: str | None) -> dict[str, Any] | None:
    """The server state for display. A state whose supervisor is gone is reported as not running
    with what it last said: its ``status`` (e.g. ``restarting``) was frozen when the process died."""
    if not state_dir:
        return None
    if state_dir.startswith(("http://", "https://")):
        return _endpoint_server(state_dir)
    from freshidx.spark_server.server_state import read_state

    state = read_state(state_dir)
    if state is None:
        return {"status": "not running", "running": False, "state_dir": state_dir,
                "note": "no state.json: never started there"}
    out = spark_server_fields(state)
    out["state_dir"] = state_dir
    alive = state.get("supervisor_alive")
    if alive is False:
        out["last_status"] = state.get("status")
        out["status"] = "not running"
        out["running"] = False
        out["note"] = f"supervisor pid {state.get('supervisor_pid') or NOT_KNOWN} gone"
    elif alive is None:  # written on another host: its pids mean nothing here
        out["running"] = None
        out["note"] = f"state written on host {state.get('hostname') or NOT_KNOWN}; liveness not checked"
    else:
        out["running"] = state.get("status") != "down"
    return out


def _endpoint_server(url: str) -> dict[str, Any]:
    """:func:`spark_server` through the supervisor's control endpoint (it answers: it is running)."""
    from freshidx.spark_server.server_state import ControlUnreachable, read_endpoint_state

    try:
        state = read_endpoint_state(url)
    except ControlUnreachable as exc:
        return {"status": "not running", "running": False, "state_dir": url, "note": str(exc)}
    if state is None:
        return {"status": "not running", "running": False, "state_dir": url, "note": "no state from the endpoint"}
    out = spark_server_fields(state)
    out["state_dir"] = url
    out["running"] = state.get("status") != "down"
    return out


def spark_server_fields(state: dict[str, Any]) -> dict[str, Any]:
    keep = ("status", "url", "pid", "supervisor_pid", "hostname", "started_at", "last_restart_at",
            "last_restart_reason", "restarts", "heap_used_bytes", "heap_max_bytes", "rss_bytes",
            "session_processes", "consecutive_health_failures", "health_busy_since", "health_busy_failures",
            "supervisor_alive", "updated_at", "last_error")
    return {k: state.get(k) for k in keep}


def continuous_status(store: ObjectStore, now: dt.datetime) -> dict[str, Any] | None:
    """The continuous run's heartbeat (``continuous/delta/heartbeat.json``), as status shows it."""
    from freshidx.trigger.continuous_rules import describe_heartbeat

    try:
        hb = Heartbeat.latest(store, "delta")
    except RecordError:
        return None  # unreadable: status shows no run rather than failing
    return describe_heartbeat(hb, now)


def trigger_mode(delta: dict[str, Any] | None, run: dict[str, Any] | None) -> tuple[str | None, str]:
    """The delta trigger mode the deployment runs, and how that is known: from the store, never from this
    shell's environment (the deployment's processes have their own). A continuous run that is alive says
    continuous; otherwise the serving delta's manifest says how its micro-batch was triggered."""
    if run is not None and run.get("state") == "live":
        return "continuous", "a live continuous run"
    trigger = (delta or {}).get("trigger")
    if trigger in ("continuous", "sensor"):
        return str(trigger), "the serving delta's run"
    if trigger:
        return None, f"the serving delta was launched by {trigger}"
    return None, "nothing published yet"


def collect(store: ObjectStore, source: str, now: dt.datetime | None = None,
            spark_server_state: str | None = None, spark_server_found_by: str | None = None) -> dict[str, Any]:
    now = now or utcnow()
    newest, ignored = newest_partition(store, source)
    delta = index_status(store, "delta", now)
    continuous = continuous_status(store, now)
    mode, mode_known_from = trigger_mode(delta, continuous)
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
        "recent_skipped": recent_decisions(store, "delta", now,
                                           {Decision.SUPERSEDED, Decision.FOLDED, Decision.NOT_LISTED}),
        "recent_refused": recent_decisions(store, "delta", now, {Decision.REFUSED}),
        "spark_server": spark_server(spark_server_state),
        "spark_server_found_by": spark_server_found_by or ("given" if spark_server_state else "none"),
        "ads_hourly": catchup_status(store),
        "delta_mode": mode,
        "delta_mode_known_from": mode_known_from,
        "continuous": continuous,
    }


def catchup_status(store: ObjectStore) -> dict[str, Any] | None:
    """The catch-up frontier (every hour before it is processed or parked) and the parked hours."""
    from freshidx.catchup.planner import ASSET
    from freshidx.catchup.state import CatchupState

    state, etag = CatchupState.load(store, ASSET)
    if etag is None:
        return None
    return {"frontier": state.frontier, "parked": state.parked, "late_cursor": state.late_cursor}


def _v(value: Any) -> str:
    return NOT_KNOWN if value is None or value == "" else str(value)


def render(s: dict[str, Any]) -> str:
    newest = s["newest_visible_partition"] or f"{NOT_KNOWN} (no raw partition yet)"
    lines = [f"store   {s['store']}", f"source  raw/{s['source']}/  newest visible: {newest}"]
    for name in ("delta", "full"):
        idx = s[name]
        if idx is None:
            lines.append(f"{name:6}  {NOT_KNOWN}  nothing published yet")
            continue
        where = idx.get("source_partition") or idx.get("cutoff")
        lines.append(
            f"{name:6}  version {idx['version']}  seq {idx['seq']}  docs {idx['doc_count']}  "
            f"covers {_v(where)}  lag {idx['lag_seconds']:.0f}s  published {idx['published_at']}"
        )
        if idx.get("window_start"):
            lines.append(f"        window ({idx['window_start']}, {_v(idx.get('window_end'))}]")
        if name == "delta" and idx.get("segments") is not None:
            why = f" ({idx['rebuild_reason']})" if idx.get("rebuild_reason") else ""
            segs = ", ".join(f"{g['position'][11:16]} {g['kind']} {g['docs']} docs" for g in idx["segments"])
            lines.append(f"        built {idx['build']}{why}; {len(idx['segments'])} segments over full "
                         f"{_v(idx.get('full_version'))}: {segs}")
        if name == "full" and idx.get("build") == "state":
            lines.append(f"        built from state: full {_v(idx.get('base_full_version'))} + "
                         f"{idx['segments_used']} delta segments ({idx['state_chain']} state builds in a row)")
        elif name == "full" and idx.get("build"):
            lines.append(f"        built from every raw partition ({_v(idx.get('raw_reason'))})")
    lines += _render_mode(s.get("delta_mode"), s.get("continuous"), s.get("delta_mode_known_from"))
    if s["seconds_behind_newest"] is not None:
        lines.append(f"delta is {s['seconds_behind_newest']:.0f}s of partitions behind the newest visible one")
    lines += _render_server(s.get("spark_server"), s.get("spark_server_found_by"))
    hourly = s.get("ads_hourly")
    if hourly:
        lines.append(f"hourly  ads_hourly frontier {_v(hourly['frontier'])} (every hour before it is processed "
                     f"or parked)  parked: {', '.join(hourly['parked']) or 'none'}")
    if s["recent_skipped"]:
        lines.append("recently skipped:")
        lines += [f"  {_v(e.get('partition') or e.get('scope'))}: {e['reason']}" for e in s["recent_skipped"]]
    if s["recent_refused"]:
        lines.append("recently refused:")
        lines += [f"  {_v(e.get('partition'))}: {e['decision']}: {e['reason']}" for e in s["recent_refused"]]
    return "\n".join(lines)


def _render_mode(mode: str | None, run: dict[str, Any] | None, known_from: str | None = None) -> list[str]:
    """The delta trigger mode (as the store shows it) and, when a continuous run left a heartbeat, that run."""
    if mode is None and run is None:
        return []
    head = f"mode    {_v(mode)}" + (f" (from {known_from})" if known_from else "")
    if run is None:
        return [head]
    ended = run.get("ended") or {}
    what = (f"ended ({ended.get('reason')}: {ended.get('detail')})" if run["state"] == "ended" else
            f"{run['state']}, last heartbeat {run['seconds_since_heartbeat']:.0f}s ago")
    return [f"{head}  continuous run {str(run.get('run_id'))[:8]} {what}",
            f"        age {run['age_seconds']:.0f}s  next planned restart {_v(run.get('planned_restart_at'))}  "
            f"last tick {_v(run.get('last_tick'))}  micro-batches {_v(run.get('micro_batches'))} "
            f"(published {_v(run.get('published'))})  rss {_v(run.get('rss_mb'))} MiB"]


def _render_server(srv: dict[str, Any] | None, found_by: str | None) -> list[str]:
    if not srv:
        return [f"spark   {NOT_KNOWN}  no Connect server state for this store (runs use local Spark; for a "
                "server elsewhere pass --spark-server-state DIR|URL or set FRESHIDX_SPARK_SERVER_URL or "
                "FRESHIDX_SPARK_SERVER_STATE)"]
    kind = "endpoint" if str(srv["state_dir"]).startswith(("http://", "https://")) else "state"
    where = f"  [{kind} {srv['state_dir']}, {found_by or 'given'}]"
    if srv.get("running") is False:
        last = f"last state: {srv['last_status']}, " if srv.get("last_status") else ""
        head = f"spark   connect server not running ({last}{srv.get('note')})"
    else:
        head = f"spark   connect server {_v(srv.get('status'))}  {_v(srv.get('url'))}  pid {_v(srv.get('pid'))}"
        if srv.get("note"):
            head += f"  ({srv['note']})"
    lines = [head + where]
    restarts = srv.get("restarts") or 0
    if srv.get("last_restart_at"):
        lines.append(f"        restarts {restarts}  last restart {srv['last_restart_at']} "
                     f"({_v(srv.get('last_restart_reason'))})")
    elif "restarts" in srv:
        lines.append(f"        restarts {restarts}  (never restarted)")
    if srv.get("running") is not False and srv.get("health_busy_since"):
        lines.append(f"        health probes failing since {srv['health_busy_since']} while runs hold leases "
                     f"({_v(srv.get('health_busy_failures'))} probes; restarted only if their jobs make no "
                     f"progress for the hang timeout; stalled {_v(srv.get('progress_stalled_s'))} s)")
    if srv.get("status") == "down" and srv.get("last_error"):
        lines.append(f"        last error: {str(srv['last_error']).splitlines()[0][:200]}")
    return lines
