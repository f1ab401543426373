"""``freshidx bench freshness`` and ``freshidx bench soak``: end-to-end latency and server endurance.

``freshidx bench freshness [--partitions N] [--window-docs D] [--modes connect,local]
[--delta-modes sensor,continuous] [--json]``
    A real end-to-end measurement through ``dagster dev`` (webserver + daemon, the packaged
    ``dagster.yaml``) on a temporary local store, once with a supervised Spark Connect server
    (:class:`~freshidx.spark_server.supervisor.SparkConnectSupervisor`, runs take leases from it) and once with
    local-mode Spark (a ``SparkSession`` per run), in one invocation.

    Per mode: seed a 5 h window of history (~D documents), start ``dagster dev``, wait until the
    first delta *and* the SLA sensor's first full index are published and no run is in flight (the
    warm-up; the full-index schedule is stopped so it cannot land in the middle), then drop N
    partitions one at a time, each after the previous one is searchable, its run has ended and a
    random 0–``--max-delay`` s pause (which samples the phase of the 5 s sensor loop). For each
    partition it records (epoch seconds):

    ============  ============================================================================
    arrival       ``write_partition`` returned (one file per partition: bursts are disabled)
    noticed       the delta sensor saw the partition (run tag ``freshidx/noticed_at``: a tick watches
                  for up to ``FRESHIDX_SENSOR_WAIT_SECONDS``, so it may have started before the arrival)
    run_created   first event of the run (``create_timestamp`` has only 1 s resolution in SQLite)
    run_start     the run record's ``start_time`` (the ``PIPELINE_START`` event)
    body_start    ``building delta for …`` log line: the asset body = the Spark job starts
    listed        ``list_seconds`` log line: Spark session (+ lease) created, window listed
    built         ``build_seconds`` log line: Spark read/validate/dedup/index shards done
    published     the delta pointer's ``published_at`` (compare-and-swap of ``CURRENT``)
    searchable    a long-lived :class:`freshidx.serve.searcher.Searcher` (what ``freshidx search``
                  uses), after ``refresh()``, returns for ``+title:<word> +ad_id:"<ad>"`` a delta
                  hit of exactly that version, for an ad whose newest record is in the partition
                  (if the Searcher cannot serve the published versions, ``ServingError``: the
                  pointer covers the partition and the version's manifest lists shards;
                  ``searchable_method`` says which)
    ============  ============================================================================

    and prints per-stage p50 / p95 / max (linear-interpolated percentiles) for both modes side by
    side. That is the delta mode ``sensor``; ``--delta-modes`` (default ``sensor,continuous``) also
    measures each Spark mode with ``FRESHIDX_DELTA_MODE=continuous`` (a second ``dagster dev``, the
    same Connect server): the long-lived ``delta_continuous`` run's micro-batch replaces the run, its
    events and stages are in :mod:`~freshidx.tools.bench_continuous`, its result is under
    ``"continuous": {"connect": {...}, "local": {...}}`` (same keys) and its goal p50 ≤ 3 s, max ≤ 6 s.
    ``--json`` prints ``{"connect": {"arrival_to_searchable": {"p50", "p95", "max", "n"},
    "stages": {...}, "samples": [...], ...}, "local": {...}, "config": {...}}`` (seconds); the
    table then goes to stderr. Polling (0.2 s) is measurement, not synchronisation.
    ``--window-minutes`` shortens the pipeline's window (tests); ``--health-timeout`` /
    ``--health-failures`` tune the Connect supervisor's health check (see :func:`bench_freshness`).

``freshidx bench soak [--batches N] [--restart-every S] [--restart-every-batches K] [--shared-session]
[--max-minutes M] [--json]``
    N micro-batches against one supervised Spark Connect server, no Dagster: each batch writes a
    new partition to a temporary local store, takes a lease, opens a Connect session, runs the real
    delta build path (:func:`freshidx.delta.delta_build.build_delta`) and publishes it
    (:func:`freshidx.publish.commit.publish`). Prints the server's heap (``jcmd``, sampled by the
    supervisor) and RSS (JVM and the JVM's whole session incl. Python workers) and its process
    count over time, batch latency, and every restart the supervisor performed (planned by age, heap,
    or every K batches). ``--shared-session`` reuses one Connect session for all batches (a Dagster
    run cannot: one session per run), to tell per-session costs from per-batch ones; ``--max-minutes``
    caps the wall time.

``freshidx bench soak --mode continuous [--minutes M] [--interval S] [--max-runtime D] [--max-rss-mb N]
[--sample-every S] [--json]``
    Continuous mode through ``dagster dev`` (the set-up of ``bench freshness --delta-modes continuous``)
    for M minutes, one partition every S seconds, with planned restarts of the long-lived run every D:
    the curve of the run's and the Connect server's RSS, the pointer and the data lag, every
    continuous run and why it ended, failed micro-batches and each partition's ledger decision
    (:mod:`~freshidx.tools.bench_soak_continuous`). Exit 0 iff no micro-batch failed and every written
    partition is explained in the ledger.

The parts: :mod:`~freshidx.tools.bench_common` (constants, seeded data, probe, Connect server),
:mod:`~freshidx.tools.bench_measure` (the freshness driver), :mod:`~freshidx.tools.bench_soak`,
:mod:`~freshidx.tools.bench_report` (statistics and tables); this module is their CLI and API.

Numbers only: nothing here asserts on timings. Every process started here (Connect server,
``dagster dev`` and its children) is stopped on exit, also on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from freshidx.procs import sigterm_as_interrupt
from freshidx.tools.bench_common import (
    DELTA_MODES,
    MODES,
    WINDOW_MINUTES,
    Probe,
    generator_config_for,
    looks_valid,
    pick_probe,
)
from freshidx.tools.bench_measure import bench_freshness
from freshidx.tools.bench_report import (
    CONTINUOUS_EVENTS,
    CONTINUOUS_STAGES,
    EVENTS,
    MAIN_STAGES,
    STAGES,
    continuous_goals,
    goal_verdict,
    mode_summary,
    percentile,
    render_freshness,
    render_soak,
    render_soak_continuous,
    sample_stages,
    summarize,
)
from freshidx.tools.bench_soak import bench_soak

SOAK_MODES = ("connect", "continuous")  # bench soak --mode

__all__ = [
    "CONTINUOUS_EVENTS",
    "CONTINUOUS_STAGES",
    "DELTA_MODES",
    "EVENTS",
    "MAIN_STAGES",
    "MODES",
    "SOAK_MODES",
    "STAGES",
    "WINDOW_MINUTES",
    "Probe",
    "bench_freshness",
    "bench_soak",
    "cmd_bench_freshness",
    "cmd_bench_soak",
    "continuous_goals",
    "generator_config_for",
    "goal_verdict",
    "looks_valid",
    "main",
    "mode_summary",
    "percentile",
    "pick_probe",
    "render_freshness",
    "render_soak",
    "render_soak_continuous",
    "sample_stages",
    "summarize",
]


_INTERRUPTED = "interrupted; every process started by the benchmark was stopped"


def _run_and_report(
    run: Callable[[], dict[str, Any]], render: Callable[[dict[str, Any]], str],
    passed: Callable[[dict[str, Any]], bool], *, as_json: bool,
) -> int:
    """Run a bench (SIGTERM counts as Ctrl-C: exit 130), print its table (to stderr beside ``--json``
    output on stdout); exit 0 when ``passed``."""
    try:
        with sigterm_as_interrupt():
            r = run()
    except KeyboardInterrupt:
        print(_INTERRUPTED, file=sys.stderr)
        return 130
    table = render(r)
    if as_json:
        print(table, file=sys.stderr)
        print(json.dumps(r, default=str))
    else:
        print(table)
    return 0 if passed(r) else 1


def cmd_bench_freshness(*, partitions: int, window_docs: int, window_minutes: int, modes: list[str],
                        delta_modes: list[str], max_delay: float, timeout: float, driver_memory: str,
                        full_warmup: bool, health_timeout: float, health_failures: int, seed: int,
                        workdir: str | None, keep: bool, as_json: bool, changes: int | None = None) -> int:
    """``freshidx bench freshness`` (options: freshidx.cli.bench)."""

    def passed(r: dict[str, Any]) -> bool:
        parts = [r if d == "sensor" else r.get(d) or {} for d in delta_modes]
        return all(isinstance(p.get(m), dict) and not p[m].get("error") for p in parts for m in modes)

    return _run_and_report(
        lambda: bench_freshness(
            partitions, window_docs, modes=modes, seed=seed, max_delay_s=max_delay,
            timeout_s=timeout, workdir=workdir, keep=keep, driver_memory=driver_memory,
            window_minutes=window_minutes, health_timeout_s=health_timeout,
            health_failures=health_failures, full_warmup=full_warmup, delta_modes=delta_modes,
            changes=changes,
        ),
        render_freshness, passed, as_json=as_json,
    )


def cmd_bench_soak(*, batches: int, window_docs: int, window_minutes: int, shared_session: bool,
                   max_minutes: float | None, restart_every: float, restart_every_batches: int,
                   max_heap_fraction: float, driver_memory: str, health_timeout: float, health_failures: int,
                   heap_check_interval: float, samples: int, seed: int, workdir: str | None, keep: bool,
                   as_json: bool, mode: str = "connect", minutes: float = 120.0, interval: float = 30.0,
                   max_runtime: str = "20m", max_rss_mb: int = 2048, sample_every: float = 10.0,
                   full_warmup: bool = True) -> int:
    """``freshidx bench soak`` (options: freshidx.cli.bench): ``--mode connect`` (:func:`bench_soak`) or
    ``--mode continuous`` (:mod:`~freshidx.tools.bench_soak_continuous`)."""
    if mode not in SOAK_MODES:
        raise ValueError(f"unknown soak mode {mode!r} (choose from {', '.join(SOAK_MODES)})")
    if mode == "continuous":
        from freshidx.tools.bench_soak_continuous import bench_soak_continuous

        return _run_and_report(
            lambda: bench_soak_continuous(
                minutes, interval_s=interval, window_docs=window_docs, window_minutes=window_minutes,
                max_runtime=max_runtime, max_rss_mb=max_rss_mb, sample_every_s=sample_every,
                driver_memory=driver_memory, health_timeout_s=health_timeout, health_failures=health_failures,
                full_warmup=full_warmup, seed=seed, workdir=workdir, keep=keep,
            ),
            render_soak_continuous, lambda r: bool(r["verdict"]["passed"]), as_json=as_json,
        )
    return _run_and_report(
        lambda: bench_soak(
            batches, window_docs=window_docs, window_minutes=window_minutes,
            shared_session=shared_session, max_minutes=max_minutes, restart_every_s=restart_every,
            restart_every_batches=restart_every_batches, max_heap_fraction=max_heap_fraction,
            driver_memory=driver_memory, heap_check_interval_s=heap_check_interval,
            samples=samples, seed=seed, workdir=workdir, keep=keep,
            health_timeout_s=health_timeout, health_failures=health_failures,
        ),
        render_soak, lambda r: r.get("failed") == 0, as_json=as_json,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m freshidx.tools.bench_freshness {freshness|soak} ...`` (same options as ``freshidx bench``)."""
    from freshidx.cli.base import run
    from freshidx.cli.bench import freshness_group

    try:
        return run(freshness_group, argv, "python -m freshidx.tools.bench_freshness")
    except KeyboardInterrupt:
        print(_INTERRUPTED, file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
