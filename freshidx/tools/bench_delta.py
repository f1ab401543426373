"""``freshidx bench delta``: does a micro-batch cost the change or the window? (docs/architecture.md#incremental-delta)

For each window size D (100k, 400k and 1M documents unless ``--window-docs`` is given), in a fresh
local store: write a 5 h window of raw partitions holding ~D distinct ads (one partition every 5
minutes), build and publish the full index, then drop new partitions of a fixed size (``--changes``
records, the same at every D), one per micro-batch: two warm-up micro-batches (the first one is
incremental over the full index's state, as after every full build), then

* ``incremental_s``: the median of three measured micro-batches (build_delta's listing + Spark work,
  the usual path; ``incremental_runs_s`` has all three, ``incremental_steps`` the segment task's steps
  of the median one: receiving the batch, reading the state rows, merging, indexing, uploading), and
* ``rebuild_s``: a window rebuild for the next such partition (``rebuild: true``), for comparison
  (``--no-rebuild``: not run, null);
* ``full_s`` / ``full_state_s``: the full index built from every raw partition (the first one) and, after
  the micro-batches, from state (the serving full version with their segments laid over it, staged only).

Publication (a few small writes) is not part of either number. Spark runs in this process
(``local[N]``) unless ``--remote sc://…`` names a Spark Connect server.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from freshidx.store.partitions import PartitionId
from freshidx.tools.bench_common import generator_config_for, log
from freshidx.tools.bench_seed import seed_history

SIZES = (100_000, 400_000, 1_000_000)
CHANGES = 1_000
WINDOW_MINUTES = 300


def _session(remote: str | None) -> tuple[Any, bool]:
    """The session and whether the bench owns it (stops it at the end): an active one is borrowed."""
    from pyspark.sql import SparkSession

    if remote:
        return SparkSession.builder.remote(remote).create(), True
    from freshidx.tools.bench_data import bench_session

    return bench_session()


def _publish(store: Any, draft: Any) -> None:
    from freshidx.publish.commit import publish

    result = publish(store, draft, max_drop_fraction=None)
    if result.outcome != "published":
        raise RuntimeError(f"{draft.index} {draft.version}: {result.outcome}: {result.reason}")


def measure(spark: Any, workdir: Path, docs: int, changes: int, seed: int,
            segment_shards: int | None = None, rebuild: bool = True) -> dict[str, Any]:
    from freshidx.delta.delta_build import DeltaPlan, build_delta
    from freshidx.full.full_build import build_full
    from freshidx.settings import Settings
    from freshidx.store import StoreConfig, open_store
    from freshidx.tools.generate import write_partition

    store_dir = workdir / f"store-{docs}"
    cfg = generator_config_for(docs, seed=seed, window_minutes=WINDOW_MINUTES)
    now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0) - dt.timedelta(minutes=15)
    records, write_s = seed_history(store_dir, cfg, now, WINDOW_MINUTES, progress=log)
    log(f"D={docs}: wrote {records} records in {write_s}s")
    sc = StoreConfig(uri=store_dir.as_uri())
    store = open_store(sc)
    # A fixed shard count, or the default rule (shards follow the batch's bytes).
    fixed = {} if segment_shards is None else {"delta_segment_shards": segment_shards, "delta_segment_shard_mb": 0}
    settings = Settings.from_env({}, store=sc.uri, window_minutes=WINDOW_MINUTES, **fixed)
    newest = PartitionId(now - dt.timedelta(minutes=now.minute % 5))
    t0 = time.monotonic()
    _publish(store, build_full(spark, store, sc, settings, cutoff=newest, run_id="bench-full", run_info={}))
    full_s = round(time.monotonic() - t0, 2)

    def micro_batch(minutes: int, rebuild: bool) -> dict[str, float]:
        p = PartitionId(newest.at + dt.timedelta(minutes=minutes))
        write_partition(store, dataclasses.replace(cfg, changes_per_partition=changes), p)
        stages: dict[str, float] = {}
        t = time.monotonic()
        draft = build_delta(spark, store, sc, settings,
                            DeltaPlan(partition=p, watermark=None, run_id=f"bench-{minutes}", run_info={},
                                      force_rebuild=rebuild),
                            on_stage=lambda name, s: stages.__setitem__(name, s))
        wall = round(time.monotonic() - t, 3)
        _publish(store, draft)
        steps = {k[len("task_"):-len("_seconds")]: v for k, v in draft.stats.items()
                 if k.startswith("task_") and k.endswith("_seconds")}
        return {"wall_s": wall, "spark_s": stages.get("build_seconds", 0.0), "files_read": draft.stats["files_read"],
                "docs": sum(int(s["doc_count"]) for s in draft.shards), "build": draft.inputs["build"],
                "shards": len(draft.shards), "steps": steps}

    for minutes in (1, 2):  # warm-up of the incremental path (plans, Python workers, decoded state)
        micro_batch(minutes, rebuild=False)
    runs = sorted((micro_batch(minutes, rebuild=False) for minutes in (3, 4, 5)), key=lambda r: r["wall_s"])
    if any(r["build"] != "incremental" for r in runs):
        raise RuntimeError(f"a measured micro-batch was not incremental: {[r['build'] for r in runs]}")
    inc = runs[1]
    # The next full version from state: the serving full + these micro-batches' segments (staged only).
    t = time.monotonic()
    state_full = build_full(spark, store, sc, settings, cutoff=PartitionId(newest.at + dt.timedelta(minutes=5)),
                            run_id="bench-full-state", run_info={}, cutoff_configured=False)
    full_state_s = round(time.monotonic() - t, 2)
    if state_full.inputs["build"] != "state":
        raise RuntimeError(f"the full build after the micro-batches was not from state: {state_full.inputs}")
    reb = micro_batch(6, rebuild=True) if rebuild else {"wall_s": None, "spark_s": None, "docs": None}
    return {"records": records, "full_s": full_s, "full_state_s": full_state_s,
            "incremental_s": inc["wall_s"], "incremental_spark_s": inc["spark_s"],
            "incremental_docs": inc["docs"], "incremental_shards": inc["shards"],
            "incremental_runs_s": [r["wall_s"] for r in runs],
            "incremental_steps": inc["steps"], "rebuild_s": reb["wall_s"], "rebuild_spark_s": reb["spark_s"],
            "rebuild_docs": reb["docs"]}


def table(sizes: dict[str, dict[str, Any]]) -> str:
    rows = ["window docs | incremental s, median of 3 (Spark s, docs indexed, shards) | rebuild s (Spark s, docs) "
            "| ratio"]
    for d, r in sizes.items():
        inc = (f"{int(d):>11} | {r['incremental_s']:>7.2f} ({r['incremental_spark_s']:.2f}, "
               f"{r['incremental_docs']}, {r.get('incremental_shards', 1)} shards) | ")
        if r["rebuild_s"] is None:
            rows.append(inc + "not run | –")
            continue
        ratio = r["rebuild_s"] / r["incremental_s"] if r["incremental_s"] else float("nan")
        rows.append(inc + f"{r['rebuild_s']:>7.2f} ({r['rebuild_spark_s']:.2f}, {r['rebuild_docs']}) | {ratio:.1f}x")
    rows.append("full index (s): from every raw partition | from state (the full + the segments)")
    for d, r in sizes.items():
        rows.append(f"{int(d):>11} | {r['full_s']:>7.2f} | {r.get('full_state_s', float('nan')):>7.2f}")
    rows.append("segment task steps of the median micro-batch (s):")
    for d, r in sizes.items():
        steps = "  ".join(f"{k} {v:.2f}" for k, v in r.get("incremental_steps", {}).items())
        rows.append(f"{int(d):>11} | {steps} | all three: {r.get('incremental_runs_s')}")
    return "\n".join(rows)


def cmd_bench_delta(*, window_docs: int | None, changes: int, remote: str | None, seed: int,
                    workdir: str | None, keep: bool, as_json: bool, segment_shards: int | None = None,
                    rebuild: bool = True) -> int:
    sizes = (window_docs,) if window_docs else SIZES
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="freshidx-bench-delta-"))
    root.mkdir(parents=True, exist_ok=True)
    spark, owned = _session(remote)
    out: dict[str, dict[str, Any]] = {}
    try:
        for d in sizes:
            out[str(d)] = measure(spark, root, d, changes, seed, segment_shards, rebuild)
            log(f"D={d}: {json.dumps(out[str(d)])}")
    finally:
        if owned:
            spark.stop()
        if not keep and not workdir:
            shutil.rmtree(root, ignore_errors=True)
    print(table(out), file=sys.stderr)
    if as_json:
        print(json.dumps({"changes": changes, "segment_shards": segment_shards, "sizes": out}, indent=2))
    return 0
