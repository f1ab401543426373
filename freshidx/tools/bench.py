"""``freshidx bench build``: index build throughput, Spark shards vs one process.

``freshidx bench build [--docs N] [--shards S] [--rounds R] [--warmup W] [--json]``
    Generates N synthetic ads in the JVM (the generator's vocabulary: brand + noun per product,
    adjectives and qualifiers per ad), caches and materializes the DataFrame,
    then, after W untimed warm-up rounds of each on the same N (default 4: the first Spark round in a
    fresh JVM costs ~2-3x a warm one, and the JIT compiler keeps spending 0.3-0.5 CPU-s a round for
    the next few, measured per JVM thread), times R alternating rounds of:

    * ``spark``: :func:`freshidx.spark.index_shards.write_index_shards` into a temporary local store,
      S shards on the local session (index + ``docs.parquet`` + ``covered.parquet``, uploaded, sha256);
    * ``single``: the same rows (pulled to the driver as Arrow before the clock starts) indexed by one
      plain Python process with the same schema and builder settings
      (:class:`freshidx.spark.index_format.IndexBuilder`). Both sides compute the product features inside
      their clock (:class:`freshidx.record_rules.ProductFeatures`), as a real build does in its shard tasks.

    Each side starts on a quiet process tree (:func:`quiesce`: the JVM's compiler and collector
    threads go on working for a second or more after a Spark job; measured in the single side's
    window they took 0.4-0.8 CPU-s from it). Spark's CPU seconds include that trailing work. Each
    round records ``started_quiet`` (false: some side waited :data:`QUIET_WAIT_S` in vain, e.g. on a
    machine shared with other work: read that round's numbers with care).

    Prints docs/s of each from the median round time and ``ratio`` = spark / single (``--json`` keys
    ``spark_docs_per_s``, ``single_docs_per_s``, ``ratio``, and ``rounds`` with every round), plus the
    CPU seconds each spent (whole process tree, median) and ``cpu_ratio`` = single / spark CPU
    seconds: on a shared machine the steadier number. A third side, ``floor`` (``floor_seconds``,
    ``floor_cpu_s``), runs only the Spark part of the build: the same shard split and Arrow hand-over
    to the Python workers, with a task that counts rows. ``spark_cpu_s`` minus ``single_cpu_s`` is what
    Spark costs on top of the shared indexing work; ``floor_cpu_s`` shows how much of that is the
    hand-over itself (the rest: ``docs.parquet``/``covered.parquet``, upload and hashing).

``freshidx bench query`` (query latency) is :mod:`freshidx.tools.bench_query`; both run on
:mod:`freshidx.tools.bench_data`. ``python -m freshidx.tools.bench`` runs either.

Numbers only: nothing here asserts on timings.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from freshidx.tools.bench_data import BENCH_SPARK_CONF, bench_session, realistic_queries, synthetic_docs
from freshidx.tools.bench_query import cmd_bench_query, percentile

# Part of this module's API though defined in bench_data / bench_query (callers and tests use them here).
__all__ = ["cmd_bench_query", "percentile", "realistic_queries"]

BUILD_ROUNDS = 5
BUILD_WARMUP = 4
#: Quiet = the process tree used less than this share of one core over a 0.2 s window.
QUIET_CORE_SHARE = 0.05
QUIET_WAIT_S = 15.0


# --------------------------------------------------------------------------- build


def tree_cpu_seconds() -> float | None:
    """CPU seconds (user + system) of this process and all its descendants (the local Spark JVM and
    its Python workers). On a shared machine CPU seconds are a steadier measure than wall time."""
    from freshidx.procs import tree_cpu_seconds as process_tree_cpu_seconds

    return process_tree_cpu_seconds(os.getpid())


def quiesce(deadline_s: float = QUIET_WAIT_S, window_s: float = 0.2) -> bool:
    """Wait until this process tree is quiet (see :data:`QUIET_CORE_SHARE`); ``False`` if it never
    got quiet before the deadline (or the process tree could not be read)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        c0 = tree_cpu_seconds()
        time.sleep(window_s)  # a measurement window, not synchronisation
        c1 = tree_cpu_seconds()
        if c0 is None or c1 is None:
            return False
        if c1 - c0 < QUIET_CORE_SHARE * window_s:
            return True
    return False


def _timed(fn: Any, *args: Any, trailing: bool = False) -> tuple[float, float | None, bool, Any]:
    """Wall seconds, CPU seconds of the process tree, whether it started quiet, result. With
    ``trailing`` the CPU seconds run on until the tree is quiet again (background JIT/GC work the
    call caused)."""
    quiet = quiesce()
    c0 = tree_cpu_seconds()
    t0 = time.perf_counter()
    result = fn(*args)
    wall = time.perf_counter() - t0
    if trailing:
        quiesce()
    c1 = tree_cpu_seconds()
    return wall, (c1 - c0 if c0 is not None and c1 is not None else None), quiet, result


def _spark_build(df: Any, n_shards: int, workdir: str, version: str) -> int:
    from freshidx.spark.index_shards import write_index_shards
    from freshidx.store import StoreConfig

    cfg = StoreConfig(uri="file://" + os.path.join(workdir, "store"))
    return sum(c.doc_count for c in write_index_shards(df, cfg, "full", version, n_shards))


def _count_rows(batches: Any) -> Any:
    import pyarrow as pa

    yield pa.RecordBatch.from_pydict({"rows": [sum(b.num_rows for b in batches)]})


def _spark_floor(df: Any, n_shards: int) -> int:
    """The Spark part of a shard build without the shard work: the same split and Arrow hand-over to
    the Python workers, whose task only counts rows."""
    from freshidx.spark.index_shards import shard_rows

    return sum(r["rows"] for r in shard_rows(df, n_shards).mapInArrow(_count_rows, "rows long").collect())


def _conform_table(table: Any) -> Any:
    from freshidx.spark.shards import DOCS_ARROW_SCHEMA

    return table.select(DOCS_ARROW_SCHEMA.names).cast(DOCS_ARROW_SCHEMA).combine_chunks()


def _single_build(table: Any, workdir: str, name: str) -> int:
    """One process, the same work as a shard task minus Spark: product features, then the index."""
    import pyarrow.compute as pc

    from freshidx.raw_record import ACTIVE
    from freshidx.record_rules import ProductFeatures
    from freshidx.spark.index_format import IndexBuilder

    builder = IndexBuilder(os.path.join(workdir, name))
    active = table.filter(pc.equal(table.column("status"), ACTIVE))
    features = ProductFeatures()
    features.add(active)
    for batch in features.attach(active).to_batches(max_chunksize=65536):
        builder.add_batch(batch)
    return builder.finish()


def _round(x: float | None, n: int = 3) -> float | None:
    return None if x is None else round(x, n)


def bench_build(
    docs: int, shards: int, *, spark: Any = None, seed: int = 0, rounds: int = BUILD_ROUNDS,
    warmup: int = BUILD_WARMUP,
) -> dict[str, Any]:
    """Run the build benchmark; returns the numbers (see the module docstring)."""
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    if warmup < 0:
        raise ValueError("warmup must be >= 0")
    from pyspark import StorageLevel

    from freshidx.spark.transform import index_rows

    own = False
    if spark is None:
        spark, own = bench_session()
    workdir = tempfile.mkdtemp(prefix="freshidx-bench-build-")
    try:
        df = index_rows(synthetic_docs(spark, docs, seed=seed)).persist(StorageLevel.MEMORY_AND_DISK)
        rows = df.count()  # materialize before any clock starts
        table = _conform_table(_driver_table(df, workdir))
        per_round: list[dict[str, Any]] = []
        for r in range(warmup + rounds):  # the first `warmup` rounds are not counted
            numbers, indexed = _build_round(df, table, rows, shards, workdir, f"r{r}")
            if r >= warmup:
                per_round.append(numbers)
        df.unpersist()
        return {"docs": rows, "indexed_docs": indexed, "shards": shards, **_medians(per_round, rows),
                "rounds": per_round, "warmup_rounds": warmup, "cores": os.cpu_count(),
                "load_avg_1m": round(os.getloadavg()[0], 2), "master": spark.conf.get("spark.master", None),
                "jvm_options": spark.conf.get("spark.driver.extraJavaOptions", None)}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if own:
            spark.stop()


def _driver_table(df: Any, workdir: str) -> Any:
    """The documents as one Arrow table in this process, for the single-process side: written by the executors
    and read back with pyarrow, not collected through the JVM driver (10M documents do not fit its heap)."""
    import pyarrow.parquet as pq

    path = os.path.join(workdir, "single-process-input")
    df.write.parquet(Path(path).as_uri())
    return pq.read_table(path)


def _build_round(df: Any, table: Any, rows: int, shards: int, workdir: str, name: str) -> tuple[dict[str, Any], int]:
    """One round of the three sides; returns its numbers and the docs indexed."""
    spark_s, spark_cpu, spark_quiet, spark_docs = _timed(
        _spark_build, df, shards, workdir, f"{name}-spark", trailing=True)
    single_s, single_cpu, single_quiet, single_docs = _timed(_single_build, table, workdir, f"{name}-single")
    floor_s, floor_cpu, floor_quiet, floor_rows = _timed(_spark_floor, df, shards, trailing=True)
    if spark_docs != single_docs:
        raise RuntimeError(f"spark indexed {spark_docs} docs, single {single_docs}")
    if floor_rows != rows:
        raise RuntimeError(f"the hand-over floor saw {floor_rows} rows of {rows}")
    shutil.rmtree(os.path.join(workdir, "store"), ignore_errors=True)
    shutil.rmtree(os.path.join(workdir, f"{name}-single"), ignore_errors=True)
    return {"spark_s": round(spark_s, 3), "single_s": round(single_s, 3),
            "spark_cpu_s": _round(spark_cpu), "single_cpu_s": _round(single_cpu),
            "floor_s": round(floor_s, 3), "floor_cpu_s": _round(floor_cpu),
            "started_quiet": spark_quiet and single_quiet and floor_quiet}, spark_docs


def _medians(per_round: list[dict[str, Any]], rows: int) -> dict[str, Any]:
    """The rates and CPU seconds of the median round (``per_round`` is never empty)."""
    def med(key: str) -> float | None:
        vals = [x[key] for x in per_round if x[key] is not None]
        return statistics.median(vals) if vals else None

    spark_s, single_s = med("spark_s") or 0.0, med("single_s") or 0.0  # rounds >= 1: never None
    spark_cpu, single_cpu, floor_cpu = med("spark_cpu_s"), med("single_cpu_s"), med("floor_cpu_s")
    spark_rate, single_rate = rows / spark_s, rows / single_s
    return {
        "spark_seconds": round(spark_s, 3),
        "single_seconds": round(single_s, 3),
        "spark_docs_per_s": round(spark_rate, 1),
        "single_docs_per_s": round(single_rate, 1),
        "ratio": round(spark_rate / single_rate, 3),
        # CPU seconds of everything involved (driver, JVM, Python workers); cpu_ratio = single / spark
        "spark_cpu_s": _round(spark_cpu),
        "single_cpu_s": _round(single_cpu),
        "cpu_ratio": _round(single_cpu / spark_cpu if spark_cpu and single_cpu else None),
        # the Spark part alone (split + Arrow hand-over, no shard work), see _spark_floor
        "floor_seconds": _round(med("floor_s")),
        "floor_cpu_s": _round(floor_cpu),
    }


# --------------------------------------------------------------------------- CLI (options: freshidx.cli.bench)


def bench_build_cluster(master: str, workers: Sequence[int], docs: int, shards: int, **kw: Any) -> list[dict[str, Any]]:
    """:func:`bench_build` on a cluster master once per executor count (``spark.cores.max``, 1 core each).

    Each count gets its own application (the cap is fixed when the context starts). The benchmark store
    is a local temp directory: run the workers on this host (or share that path with them)."""
    from freshidx.spark.code_shipping import ship_to_cluster
    from freshidx.spark.session import build_local_session, cluster_conf

    out = []
    for n in workers:
        spark = build_local_session(master, conf={**BENCH_SPARK_CONF, **cluster_conf(master),
                                                  "spark.cores.max": str(n), "spark.executor.cores": "1"})
        try:
            ship_to_cluster(spark)
            out.append({"workers": n, **bench_build(docs, shards, spark=spark, **kw)})
        finally:
            spark.stop()
    return out


def cmd_bench_build(*, docs: int, shards: int, rounds: int, warmup: int, seed: int, master: str | None,
                    workers: str, as_json: bool) -> int:
    if master:
        counts = [int(x) for x in str(workers).split(",") if x.strip()]
        rs = bench_build_cluster(master, counts, docs, shards, seed=seed, rounds=rounds, warmup=warmup)
        if as_json:
            print(json.dumps(rs))
            return 0
        print(f"{rs[0]['docs']} docs, {shards} shards, master {master}, load {rs[-1]['load_avg_1m']}")
        for r in rs:
            print(f"workers {r['workers']}: spark {r['spark_docs_per_s']:>12,.0f} docs/s  ({r['spark_seconds']} s, "
                  f"rounds {[x['spark_s'] for x in r['rounds']]}); single process {r['single_docs_per_s']:,.0f} docs/s")
        return 0
    r = bench_build(docs, shards, seed=seed, rounds=rounds, warmup=warmup)
    if as_json:
        print(json.dumps(r))
    else:
        print(f"{r['docs']} docs ({r['indexed_docs']} active), {r['shards']} shards, {r['cores']} cores, "
              f"load {r['load_avg_1m']}")
        print(f"median of {len(r['rounds'])} rounds after {r['warmup_rounds']} warm-up rounds; "
              "per round (spark s / single s): " + ", ".join(f"{x['spark_s']}/{x['single_s']}" for x in r["rounds"]))
        print(f"spark : {r['spark_docs_per_s']:>12,.0f} docs/s  ({r['spark_seconds']} s)")
        print(f"single: {r['single_docs_per_s']:>12,.0f} docs/s  ({r['single_seconds']} s)")
        print(f"ratio spark/single: {r['ratio']}  (CPU seconds: spark {r['spark_cpu_s']}, "
              f"single {r['single_cpu_s']}, single/spark {r['cpu_ratio']})")
        print(f"spark floor (split + Arrow hand-over, no shard work): {r['floor_seconds']} s, "
              f"{r['floor_cpu_s']} CPU-s")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m freshidx.tools.bench {build|query|freshness|soak} ...`` (same options as ``freshidx bench``)."""
    from freshidx.cli.base import run
    from freshidx.cli.bench import bench_group

    return run(bench_group, argv, "python -m freshidx.tools.bench")


if __name__ == "__main__":
    sys.exit(main())
