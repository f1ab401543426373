"""The end-to-end benchmarks' numbers: stage definitions, percentiles and summaries, and the
human-readable tables of ``freshidx bench freshness`` and ``freshidx bench soak``."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from freshidx.tools.bench_common import MODES

#: Sensor mode, Connect, 100k-doc window: sensor mode's freshness goal (docs/benchmarks.md).
GOAL_P50_S = 6.0
GOAL_MAX_S = 10.0

#: Events recorded per partition, in pipeline order.
EVENTS = ("arrival", "noticed", "run_created", "run_start", "body_start", "listed", "built", "published",
          "searchable")

#: (name, from event, to event, label, depth). Depth 0 rows are consecutive and add up to the total;
#: depth 1 rows split the depth 0 row above them.
Stage = tuple[str, str, str, str, int]
Stages = tuple[Stage, ...]


def _from_spark_job(session: str) -> tuple[Stage, ...]:
    """The rows both delta modes share, from the micro-batch's Spark job to searchable."""
    return (
        ("spark_job_to_published", "body_start", "published", "Spark job start → published", 0),
        ("session_and_listing", "body_start", "listed", f"{session} + window listing", 1),
        ("spark_build", "listed", "built", "Spark build (read→shards)", 1),
        ("publish", "built", "published", "gate + manifest + CAS", 1),
        ("published_to_searchable", "published", "searchable", "published → searchable (refresh)", 0),
        ("arrival_to_published", "arrival", "published", "arrival → published", -1),
        ("arrival_to_searchable", "arrival", "searchable", "arrival → searchable", -1),
    )


STAGES: Stages = (
    ("arrival_to_run_created", "arrival", "run_created", "arrival → run created (sensor)", 0),
    ("arrival_to_noticed", "arrival", "noticed", "arrival → noticed (sensor tick)", 1),
    ("noticed_to_run_created", "noticed", "run_created", "noticed → run created (plan, ledger)", 1),
    ("run_created_to_start", "run_created", "run_start", "run created → run start (queue, worker)", 0),
    ("run_start_to_spark_job", "run_start", "body_start", "run start → Spark job start (step)", 0),
    *_from_spark_job("session (+lease)"),
)
MAIN_STAGES = tuple(name for name, _, _, _, depth in STAGES if depth == 0)
#: The per-sample columns of the table (event times relative to arrival), sensor mode.
SAMPLE_COLUMNS = ("run_created", "run_start", "body_start", "published")

#: Continuous mode (``FRESHIDX_DELTA_MODE=continuous``): no run per partition, the long-lived
#: ``delta_continuous`` run's log lines for the partition's micro-batch instead.
CONTINUOUS_GOAL_P50_S = 3.0
CONTINUOUS_GOAL_MAX_S = 6.0
#: A seed-sized window (a million documents, ~44,600 changes a partition) has its own bound on the worst case.
SEED_SIZED_DOCS = 1_000_000
SEED_SIZED_GOAL_MAX_S = 5.0


def continuous_goals(window_docs: int) -> tuple[float, float]:
    """Continuous mode's goal (p50, max seconds from arrival to searchable) at ``window_docs``."""
    return CONTINUOUS_GOAL_P50_S, SEED_SIZED_GOAL_MAX_S if window_docs >= SEED_SIZED_DOCS else CONTINUOUS_GOAL_MAX_S

CONTINUOUS_EVENTS = ("arrival", "micro_batch", "body_start", "listed", "built", "published", "searchable")
CONTINUOUS_STAGES: Stages = (
    ("arrival_to_micro_batch", "arrival", "micro_batch", "arrival → micro-batch start (trigger phase)", 0),
    ("micro_batch_to_spark_job", "micro_batch", "body_start", "micro-batch → Spark job start (ledger)", 0),
    *_from_spark_job("session (warm)"),
)
CONTINUOUS_SAMPLE_COLUMNS = ("micro_batch", "body_start", "published")


def percentile(values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (``p`` in 0..100) of ``values``; NaN when empty."""
    s = sorted(values)
    if not s:
        return float("nan")
    if len(s) == 1:
        return float(s[0])
    pos = (len(s) - 1) * p / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return float(s[lo] + (s[hi] - s[lo]) * (pos - lo))


def summarize(values: Sequence[float | None]) -> dict[str, float | int | None]:
    """``{"p50", "p95", "max", "n"}`` over the non-None values (seconds, 3 decimals; None if no value)."""
    vals = [float(v) for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return {"p50": None, "p95": None, "max": None, "n": 0}
    return {"p50": round(percentile(vals, 50), 3), "p95": round(percentile(vals, 95), 3),
            "max": round(max(vals), 3), "n": len(vals)}


def sample_stages(events: dict[str, float | None], stages: Stages = STAGES) -> dict[str, float | None]:
    """Every stage duration of one sample (None where an end point is missing)."""
    out: dict[str, float | None] = {}
    for name, start, end, _, _ in stages:
        a, b = events.get(start), events.get(end)
        out[name] = round(b - a, 3) if a is not None and b is not None else None
    return out


def mode_summary(samples: list[dict[str, Any]], stage_defs: Stages = STAGES) -> dict[str, Any]:
    ok = [s for s in samples if s.get("events", {}).get("searchable") is not None]
    main = [name for name, _, _, _, depth in stage_defs if depth == 0]
    stages = {name: summarize([s["stages"].get(name) for s in ok]) for name, *_ in stage_defs}
    dominant_p50 = max(main, key=lambda n: stages[n]["p50"] or -1.0) if ok else None
    worst = max(ok, key=lambda s: s["stages"]["arrival_to_searchable"] or 0.0) if ok else None
    dominant_worst = (max(main, key=lambda n: worst["stages"].get(n) or -1.0) if worst else None)
    return {
        "arrival_to_searchable": stages["arrival_to_searchable"],
        "arrival_to_published": stages["arrival_to_published"],
        "stages": stages,
        "completed": len(ok),
        "failed": len(samples) - len(ok),
        "dominant_stage_p50": dominant_p50,
        "dominant_stage_worst_sample": dominant_worst,
        "worst_sample": worst["partition"] if worst else None,
        "searchable_parts": _parts_summary(ok),
    }


#: The parts of ``published → searchable`` (bench_common.Visibility.parts), in order, with their labels.
SEARCHABLE_PARTS = (("wait_s", "wait for the refresh"), ("pointers_s", "pointers"), ("manifests_s", "manifests"),
                    ("download_s", "download + sha256"), ("open_s", "tantivy open"),
                    ("kill_list_s", "kill-list (within the download)"))


def _parts_summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    parts = [s["searchable_parts"] for s in samples if s.get("searchable_parts")]
    out: dict[str, Any] = {name: summarize([p.get(name) for p in parts]) for name, _ in SEARCHABLE_PARTS}
    out["downloaded_bytes"] = summarize([p.get("downloaded_bytes") for p in parts])
    return out


def parts_line(summary: dict[str, Any]) -> str | None:
    """One line: the p50 of each part of ``published → searchable``."""
    parts = summary.get("searchable_parts") or {}
    if (parts.get("wait_s") or {}).get("p50") is None:
        return None
    cells = [f"{label} {fmt((parts.get(name) or {}).get('p50'), 0)}" for name, label in SEARCHABLE_PARTS]
    size = (parts.get("downloaded_bytes") or {}).get("p50")
    return ("published → searchable p50 by part (s): " + ", ".join(cells)
            + (f"; {size / 2**20:.1f} MiB downloaded" if isinstance(size, int | float) else ""))


def goal_verdict(summary: dict[str, Any], p50_goal: float = GOAL_P50_S, max_goal: float = GOAL_MAX_S) -> dict[str, Any]:
    a2s = summary.get("arrival_to_searchable") or {}
    p50, mx = a2s.get("p50"), a2s.get("max")
    met = p50 is not None and mx is not None and p50 <= p50_goal and mx <= max_goal
    return {"p50_goal_s": p50_goal, "max_goal_s": max_goal, "met": bool(met),
            "p50_met": p50 is not None and p50 <= p50_goal, "max_met": mx is not None and mx <= max_goal}


def fmt(v: Any, width: int = 6) -> str:
    return f"{v:{width}.2f}" if isinstance(v, int | float) else f"{'–':>{width}}"


def render_freshness(result: dict[str, Any]) -> str:
    """The human-readable report of :func:`bench_freshness`: per delta mode (sensor: the top-level
    ``connect``/``local`` results; continuous: ``result["continuous"]``) a side-by-side table per Spark mode."""
    cfg = result.get("config", {})
    lines = [
        f"freshidx bench freshness: {cfg.get('partitions')} partitions per mode, window ≈ "
        f"{cfg.get('window_docs', 0):,} docs requested, {os.cpu_count()} cores",
    ]
    if any(isinstance(result.get(m), dict) for m in MODES):
        if isinstance(result.get("continuous"), dict):
            lines.append("delta mode sensor (delta_index_sensor requests one run per micro-batch):")
        lines += _render_section(result, STAGES, SAMPLE_COLUMNS, "run created, run start, Spark job")
    cont = result.get("continuous")
    if isinstance(cont, dict) and any(isinstance(cont.get(m), dict) for m in MODES):
        lines += ["", "delta mode continuous (one long-lived delta_continuous run, trigger every "
                  f"{cfg.get('continuous_trigger_seconds', 1)} s):"]
        lines += _render_section(cont, CONTINUOUS_STAGES, CONTINUOUS_SAMPLE_COLUMNS, "micro-batch, Spark job",
                                 continuous_goals(int(cfg.get("window_docs") or 0)))
    return "\n".join(lines)


def _render_section(result: dict[str, Any], stages: Stages, columns: Sequence[str], columns_label: str,
                    goals: tuple[float, float] = (GOAL_P50_S, GOAL_MAX_S)) -> list[str]:
    """One delta mode's part of :func:`render_freshness`: each Spark mode's header, the stage table side by
    side, the goal lines and the samples."""
    modes = [m for m in MODES if m in result and isinstance(result[m], dict)]
    return [*_mode_headers(result, modes), *_stage_table(result, modes, stages), "",
            *_goal_lines(result, modes, goals), *_sample_lines(result, modes, columns, columns_label)]


def _mode_headers(result: dict[str, Any], modes: list[str]) -> list[str]:
    lines: list[str] = []
    for m in modes:
        r = result[m]
        if r.get("error"):
            lines.append(f"  {m}: FAILED during {r.get('phase')}: {r['error']}")
            continue
        lines.append(
            f"  {m:7} spark={r.get('spark')}  delta docs {r.get('delta_docs')}  full docs {r.get('full_docs')}  "
            f"{r.get('completed')}/{r.get('partitions')} searchable  searchable via {r.get('searchable_method')}  "
            f"load avg {r.get('load_avg_range')}"
        )
        srv = r.get("spark_server")
        if srv:
            lines.append(
                f"          Connect server: up in {srv.get('ready_s')} s, restarted {srv.get('restarts')} times "
                f"(last: {srv.get('last_restart_reason')}); at the end {srv.get('session_processes')} processes, "
                f"session RSS {mib(srv.get('session_rss_bytes')).strip()} MiB "
                f"(PSS {mib(srv.get('session_pss_bytes')).strip()} MiB; "
                f"file-backed {mib(srv.get('session_file_rss_bytes')).strip()} MiB of the RSS)"
            )
        peak = r.get("session_rss_peak")
        if peak:
            lines.append(
                f"          session RSS at its highest (sampled every second): {mib(peak.get('bytes')).strip()} MiB "
                f"in {peak.get('processes')} processes, during the {peak.get('phase')}"
            )
    return lines


def _stage_table(result: dict[str, Any], modes: list[str], stages: Stages) -> list[str]:
    label_w = max(len(label) + 2 * max(depth, 0) for _, _, _, label, depth in STAGES + stages) + 2
    head = f"{'stage (seconds)':<{label_w}}" + "".join(f"| {m + ' p50':>12} {'p95':>6} {'max':>6} " for m in modes)
    lines = ["", head, "-" * len(head)]
    for name, _, _, label, depth in stages:
        if depth < 0 and not lines[-1].startswith("-"):
            lines.append("-" * len(head))
        indent = "  " * max(depth, 0)
        row = f"{indent + label:<{label_w}}"
        for m in modes:
            st = (result[m].get("stages") or {}).get(name) or {}
            row += f"| {fmt(st.get('p50'), 12)} {fmt(st.get('p95'))} {fmt(st.get('max'))} "
        lines.append(row)
    return lines


def _goal_lines(result: dict[str, Any], modes: list[str], goals: tuple[float, float]) -> list[str]:
    lines: list[str] = []
    for m in modes:
        r = result[m]
        if r.get("error") or not r.get("completed"):
            continue
        a2s = r["arrival_to_searchable"]
        verdict = r.get("goal") or goal_verdict(r, *goals)
        goal = (f"goal p50 ≤ {verdict['p50_goal_s']:g} s, max ≤ {verdict['max_goal_s']:g} s: "
                f"{'met' if verdict['met'] else 'MISSED'}") if m == "connect" else "(comparison)"
        lines.append(f"{m:7} arrival → searchable p50 {a2s['p50']:.2f} s, p95 {a2s['p95']:.2f} s, "
                     f"max {a2s['max']:.2f} s  {goal}")
        lines.append(f"        dominant stage: {r.get('dominant_stage_p50')} (by p50); in the worst sample "
                     f"({r.get('worst_sample')}): {r.get('dominant_stage_worst_sample')}")
        if (parts := parts_line(r)) is not None:
            lines.append(f"        {parts}")
    return lines


def _sample_lines(result: dict[str, Any], modes: list[str], columns: Sequence[str], columns_label: str) -> list[str]:
    lines: list[str] = []
    for m in modes:
        samples = result[m].get("samples") or []
        if not samples:
            continue
        lines += ["", f"{m} samples (s): partition, {columns_label}, published, searchable, "
                      "delay before drop, load"]
        for s in samples:
            st = s.get("stages", {})
            ev = s.get("events", {})
            a = ev.get("arrival")

            def rel(name: str, a: float | None = a, ev: dict[str, Any] = ev) -> str:
                t = ev.get(name)
                return fmt(t - a) if t is not None and a is not None else fmt(None)

            err = f"  ERROR {s['error']}" if s.get("error") else ""
            lines.append(
                f"  {s['partition'][-27:]}  {' '.join(rel(c) for c in columns)} "
                f"{fmt(st.get('arrival_to_searchable'))}  {fmt(s.get('delay_before_drop_s'))}"
                f"  {fmt(s.get('load_avg_1m'))}{err}"
            )
    return lines


def mib(v: Any) -> str:
    return f"{v / 2**20:7.0f}" if isinstance(v, int | float) else f"{'–':>7}"


def render_soak(r: dict[str, Any]) -> str:
    """The human-readable report of :func:`bench_soak`."""
    c = r.get("config", {})
    bs = r.get("batch_seconds") or {}
    lines = [
        f"freshidx bench soak: {r.get('completed')}/{r.get('ran')} batches ok ({r.get('failed')} failed"
        + (f"; stopped early, {r.get('batches')} asked" if r.get("stopped_early") else "")
        + f") in {r.get('wall_s')} s; window {c.get('window_minutes')} min ≈ {c.get('window_docs')} docs; "
        + ("one shared session" if c.get("shared_session") else "one Connect session per batch")
        + f"; planned restart every {c.get('restart_every_s')} s"
        + (f" / {c.get('restart_every_batches')} batches" if c.get("restart_every_batches") else ""),
        f"batch seconds: p50 {fmt(bs.get('p50'), 0)}  p95 {fmt(bs.get('p95'), 0)}  max {fmt(bs.get('max'), 0)}"
        f"   (server ready in {r.get('server_ready_s')} s)",
        "",
        f"{'batch':>6} {'elapsed s':>9} {'batch s':>8} {'pid':>8} {'heap MiB':>8} {'/max':>7} {'JVM RSS':>8} "
        f"{'sess RSS':>8} {'procs':>6} {'restarts':>8}",
    ]
    for t in r.get("timeline", []):
        lines.append(
            f"{t['batch'] + 1:>6} {t['elapsed_s']:>9.1f} {t['batch_s']:>8.2f} {t.get('server_pid') or '–':>8} "
            f"{mib(t.get('heap_used_bytes')):>8} {mib(t.get('heap_max_bytes')):>7} {mib(t.get('jvm_rss_bytes')):>8} "
            f"{mib(t.get('session_rss_bytes')):>8} {t.get('session_processes', 0):>6} {t.get('restarts'):>8}"
        )
    lines += ["", "per server process (MiB: first → last, max; processes = JVM + Python worker daemons):"]
    for s in r.get("per_server", []):
        def trend(key: str, s: dict[str, Any] = s) -> str:
            return (f"{mib(s.get(key + '_first')).strip()} → {mib(s.get(key + '_last')).strip()} "
                    f"(max {mib(s.get(key + '_max')).strip()})")

        lines.append(f"  pid {s['pid']}: batches {s['first_batch'] + 1}–{s.get('last_batch', 0) + 1}  "
                     f"heap {trend('heap_used_bytes')}  JVM RSS {trend('jvm_rss_bytes')}  "
                     f"session RSS {trend('session_rss_bytes')}  processes {s.get('session_processes_first')} → "
                     f"{s.get('session_processes_last')}")
    lines += ["", f"restarts performed: {len(r.get('restarts', []))}"]
    for x in r.get("restarts", []):
        lines.append(f"  #{x['restarts']} {x['reason']} at {x['at']} (seen at batch {x['seen_at_batch'] + 1}, "
                     f"whose lease waited {x['batch_lease_wait_s']} s): took {x['duration_s']} s, "
                     f"pid {x['old_pid']} → {x['new_pid']}")
    for f in r.get("failures", []):
        lines.append(f"  batch {f['batch'] + 1} failed: {f['error']}")
    return "\n".join(lines)


#: Rows of the printed continuous-soak curve at most (``--json`` has every sample).
SOAK_CURVE_ROWS = 80


def soak_curve_rows(samples: list[dict[str, Any]], max_rows: int = SOAK_CURVE_ROWS) -> list[dict[str, Any]]:
    """At most about ``max_rows`` evenly spaced samples, plus the last one and every run change."""
    if len(samples) <= max_rows:
        return samples
    step = math.ceil(len(samples) / max_rows)
    return [s for i, s in enumerate(samples)
            if i % step == 0 or i == len(samples) - 1 or s.get("run_id") != samples[i - 1].get("run_id")]


def clock(seconds: float) -> str:
    """Elapsed seconds as ``m:ss``."""
    return f"{int(seconds) // 60:3d}:{int(seconds) % 60:02d}"


def render_soak_continuous(r: dict[str, Any]) -> str:
    """The human-readable report of ``bench soak --mode continuous``
    (:func:`freshidx.tools.bench_soak_continuous.bench_soak_continuous`): summary, runs, the curve."""
    c, s, v = r.get("config", {}), r.get("summary", {}), r.get("verdict", {})
    lag = s.get("arrival_to_published") or {}
    lines = [
        f"freshidx bench soak --mode continuous: {s.get('written', 0)} partitions, one every {c.get('interval_s')} s "
        f"for {c.get('minutes')} min; window {c.get('window_minutes')} min ≈ {c.get('window_docs')} docs; planned "
        f"restart every {c.get('max_runtime')} or at {c.get('max_rss_mb')} MiB RSS",
        "verdict: " + ("PASSED" if v.get("passed") else "FAILED: " + "; ".join(v.get("why", []))),
        f"partitions: written {s.get('written', 0)}, decisions {s.get('decisions', {})}, covered by the pointer "
        f"{s.get('covered_by_pointer', 0)}, not explained {len(s.get('unexplained', []))}",
        f"arrival → published: p50 {fmt(lag.get('p50'), 0)} s  p95 {fmt(lag.get('p95'), 0)} s  "
        f"max {fmt(lag.get('max'), 0)} s  (n {lag.get('n', 0)})",
        f"micro-batches: {s.get('micro_batches', 0)} started (the warm-up's included), "
        f"{s.get('failed_micro_batches', 0)} failed",
        f"continuous runs: {s.get('runs', 0)} ({s.get('planned_restarts', 0)} planned restarts, "
        f"{s.get('crashes', 0)} crashes); max run RSS {mib(s.get('max_run_rss_bytes')).strip()} MiB, max server "
        f"RSS {mib(s.get('max_server_rss_bytes')).strip()} MiB",
    ]
    if r.get("error"):
        lines.append(f"error: {r['error']}")
    for run in r.get("runs", []):
        lines.append(f"  run {run['run_id'][:8]} {run.get('status')}: {run.get('micro_batches', 0)} micro-batches "
                     f"({len(run.get('failures', []))} failed), max RSS {mib(run.get('max_rss_bytes')).strip()} MiB;"
                     f" started because {run.get('started_because')}; ended: {run['ended']}")
    for p in s.get("not_published", [])[:10]:
        lines.append(f"  {p['partition']}: {p['decision']} ({p['reason']})")
    for f in s.get("failures", [])[:10]:
        lines.append(f"  FAILED micro-batch for {f['partition']} (attempt {f['attempt']}): {f['error']}")
    samples = r.get("samples", [])
    rows = soak_curve_rows(samples)
    lines += ["", f"curve ({len(rows)} of {len(samples)} samples; server = Connect JVM + Python workers):",
              f"{'time':>6}  {'run':8}  {'run MiB':>7}  {'server MiB':>10}  {'seq':>5}  {'lag s':>6}  {'runs':>4}"]
    for x in rows:
        lines.append(f"{clock(x['t']):>6}  {(x.get('run_id') or '–')[:8]:8}  {mib(x.get('run_rss_bytes')):>7}  "
                     f"{mib(x.get('server_rss_bytes')):>10}  {x.get('seq') if x.get('seq') is not None else '–':>5}  "
                     f"{fmt(x.get('lag_s'))}  {x.get('runs', 0):>4}")
    return "\n".join(lines)
