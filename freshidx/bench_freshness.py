"""``freshidx bench freshness`` and ``freshidx bench soak``: end-to-end latency and server endurance.

``freshidx bench freshness [--partitions N] [--window-docs D] [--modes connect,local] [--json]``
    A real end-to-end measurement through ``dagster dev`` (webserver + daemon, the repository's
    ``dagster.yaml``) on a temporary local store, once with a supervised Spark Connect server
    (:class:`~freshidx.spark.supervisor.SparkConnectSupervisor`, runs take leases from it) and once with
    local-mode Spark (a ``SparkSession`` per run), in one invocation.

    Per mode: seed a 5 h window of history (~D documents), start ``dagster dev``, wait until the
    first delta *and* the SLA sensor's first full index are published and no run is in flight (the
    warm-up; the full-index schedule is stopped so it cannot land in the middle), then drop N
    partitions one at a time, each after the previous one is searchable, its run has ended and a
    random 0–``--max-delay`` s pause (which samples the phase of the 5 s sensor loop). For each
    partition it records (epoch seconds):

    ============  ============================================================================
    arrival       ``write_partition`` returned (one file per partition: bursts are disabled)
    sensor_tick   the delta sensor tick that requested the run (GraphQL tick timestamp)
    run_created   first event of the run (``create_timestamp`` has only 1 s resolution in SQLite)
    run_start     the run record's ``start_time`` (the ``PIPELINE_START`` event)
    body_start    ``building delta for …`` log line: the asset body = the Spark job starts
    listed        ``list_seconds`` log line: Spark session (+ lease) created, window listed
    built         ``build_seconds`` log line: Spark read/validate/dedup/index shards done
    published     the delta pointer's ``published_at`` (compare-and-swap of ``CURRENT``)
    searchable    a long-lived :class:`freshidx.serving.Searcher` (what ``freshidx search``
                  uses), after ``refresh()``, returns for ``+title:<word> +ad_id:"<ad>"`` a delta
                  hit of exactly that version, for an ad whose newest record is in the partition
                  (if the Searcher cannot serve the published versions, ``ServingError``: the
                  pointer covers the partition and the version's manifest lists shards;
                  ``searchable_method`` says which)
    ============  ============================================================================

    and prints per-stage p50 / p95 / max (linear-interpolated percentiles) for both modes side by
    side. ``--json`` prints ``{"connect": {"arrival_to_searchable": {"p50", "p95", "max", "n"},
    "stages": {...}, "samples": [...], ...}, "local": {...}, "config": {...}}`` (seconds); the
    table then goes to stderr. Polling (0.2 s) is measurement, not synchronisation.
    ``--window-minutes`` shortens the pipeline's window (tests); ``--health-timeout`` /
    ``--health-failures`` tune the Connect supervisor's health check (see :func:`bench_freshness`).

``freshidx bench soak [--batches N] [--restart-every S] [--restart-every-batches K] [--shared-session]
[--max-minutes M] [--json]``
    N micro-batches against one supervised Spark Connect server, no Dagster: each batch writes a
    new partition to a temporary local store, takes a lease, opens a Connect session, runs the real
    delta build path (:func:`freshidx.delta.build_delta`) and publishes it
    (:func:`freshidx.publish.publish`). Prints the server's heap (``jcmd``, sampled by the
    supervisor) and RSS (JVM and the JVM's whole session incl. Python workers) and its process
    count over time, batch latency, and every restart the supervisor performed (planned by age, heap,
    or every K batches). ``--shared-session`` reuses one Connect session for all batches (a Dagster
    run cannot: one session per run), to tell per-session costs from per-batch ones; ``--max-minutes``
    caps the wall time.

Numbers only: nothing here asserts on timings. Every process started here (Connect server,
``dagster dev`` and its children) is stopped on exit, also on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from freshidx.generate import GeneratorConfig, history_partitions, partition_records, write_partition
from freshidx.partitions import PartitionId
from freshidx.records import STATUSES

__all__ = [
    "EVENTS",
    "MAIN_STAGES",
    "MODES",
    "STAGES",
    "Probe",
    "bench_freshness",
    "bench_soak",
    "generator_config_for",
    "main",
    "percentile",
    "pick_probe",
    "render_freshness",
    "render_soak",
    "sample_stages",
    "summarize",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
MODES = ("connect", "local")
WINDOW_MINUTES = 300
SOURCE = "ad_updates"
POLL_S = 0.2  # measurement resolution
GOAL_P50_S = 8.0
GOAL_MAX_S = 15.0
DEFAULT_CDS_DIR = Path(tempfile.gettempdir()) / "freshidx-bench-cds"
_SENSOR = "delta_index_sensor"
_TAG_PARTITION = "freshidx/source_partition"
_TITLE_WORD = re.compile(r"^[a-z0-9]+$")
_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
_AD_IN_LINE = re.compile(r'"ad_id":"([^"]+)"')

#: Events recorded per partition, in pipeline order.
EVENTS = ("arrival", "sensor_tick", "run_created", "run_start", "body_start", "listed", "built", "published",
          "searchable")

#: (name, from event, to event, label, depth). Depth 0 rows are consecutive and add up to the total;
#: depth 1 rows split the depth 0 row above them.
STAGES: tuple[tuple[str, str, str, str, int], ...] = (
    ("arrival_to_run_created", "arrival", "run_created", "arrival → run created (sensor)", 0),
    ("arrival_to_tick", "arrival", "sensor_tick", "arrival → sensor tick (loop phase)", 1),
    ("tick_to_run_created", "sensor_tick", "run_created", "tick → run created (evaluation)", 1),
    ("run_created_to_start", "run_created", "run_start", "run created → run start (queue, worker)", 0),
    ("run_start_to_spark_job", "run_start", "body_start", "run start → Spark job start (step)", 0),
    ("spark_job_to_published", "body_start", "published", "Spark job start → published", 0),
    ("session_and_listing", "body_start", "listed", "session (+lease) + window listing", 1),
    ("spark_build", "listed", "built", "Spark build (read→shards)", 1),
    ("publish", "built", "published", "gate + manifest + CAS", 1),
    ("published_to_searchable", "published", "searchable", "published → searchable (refresh)", 0),
    ("arrival_to_published", "arrival", "published", "arrival → published", -1),
    ("arrival_to_searchable", "arrival", "searchable", "arrival → searchable", -1),
)
MAIN_STAGES = tuple(name for name, _, _, _, depth in STAGES if depth == 0)


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ============================================================================== statistics


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


def sample_stages(events: dict[str, float | None]) -> dict[str, float | None]:
    """Every stage duration of one sample (None where an end point is missing)."""
    out: dict[str, float | None] = {}
    for name, start, end, _, _ in STAGES:
        a, b = events.get(start), events.get(end)
        out[name] = round(b - a, 3) if a is not None and b is not None else None
    return out


def _mode_summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [s for s in samples if s.get("events", {}).get("searchable") is not None]
    stages = {name: summarize([s["stages"].get(name) for s in ok]) for name, *_ in STAGES}
    dominant_p50 = max(MAIN_STAGES, key=lambda n: stages[n]["p50"] or -1.0) if ok else None
    worst = max(ok, key=lambda s: s["stages"]["arrival_to_searchable"] or 0.0) if ok else None
    dominant_worst = (max(MAIN_STAGES, key=lambda n: worst["stages"].get(n) or -1.0) if worst else None)
    return {
        "arrival_to_searchable": stages["arrival_to_searchable"],
        "arrival_to_published": stages["arrival_to_published"],
        "stages": stages,
        "completed": len(ok),
        "failed": len(samples) - len(ok),
        "dominant_stage_p50": dominant_p50,
        "dominant_stage_worst_sample": dominant_worst,
        "worst_sample": worst["partition"] if worst else None,
    }


def goal_verdict(summary: dict[str, Any]) -> dict[str, Any]:
    a2s = summary.get("arrival_to_searchable") or {}
    p50, mx = a2s.get("p50"), a2s.get("max")
    met = p50 is not None and mx is not None and p50 <= GOAL_P50_S and mx <= GOAL_MAX_S
    return {"p50_goal_s": GOAL_P50_S, "max_goal_s": GOAL_MAX_S, "met": bool(met),
            "p50_met": p50 is not None and p50 <= GOAL_P50_S, "max_met": mx is not None and mx <= GOAL_MAX_S}


def _fmt(v: Any, width: int = 6) -> str:
    return f"{v:{width}.2f}" if isinstance(v, int | float) else f"{'–':>{width}}"


def render_freshness(result: dict[str, Any]) -> str:
    """The human-readable report of :func:`bench_freshness` (side-by-side table per mode)."""
    modes = [m for m in MODES if m in result and isinstance(result[m], dict)]
    cfg = result.get("config", {})
    lines = [
        f"freshidx bench freshness: {cfg.get('partitions')} partitions per mode, window ≈ "
        f"{cfg.get('window_docs', 0):,} docs requested, {os.cpu_count()} cores",
    ]
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
                f"session RSS {_mib(srv.get('session_rss_bytes')).strip()} MiB"
            )
    label_w = max(len(label) + 2 * max(depth, 0) for _, _, _, label, depth in STAGES) + 2
    head = f"{'stage (seconds)':<{label_w}}" + "".join(f"| {m + ' p50':>12} {'p95':>6} {'max':>6} " for m in modes)
    lines += ["", head, "-" * len(head)]
    for name, _, _, label, depth in STAGES:
        if depth < 0 and not lines[-1].startswith("-"):
            lines.append("-" * len(head))
        indent = "  " * max(depth, 0)
        row = f"{indent + label:<{label_w}}"
        for m in modes:
            st = (result[m].get("stages") or {}).get(name) or {}
            row += f"| {_fmt(st.get('p50'), 12)} {_fmt(st.get('p95'))} {_fmt(st.get('max'))} "
        lines.append(row)
    lines.append("")
    for m in modes:
        r = result[m]
        if r.get("error") or not r.get("completed"):
            continue
        a2s = r["arrival_to_searchable"]
        verdict = r.get("goal") or goal_verdict(r)
        goal = (f"goal p50 ≤ {GOAL_P50_S:.0f} s, max ≤ {GOAL_MAX_S:.0f} s: "
                f"{'met' if verdict['met'] else 'MISSED'}") if m == "connect" else "(comparison)"
        lines.append(f"{m:7} arrival → searchable p50 {a2s['p50']:.2f} s, p95 {a2s['p95']:.2f} s, "
                     f"max {a2s['max']:.2f} s  {goal}")
        lines.append(f"        dominant stage: {r.get('dominant_stage_p50')} (by p50); in the worst sample "
                     f"({r.get('worst_sample')}): {r.get('dominant_stage_worst_sample')}")
    for m in modes:
        samples = result[m].get("samples") or []
        if not samples:
            continue
        lines += ["", f"{m} samples (s): partition, run created, run start, Spark job, published, searchable, "
                      "delay before drop, load"]
        for s in samples:
            st = s.get("stages", {})
            ev = s.get("events", {})
            a = ev.get("arrival")

            def rel(name: str, a: float | None = a, ev: dict[str, Any] = ev) -> str:
                t = ev.get(name)
                return _fmt(t - a) if t is not None and a is not None else _fmt(None)

            err = f"  ERROR {s['error']}" if s.get("error") else ""
            lines.append(
                f"  {s['partition'][-27:]}  {rel('run_created')} {rel('run_start')} {rel('body_start')} "
                f"{rel('published')} {_fmt(st.get('arrival_to_searchable'))}  {_fmt(s.get('delay_before_drop_s'))}"
                f"  {_fmt(s.get('load_avg_1m'))}{err}"
            )
    return "\n".join(lines)


# ============================================================================== data


def generator_config_for(window_docs: int, seed: int = 0, window_minutes: int = WINDOW_MINUTES) -> GeneratorConfig:
    """A generator config whose history (one partition every 5 min over the window) holds ~``window_docs``
    distinct ads.

    ``ads`` = 1.25 × D; 25 % of the changes go to the 2 % hot ads, the rest uniformly, so the distinct
    ads seen after T valid changes are ``hot + (ads − hot)(1 − exp(−0.75 T / ads))``; solve for T.
    Bursts are disabled: every partition is one file, so "arrival" is one atomic put.
    """
    if window_docs < 10:
        raise ValueError(f"window_docs must be >= 10, got {window_docs}")
    ads = max(20, round(window_docs * 1.25))
    hot = max(1, ads // 50)
    frac = min(0.999, max(0.0, (window_docs - hot) / (ads - hot)))
    total_valid = -math.log(1.0 - frac) * ads / 0.75
    partitions = max(1, window_minutes // 5)
    malformed = 0.01
    changes = max(1, math.ceil(total_valid / (partitions * (1 - malformed))))
    return GeneratorConfig(source=SOURCE, seed=seed, ads=ads, products=max(10, ads // 8),
                           changes_per_partition=changes, malformed_rate=malformed, burst_probability=0.0)


@dataclass(frozen=True)
class Probe:
    """A document of one partition that its delta version must serve."""

    ad_id: str
    title: str
    word: str
    version: int

    @property
    def query(self) -> str:
        return f'+title:{self.word} +ad_id:"{self.ad_id}"'


def _looks_valid(r: Any) -> bool:
    if not isinstance(r, dict):
        return False
    for name in ("ad_id", "campaign_id", "product_id", "title", "bid", "status", "updated_at", "version"):
        if r.get(name) is None:
            return False
    bid = r["bid"]
    return (
        r["status"] in STATUSES and isinstance(bid, int | float) and not isinstance(bid, bool) and bid >= 0
        and isinstance(r["updated_at"], str) and bool(_TIMESTAMP.match(r["updated_at"]))
        and isinstance(r["version"], int) and isinstance(r["title"], str)
    )


def pick_probe(cfg: GeneratorConfig, partition: PartitionId, seed: int = 0) -> Probe | None:
    """An ad whose newest record is in ``partition``, active and beyond doubt valid.

    Any ad that appears in a line failing the (strict) check is avoided altogether, so a
    disagreement between this check and the pipeline's validation can never pick a rejected record.
    """
    lines, _ = partition_records(cfg, partition)
    tainted: set[str] = set()
    latest: dict[str, dict[str, Any]] = {}
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            r = None
        if not _looks_valid(r):
            tainted.update(_AD_IN_LINE.findall(line))
            if isinstance(r, dict) and isinstance(r.get("ad_id"), str):
                tainted.add(r["ad_id"])
            continue
        assert isinstance(r, dict)
        have = latest.get(r["ad_id"])
        if have is None or r["version"] > have["version"]:
            latest[r["ad_id"]] = r
    candidates = []
    for ad, r in sorted(latest.items()):
        if ad in tainted or r["status"] != "active":
            continue
        words = [w for w in r["title"].split() if _TITLE_WORD.match(w)]
        if words:
            candidates.append(Probe(ad, r["title"], max(words, key=len), int(r["version"])))
    if not candidates:
        return None
    return random.Random(f"{seed}:{partition.compact}").choice(candidates)


def _seed_history(store_dir: Path, cfg: GeneratorConfig, now: dt.datetime, window_minutes: int) -> tuple[int, float]:
    from freshidx.store import StoreConfig, open_store

    store = open_store(StoreConfig(uri=store_dir.as_uri()))
    t0 = time.monotonic()
    parts = history_partitions(now, dt.timedelta(minutes=window_minutes))
    records = 0
    for p in parts:
        records += write_partition(store, cfg, p).records
    return records, round(time.monotonic() - t0, 1)


# ============================================================================== Connect server


class _ConnectServer:
    """A :class:`SparkConnectSupervisor` on a free loopback port, supervised in a background thread."""

    def __init__(self, state_dir: Path, *, restart_every_s: float = 24 * 3600.0, driver_memory: str = "2g",
                 heap_check_interval_s: float = 30.0, max_heap_fraction: float = 0.85,
                 cds_dir: Path | None = DEFAULT_CDS_DIR, health_timeout_s: float = 15.0,
                 health_failures: int = 3) -> None:
        from freshidx.devserver import free_port
        from freshidx.spark.server_config import ServerConfig
        from freshidx.spark.supervisor import SparkConnectSupervisor

        self.config = ServerConfig(
            port=free_port(), state_dir=state_dir, restart_every_s=restart_every_s, driver_memory=driver_memory,
            heap_check_interval_s=heap_check_interval_s, max_heap_fraction=max_heap_fraction,
            drain_timeout_s=120.0, cds_dir=cds_dir, health_timeout_s=health_timeout_s,
            health_failures=health_failures,
        )
        self.supervisor = SparkConnectSupervisor(self.config)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_error: BaseException | None = None
        self._started = threading.Event()
        self.ready_s: float | None = None
        self.timings: dict[str, Any] = {}

    @property
    def url(self) -> str:
        return self.config.url

    @property
    def state_dir(self) -> Path:
        return self.config.state_dir

    def start_async(self) -> None:
        """Start (in the background thread) and keep supervising; :meth:`wait_up` waits for it."""

        def body() -> None:
            t0 = time.monotonic()
            try:
                self.timings = self.supervisor.start()
                self.ready_s = round(time.monotonic() - t0, 1)
            except BaseException as exc:  # reported by wait_up
                self._start_error = exc
                return
            finally:
                self._started.set()
            self.supervisor.run_forever(self._stop)

        self._thread = threading.Thread(target=body, name="freshidx-bench-spark-server", daemon=True)
        self._thread.start()

    def wait_up(self, timeout_s: float = 600.0) -> None:
        if not self._started.wait(timeout_s):
            raise TimeoutError(f"Spark Connect server not up after {timeout_s:.0f}s (log {self.state_dir}/server.log)")
        if self._start_error is not None:
            raise RuntimeError(f"Spark Connect server failed to start: {self._start_error}") from self._start_error

    def state(self) -> dict[str, Any]:
        from freshidx.spark.server_state import read_state

        return read_state(self.state_dir) or {}

    def stop(self) -> None:
        self._stop.set()
        self.supervisor.stop()
        if self._thread is not None:
            self._thread.join(60)


# ============================================================================== freshness


def _dagster_yaml() -> Path | None:
    p = REPO_ROOT / "dagster.yaml"
    return p if p.exists() else None


_SCHEDULE_QUERY = """
query FreshidxBenchSchedule($selector: ScheduleSelector!) {
  scheduleOrError(scheduleSelector: $selector) {
    __typename
    ... on Schedule { name scheduleState { id status } }
  }
}
"""

_STOP_SCHEDULE = """
mutation FreshidxBenchStopSchedule($id: String!) {
  stopRunningSchedule(id: $id) {
    __typename
    ... on ScheduleStateResult { scheduleState { id status } }
    ... on PythonError { message }
  }
}
"""


def _stop_schedule(dev: Any, name: str) -> str:
    """Stop a running schedule (best effort); returns its status afterwards or the error."""
    try:
        selector = {"repositoryLocationName": dev.location_name, "repositoryName": dev.repository_name,
                    "scheduleName": name}
        sched = dev.graphql(_SCHEDULE_QUERY, {"selector": selector})["scheduleOrError"]
        state = (sched or {}).get("scheduleState") or {}
        if not state.get("id"):
            return f"not found ({(sched or {}).get('__typename')})"
        if state.get("status") != "RUNNING":
            return str(state.get("status"))
        res = dev.graphql(_STOP_SCHEDULE, {"id": state["id"]})["stopRunningSchedule"]
        return str(((res or {}).get("scheduleState") or {}).get("status") or res)
    except Exception as exc:  # measurement goes on; reported in the result
        return f"error: {exc}"


def _stop_sensor(dev: Any, name: str) -> str:
    """Stop a running sensor (best effort); returns its status afterwards, or why not."""
    try:
        status = dev.sensor_state(name, tick_limit=0).get("status")
    except Exception as exc:  # not in this code location
        return f"not found ({type(exc).__name__})"
    if status != "RUNNING":
        return str(status)
    try:
        return str(dev.stop_sensor(name).get("status"))
    except Exception as exc:  # measurement goes on; reported in the result
        return f"error: {exc}"[:300]


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def passed(self) -> bool:
        return time.monotonic() >= self.end


def _in_flight_runs(instance: Any) -> list[Any]:
    from dagster._core.storage.dagster_run import DagsterRunStatus, RunsFilter

    statuses = [DagsterRunStatus.NOT_STARTED, DagsterRunStatus.QUEUED, DagsterRunStatus.STARTING,
                DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]
    return list(instance.get_runs(RunsFilter(statuses=statuses), limit=20))


def _run_record_for(instance: Any, partition: PartitionId) -> Any | None:
    from dagster._core.storage.dagster_run import RunsFilter

    records = instance.get_run_records(RunsFilter(tags={_TAG_PARTITION: partition.path}), limit=5)
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


def _tick_time(dev: Any, run_id: str) -> float | None:
    try:
        ticks = dev.sensor_state(_SENSOR, tick_limit=30)["ticks"]
    except Exception:
        return None
    for t in ticks:
        if run_id in (t.get("runIds") or []):
            return float(t["timestamp"])
    return None


def _iso_epoch(text: str) -> float:
    from freshidx.publish import parse_iso

    return parse_iso(text).timestamp()


class _Visibility:
    """Decides when a delta version is searchable: the real Searcher if it works, else the fallback."""

    def __init__(self, store: Any, cache_dir: Path) -> None:
        self.store = store
        self.method = "searcher"
        self.error: str | None = None
        self.searcher: Any = None
        try:
            from freshidx.serving import Searcher

            self.searcher = Searcher(store, cache_dir)
        except Exception as exc:
            self._fall_back(exc)

    def _fall_back(self, exc: BaseException) -> None:
        self.method = "pointer+manifest"
        self.error = f"{type(exc).__name__}: {exc}"[:500]
        self.searcher = None
        _log(f"Searcher unavailable ({self.error}); searchable = pointer covers P and its manifest lists shards")

    def visible(self, version: str, probe: Probe | None) -> bool:
        if self.searcher is not None and probe is not None:
            try:
                self.searcher.refresh()
                hits = self.searcher.search(probe.query, 5)
            except Exception as exc:
                if type(exc).__name__ == "ServingError":  # the version cannot be served at all
                    self._fall_back(exc)
                    return self.visible(version, probe)
                self.error = f"{type(exc).__name__}: {exc}"[:500]  # transient: keep polling
                return False
            return any(h.ad_id == probe.ad_id and h.index == "delta" and h.version == version for h in hits)
        from freshidx.publish import read_manifest

        try:
            return bool(read_manifest(self.store, "delta", version).get("shards"))
        except Exception:
            return False


def _measure_partition(
    dev: Any, instance: Any, store: Any, vis: _Visibility, cfg: GeneratorConfig, partition: PartitionId,
    probe: Probe | None, timeout_s: float,
) -> dict[str, Any]:
    from freshidx.publish import read_pointer

    sample: dict[str, Any] = {"partition": partition.path, "probe": probe.query if probe else None, "error": None}
    written = write_partition(store, cfg, partition)
    arrival = time.time()
    sample["records"] = written.records
    events: dict[str, float | None] = dict.fromkeys(EVENTS)
    events["arrival"] = arrival
    deadline = _Deadline(timeout_s)
    version: str | None = None
    next_run_check = 0.0
    run_id: str | None = None
    while True:
        if version is None:
            ptr, _ = read_pointer(store, "delta")
            if ptr is not None and ptr.source_partition and PartitionId.parse(ptr.source_partition) >= partition:
                version = ptr.version
                events["published"] = _iso_epoch(ptr.published_at)
                sample.update(version=ptr.version, doc_count=ptr.doc_count, covered_partition=ptr.source_partition)
        if version is not None and vis.visible(version, probe):
            events["searchable"] = time.time()
            break
        if time.monotonic() >= next_run_check:
            next_run_check = time.monotonic() + 1.0
            rec = _run_record_for(instance, partition)
            if rec is not None:
                run_id = rec.dagster_run.run_id
                if rec.dagster_run.status.value in ("FAILURE", "CANCELED") and version is None:
                    sample["error"] = f"run {run_id} {rec.dagster_run.status.value}"
                    break
            if not dev.is_running:
                sample["error"] = "dagster dev exited"
                break
        if deadline.passed():
            sample["error"] = (f"not {'searchable' if version else 'published'} after {timeout_s:.0f}s"
                               + (f" ({vis.error})" if vis.error else ""))
            break
        time.sleep(POLL_S)
    # The run's own record: wait for it to end (the next partition must find no run in flight).
    end = _Deadline(120)
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
        events["sensor_tick"] = _tick_time(dev, run_id)
    elif sample["error"] is None:
        sample["error"] = "no run found for the partition"
    sample["events"] = {k: (round(v, 3) if v is not None else None) for k, v in events.items()}
    sample["stages"] = sample_stages(events)
    return sample


def _run_mode(
    mode: str, *, root: Path, seed_raw: Path, cfg: GeneratorConfig, partitions: int, timeout_s: float,
    max_delay_s: float, rng: random.Random, server: _ConnectServer | None, seed: int, window_minutes: int,
    full_warmup: bool = True,
) -> dict[str, Any]:
    import dagster as dg
    from dagster._core.instance.ref import InstanceRef

    from freshidx.devserver import DagsterDev, prepare_home
    from freshidx.publish import read_pointer
    from freshidx.store import StoreConfig, open_store

    out: dict[str, Any] = {"mode": mode, "partitions": partitions, "phase": "setup"}
    mdir = root / mode
    store_dir = mdir / "store"
    shutil.copytree(seed_raw, store_dir / "raw")
    uri = store_dir.as_uri()
    store = open_store(StoreConfig(uri=uri))
    env = {
        "FRESHIDX_STORE": uri, "FRESHIDX_S3_ENDPOINT_URL": "", "FRESHIDX_SOURCE": SOURCE,
        "FRESHIDX_WINDOW_MINUTES": str(window_minutes), "PYSPARK_PYTHON": sys.executable,
        "FRESHIDX_SPARK_REMOTE": server.url if server else "",
        "FRESHIDX_SPARK_SERVER_STATE": str(server.state_dir) if server else "",
        "FRESHIDX_CATCHUP_AUTOSTART": "false",
    }
    out["spark"] = server.url if server else "local[2] (a SparkSession per run)"
    home = prepare_home(mdir / "dagster_home", _dagster_yaml())
    dev = DagsterDev(home=home, module="freshidx.definitions", env=env, cwd=REPO_ROOT,
                     log_path=mdir / "dagster-dev.log")
    instance: Any = None
    loads: list[float] = []
    try:
        t0 = time.monotonic()
        dev.start()
        if server is not None:
            # The URL is fixed before the JVM is up: dagster dev starts meanwhile, and a run that
            # comes first waits for its lease.
            out["phase"] = "spark server start"
            server.wait_up()
            _log(f"Spark Connect server up after {server.ready_s} s ({server.timings})")
        out["phase"] = "dagster dev start"
        dev.wait_ready(timeout=300)
        out["dagster_ready_s"] = round(time.monotonic() - t0, 1)
        out["full_index_schedule"] = _stop_schedule(dev, "full_index_schedule")
        # The hourly catch-up (ads_hourly) would build every hour of the seeded history on the same
        # Spark while we measure the delta path: off (env at load, and stopped here if it runs).
        out["ads_hourly_sensor"] = _stop_sensor(dev, "ads_hourly_sensor")
        _log(f"{mode}: dagster dev ready in {out['dagster_ready_s']} s on {dev.url} "
             f"(full_index_schedule {out['full_index_schedule']}, ads_hourly_sensor {out['ads_hourly_sensor']}); "
             f"warming up: first delta" + (" + full index" if full_warmup else ""))
        instance = dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))

        out["phase"] = "warm-up"
        warm = _Deadline(max(900.0, timeout_s * 3))
        while True:
            delta, _ = read_pointer(store, "delta")
            full, _ = read_pointer(store, "full")
            busy = _in_flight_runs(instance)
            full_tried = not full_warmup or full is not None or any(
                dg.AssetKey("full_index") in (r.asset_selection or ()) for r in instance.get_runs(limit=20))
            if delta is not None and full_tried and not busy:
                break
            if not dev.is_running:
                raise RuntimeError(f"dagster dev exited during warm-up; see {dev.log_path}")
            if warm.passed():
                raise TimeoutError(f"warm-up not done: delta={delta is not None} full={full is not None} "
                                   f"in flight={[r.run_id[:8] for r in busy]}; see {dev.log_path}")
            time.sleep(1.0)
        out["warmup_s"] = round(time.monotonic() - t0, 1)
        out["delta_docs"] = delta.doc_count
        out["full_docs"] = full.doc_count if full else None
        vis = _Visibility(store, mdir / "cache")
        out["searchable_method"] = vis.method
        _log(f"{mode}: warm-up done after {out['warmup_s']} s: delta {delta.doc_count} docs, full "
             f"{out['full_docs']} docs; measuring {partitions} partitions")

        out["phase"] = "measure"
        samples: list[dict[str, Any]] = []
        last = max(PartitionId.from_datetime(dt.datetime.now(dt.UTC)), _newest(store))
        for i in range(partitions):
            now_p = PartitionId.from_datetime(dt.datetime.now(dt.UTC))
            partition = max(now_p, PartitionId(last.at + dt.timedelta(minutes=1)))
            last = partition
            probe = pick_probe(cfg, partition, seed)
            delay = rng.uniform(0.0, max_delay_s)
            time.sleep(delay)
            load = round(os.getloadavg()[0], 2)
            loads.append(load)
            s = _measure_partition(dev, instance, store, vis, cfg, partition, probe, timeout_s)
            s.update(delay_before_drop_s=round(delay, 3), load_avg_1m=load)
            samples.append(s)
            if s["error"]:
                # The sensor retries a failed partition (attempt N+1): let that settle first, so the
                # next sample does not start behind someone else's run.
                time.sleep(6.0)
                settle = _Deadline(timeout_s)
                while _in_flight_runs(instance) and not settle.passed() and dev.is_running:
                    time.sleep(1.0)
            st = s["stages"]
            _log(f"{mode} {i + 1}/{partitions} {partition.path}: "
                 + (f"ERROR {s['error']}" if s["error"] else
                    f"published +{_fmt(st['arrival_to_published'], 0)} s, searchable "
                    f"+{_fmt(st['arrival_to_searchable'], 0)} s (run created +{_fmt(st['arrival_to_run_created'], 0)},"
                    f" start +{_fmt((s['events']['run_start'] or 0) - s['events']['arrival'], 0)},"
                    f" spark job +{_fmt((s['events']['body_start'] or 0) - s['events']['arrival'], 0)})"))
        out["samples"] = samples
        out["searchable_method"] = vis.method
        if vis.error and vis.method != "searcher":
            out["searcher_error"] = vis.error
        out.update(_mode_summary(samples))
        out["phase"] = "done"
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        _log(f"{mode}: FAILED during {out['phase']}: {out['error']}")
    finally:
        if loads:
            out["load_avg_range"] = [min(loads), max(loads)]
        if instance is not None:
            with contextlib.suppress(Exception):
                instance.dispose()
        dev.stop()
    if mode == "connect" and "error" not in out:
        out["goal"] = goal_verdict(out)
    return out


def _newest(store: Any) -> PartitionId:
    from freshidx.listing import newest_partition

    found, _ = newest_partition(store, SOURCE)
    if found is None:
        raise RuntimeError("no seeded partition in the store")
    return found


def bench_freshness(
    partitions: int = 8, window_docs: int = 100_000, *, modes: Sequence[str] = MODES, seed: int = 0,
    max_delay_s: float = 5.0, timeout_s: float = 300.0, workdir: str | None = None, keep: bool = False,
    driver_memory: str = "2g", window_minutes: int = WINDOW_MINUTES, health_timeout_s: float = 15.0,
    health_failures: int = 3, full_warmup: bool = True,
) -> dict[str, Any]:
    """Run the freshness benchmark (module docstring) for ``modes``; returns the JSON-able result.

    ``full_warmup=False`` measures as soon as the first delta is published, without waiting for the
    SLA sensor's first full index (which then may run during the measurement: smoke tests only).

    ``health_timeout_s`` / ``health_failures`` configure the Connect supervisor's health check (its
    defaults: 15 s, 3 in a row); its ``SELECT 1`` probe needs a free task slot, so a long build on a
    saturated ``local[2]`` server can fail it and get the server restarted mid-run.
    """
    for m in modes:
        if m not in MODES:
            raise ValueError(f"unknown mode {m!r} (choose from {', '.join(MODES)})")
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    root = Path(workdir or tempfile.mkdtemp(prefix="freshidx-bench-freshness-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    cfg = generator_config_for(window_docs, seed, window_minutes)
    rng = random.Random(seed)
    result: dict[str, Any] = {"config": {
        "partitions": partitions, "window_docs": window_docs, "modes": list(modes), "seed": seed,
        "max_delay_s": max_delay_s, "timeout_s": timeout_s, "window_minutes": window_minutes,
        "generator": {"ads": cfg.ads, "products": cfg.products, "changes_per_partition": cfg.changes_per_partition},
        "dagster_yaml": str(_dagster_yaml()), "cores": os.cpu_count(), "workdir": str(root),
        "percentiles": "linear interpolation",
        "spark_server_health": {"timeout_s": health_timeout_s, "failures": health_failures},
        "full_warmup": full_warmup,
    }}
    server: _ConnectServer | None = None
    try:
        if "connect" in modes:
            server = _ConnectServer(root / "spark-server", driver_memory=driver_memory,
                                    health_timeout_s=health_timeout_s, health_failures=health_failures)
            server.start_async()  # JVM start-up overlaps the seeding below
            _log(f"starting Spark Connect server on {server.url} (state {server.state_dir})")
        _log(f"seeding a {window_minutes} min window: {window_minutes // 5} partitions × "
             f"{cfg.changes_per_partition} changes over {cfg.ads} ads")
        records, seed_s = _seed_history(root / "seed", cfg, dt.datetime.now(dt.UTC), window_minutes)
        result["config"]["seed_records"] = records
        result["config"]["seed_seconds"] = seed_s
        _log(f"seeded {records} records in {seed_s} s")
        for mode in modes:
            srv = None
            if mode == "connect":
                assert server is not None
                srv = server  # _run_mode waits for it after starting dagster dev (the starts overlap)
            result[mode] = _run_mode(
                mode, root=root, seed_raw=root / "seed" / "raw", cfg=cfg, partitions=partitions,
                timeout_s=timeout_s, max_delay_s=max_delay_s, rng=rng, server=srv, seed=seed,
                window_minutes=window_minutes, full_warmup=full_warmup,
            )
            if srv is not None and srv.ready_s is not None:
                st = srv.state()
                pid = st.get("pid")
                session_rss, procs = _session_usage(pid) if isinstance(pid, int) else (None, 0)
                result[mode]["spark_server"] = {
                    "ready_s": srv.ready_s, "start_timings": srv.timings, "restarts": st.get("restarts"),
                    "heap_used_bytes": st.get("heap_used_bytes"), "rss_bytes": st.get("rss_bytes"),
                    "session_rss_bytes": session_rss, "session_processes": procs,
                    "last_restart_reason": st.get("last_restart_reason"),
                }
                _log("stopping the Spark Connect server before the next mode")
                srv.stop()
                server = None
        return result
    finally:
        if server is not None:
            server.stop()
        if not keep and workdir is None:
            shutil.rmtree(root, ignore_errors=True)


# ============================================================================== soak


def _session_usage(sid: int) -> tuple[int | None, int]:
    """(summed RSS, process count) of the live processes in session ``sid``: the JVM and its Python
    worker daemons (which Spark Connect starts per client session and does not reap, SPARK-54055)."""
    from freshidx.procs import rss_bytes, session_members

    rss = [r for r in (rss_bytes(p) for p in session_members(sid)) if r is not None]
    return (sum(rss) if rss else None), len(rss)


def _mib(v: Any) -> str:
    return f"{v / 2**20:7.0f}" if isinstance(v, int | float) else f"{'–':>7}"


def bench_soak(
    batches: int = 500, *, window_docs: int = 2_000, window_minutes: int = WINDOW_MINUTES,
    restart_every_s: float = 600.0, restart_every_batches: int = 0, max_heap_fraction: float = 0.85,
    driver_memory: str = "2g", heap_check_interval_s: float = 15.0, shared_session: bool = False,
    health_timeout_s: float = 15.0, health_failures: int = 3,
    max_minutes: float | None = None, samples: int = 25, seed: int = 0, workdir: str | None = None,
    keep: bool = False, progress: Callable[[str], None] = _log,
) -> dict[str, Any]:
    """Run the soak benchmark (module docstring); returns the JSON-able result.

    ``shared_session``: one Connect session for all batches (re-created after a server restart)
    instead of one per batch like a Dagster run. ``max_minutes`` stops early (``completed`` says how
    many batches ran).
    """
    from freshidx.delta import DeltaPlan, build_delta
    from freshidx.procs import rss_bytes
    from freshidx.publish import publish
    from freshidx.settings import Settings
    from freshidx.spark.lease import acquire_lease
    from freshidx.spark.session import build_connect_session
    from freshidx.store import StoreConfig, open_store

    if batches < 1:
        raise ValueError("batches must be >= 1")
    root = Path(workdir or tempfile.mkdtemp(prefix="freshidx-bench-soak-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    cfg = generator_config_for(window_docs, seed, window_minutes)
    store_cfg = StoreConfig(uri=(root / "store").as_uri())
    store = open_store(store_cfg)
    settings = Settings.from_env({}, store=store_cfg.uri, source=SOURCE, window_minutes=window_minutes)
    every = max(1, batches // max(1, samples))
    server = _ConnectServer(root / "spark-server", restart_every_s=restart_every_s, driver_memory=driver_memory,
                            heap_check_interval_s=heap_check_interval_s, max_heap_fraction=max_heap_fraction,
                            health_timeout_s=health_timeout_s, health_failures=health_failures)
    result: dict[str, Any] = {"config": {
        "batches": batches, "window_docs": window_docs, "window_minutes": window_minutes,
        "restart_every_s": restart_every_s, "restart_every_batches": restart_every_batches,
        "max_heap_fraction": max_heap_fraction, "driver_memory": driver_memory,
        "heap_check_interval_s": heap_check_interval_s, "shared_session": shared_session,
        "max_minutes": max_minutes,
        "spark_server_health": {"timeout_s": health_timeout_s, "failures": health_failures},
        "generator": {"ads": cfg.ads, "changes_per_partition": cfg.changes_per_partition},
        "workdir": str(root), "cores": os.cpu_count(),
    }}
    timeline: list[dict[str, Any]] = []
    restarts: list[dict[str, Any]] = []
    durations: list[float] = []
    failures: list[dict[str, Any]] = []
    per_server: dict[int, dict[str, Any]] = {}
    session: Any = None
    session_pid: int | None = None
    stopped_early = False
    done = 0
    try:
        server.start_async()
        start = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
        for p in history_partitions(start, dt.timedelta(minutes=window_minutes)):
            write_partition(store, cfg, p)
        server.wait_up()
        result["server_ready_s"] = server.ready_s
        result["server_start_timings"] = server.timings
        progress(f"soak: Spark Connect server up after {server.ready_s} s on {server.url}; {batches} batches, "
                 f"planned restart every {restart_every_s:.0f} s"
                 + (f" and every {restart_every_batches} batches" if restart_every_batches else "")
                 + ("; one shared session" if shared_session else "; one session per batch"))
        watermark: PartitionId | None = None
        prev_restarts = 0
        t_start = time.monotonic()
        for i in range(batches):
            if max_minutes is not None and time.monotonic() - t_start > max_minutes * 60:
                stopped_early = True
                progress(f"soak: stopping after {i} batches (--max-minutes {max_minutes:g})")
                break
            partition = PartitionId(start + dt.timedelta(minutes=i + 1))
            write_partition(store, cfg, partition)
            t0 = time.monotonic()
            lease_wait = None
            pid = None
            try:
                with acquire_lease(server.state_dir, f"soak-{i:05d}", timeout_s=300) as lease:
                    lease_wait = lease.waited_s
                    pid = lease.server_pid
                    if session is None or session_pid != pid:
                        if session is not None:
                            with contextlib.suppress(Exception):
                                session.stop()
                        session, session_pid = build_connect_session(lease.url), pid
                    try:
                        draft = build_delta(session, store, store_cfg, settings, DeltaPlan(
                            partition=partition, watermark=watermark, run_id=f"soak-{i:05d}", run_info={}))
                    finally:
                        if not shared_session:
                            with contextlib.suppress(Exception):
                                session.stop()
                            session = None
                res = publish(store, draft)
                if res.outcome != "published":
                    raise RuntimeError(f"publish {res.outcome}: {res.reason}")
                watermark = partition
                dur = time.monotonic() - t0
                durations.append(dur)
            except Exception as exc:
                dur = time.monotonic() - t0
                failures.append({"batch": i, "error": f"{type(exc).__name__}: {exc}"[:500]})
                progress(f"soak batch {i + 1}: FAILED {failures[-1]['error']}")
                if session is not None:  # a broken session is not reused
                    with contextlib.suppress(Exception):
                        session.stop()
                    session = None
            done = i + 1
            st = server.state()
            n_restarts = int(st.get("restarts") or 0)
            if n_restarts > prev_restarts:
                restarts.append({
                    "seen_at_batch": i, "restarts": n_restarts, "reason": st.get("last_restart_reason"),
                    "at": st.get("last_restart_at"), "duration_s": st.get("last_restart_duration_s"),
                    "old_pid": st.get("last_restart_old_pid"), "new_pid": st.get("pid"),
                    "batch_lease_wait_s": lease_wait,
                })
                progress(f"soak: restart #{n_restarts} ({st.get('last_restart_reason')}) took "
                         f"{st.get('last_restart_duration_s')} s: pid {st.get('last_restart_old_pid')} "
                         f"→ {st.get('pid')}")
                prev_restarts = n_restarts
            spid = pid if isinstance(pid, int) else st.get("pid") if isinstance(st.get("pid"), int) else None
            sess_rss, procs = _session_usage(spid) if spid else (None, 0)
            row = {
                "batch": i, "elapsed_s": round(time.monotonic() - t_start, 1), "batch_s": round(dur, 3),
                "lease_wait_s": lease_wait, "server_pid": spid,
                "jvm_rss_bytes": rss_bytes(spid) if spid else None,
                "session_rss_bytes": sess_rss, "session_processes": procs,
                "heap_used_bytes": st.get("heap_used_bytes") if st.get("pid") == spid else None,
                "heap_max_bytes": st.get("heap_max_bytes"),
                "heap_sampled_at": st.get("heap_sampled_at"), "restarts": n_restarts, "status": st.get("status"),
            }
            if spid:
                agg = per_server.setdefault(spid, {"pid": spid, "first_batch": i, "batches": 0})
                agg["batches"] += 1
                agg["last_batch"] = i
                for key in ("jvm_rss_bytes", "session_rss_bytes", "session_processes", "heap_used_bytes"):
                    v = row[key]
                    if v is None:
                        continue
                    agg.setdefault(f"{key}_first", v)
                    agg[f"{key}_last"] = v
                    agg[f"{key}_max"] = max(v, agg.get(f"{key}_max", 0))
            if i % every == 0 or i == batches - 1:
                timeline.append(row)
                progress(f"soak {i + 1}/{batches}: {dur:5.2f} s  heap {_mib(row['heap_used_bytes'])}/"
                         f"{_mib(row['heap_max_bytes']).strip()} MiB  JVM RSS {_mib(row['jvm_rss_bytes'])} MiB  "
                         f"session RSS {_mib(sess_rss)} MiB in {procs} processes  pid {spid}  restarts {n_restarts}")
            if restart_every_batches and (i + 1) % restart_every_batches == 0 and i + 1 < batches:
                # Planned restart between batches: ask, then wait until the supervisor has started
                # draining it (the next batch's lease then waits for the new server).
                server.supervisor.request_restart("planned-manual")
                asked = _Deadline(30.0)
                while not asked.passed():
                    st = server.state()
                    if st.get("status") != "up" or int(st.get("restarts") or 0) > n_restarts:
                        break
                    time.sleep(POLL_S)
        if timeline and timeline[-1]["batch"] != done - 1 and done:
            timeline.append(row)
        result["wall_s"] = round(time.monotonic() - t_start, 1)
    finally:
        if session is not None:
            with contextlib.suppress(Exception):
                session.stop()
        server.stop()
        if not keep and workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    result.update({
        "batches": batches, "ran": done, "completed": len(durations), "failed": len(failures),
        "stopped_early": stopped_early, "failures": failures[:20], "batch_seconds": summarize(durations),
        "restarts": restarts, "timeline": timeline, "per_server": list(per_server.values()),
    })
    return result


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
        f"batch seconds: p50 {_fmt(bs.get('p50'), 0)}  p95 {_fmt(bs.get('p95'), 0)}  max {_fmt(bs.get('max'), 0)}"
        f"   (server ready in {r.get('server_ready_s')} s)",
        "",
        f"{'batch':>6} {'elapsed s':>9} {'batch s':>8} {'pid':>8} {'heap MiB':>8} {'/max':>7} {'JVM RSS':>8} "
        f"{'sess RSS':>8} {'procs':>6} {'restarts':>8}",
    ]
    for t in r.get("timeline", []):
        lines.append(
            f"{t['batch'] + 1:>6} {t['elapsed_s']:>9.1f} {t['batch_s']:>8.2f} {t.get('server_pid') or '–':>8} "
            f"{_mib(t.get('heap_used_bytes')):>8} {_mib(t.get('heap_max_bytes')):>7} {_mib(t.get('jvm_rss_bytes')):>8} "
            f"{_mib(t.get('session_rss_bytes')):>8} {t.get('session_processes', 0):>6} {t.get('restarts'):>8}"
        )
    lines += ["", "per server process (MiB: first → last, max; processes = JVM + Python worker daemons):"]
    for s in r.get("per_server", []):
        def trend(key: str, s: dict[str, Any] = s) -> str:
            return (f"{_mib(s.get(key + '_first')).strip()} → {_mib(s.get(key + '_last')).strip()} "
                    f"(max {_mib(s.get(key + '_max')).strip()})")

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


# ============================================================================== CLI


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM behaves like Ctrl-C, so the ``finally`` blocks stop every process we started."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


_INTERRUPTED = "interrupted; every process started by the benchmark was stopped"


def cmd_bench_freshness(*, partitions: int, window_docs: int, window_minutes: int, modes: list[str], max_delay: float,
                        timeout: float, driver_memory: str, full_warmup: bool, health_timeout: float,
                        health_failures: int, seed: int, workdir: str | None, keep: bool, as_json: bool) -> int:
    """``freshidx bench freshness`` (options: freshidx.cli.bench)."""
    try:
        with _sigterm_as_interrupt():
            r = bench_freshness(
                partitions, window_docs, modes=modes, seed=seed, max_delay_s=max_delay,
                timeout_s=timeout, workdir=workdir, keep=keep, driver_memory=driver_memory,
                window_minutes=window_minutes, health_timeout_s=health_timeout,
                health_failures=health_failures, full_warmup=full_warmup,
            )
    except KeyboardInterrupt:
        print(_INTERRUPTED, file=sys.stderr)
        return 130
    table = render_freshness(r)
    if as_json:
        print(table, file=sys.stderr)
        print(json.dumps(r, default=str))
    else:
        print(table)
    return 0 if all(isinstance(r.get(m), dict) and not r[m].get("error") for m in modes) else 1


def cmd_bench_soak(*, batches: int, window_docs: int, window_minutes: int, shared_session: bool,
                   max_minutes: float | None, restart_every: float, restart_every_batches: int,
                   max_heap_fraction: float, driver_memory: str, health_timeout: float, health_failures: int,
                   heap_check_interval: float, samples: int, seed: int, workdir: str | None, keep: bool,
                   as_json: bool) -> int:
    """``freshidx bench soak`` (options: freshidx.cli.bench)."""
    try:
        with _sigterm_as_interrupt():
            r = bench_soak(
                batches, window_docs=window_docs, window_minutes=window_minutes,
                shared_session=shared_session, max_minutes=max_minutes, restart_every_s=restart_every,
                restart_every_batches=restart_every_batches, max_heap_fraction=max_heap_fraction,
                driver_memory=driver_memory, heap_check_interval_s=heap_check_interval,
                samples=samples, seed=seed, workdir=workdir, keep=keep,
                health_timeout_s=health_timeout, health_failures=health_failures,
            )
    except KeyboardInterrupt:
        print(_INTERRUPTED, file=sys.stderr)
        return 130
    table = render_soak(r)
    if as_json:
        print(table, file=sys.stderr)
        print(json.dumps(r, default=str))
    else:
        print(table)
    return 0 if r.get("failed") == 0 else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m freshidx.bench_freshness {freshness|soak} ...`` (same options as ``freshidx bench``)."""
    from freshidx.cli.base import run
    from freshidx.cli.bench import freshness_group

    try:
        return run(freshness_group, argv, "python -m freshidx.bench_freshness")
    except KeyboardInterrupt:
        print(_INTERRUPTED, file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
