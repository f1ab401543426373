"""``freshidx bench query [--docs N] [--queries Q] [--json]``: query latency.

Builds (or reuses, from ``--workdir``) a local store with a published full version of N ads and a
published delta re-emitting the products of 1% changed ads (the real delta path), opens the real
:class:`freshidx.serve.searcher.Searcher` on it and runs Q 1-3 word queries after a warm-up pass.
Prints p50/p95 latency (``--json``: ``p50_ms``, ``p95_ms``) and where a query's time goes: its shards'
first searches one after another (``shard_searches_ms_p50``, the CPU the scoring takes; the Searcher runs
them on one thread per core) and the stored documents the merge fetched (``docs_fetched_avg``: the k hits,
the ones a kill-list hides and the ties at the k-th score). Numbers only: nothing here asserts on timings.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from freshidx.tools.bench_data import T0, bench_session, realistic_queries, synthetic_docs

QUERY_WARMUP = 50
PARTITION_FMT = "year=%Y/month=%m/day=%d/hour=%H/minute=%M"


def _bench_marker(docs: int, shards: int, seed: int) -> dict[str, Any]:
    return {"docs": docs, "shards": shards, "seed": seed, "format": 1}


def _store_ready(workdir: str, docs: int, shards: int, seed: int) -> bool:
    try:
        with open(os.path.join(workdir, "bench.json"), encoding="utf-8") as f:
            return bool(json.load(f) == _bench_marker(docs, shards, seed))
    except (OSError, ValueError):
        return False


def prepare_query_store(spark: Any, workdir: str, docs: int, shards: int, *, seed: int = 0) -> str:
    """A local store under ``workdir`` with a published full (N ads) and delta version; reused if present.

    Returns the store URI.
    """
    from pyspark.sql import functions as F

    from freshidx.delta.product_expansion import expand_to_products
    from freshidx.publish.commit import DraftManifest, iso, new_version, publish, read_manifest, read_pointer
    from freshidx.spark.index_shards import read_version_docs, write_index_shards
    from freshidx.spark.transform import index_rows
    from freshidx.store import StoreConfig, open_store

    marker_path = os.path.join(workdir, "bench.json")
    uri = "file://" + os.path.join(workdir, "store")
    want = _bench_marker(docs, shards, seed)
    if _store_ready(workdir, docs, shards, seed):
        return uri
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir, exist_ok=True)
    cfg = StoreConfig(uri=uri)
    store = open_store(cfg)

    def draft(index: str, version: str, position: dt.datetime, commits: list[Any]) -> DraftManifest:
        return DraftManifest(
            index=index, version=version, position=iso(position), run_id="bench",
            shards=[c.to_dict() for c in commits], doc_count=sum(c.doc_count for c in commits),
            num_shards=len(commits), covered_count=sum(c.covered_count for c in commits),
            cutoff=iso(position) if index == "full" else None,
            source_partition=None if index == "full" else position.strftime(PARTITION_FMT),
        )

    full_at = T0 + dt.timedelta(hours=1)
    full_version = new_version(full_at)
    commits = write_index_shards(index_rows(synthetic_docs(spark, docs, seed=seed)), cfg, "full", full_version, shards)
    res = publish(store, draft("full", full_version, full_at, commits))
    if res.outcome != "published":
        raise RuntimeError(f"bench full publish: {res.reason}")

    # The delta: 1% of the ads changed (new title words, new bid), expanded to their whole products.
    delta_at = full_at + dt.timedelta(minutes=5)
    delta_version = new_version(delta_at)
    pointer, _ = read_pointer(store, "full")
    assert pointer is not None
    full_docs = read_version_docs(spark, cfg, read_manifest(store, "full", pointer.version))
    changed = (
        synthetic_docs(spark, docs, seed=seed)
        .filter(F.pmod(F.xxhash64(F.col("ad_id"), F.lit("delta")), F.lit(100)) == 0)
        .withColumn("title", F.concat_ws(" ", F.lit("updated"), F.col("title")))
        .withColumn("bid", F.col("bid") + F.lit(0.5))
        .withColumn("version", F.col("version") + F.lit(10_000_000_000))
    )
    delta_rows = expand_to_products(changed, full_docs)
    delta_commits = write_index_shards(delta_rows, cfg, "delta", delta_version, max(1, shards // 2))
    res = publish(store, draft("delta", delta_version, delta_at, delta_commits))
    if res.outcome != "published":
        raise RuntimeError(f"bench delta publish: {res.reason}")
    with open(marker_path, "w", encoding="utf-8") as f:
        json.dump(want, f)
    return uri


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    s = sorted(values)
    if not s:
        return float("nan")
    rank = max(1, min(len(s), math.ceil(p / 100 * len(s))))
    return s[rank - 1]


def bench_query(
    docs: int, queries: int, *, shards: int = 4, k: int = 10, workdir: str | None = None, spark: Any = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Run the query benchmark; returns the numbers (see the module docstring)."""
    from freshidx.serve.searcher import Searcher
    from freshidx.store import open_store

    workdir = workdir or os.path.join(tempfile.gettempdir(), f"freshidx-bench-query-{docs}-{shards}-{seed}")
    t_build = time.perf_counter()
    reused = _store_ready(workdir, docs, shards, seed)
    uri = "file://" + os.path.join(workdir, "store")
    if not reused:
        own = False
        if spark is None:
            spark, own = bench_session()
        try:
            uri = prepare_query_store(spark, workdir, docs, shards, seed=seed)
        finally:
            if own:
                spark.stop()
    build_s = time.perf_counter() - t_build
    cache = os.path.join(workdir, "cache")
    shutil.rmtree(cache, ignore_errors=True)
    t_load = time.perf_counter()
    searcher = Searcher(open_store(uri), cache)
    load_s = time.perf_counter() - t_load
    qs = realistic_queries(queries, seed=seed + 1)
    for q in realistic_queries(QUERY_WARMUP, seed=seed + 2):
        searcher.search(q, k)
    lat: list[float] = []
    hits = 0
    for q in qs:
        t = time.perf_counter()
        res = searcher.search(q, k)
        lat.append((time.perf_counter() - t) * 1000)
        hits += len(res)
    snap = searcher.current
    shard_ms, fetched = _where_time_goes(searcher, qs, k)
    return {
        "docs": docs,
        "queries": queries,
        "k": k,
        "shards": {"full": len(snap.full.shards) if snap.full else 0,
                   "delta": len(snap.delta.shards) if snap.delta else 0},
        "kill_list": len(snap.kill_list),
        "p50_ms": round(percentile(lat, 50), 3),
        "p95_ms": round(percentile(lat, 95), 3),
        "mean_ms": round(statistics.fmean(lat), 3) if lat else None,
        "max_ms": round(max(lat), 3) if lat else None,
        "avg_hits": round(hits / max(1, len(qs)), 2),
        "shard_searches_ms_p50": round(percentile(shard_ms, 50), 3),
        "docs_fetched_avg": round(fetched, 1),
        "build_reused": reused,
        "build_seconds": round(build_s, 1),
        "load_seconds": round(load_s, 2),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "workdir": workdir,
    }


def _where_time_goes(searcher: Any, queries: Sequence[str], k: int) -> tuple[list[float], float]:
    """Per query: its shards' first searches run one after another (ms); and the stored documents one
    search fetches, on average."""
    from freshidx.serve import topk

    shards = [sh for _, _, part, _ in searcher.current.searched for sh in part.shards if sh.doc_count]
    sums: list[float] = []
    for q in queries:
        parsed, _ = searcher.parse_query(q)
        if parsed is None:
            continue
        t = time.perf_counter()
        for sh in shards:
            topk.top_hits(sh, parsed, topk.FIRST_LIST_FACTOR * k)
        sums.append((time.perf_counter() - t) * 1000)
    fetched = 0
    take = topk.ShardStream.take

    def counted(stream: topk.ShardStream) -> Any:
        nonlocal fetched
        fetched += 1
        return take(stream)

    topk.ShardStream.take = counted  # type: ignore[method-assign]
    try:
        for q in queries:
            searcher.search(q, k)
    finally:
        topk.ShardStream.take = take  # type: ignore[method-assign]
    return sums, fetched / max(1, len(queries))


def cmd_bench_query(*, docs: int, queries: int, shards: int, k: int, workdir: str | None, seed: int,
                    as_json: bool) -> int:
    r = bench_query(docs, queries, shards=shards, k=k, workdir=workdir, seed=seed)
    if as_json:
        print(json.dumps(r))
    else:
        print(f"{r['docs']} docs, shards {r['shards']}, {r['queries']} queries, k={r['k']}: "
              f"p50 {r['p50_ms']} ms, p95 {r['p95_ms']} ms (mean {r['mean_ms']}, max {r['max_ms']}); "
              f"its shards' searches one after another p50 {r['shard_searches_ms_p50']} ms, "
              f"{r['docs_fetched_avg']} stored docs fetched per query")
    return 0
