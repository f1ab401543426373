"""The ``freshidx bench soak`` driver: N micro-batches (write a partition, take a lease, build and
publish a delta over Spark Connect) against one supervised Connect server, no Dagster; samples the
server's heap, RSS and process count and records every restart (see
:mod:`freshidx.tools.bench_freshness`)."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from freshidx.store.partitions import PartitionId
from freshidx.tools.bench_common import (
    POLL_S,
    SOURCE,
    WINDOW_MINUTES,
    ConnectServer,
    Deadline,
    generator_config_for,
    log,
    session_usage,
)
from freshidx.tools.bench_report import mib, summarize
from freshidx.tools.generate import GeneratorConfig, history_partitions, write_partition


@dataclass
class _Progress:
    """What the batches have recorded so far."""

    timeline: list[dict[str, Any]] = field(default_factory=list)
    restarts: list[dict[str, Any]] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    per_server: dict[int, dict[str, Any]] = field(default_factory=dict)
    prev_restarts: int = 0
    done: int = 0
    row: dict[str, Any] | None = None


class _Batches:
    """One Connect session (per batch, or shared) and the delta build + publish of each batch."""

    def __init__(self, server: ConnectServer, store: Any, store_cfg: Any, settings: Any, shared: bool) -> None:
        self.server, self.store, self.store_cfg, self.settings, self.shared = server, store, store_cfg, settings, shared
        self.session: Any = None
        self.session_pid: int | None = None
        self.watermark: PartitionId | None = None
        # the last batch's lease: how long it waited, which server process (also after a failure)
        self.lease_wait: float | None = None
        self.pid: int | None = None

    def run(self, i: int, partition: PartitionId) -> None:
        """Build and publish ``partition`` (sets :attr:`lease_wait`, :attr:`pid`). Raises on failure."""
        from freshidx.delta.delta_build import DeltaPlan, build_delta
        from freshidx.publish.commit import publish
        from freshidx.spark.session import build_connect_session
        from freshidx.spark_server.lease import acquire_lease

        self.lease_wait = self.pid = None
        with acquire_lease(self.server.state_dir, f"soak-{i:05d}", timeout_s=300) as lease:
            self.lease_wait = lease.waited_s
            self.pid = pid = lease.server_pid
            if self.session is None or self.session_pid != pid:
                self.close()
                self.session, self.session_pid = build_connect_session(lease.url), pid
            try:
                draft = build_delta(self.session, self.store, self.store_cfg, self.settings, DeltaPlan(
                    partition=partition, watermark=self.watermark, run_id=f"soak-{i:05d}", run_info={}))
            finally:
                if not self.shared:
                    self.close()
        res = publish(self.store, draft)
        if res.outcome != "published":
            raise RuntimeError(f"publish {res.outcome}: {res.reason}")
        self.watermark = partition

    def close(self) -> None:
        if self.session is not None:
            with contextlib.suppress(Exception):
                self.session.stop()
        self.session = None


def _note_restart(st: dict[str, Any], i: int, lease_wait: float | None, prog: _Progress,
                  progress: Callable[[str], None]) -> int:
    """Record a restart the supervisor performed since the last batch; returns the restart count."""
    n_restarts = int(st.get("restarts") or 0)
    if n_restarts > prog.prev_restarts:
        prog.restarts.append({
            "seen_at_batch": i, "restarts": n_restarts, "reason": st.get("last_restart_reason"),
            "at": st.get("last_restart_at"), "duration_s": st.get("last_restart_duration_s"),
            "old_pid": st.get("last_restart_old_pid"), "new_pid": st.get("pid"),
            "batch_lease_wait_s": lease_wait,
        })
        progress(f"soak: restart #{n_restarts} ({st.get('last_restart_reason')}) took "
                 f"{st.get('last_restart_duration_s')} s: pid {st.get('last_restart_old_pid')} "
                 f"→ {st.get('pid')}")
        prog.prev_restarts = n_restarts
    return n_restarts


def _sample_row(i: int, elapsed: float, dur: float, lease_wait: float | None, pid: int | None,
                st: dict[str, Any], n_restarts: int) -> dict[str, Any]:
    """One timeline row: the server's memory and processes after batch ``i``."""
    from freshidx.procs import rss_bytes

    spid = pid if isinstance(pid, int) else st.get("pid") if isinstance(st.get("pid"), int) else None
    sess_rss, procs = session_usage(spid) if spid else (None, 0)
    return {
        "batch": i, "elapsed_s": round(elapsed, 1), "batch_s": round(dur, 3),
        "lease_wait_s": lease_wait, "server_pid": spid,
        "jvm_rss_bytes": rss_bytes(spid) if spid else None,
        "session_rss_bytes": sess_rss, "session_processes": procs,
        "heap_used_bytes": st.get("heap_used_bytes") if st.get("pid") == spid else None,
        "heap_max_bytes": st.get("heap_max_bytes"),
        "heap_sampled_at": st.get("heap_sampled_at"), "restarts": n_restarts, "status": st.get("status"),
    }


def _aggregate(per_server: dict[int, dict[str, Any]], row: dict[str, Any]) -> None:
    """Fold ``row`` into its server process's first / last / max figures."""
    spid, i = row["server_pid"], row["batch"]
    if not spid:
        return
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


def _planned_restart(server: ConnectServer, n_restarts: int) -> None:
    """Ask for a restart between batches, then wait until the supervisor has started draining (the
    next batch's lease then waits for the new server)."""
    server.supervisor.request_restart("planned-manual")
    asked = Deadline(30.0)
    while not asked.passed():
        st = server.state()
        if st.get("status") != "up" or int(st.get("restarts") or 0) > n_restarts:
            break
        time.sleep(POLL_S)


def _batch(i: int, batches: int, every: int, t_start: float, start: dt.datetime, cfg: GeneratorConfig,
           runner: _Batches, prog: _Progress, progress: Callable[[str], None]) -> int:
    """Run batch ``i`` and record it; returns the server's restart count afterwards."""
    partition = PartitionId(start + dt.timedelta(minutes=i + 1))
    write_partition(runner.store, cfg, partition)
    t0 = time.monotonic()
    try:
        runner.run(i, partition)
        dur = time.monotonic() - t0
        prog.durations.append(dur)
    except Exception as exc:
        dur = time.monotonic() - t0
        prog.failures.append({"batch": i, "error": f"{type(exc).__name__}: {exc}"[:500]})
        progress(f"soak batch {i + 1}: FAILED {prog.failures[-1]['error']}")
        runner.close()  # a broken session is not reused
    prog.done = i + 1
    lease_wait, pid = runner.lease_wait, runner.pid
    st = runner.server.state()
    n_restarts = _note_restart(st, i, lease_wait, prog, progress)
    row = _sample_row(i, time.monotonic() - t_start, dur, lease_wait, pid, st, n_restarts)
    prog.row = row
    _aggregate(prog.per_server, row)
    if i % every == 0 or i == batches - 1:
        prog.timeline.append(row)
        progress(f"soak {i + 1}/{batches}: {dur:5.2f} s  heap {mib(row['heap_used_bytes'])}/"
                 f"{mib(row['heap_max_bytes']).strip()} MiB  JVM RSS {mib(row['jvm_rss_bytes'])} MiB  "
                 f"session RSS {mib(row['session_rss_bytes'])} MiB in {row['session_processes']} processes  "
                 f"pid {row['server_pid']}  restarts {n_restarts}")
    return n_restarts


def _seed_and_start(server: ConnectServer, store: Any, cfg: GeneratorConfig, window_minutes: int,
                    result: dict[str, Any]) -> dt.datetime:
    """Start the server and seed the window's history meanwhile; returns the minute batches count from."""
    server.start_async()
    start = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    for p in history_partitions(start, dt.timedelta(minutes=window_minutes)):
        write_partition(store, cfg, p)
    server.wait_up()
    result["server_ready_s"] = server.ready_s
    result["server_start_timings"] = server.timings
    return start


def _run_batches(batches: int, every: int, t_start: float, start: dt.datetime, cfg: GeneratorConfig,
                 runner: _Batches, prog: _Progress, max_minutes: float | None, restart_every_batches: int,
                 progress: Callable[[str], None]) -> bool:
    """Run the batches, with the planned restarts between them, and end the timeline with the last one's
    row; returns whether ``max_minutes`` stopped them early."""
    stopped_early = False
    for i in range(batches):
        if max_minutes is not None and time.monotonic() - t_start > max_minutes * 60:
            stopped_early = True
            progress(f"soak: stopping after {i} batches (--max-minutes {max_minutes:g})")
            break
        n_restarts = _batch(i, batches, every, t_start, start, cfg, runner, prog, progress)
        if restart_every_batches and (i + 1) % restart_every_batches == 0 and i + 1 < batches:
            _planned_restart(runner.server, n_restarts)
    if prog.timeline and prog.timeline[-1]["batch"] != prog.done - 1 and prog.done and prog.row is not None:
        prog.timeline.append(prog.row)
    return stopped_early


def _totals(batches: int, prog: _Progress, stopped_early: bool) -> dict[str, Any]:
    """The result's counts, batch times, restarts and curves."""
    return {
        "batches": batches, "ran": prog.done, "completed": len(prog.durations), "failed": len(prog.failures),
        "stopped_early": stopped_early, "failures": prog.failures[:20], "batch_seconds": summarize(prog.durations),
        "restarts": prog.restarts, "timeline": prog.timeline, "per_server": list(prog.per_server.values()),
    }


def bench_soak(
    batches: int = 500, *, window_docs: int = 2_000, window_minutes: int = WINDOW_MINUTES,
    restart_every_s: float = 600.0, restart_every_batches: int = 0, max_heap_fraction: float = 0.85,
    driver_memory: str = "2g", heap_check_interval_s: float = 15.0, shared_session: bool = False,
    health_timeout_s: float = 15.0, health_failures: int = 3,
    max_minutes: float | None = None, samples: int = 25, seed: int = 0, workdir: str | None = None,
    keep: bool = False, progress: Callable[[str], None] = log,
) -> dict[str, Any]:
    """Run the soak benchmark (:mod:`freshidx.tools.bench_freshness`); returns the JSON-able result.

    ``shared_session``: one Connect session for all batches (re-created after a server restart)
    instead of one per batch like a Dagster run. ``max_minutes`` stops early (``completed`` says how
    many batches ran).
    """
    from freshidx.settings import Settings
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
    server = ConnectServer(root / "spark-server", restart_every_s=restart_every_s, driver_memory=driver_memory,
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
    prog = _Progress()
    runner = _Batches(server, store, store_cfg, settings, shared_session)
    stopped_early = False
    try:
        start = _seed_and_start(server, store, cfg, window_minutes, result)
        progress(f"soak: Spark Connect server up after {server.ready_s} s on {server.url}; {batches} batches, "
                 f"planned restart every {restart_every_s:.0f} s"
                 + (f" and every {restart_every_batches} batches" if restart_every_batches else "")
                 + ("; one shared session" if shared_session else "; one session per batch"))
        t_start = time.monotonic()
        stopped_early = _run_batches(batches, every, t_start, start, cfg, runner, prog, max_minutes,
                                     restart_every_batches, progress)
        result["wall_s"] = round(time.monotonic() - t_start, 1)
    finally:
        runner.close()
        server.stop()
        if not keep and workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    result.update(_totals(batches, prog, stopped_early))
    return result
