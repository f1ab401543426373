"""``freshidx bench freshness`` in sensor mode: one partition measured, through the run the delta sensor
requests for it (the continuous mode's counterpart is :mod:`freshidx.tools.bench_continuous`; the driver
that drops the partitions is :mod:`freshidx.tools.bench_measure`).

Its events: the sensor's ``noticed`` run tag, the run's first event (``run_created``), its start, the
``building delta for <P>`` / ``list_seconds`` / ``build_seconds`` log lines of its last attempt, the delta
pointer (``published``) and the Searcher (``searchable``, :mod:`freshidx.tools.bench_wait`); with the
published version's own account of its build (manifest stats).
"""

from __future__ import annotations

import time
from typing import Any

from freshidx.store.partitions import PartitionId
from freshidx.tools.bench_common import POLL_S, Deadline, Probe, Visibility, log
from freshidx.tools.bench_report import EVENTS, fmt, sample_stages
from freshidx.tools.bench_wait import iso_epoch, wait_searchable
from freshidx.tools.generate import GeneratorConfig, write_partition

_TAG_PARTITION = "freshidx/source_partition"


def _run_record_for(instance: Any, partition: PartitionId) -> Any | None:
    import dagster as dg

    records = instance.get_run_records(dg.RunsFilter(tags={_TAG_PARTITION: partition.path}), limit=5)
    return records[0] if records else None  # newest first


def _run_events(instance: Any, run_id: str) -> dict[str, float | None]:
    """run_created (first event), body_start / listed / built (log lines of the last attempt)."""
    out: dict[str, float | None] = {"run_created": None, "body_start": None, "listed": None, "built": None}
    logs = sorted(instance.all_logs(run_id), key=lambda e: e.timestamp)
    if logs:
        out["run_created"] = float(logs[0].timestamp)
    for e in logs:
        msg = e.user_message or ""
        if msg.startswith("building delta for"):
            out.update(body_start=float(e.timestamp), listed=None, built=None)  # a retry starts over
        elif msg.startswith("list_seconds:") and out["body_start"] is not None:
            out["listed"] = float(e.timestamp)
        elif msg.startswith("build_seconds:") and out["body_start"] is not None:
            out["built"] = float(e.timestamp)
    return out


def _noticed_time(run: Any) -> float | None:
    """When the delta sensor saw the partition (its run tag), epoch seconds."""
    from freshidx.defs.shared.assets import TAG_NOTICED

    text = run.tags.get(TAG_NOTICED)
    return iso_epoch(text) if text else None


def _build_stats(store: Any, version: str | None) -> dict[str, Any] | None:
    """The published version's own account of its build (manifest stats: Spark step seconds, segment
    task steps, segments) and the task attempts of its new segment (a retried task shows attempt 1)."""
    from freshidx.publish.commit import read_manifest

    if version is None:
        return None
    try:
        manifest = read_manifest(store, "delta", version)
    except Exception as exc:  # measurement goes on; reported in the result
        return {"error": f"{type(exc).__name__}: {exc}"}
    newest = (manifest.get("segments") or [{}])[-1]
    return {**{k: v for k, v in (manifest.get("stats") or {}).items() if isinstance(v, int | float)},
            "kind": newest.get("kind"), "attempts": [sh.get("attempt") for sh in newest.get("shards") or []]}


def measure_partition(
    dev: Any, instance: Any, store: Any, vis: Visibility, cfg: GeneratorConfig, partition: PartitionId,
    probe: Probe | None, timeout_s: float,
) -> dict[str, Any]:
    sample: dict[str, Any] = {"partition": partition.path, "probe": probe.query if probe else None, "error": None}
    written = write_partition(store, cfg, partition)
    sample["records"] = written.records
    events: dict[str, float | None] = dict.fromkeys(EVENTS)
    events["arrival"] = time.time()

    def check(published: bool) -> str | None:
        rec = _run_record_for(instance, partition)
        if rec is not None and rec.dagster_run.status.value in ("FAILURE", "CANCELED") and not published:
            return f"run {rec.dagster_run.run_id} {rec.dagster_run.status.value}"
        return None if dev.is_running else "dagster dev exited"

    wait_searchable(store, vis, partition, probe, timeout_s, events, sample, check)
    # The run's own record: wait for it to end (the next partition must find no run in flight).
    end = Deadline(120)
    rec = None
    while not end.passed():
        rec = _run_record_for(instance, partition)
        if rec is not None and rec.dagster_run.is_finished:
            break
        time.sleep(POLL_S)
    if rec is not None:
        run_id = rec.dagster_run.run_id
        sample.update(run_id=run_id, run_status=rec.dagster_run.status.value)
        ev = _run_events(instance, run_id)
        if ev["run_created"] is None:  # no event yet: the run record (1 s resolution in SQLite)
            ev["run_created"] = rec.create_timestamp.timestamp()
        events.update(ev)
        events["run_start"] = float(rec.start_time) if rec.start_time else None
        sample["run_end"] = float(rec.end_time) if rec.end_time else None
        events["noticed"] = _noticed_time(rec.dagster_run)
    elif sample["error"] is None:
        sample["error"] = "no run found for the partition"
    sample["events"] = {k: (round(v, 3) if v is not None else None) for k, v in events.items()}
    sample["stages"] = sample_stages(events)
    sample["build"] = _build_stats(store, sample.get("version"))
    return sample


def log_sample(mode: str, i: int, partitions: int, partition: PartitionId, s: dict[str, Any]) -> None:
    st, ev = s["stages"], s["events"]
    log(f"{mode} {i + 1}/{partitions} {partition.path}: "
        + (f"ERROR {s['error']}" if s["error"] else
           f"published +{fmt(st['arrival_to_published'], 0)} s, searchable "
           f"+{fmt(st['arrival_to_searchable'], 0)} s (run created +{fmt(st['arrival_to_run_created'], 0)},"
           f" start +{fmt((ev['run_start'] or 0) - ev['arrival'], 0)},"
           f" spark job +{fmt((ev['body_start'] or 0) - ev['arrival'], 0)})"))
