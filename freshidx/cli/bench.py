"""``freshidx bench {build|query|delta|floor|freshness|soak|simulate}``: the benchmarks' options.

The benchmarks: :mod:`freshidx.tools.bench` (build), :mod:`freshidx.tools.bench_query` (query) and
:mod:`freshidx.tools.bench_freshness` (freshness, soak); ``python -m freshidx.tools.bench`` and
``python -m freshidx.tools.bench_freshness`` run the same commands.
"""

from __future__ import annotations

import os
from typing import Any

import click

from freshidx.cli.base import LazyCommand, LazyGroup, Parsed, json_option
from freshidx.tools import bench_chaos  # `bench chaos`: its options live beside it (light: click only)

BUILD_ROUNDS = 5  # freshidx.tools.bench.BUILD_ROUNDS
BUILD_WARMUP = 4  # freshidx.tools.bench.BUILD_WARMUP
MODES = ("connect", "local")  # freshidx.tools.bench_freshness.MODES
DELTA_MODES = ("sensor", "continuous")  # freshidx.tools.bench_common.DELTA_MODES
WINDOW_MINUTES = 300  # freshidx.tools.bench_freshness.WINDOW_MINUTES
SOAK_MODES = ("connect", "continuous")  # freshidx.tools.bench_freshness.SOAK_MODES


def modes(text: str) -> list[str]:
    chosen = [m.strip() for m in text.split(",") if m.strip()]
    if not chosen or any(m not in MODES for m in chosen):
        raise ValueError(f"modes are a comma-separated subset of {','.join(MODES)}, got {text!r}")
    return chosen


def delta_modes(text: str) -> list[str]:
    chosen = [m.strip() for m in text.split(",") if m.strip()]
    if not chosen or any(m not in DELTA_MODES for m in chosen):
        raise ValueError(f"delta modes are a comma-separated subset of {','.join(DELTA_MODES)}, got {text!r}")
    return chosen


def duration(text: str) -> str:
    """A ``FRESHIDX_CONTINUOUS_MAX_RUNTIME`` value (seconds, ``90s``, ``30m``, ``1h30m``), checked, as given."""
    from freshidx.settings_values import parse_duration  # no Spark, no Dagster

    parse_duration(text)
    return text.strip()


def _opt(*decls: str, **kw: Any) -> click.Option:
    return click.Option(list(decls), **kw)


def _common(workdir_help: str) -> list[click.Parameter]:
    return [
        _opt("--seed", type=int, default=0),
        _opt("--workdir", help=workdir_help),
        _opt("--keep", is_flag=True, help="do not delete the temp dir"),
        json_option("print the result as JSON on stdout (table on stderr)"),
    ]


def _health() -> list[click.Parameter]:
    return [
        _opt("--health-timeout", type=float, default=15.0, metavar="SECONDS",
             help="Connect supervisor: health probe timeout (default 15, the supervisor's default)"),
        _opt("--health-failures", type=int, default=3, metavar="N",
             help="Connect supervisor: failed probes in a row before a restart (default 3)"),
    ]


build = LazyCommand(
    "build", "freshidx.tools.bench:cmd_bench_build",
    _opt("--docs", type=int, default=200_000),
    _opt("--shards", type=int, default=os.cpu_count() or 2, help="default: one per core"),
    _opt("--rounds", type=int, default=BUILD_ROUNDS, help="timed rounds after the warm-up (median)"),
    _opt("--warmup", type=int, default=BUILD_WARMUP, help="untimed rounds first (JIT, Python workers)"),
    _opt("--seed", type=int, default=0),
    _opt("--master", help="a cluster master (spark://host:port): run the Spark side there, once per "
         "--workers count; the driver is this process"),
    _opt("--workers", default="1,2", help="with --master: executor counts to compare, 1 core each (default 1,2); "
         "on a cluster of 1-core workers, the number of workers used"),
    json_option(),
    help="Spark shards vs one process: docs/s and ratio",
)

query = LazyCommand(
    "query", "freshidx.tools.bench_query:cmd_bench_query",
    _opt("--docs", type=int, default=1_000_000),
    _opt("--queries", type=int, default=300),
    _opt("--shards", type=int, default=4),
    _opt("--k", type=int, default=10),
    _opt("--workdir", help="where the benchmark store is built and reused (default: a temp dir per N)"),
    _opt("--seed", type=int, default=0),
    json_option(),
    help="query latency through the real Searcher (p50/p95)",
)

freshness = LazyCommand(
    "freshness", "freshidx.tools.bench_freshness:cmd_bench_freshness",
    _opt("--partitions", type=int, default=8, help="measured partitions per mode (default 8)"),
    _opt("--window-docs", type=int, default=100_000, help="documents in the window (default 100000)"),
    _opt("--window-minutes", type=int, default=WINDOW_MINUTES,
         help=f"delta window length given to the pipeline (default {WINDOW_MINUTES})"),
    _opt("--changes", type=click.IntRange(min=1), default=None,
         help="records per measured partition (default: the window's rate, window docs over a partition "
         "every 5 min: ~4,460 at 100k, ~44,600 at 1M)"),
    _opt("--modes", type=Parsed("MODES", modes), default=",".join(MODES),
         help="connect,local (default both, in that order)"),
    _opt("--delta-modes", type=Parsed("DELTA_MODES", delta_modes), default=",".join(DELTA_MODES),
         help="sensor,continuous (FRESHIDX_DELTA_MODE; default both, in that order, per Spark mode; "
         "--json: sensor under connect/local, continuous under continuous.connect/.local)"),
    _opt("--max-delay", type=float, default=5.0, help="random pause before each drop, 0..S s (default 5)"),
    _opt("--timeout", type=float, default=300.0, help="per-partition deadline in seconds (default 300)"),
    _opt("--driver-memory", default="2g", help="Spark Connect server heap (default 2g)"),
    _opt("--no-full-warm-up", "full_warmup", is_flag=True, flag_value=False, default=True,
         help="measure once the first delta is published, without waiting for the first full index "
         "(which may then run during the measurement; for smoke tests)"),
    *_health(),
    *_common("keep everything (stores, Dagster homes, logs) here instead of a temp dir"),
    help="end-to-end arrival → searchable latency through dagster dev (Connect vs local Spark; sensor vs "
    "continuous delta mode)",
)

soak = LazyCommand(
    "soak", "freshidx.tools.bench_freshness:cmd_bench_soak",
    _opt("--mode", type=click.Choice(SOAK_MODES), default="connect",
         help="connect (default): micro-batches straight against one supervised Connect server, no Dagster; "
         "continuous: dagster dev in FRESHIDX_DELTA_MODE=continuous, a partition every --interval s for --minutes"),
    _opt("--batches", type=int, default=500, help="micro-batches (default 500)"),
    _opt("--window-docs", type=int, default=2_000, help="documents in the window (default 2000)"),
    _opt("--window-minutes", type=int, default=WINDOW_MINUTES,
         help=f"delta window length (default {WINDOW_MINUTES}: one raw file per 5 min = 60 read tasks)"),
    _opt("--shared-session", is_flag=True,
         help="one Connect session for all batches instead of one per batch (as Dagster runs do)"),
    _opt("--max-minutes", type=float, default=None, help="stop after this many minutes"),
    _opt("--restart-every", type=float, default=600.0, metavar="SECONDS",
         help="planned restart cadence of the supervisor (server age; default 600)"),
    _opt("--restart-every-batches", type=int, default=0, metavar="K",
         help="also request a planned restart after every K batches (default 0 = never)"),
    _opt("--max-heap-fraction", type=float, default=0.85, help="planned restart above this live heap"),
    _opt("--driver-memory", default="2g", help="Spark Connect server heap (default 2g)"),
    *_health(),
    _opt("--heap-check-interval", type=float, default=15.0, metavar="SECONDS",
         help="how often the supervisor samples the heap with jcmd (default 15)"),
    _opt("--samples", type=int, default=25, help="rows of the heap/RSS timeline (default 25)"),
    _opt("--minutes", type=float, default=120.0, help="continuous: minutes of partition drops (default 120)"),
    _opt("--interval", type=float, default=30.0, metavar="SECONDS",
         help="continuous: seconds between two partitions (default 30)"),
    _opt("--max-runtime", type=Parsed("DURATION", duration), default="20m",
         help="continuous: FRESHIDX_CONTINUOUS_MAX_RUNTIME, the planned restart of the run (default 20m)"),
    _opt("--max-rss-mb", type=int, default=2048,
         help="continuous: FRESHIDX_CONTINUOUS_MAX_RSS_MB, restart above this run RSS (default 2048)"),
    _opt("--sample-every", type=float, default=10.0, metavar="SECONDS",
         help="continuous: seconds between two samples of the curve (default 10)"),
    _opt("--no-full-warm-up", "full_warmup", is_flag=True, flag_value=False, default=True,
         help="continuous: start once the first delta is published, without waiting for the first full index"),
    *_common("work here instead of a temp dir"),
    help="endurance: many micro-batches against one supervised Spark Connect server (heap/RSS, restarts), or "
    "continuous mode through dagster dev for --minutes (run/server RSS, planned restarts, failed micro-batches)",
)

delta = LazyCommand(
    "delta", "freshidx.tools.bench_delta:cmd_bench_delta",
    _opt("--window-docs", type=int, default=None,
         help="documents in the window (default: 100000, 400000 and 1000000 in turn)"),
    _opt("--changes", type=int, default=1000, help="records in the measured new partition (default 1000)"),
    _opt("--segment-shards", type=click.IntRange(min=1, max=4096), default=None,
         help="shards (tasks) of every incremental segment (default: as many as the batch's size calls for, "
         "FRESHIDX_DELTA_SEGMENT_SHARD_MB)"),
    _opt("--remote", help="a Spark Connect server (sc://host:port) instead of local Spark in this process"),
    _opt("--no-rebuild", "rebuild", is_flag=True, flag_value=False, default=True,
         help="skip the window rebuild (the fallback, for comparison; at ten million documents it alone takes "
         "a quarter of an hour)"),
    *_common("keep the stores here instead of a temp dir"),
    help="one micro-batch: incremental segment vs window rebuild, at several window sizes",
)

floor = LazyCommand(
    "floor", "freshidx.tools.bench_floor:cmd_bench_floor",
    _opt("--window-docs", type=int, default=1_000_000, help="documents in the window (default 1000000)"),
    _opt("--changes", type=click.IntRange(min=1), default=None,
         help="records in the measured partition (default: the window's rate, ~44,600 at 1M)"),
    _opt("--rounds", type=click.IntRange(min=1), default=3,
         help="measured micro-batches, each beside the floor of its partition; medians are reported (default 3)"),
    _opt("--warm-builds", type=click.IntRange(min=0), default=6,
         help="before the measured rounds, builds of the last warm-up micro-batch, staged and never published: "
         "the Connect server's JIT has compiled the job's paths, as on a server that has run the loop a while "
         "(default 6)"),
    _opt("--idle-minutes", type=click.FloatRange(min=0), default=10.0,
         help="before the measured rounds, the keep-alive jobs the continuous loop runs in this many idle "
         "minutes (one per 30 s, back to back): a server that has run the loop a while (default 10)"),
    *_common("keep the store and the server's state here instead of a temp dir"),
    help="a micro-batch's Spark build through warm Connect vs the single-process floor (pyarrow parse + "
    "tantivy index of the same documents): floor_s, spark_s, ratio",
)

simulate = LazyCommand(
    "simulate", "freshidx.tools.bench_simulate:cmd_bench_simulate",
    _opt("--schedules", type=click.IntRange(min=1), default=10_000, help="schedules to run (default 10000)"),
    _opt("--seed", type=int, default=0, help="the first schedule's seed; schedule i is seed + i (default 0)"),
    _opt("--workers", type=click.IntRange(min=0), default=1,
         help="processes (default 1; 0: one per core)"),
    json_option("print the result as JSON on stdout (summary on stderr)"),
    help="deterministic simulation of the commit protocol: the real publish, ledger, compaction, gc and "
    "rollback code over an in-memory store with seeded interleavings, lost responses and crashes; "
    "schedules/s and violations, each with the command that reproduces it",
)

bench_group = LazyGroup(
    "bench", [build, query, delta, floor, freshness, soak, simulate, bench_chaos.chaos],
    help="benchmarks: index build throughput, query latency, incremental delta cost, the micro-batch against "
         "its single-process floor, end-to-end freshness, soak (Connect server or continuous mode), the commit "
         "protocol's deterministic simulation",
)
#: ``python -m freshidx.tools.bench_freshness``: the two end-to-end benchmarks alone.
freshness_group = LazyGroup(
    "bench", [freshness, soak],
    help="end-to-end freshness through dagster dev, and a soak (Connect server or continuous mode)",
)
