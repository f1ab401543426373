"""The pure decisions of ``freshidx bench soak --mode continuous`` (:mod:`freshidx.tools.bench_soak_continuous`
runs the soak): which partition to drop next, the data lag of a sample, what a continuous run's log and
tags say, which written partitions the ledger and the pointer explain, the summary and the verdict."""

from __future__ import annotations

import datetime as dt
import math
import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

from freshidx.defs.runs.run_status import IN_FLIGHT
from freshidx.store.partitions import PartitionId
from freshidx.tools.bench_report import summarize

_STARTED = re.compile(r"^micro-batch for (\S+) \(attempt (\d+), ")
_FAILED = re.compile(r"^micro-batch for (\S+) \(attempt (\d+)\) failed: (.*)")
_PUBLISHED = re.compile(r"^published delta (\S+) for (\S+) \(")
_ENDS = re.compile(r"^continuous delta ends: (.*)")
_ENDED_BY_TAG = {"max_runtime": "planned restart (runtime)", "max_memory": "planned restart (memory)",
                 "stop_requested": "stop requested"}
#: Run statuses of a run that has not ended: the sensors' own vocabulary (freshidx.defs.runs.run_status.IN_FLIGHT).
_UNFINISHED = frozenset(status.value for status in IN_FLIGHT)


def next_partition(last: PartitionId | None, now: dt.datetime) -> PartitionId:
    """The partition of the next drop: the current minute, or one after the last drop if that is later."""
    at = PartitionId.from_datetime(now)
    return at if last is None or at > last else PartitionId(last.at + dt.timedelta(minutes=1))


def sample_lag(at: float, written: list[dict[str, Any]], covered: str | None) -> float | None:
    """Data lag at epoch ``at``: how long the oldest written partition the pointer (source partition
    ``covered``) does not cover has waited; 0 when it covers them all, None before the first drop."""
    if not written:
        return None
    edge = PartitionId.parse(covered) if covered else None
    waiting = [w["arrival"] for w in written if edge is None or PartitionId.parse(w["partition"]) > edge]
    return round(max(0.0, at - min(waiting)), 3) if waiting else 0.0


def run_end(status: str | None, ended_tag: str | None) -> str:
    """Why a continuous run ended, from its status and the ``freshidx/ended`` tag the loop sets."""
    if ended_tag in _ENDED_BY_TAG:
        return _ENDED_BY_TAG[ended_tag]
    if status in _UNFINISHED:
        return "running at the end of the soak"
    if status == "FAILURE":
        return "crash"
    return "canceled" if status == "CANCELED" else f"ended {status} without a reason tag"


def scan_run_log(messages: Iterable[tuple[float, str]]) -> dict[str, Any]:
    """A continuous run's micro-batches from its log lines ``(timestamp, message)``."""
    out: dict[str, Any] = {"micro_batches": 0, "published": 0, "failures": [], "end_message": None}
    for ts, msg in messages:
        if _STARTED.match(msg):
            out["micro_batches"] += 1
        elif m := _FAILED.match(msg):
            out["failures"].append({"partition": m[1], "attempt": int(m[2]), "error": m[3][:300], "at": ts})
        elif _PUBLISHED.match(msg):
            out["published"] += 1
        elif m := _ENDS.match(msg):
            out["end_message"] = m[1][:300]
    return out


def first_publication(partition: str, history: list[tuple[str, float]]) -> float | None:
    """When the pointer first covered ``partition``: the earliest ``(source_partition, published_at)``
    publication whose source partition is at or after it."""
    p = PartitionId.parse(partition)
    times = [at for source, at in history if source and PartitionId.parse(source) >= p]
    return min(times) if times else None


def explain(written: list[dict[str, Any]], decisions: dict[str, dict[str, Any] | None], explained: set[str],
            history: list[tuple[str, float]]) -> list[dict[str, Any]]:
    """Per written partition: its ledger decision and reason, whether the ledger explains it (a final
    decision, parked, or in a recorded gap: ``explained``), and arrival → published (pointer)."""
    rows = []
    for w in written:
        d = decisions.get(w["partition"]) or {}
        published = first_publication(w["partition"], history)
        rows.append({**w, "decision": d.get("decision"), "reason": d.get("reason"),
                     "explained": w["partition"] in explained, "published_at": published,
                     "lag_s": round(published - w["arrival"], 3) if published is not None else None})
    return rows


def summarize_runs(runs: list[dict[str, Any]], samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each run (oldest first) with why it ended and its largest sampled process-tree RSS."""
    peak: dict[str, int] = {}
    for s in samples:
        if s.get("run_id") and s.get("run_rss_bytes"):
            peak[s["run_id"]] = max(peak.get(s["run_id"], 0), s["run_rss_bytes"])
    return [{**r, "ended": run_end(r.get("status"), r.get("ended_tag")),
             "max_rss_bytes": peak.get(r["run_id"]), "samples": sum(s.get("run_id") == r["run_id"] for s in samples)}
            for r in sorted(runs, key=lambda r: r.get("start") or math.inf)]


def soak_summary(partitions: list[dict[str, Any]], runs: list[dict[str, Any]],
                 samples: list[dict[str, Any]]) -> dict[str, Any]:
    failures = [f for r in runs for f in r.get("failures", [])]
    ended = Counter(r["ended"] for r in runs)
    servers = [s["server_rss_bytes"] for s in samples if s.get("server_rss_bytes")]
    return {
        "written": len(partitions),
        "published": sum(p["decision"] == "published" for p in partitions),
        "covered_by_pointer": sum(p["published_at"] is not None for p in partitions),
        "decisions": dict(Counter(str(p["decision"]) for p in partitions)),
        "not_published": [{k: p[k] for k in ("partition", "decision", "reason")}
                          for p in partitions if p["decision"] != "published"],
        "unexplained": [p["partition"] for p in partitions if not p["explained"]],
        "arrival_to_published": summarize([p["lag_s"] for p in partitions]),
        "micro_batches": sum(r.get("micro_batches", 0) for r in runs),
        "failed_micro_batches": len(failures),
        "failures": failures[:50],
        "runs": len(runs),
        "ended": dict(ended),
        "planned_restarts": ended[_ENDED_BY_TAG["max_runtime"]] + ended[_ENDED_BY_TAG["max_memory"]],
        "crashes": ended["crash"],
        "max_run_rss_bytes": max((r["max_rss_bytes"] or 0 for r in runs), default=0) or None,
        "max_server_rss_bytes": max(servers) if servers else None,
        "data_lag": summarize([s.get("lag_s") for s in samples]),
    }


def verdict(summary: dict[str, Any], error: str | None) -> dict[str, Any]:
    """Passed iff no error, something was written, 0 failed micro-batches, every partition explained."""
    why = ([f"error: {error}"] if error else []) + (["no partition written"] if not summary.get("written") else [])
    if summary.get("failed_micro_batches"):
        why.append(f"{summary['failed_micro_batches']} failed micro-batches")
    if summary.get("unexplained"):
        why.append(f"{len(summary['unexplained'])} partitions not explained in the ledger")
    return {"passed": not why, "why": why}
