"""``freshidx bench floor``: a micro-batch's Spark build against the single-process floor of the same work
(docs/benchmarks.md).

In a fresh local store: a window of ``--window-docs`` documents (one partition every 5 minutes, at the
window's rate unless ``--changes`` says otherwise), its full index, then micro-batches through one
supervised, warm Spark Connect server (two to warm it, the second built ``--warm-builds`` more times first,
staged and never published; then the keep-alive jobs the continuous loop runs in ``--idle-minutes`` with
nothing to do, then ``--rounds`` measured ones; between two, the workers decode the next micro-batch's state,
as the continuous loop has them do while it waits): a server that has run the loop a while, whose JVM has
compiled the job's paths (its JIT compilers keep working through the first micro-batches, on the cores the
tasks need), over the state of the first micro-batches after a full index. Then the server is stopped, and
for each measured partition, in this process and without Spark:

* ``parse_s``: pyarrow's JSON reader over the partition's valid lines into the typed record (the bytes
  already in memory; the few lines the micro-batch quarantined are left out: the floor pays nothing for
  bad input, and nothing for validating the rest);
* ``index_s``: the documents the micro-batch indexed (its re-indexed ads with their product features,
  computed with the micro-batch's own merge, untimed) indexed by tantivy with the same schema, one writer
  using every core, committed and merged;
* ``floor_s`` = ``parse_s`` + ``index_s``;

and ``spark_s``, the micro-batch's build (``build_seconds``: from the Spark job's start to the staged shards,
listing and publication excluded). Each figure is the median over the rounds (one run of either side is at
the mercy of whatever else the box does), and ``ratio`` = median ``spark_s`` / median ``floor_s``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from freshidx.store.partitions import PartitionId
from freshidx.tools.bench_common import SOURCE, WINDOW_MINUTES, ConnectServer, generator_config_for, log
from freshidx.tools.bench_seed import seed_history


def parse_floor(data: bytes) -> tuple[pa.Table, float]:
    """pyarrow's parse of JSON lines ``data`` into the typed record (``DOCS_ARROW_SCHEMA``: ``updated_at`` read as
    a UTC timestamp); returns the table and the seconds it took."""
    from freshidx.spark.index_format import DOCS_ARROW_SCHEMA

    t0 = time.monotonic()
    options = pajson.ParseOptions(explicit_schema=DOCS_ARROW_SCHEMA, unexpected_field_behavior="ignore")
    table = pajson.read_json(io.BytesIO(data), parse_options=options)
    return table, round(time.monotonic() - t0, 3)


def index_floor(docs: pa.Table, workdir: Path) -> float:
    """Seconds to index ``docs`` (``INDEX_ARROW_SCHEMA`` columns) with one tantivy writer on every core."""
    from freshidx.spark.index_format import IndexBuilder

    path = workdir / "floor-index"
    shutil.rmtree(path, ignore_errors=True)
    t0 = time.monotonic()
    builder = IndexBuilder(str(path), num_threads=os.cpu_count() or 2)
    for batch in docs.to_batches(max_chunksize=8192):
        builder.add_batch(batch)
    builder.finish()
    return round(time.monotonic() - t0, 3)


def _valid_lines(store: Any, keys: list[str], quarantined: set[tuple[str, int]]) -> bytes:
    """The partition's lines less the ones the micro-batch quarantined."""
    out: list[bytes] = []
    for key in keys:
        for n, line in enumerate(store.get(key).data.split(b"\n"), start=1):
            if line.strip() and (key, n) not in quarantined:
                out.append(line)
    return b"\n".join(out) + b"\n"


def _indexed_docs(store_cfg: Any, layers: list[Any], valid: pa.Table) -> pa.Table:
    """The documents the micro-batch indexed: its re-indexed active ads with their products' features."""
    from freshidx.delta.executor.state_lookup import merged_rows, state_file_refs
    from freshidx.raw_record import ACTIVE
    from freshidx.record_rules import ProductFeatures
    from freshidx.spark.index_shards import REPLACE_COLUMN

    rows = merged_rows(store_cfg, state_file_refs(layers), 0, valid)
    active = rows.filter(pc.equal(rows.column("status"), ACTIVE))
    features = ProductFeatures()
    features.add(active)
    return features.attach(active.filter(active.column(REPLACE_COLUMN)).drop_columns([REPLACE_COLUMN]))


def _serving_layers(store: Any) -> list[Any]:
    """What the next micro-batch rests on: the serving full version, then the serving delta's segments."""
    from freshidx.delta.serving_state import state_layers

    found = state_layers(store)
    assert found is not None
    return found[1]


def _quarantined_lines(store: Any, partition: PartitionId) -> set[tuple[str, int]]:
    from freshidx.cli.quarantine import entries

    return {(str(e["file"]), int(e["line"])) for _, e in entries(store, SOURCE) if e.get("file")
            and partition.path in str(e["file"])}


def _keep_alive_jobs(idle_minutes: float) -> int:
    """The keep-alive jobs the continuous loop runs in ``idle_minutes`` with nothing to do (one every
    ``trigger.continuous.KEEP_WARM``)."""
    from freshidx.trigger.continuous_rules import KEEP_WARM

    return round(idle_minutes * 60 / KEEP_WARM.total_seconds())


def measure(server: ConnectServer, root: Path, docs: int, changes: int | None, seed: int,
            rounds: int, idle_minutes: float, warm_builds: int) -> dict[str, Any]:
    from freshidx.settings import Settings
    from freshidx.spark.session import build_connect_session
    from freshidx.spark_server.lease import acquire_lease
    from freshidx.store import StoreConfig, open_store

    store_dir = root / "store"
    cfg = generator_config_for(docs, seed=seed, window_minutes=WINDOW_MINUTES)
    if changes is not None:
        cfg = dataclasses.replace(cfg, changes_per_partition=changes)
    now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0) - dt.timedelta(minutes=5 * (rounds + 2))
    newest = PartitionId(now - dt.timedelta(minutes=now.minute % 5))
    server.start_async()
    records, write_s = seed_history(store_dir, cfg, newest.at, WINDOW_MINUTES, progress=log)
    server.wait_up()
    log(f"floor: {records} records seeded in {write_s} s; Spark Connect server up on {server.url}")
    sc = StoreConfig(uri=store_dir.as_uri())
    store = open_store(sc)
    settings = Settings.from_env({}, store=sc.uri, source=SOURCE, window_minutes=WINDOW_MINUTES)
    # Held as a run holds it: the supervisor then judges a starved health probe by the work's progress
    # instead of restarting the server under a long full build (which stops the session's SparkContext).
    with acquire_lease(server.state_dir, "bench-floor", timeout_s=600) as lease:
        measured = _spark_rounds(build_connect_session(lease.url), store, sc, settings, cfg, newest, rounds,
                                 idle_minutes, warm_builds)
    server.stop()  # the floor is measured with nothing else running (no JVM, no health checks)
    runs = [_floor_round(store, sc, root, p, layers, draft) for p, layers, draft in measured]
    return {"window_docs": docs, "changes": cfg.changes_per_partition, "warm_builds": warm_builds,
            "idle_minutes": idle_minutes, "keep_alive_jobs": _keep_alive_jobs(idle_minutes), **_medians(runs)}


def _spark_rounds(spark: Any, store: Any, sc: Any, settings: Any, cfg: Any, newest: PartitionId, rounds: int,
                  idle_minutes: float, warm_builds: int) -> list[tuple[PartitionId, list[Any], Any]]:
    """The full index, then the micro-batches (see the module docstring): the measured ones with the state
    each rested on and its draft."""
    from freshidx.delta.delta_build import DeltaPlan, build_delta
    from freshidx.delta.executor.warm_state import warm_state
    from freshidx.full.full_build import build_full
    from freshidx.publish.commit import publish
    from freshidx.tools.generate import write_partition

    measured: list[tuple[PartitionId, list[Any], Any]] = []
    try:
        def published(draft: Any) -> Any:
            result = publish(store, draft, max_drop_fraction=None)
            if result.outcome != "published":
                raise RuntimeError(f"{draft.index} {draft.version}: {result.outcome}: {result.reason}")
            return draft

        t0 = time.monotonic()
        log("floor: full index from the raw window ...")
        published(build_full(spark, store, sc, settings, cutoff=newest, run_id="floor-full", run_info={}))
        log(f"floor: full index published after {time.monotonic() - t0:.1f} s")
        total = rounds + 2
        for n in range(1, total + 1):  # two to warm the server and its Python workers, then the measured ones
            p = PartitionId(newest.at + dt.timedelta(minutes=5 * n))
            write_partition(store, cfg, p)
            layers = _serving_layers(store)  # the state the micro-batch rests on, for the floor's documents
            plan = DeltaPlan(partition=p, watermark=None, run_id=f"floor-{n}", run_info={})
            warm = warm_builds if n == 2 else 0
            for k in range(warm):  # the JVM's warm-up: the same job, never published
                t1 = time.monotonic()
                build_delta(spark, store, sc, settings, plan)
                log(f"floor: warm-up build {k + 1}/{warm} of micro-batch 2 in {time.monotonic() - t1:.1f} s")
            draft = published(build_delta(spark, store, sc, settings, plan))
            log(f"floor: micro-batch {n}/{total} ({'measured' if n > 2 else 'warm-up'}) built in "
                f"{draft.stats['build_seconds']} s")
            # What the continuous loop does while it waits for the next partition: the warm-up after a
            # publication and, before the measured rounds, the keep-alive jobs of ``idle_minutes``.
            jobs = 1 + (_keep_alive_jobs(idle_minutes) if n == 2 else 0)
            t1 = time.monotonic()
            for k in range(jobs):
                warm_state(spark, sc, _serving_layers(store), tasks=settings.delta_segment_shards,
                           cache_bytes=settings.delta_state_cache_bytes,
                           disk_bytes=settings.delta_state_disk_bytes)
                if jobs > 1:
                    each = (time.monotonic() - t1) / (k + 1)
                    log(f"floor: idle keep-alive job {k + 1}/{jobs}, about {each * (jobs - k - 1):.0f} s left")
            if n > 2:
                measured.append((p, layers, draft))
    finally:
        spark.stop()
    return measured


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds' medians and ratio, with the last round's counts and steps."""
    median = {k: round(statistics.median(r[k] for r in runs), 3) for k in ("parse_s", "index_s", "floor_s", "spark_s")}
    last = runs[-1]
    return {"records": last["records"], "indexed_docs": last["indexed_docs"],
            "spark_indexed_docs": last["spark_indexed_docs"], **median,
            "ratio": round(median["spark_s"] / median["floor_s"], 2) if median["floor_s"] else None,
            "spark_steps": last["spark_steps"], "rounds": runs}


def _floor_round(store: Any, sc: Any, root: Path, p: PartitionId, layers: list[Any], draft: Any) -> dict[str, Any]:
    """The floor of one measured micro-batch's partition, beside that micro-batch's build seconds."""
    keys = [f["key"] for f in draft.inputs["files"]]
    data = _valid_lines(store, keys, _quarantined_lines(store, p))
    parsed, parse_s = parse_floor(data)
    indexed = _indexed_docs(sc, layers, parsed)
    index_s = index_floor(indexed, root)
    return {"partition": p.path, "records": int(parsed.num_rows), "indexed_docs": int(indexed.num_rows),
            "spark_indexed_docs": int(draft.segments[-1]["doc_count"]), "parse_s": parse_s, "index_s": index_s,
            "floor_s": round(parse_s + index_s, 3), "spark_s": float(draft.stats["build_seconds"]),
            "spark_steps": {k: v for k, v in draft.stats.items() if k.endswith("_seconds")}}


def table(r: dict[str, Any]) -> str:
    return "\n".join([
        f"medians of {len(r['rounds'])} measured micro-batches (each beside the floor of its own partition)",
        f"window {r['window_docs']} docs, partition of {r['changes']} changes ({r['records']} valid records, "
        f"{r['indexed_docs']} documents indexed; the micro-batch indexed {r['spark_indexed_docs']})",
        f"floor (one process, no Spark): parse {r['parse_s']:.3f} s + index {r['index_s']:.3f} s "
        f"= {r['floor_s']:.3f} s",
        f"Spark micro-batch build (warm Connect): {r['spark_s']:.3f} s   ratio {r['ratio']}x   goal ≤ 2x",
        "last micro-batch's steps (s): " + "  ".join(f"{k.removesuffix('_seconds')} {v}"
                                                     for k, v in r["spark_steps"].items()),
        *(f"  round {n}: floor {x['floor_s']:.3f} s (parse {x['parse_s']:.3f} + index {x['index_s']:.3f}), "
          f"Spark {x['spark_s']:.3f} s" for n, x in enumerate(r["rounds"], start=1)),
    ])


def cmd_bench_floor(*, window_docs: int, changes: int | None, rounds: int, warm_builds: int, idle_minutes: float,
                    seed: int, workdir: str | None, keep: bool, as_json: bool) -> int:
    root = Path(workdir or tempfile.mkdtemp(prefix="freshidx-bench-floor-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    server = ConnectServer(root / "spark-server")
    try:
        result = measure(server, root, window_docs, changes, seed, rounds, idle_minutes, warm_builds)
    finally:
        server.stop()
        if not keep and workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    print(table(result), file=sys.stderr)
    if as_json:
        print(json.dumps(result, indent=2))
    return 0
