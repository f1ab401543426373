"""``freshidx bench soak --mode continuous``: continuous mode left running for a long time.

It starts what ``freshidx bench freshness --delta-modes continuous`` starts (:mod:`~freshidx.tools.bench_measure`:
a supervised Spark Connect server, ``dagster dev`` with ``FRESHIDX_DELTA_MODE=continuous``, so the
``delta_continuous_watchdog`` starts the long-lived ``delta_continuous`` run), with
``FRESHIDX_CONTINUOUS_MAX_RUNTIME`` / ``_MAX_RSS_MB`` set so that planned restarts happen during the soak.
After the warm-up it writes one partition every ``interval`` seconds for ``minutes`` (partition minutes
advance by one per drop, so at 30 s the data's clock runs twice as fast as the wall clock), then
polls until every written partition has a decision in the ledger (or :data:`DRAIN_TIMEOUT_S` passed).

Every ``sample_every`` s it samples the curve: RSS of the live continuous run's process tree (its worker
pid comes from the run's ``Started process for run (pid: N)`` engine event, as run health reads it; the
heartbeat ``layout.continuous_heartbeat_key`` holds the run id and the run's own RSS, not its pid), RSS
of the Connect server's session (JVM + Python workers), the delta pointer's ``seq`` and source
partition, the data lag (now − arrival of the oldest written partition the pointer does not cover yet)
and the number of continuous runs so far. At the end it reads each run's logs (started / failed /
published micro-batches, as :mod:`~freshidx.tools.bench_continuous` reads them), its status and
``freshidx/ended`` tag, each partition's ledger decision and the pointer history (arrival → published).

The decisions (pure) are :mod:`~freshidx.tools.bench_soak_decisions`. The verdict (exit 0) is
:func:`verdict`: no error, at least one partition written, no ``micro-batch for … failed:`` line in any
continuous run, every written partition explained in the ledger. Numbers only otherwise: nothing here
asserts on timings.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from freshidx.store.partitions import PartitionId
from freshidx.tools.bench_common import (
    WINDOW_MINUTES,
    ConnectServer,
    Deadline,
    generator_config_for,
    log,
    session_usage,
)
from freshidx.tools.bench_report import clock, fmt, mib
from freshidx.tools.bench_seed import seed_history
from freshidx.tools.bench_soak_decisions import (
    explain,
    first_publication,
    next_partition,
    run_end,
    sample_lag,
    scan_run_log,
    soak_summary,
    summarize_runs,
    verdict,
)
from freshidx.tools.generator import GeneratorConfig

# The decisions are defined in bench_soak_decisions; callers and tests use them here.
__all__ = [
    "DRAIN_TIMEOUT_S",
    "bench_soak_continuous",
    "explain",
    "first_publication",
    "next_partition",
    "run_end",
    "sample_lag",
    "scan_run_log",
    "soak_summary",
    "summarize_runs",
    "verdict",
]

DEFAULT_MINUTES = 120.0
DEFAULT_INTERVAL_S = 30.0
DEFAULT_MAX_RUNTIME = "20m"
DEFAULT_MAX_RSS_MB = 2048  # the pipeline's default
DEFAULT_SAMPLE_EVERY_S = 10.0
#: After the last drop: how long every written partition gets to reach a ledger decision.
DRAIN_TIMEOUT_S = 600.0


def _next_slot(due: float, every: float, now: float) -> float:
    """The next slot of a fixed cadence after ``now`` (slots missed while busy are skipped, not bunched)."""
    due += every
    return due if due > now else due + math.ceil((now - due) / every) * every


# ================================================================================ effects


class _Observer:
    """Reads what the soak samples and collects: Dagster's runs and logs, the store, the Connect server."""

    def __init__(self, instance: Any, store: Any, server: ConnectServer) -> None:
        self.instance, self.store, self.server = instance, store, server
        self.pids: dict[str, int | None] = {}

    def _records(self) -> list[Any]:
        import dagster as dg

        from freshidx.trigger.continuous_rules import JOB_NAME

        return list(self.instance.get_run_records(dg.RunsFilter(job_name=JOB_NAME), limit=1000))

    def _pid(self, run: Any) -> int | None:
        from freshidx.defs.runs.health import run_facts

        if self.pids.get(run.run_id) is None:
            self.pids[run.run_id] = run_facts(self.instance, run).pid
        return self.pids[run.run_id]

    def sample(self, t: float, written: list[dict[str, Any]]) -> dict[str, Any]:
        from freshidx.procs import rss_bytes, tree_rss_bytes
        from freshidx.publish.commit import read_pointer
        from freshidx.store import layout

        at = time.time()
        records = self._records()
        live = next((r.dagster_run for r in records if r.dagster_run.status.value in ("STARTING", "STARTED")), None)
        pid = self._pid(live) if live is not None else None
        hb: dict[str, Any] = {}
        with contextlib.suppress(Exception):
            hb = dict(self.store.get_json(layout.continuous_heartbeat_key("delta"))[0])
        st = self.server.state()
        spid = st.get("pid") if isinstance(st.get("pid"), int) else None
        server_rss, server_procs = session_usage(spid) if spid else (None, 0)
        ptr, _ = read_pointer(self.store, "delta")
        return {
            "t": round(t, 1), "at": round(at, 3), "runs": len(records),
            "run_id": live.run_id if live is not None else None, "run_pid": pid,
            "run_rss_bytes": tree_rss_bytes(pid) if pid else None,
            "heartbeat_run_id": hb.get("run_id"), "heartbeat_rss_mb": hb.get("rss_mb"),
            "server_pid": spid, "server_jvm_rss_bytes": rss_bytes(spid) if spid else None,
            "server_rss_bytes": server_rss, "server_processes": server_procs, "server_restarts": st.get("restarts"),
            "seq": ptr.seq if ptr else None, "source_partition": ptr.source_partition if ptr else None,
            "lag_s": sample_lag(at, written, ptr.source_partition if ptr else None),
            "load_avg_1m": round(os.getloadavg()[0], 2),
        }

    def unexplained(self, written: list[dict[str, Any]]) -> tuple[list[str], Any]:
        from freshidx.trigger import ledger

        days = [PartitionId.parse(w["partition"]).at.date() for w in written]
        ex = ledger.explained(self.store, "delta", min(days), max(days))
        return [w["partition"] for w in written if not ex.covers(PartitionId.parse(w["partition"]))], ex

    def runs(self) -> list[dict[str, Any]]:
        from freshidx.trigger.continuous_rules import TAG_WHY

        out = []
        for rec in self._records():
            run = rec.dagster_run
            logs = sorted(self.instance.all_logs(run.run_id), key=lambda e: e.timestamp)
            out.append({"run_id": run.run_id, "status": run.status.value, "pid": self.pids.get(run.run_id),
                        "started_because": run.tags.get(TAG_WHY), "ended_tag": run.tags.get("freshidx/ended"),
                        "start": rec.start_time, "end": rec.end_time,
                        **scan_run_log((float(e.timestamp), e.user_message or "") for e in logs)})
        return out

    def partitions(self, written: list[dict[str, Any]]) -> list[dict[str, Any]]:
        from freshidx.publish.commit import parse_iso
        from freshidx.publish.retention import history_entries
        from freshidx.trigger import ledger

        _, ex = self.unexplained(written)
        decisions = {w["partition"]: ledger.decision(self.store, "delta", PartitionId.parse(w["partition"]))
                     for w in written}
        explained = {w["partition"] for w in written if ex.covers(PartitionId.parse(w["partition"]))}
        history = [(e.source_partition or "", parse_iso(e.published_at).timestamp())
                   for e in history_entries(self.store, "delta", limit=10 * len(written) + 100)
                   if e.action == "publish"]
        return explain(written, decisions, explained, history)


def bench_soak_continuous(
    minutes: float = DEFAULT_MINUTES, *, interval_s: float = DEFAULT_INTERVAL_S, window_docs: int = 2_000,
    window_minutes: int = WINDOW_MINUTES, max_runtime: str = DEFAULT_MAX_RUNTIME,
    max_rss_mb: int = DEFAULT_MAX_RSS_MB, sample_every_s: float = DEFAULT_SAMPLE_EVERY_S,
    driver_memory: str = "2g", health_timeout_s: float = 15.0, health_failures: int = 3, full_warmup: bool = True,
    seed: int = 0, workdir: str | None = None, keep: bool = False, progress: Callable[[str], None] = log,
) -> dict[str, Any]:
    """Run the continuous-mode soak (module docstring); returns the JSON-able result."""
    import dagster as dg

    from freshidx.settings_values import parse_duration
    from freshidx.store import StoreConfig, open_store
    from freshidx.tools.bench_measure import dev_env, start_dev, warm_up
    from freshidx.tools.devserver import DagsterDev, packaged_dagster_yaml, prepare_home

    parse_duration(max_runtime)  # a bad value fails here, not at dagster dev's load
    if minutes <= 0 or interval_s <= 0 or sample_every_s <= 0:
        raise ValueError("minutes, interval and sample-every must be > 0")
    root = Path(workdir or tempfile.mkdtemp(prefix="freshidx-bench-soak-continuous-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    cfg = generator_config_for(window_docs, seed, window_minutes)
    store_dir = root / "store"
    store = open_store(StoreConfig(uri=store_dir.as_uri()))
    result: dict[str, Any] = {"mode": "continuous", "error": None, "phase": "setup", "config": {
        "minutes": minutes, "interval_s": interval_s, "window_docs": window_docs, "window_minutes": window_minutes,
        "max_runtime": max_runtime, "max_rss_mb": max_rss_mb, "sample_every_s": sample_every_s,
        "driver_memory": driver_memory, "full_warmup": full_warmup, "seed": seed, "workdir": str(root),
        "cores": os.cpu_count(), "drain_timeout_s": DRAIN_TIMEOUT_S,
        "generator": {"ads": cfg.ads, "changes_per_partition": cfg.changes_per_partition},
    }}
    server = ConnectServer(root / "spark-server", driver_memory=driver_memory, health_timeout_s=health_timeout_s,
                           health_failures=health_failures)
    env = {**dev_env(store_dir.as_uri(), server, window_minutes, "continuous"),
           "FRESHIDX_CONTINUOUS_MAX_RUNTIME": max_runtime, "FRESHIDX_CONTINUOUS_MAX_RSS_MB": str(max_rss_mb)}
    home = prepare_home(root / "dagster_home", packaged_dagster_yaml())
    dev = DagsterDev(home=home, module="freshidx.definitions", env=env, log_path=root / "dagster-dev.log")
    written: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    instance: Any = None
    try:
        server.start_async()  # the JVM starts while the history is seeded
        records, seed_s = seed_history(store_dir, cfg, dt.datetime.now(dt.UTC), window_minutes, progress=log)
        progress(f"soak: seeded {records} records in {seed_s} s; starting dagster dev (continuous mode)")
        start_dev("continuous soak", dev, server, result, full_warmup)
        instance = dg.DagsterInstance.from_config(str(home))
        result["phase"] = "warm-up"
        warm_up(dev, instance, store, 300.0, full_warmup)
        obs = _Observer(instance, store, server)
        result["wall_s"] = _soak(dev, obs, store, cfg, result, written, samples, minutes, interval_s,
                                 sample_every_s, progress)
        _collect(result, obs, written, samples, server)
        result["phase"] = "done"
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        progress(f"soak: FAILED during {result['phase']}: {result['error']}")
    finally:
        _stop(instance, dev, server, None if keep or workdir is not None else root)
    return _conclude(result, written, samples)


def _soak(dev: Any, obs: _Observer, store: Any, cfg: GeneratorConfig, result: dict[str, Any],
          written: list[dict[str, Any]], samples: list[dict[str, Any]], minutes: float, interval_s: float,
          sample_every_s: float, progress: Callable[[str], None]) -> float:
    """Drop a partition every ``interval_s`` for ``minutes`` and sample every ``sample_every_s``, then drain
    until the ledger explains every written partition (or :data:`DRAIN_TIMEOUT_S` passed); returns the
    seconds it took."""
    from freshidx.tools.generate import write_partition
    from freshidx.trigger.listing import newest_partition

    result["phase"] = "soak"
    progress(f"soak: warm; one partition every {interval_s:g} s for {minutes:g} min, a sample every "
             f"{sample_every_s:g} s")
    t0 = time.monotonic()
    drops_end = t0 + minutes * 60.0
    next_drop = next_sample = t0
    drain: Deadline | None = None
    last = newest_partition(store, cfg.source)[0]
    while True:
        now = time.monotonic()
        if drain is None and now >= next_drop and now < drops_end:
            last = next_partition(last, dt.datetime.now(dt.UTC))
            n = write_partition(store, cfg, last).records
            written.append({"partition": last.path, "arrival": round(time.time(), 3), "records": n})
            next_drop = _next_slot(next_drop, interval_s, time.monotonic())
        if now >= next_sample:
            samples.append(_sample(obs, now - t0, written, progress))
            next_sample = _next_slot(next_sample, sample_every_s, time.monotonic())
        if not dev.is_running:
            raise RuntimeError(f"dagster dev exited during the soak; see {dev.log_path}")
        if drain is None and now >= drops_end:
            result["phase"] = "drain"
            drain = Deadline(DRAIN_TIMEOUT_S)
        if drain is not None:
            left, _ = obs.unexplained(written)
            if not left or drain.passed():
                break
        # Pacing, not synchronisation: the next drop or sample is due then (the drain polls every second).
        due = min(next_sample, next_drop if drain is None else now + 1.0, now + 1.0)
        time.sleep(max(0.0, due - time.monotonic()))
    return round(time.monotonic() - t0, 1)


def _collect(result: dict[str, Any], obs: _Observer, written: list[dict[str, Any]], samples: list[dict[str, Any]],
             server: ConnectServer) -> None:
    """After the soak: each continuous run, each written partition's decision and the server's state."""
    from freshidx.tools.bench_measure import server_snapshot

    result["phase"] = "collect"
    result["runs"] = summarize_runs(obs.runs(), samples)
    result["partitions"] = obs.partitions(written)
    result["spark_server"] = server_snapshot(server)


def _stop(instance: Any, dev: Any, server: ConnectServer, workdir: Path | None) -> None:
    """Stop what the soak started, and remove ``workdir`` unless it is ``None`` (kept)."""
    if instance is not None:
        with contextlib.suppress(Exception):
            instance.dispose()
    dev.stop()
    server.stop()
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)


def _sample(obs: _Observer, t: float, written: list[dict[str, Any]], progress: Callable[[str], None]) -> dict[str, Any]:
    """One point of the curve, and its progress line."""
    try:
        s = obs.sample(t, written)
    except Exception as exc:  # one unreadable sample (a busy SQLite, …) does not end the soak
        s = {"t": round(t, 1), "error": f"{type(exc).__name__}: {exc}"[:300]}
    progress(f"soak {clock(s['t']).strip()}: {len(written)} written, run {(s.get('run_id') or '–')[:8]} "
             f"{mib(s.get('run_rss_bytes')).strip()} MiB, server {mib(s.get('server_rss_bytes')).strip()} "
             f"MiB, seq {s.get('seq')}, lag {fmt(s.get('lag_s'), 0)} s, runs {s.get('runs')}"
             + (f" (sample error: {s['error']})" if s.get("error") else ""))
    return s


def _conclude(result: dict[str, Any], written: list[dict[str, Any]], samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The result with its samples, the partitions (unexplained when the soak failed before reading
    them), the summary and the verdict."""
    result["samples"] = samples
    result.setdefault("runs", [])
    result.setdefault("partitions", [{**w, "decision": None, "reason": None, "explained": False,
                                      "published_at": None, "lag_s": None} for w in written])
    result["summary"] = soak_summary(result["partitions"], result["runs"], samples)
    result["verdict"] = verdict(result["summary"], result["error"])
    return result
