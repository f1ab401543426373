"""``freshidx bench freshness --delta-modes continuous``: one partition measured in continuous mode.

With ``FRESHIDX_DELTA_MODE=continuous`` no run is created per partition: the long-lived
``delta_continuous`` run (started by ``delta_continuous_watchdog``) picks the partition up on its next
tick and runs one micro-batch. Everything else is the sensor-mode measurement of
:mod:`freshidx.tools.bench_measure` (the same ``dagster dev`` start and warm-up, generator, probe,
pointer and Searcher polling, per-mode loop and reporting); this module only replaces the per-run
part by the micro-batch's log lines in the continuous run:

============  ============================================================================
arrival       ``write_partition`` returned
micro_batch   ``micro-batch for <P> (attempt …`` log line: the loop's tick saw P and the latest-only
              rule accepted it (its ledger decisions are written)
body_start    ``building delta for <P>`` log line (the ``started`` ledger entry is written; Spark job)
listed        ``list_seconds`` log line: session (warm) + window listed
built         ``build_seconds`` log line
published     the delta pointer's ``published_at``
searchable    the Searcher serves the probe (as in sensor mode)
============  ============================================================================

A retry (a failed attempt, retried on a later tick) starts the micro-batch's events over.
"""

from __future__ import annotations

import re
import time
from typing import Any

from freshidx.store.partitions import PartitionId
from freshidx.tools.bench_common import POLL_S, Deadline, Probe, Visibility, log
from freshidx.tools.bench_report import CONTINUOUS_EVENTS, CONTINUOUS_STAGES, fmt, sample_stages
from freshidx.tools.bench_wait import wait_searchable
from freshidx.tools.generate import GeneratorConfig, write_partition

#: How long after ``searchable`` the micro-batch gets to log its end (the loop must be idle before the
#: next partition is dropped, as sensor mode waits for the run's end).
END_WAIT_S = 60.0


def _micro_batch_events(instance: Any, partition: PartitionId) -> tuple[dict[str, float | None], dict[str, Any]]:
    """The partition's micro-batch events (``micro_batch``, ``body_start``, ``listed``, ``built``) from the
    newest continuous run whose logs name it, and ``{"run_id", "run_status", "outcome"}`` (``outcome``
    None until the micro-batch logged its end)."""
    import dagster as dg

    from freshidx.trigger.continuous_rules import JOB_NAME

    path = re.escape(partition.path)
    started = re.compile(rf"^micro-batch for {path} \(attempt \d+, ")
    failed = re.compile(rf"^micro-batch for {path} \(attempt \d+\) failed: ")
    ended = re.compile(rf"^(\w+) delta \S+ for {path} \(")
    out: dict[str, float | None] = {"micro_batch": None, "body_start": None, "listed": None, "built": None}
    info: dict[str, Any] = {"run_id": None, "run_status": None, "outcome": None}
    for run in instance.get_runs(dg.RunsFilter(job_name=JOB_NAME), limit=3):  # newest first
        mine = False
        for e in sorted(instance.all_logs(run.run_id), key=lambda e: e.timestamp):
            msg = e.user_message or ""
            if started.match(msg):
                mine = True
                out = {"micro_batch": float(e.timestamp), "body_start": None, "listed": None, "built": None}
                info["outcome"] = None
            elif not mine or out["micro_batch"] is None:
                continue
            elif msg.startswith(f"building delta for {partition.path} ("):
                out["body_start"] = float(e.timestamp)
            elif msg.startswith("list_seconds:") and out["body_start"] is not None and out["listed"] is None:
                out["listed"] = float(e.timestamp)
            elif msg.startswith("build_seconds:") and out["body_start"] is not None and out["built"] is None:
                out["built"] = float(e.timestamp)
            elif failed.match(msg):
                info["outcome"] = "failed"
            elif (m := ended.match(msg)) is not None:
                info["outcome"] = m.group(1)
            elif msg.startswith("nothing new: delta not published") or (
                    msg.startswith("delta ") and " not published: " in msg):
                info["outcome"] = "not published"
        if mine:
            info.update(run_id=run.run_id, run_status=run.status.value)
            break
    return out, info


def measure_partition(
    dev: Any, instance: Any, store: Any, vis: Visibility, cfg: GeneratorConfig, partition: PartitionId,
    probe: Probe | None, timeout_s: float,
) -> dict[str, Any]:
    """Drop ``partition`` and measure it through the continuous run (the sensor-mode
    ``_measure_partition`` with the micro-batch's log lines instead of a run's)."""
    sample: dict[str, Any] = {"partition": partition.path, "probe": probe.query if probe else None, "error": None}
    written = write_partition(store, cfg, partition)
    sample["records"] = written.records
    events: dict[str, float | None] = dict.fromkeys(CONTINUOUS_EVENTS)
    events["arrival"] = time.time()
    wait_searchable(store, vis, partition, probe, timeout_s, events, sample,
                    lambda published: None if dev.is_running else "dagster dev exited")
    end = Deadline(END_WAIT_S)
    while True:
        found, info = _micro_batch_events(instance, partition)
        if info["outcome"] is not None or end.passed() or not dev.is_running:
            break
        time.sleep(max(POLL_S, 0.5))
    events.update(found)
    sample.update(info)
    if found["micro_batch"] is None and sample["error"] is None:
        sample["error"] = "no micro-batch found for the partition in the continuous run's logs"
    elif info["outcome"] == "failed" and events["searchable"] is None and sample["error"] is None:
        sample["error"] = f"micro-batch failed in run {info['run_id']}"
    sample["events"] = {k: (round(v, 3) if v is not None else None) for k, v in events.items()}
    sample["stages"] = sample_stages(events, CONTINUOUS_STAGES)
    return sample


def log_sample(mode: str, i: int, partitions: int, partition: PartitionId, s: dict[str, Any]) -> None:
    st = s["stages"]
    log(f"{mode} {i + 1}/{partitions} {partition.path}: "
        + (f"ERROR {s['error']}" if s["error"] else
           f"published +{fmt(st['arrival_to_published'], 0)} s, searchable "
           f"+{fmt(st['arrival_to_searchable'], 0)} s (micro-batch +{fmt(st['arrival_to_micro_batch'], 0)},"
           f" Spark job +{fmt(st['micro_batch_to_spark_job'], 0)}, build {fmt(st['spark_build'], 0)},"
           f" publish {fmt(st['publish'], 0)})"))
