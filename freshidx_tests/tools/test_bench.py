"""``freshidx bench`` runs end to end on a tiny N and prints its JSON keys (no timing assertions)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from freshidx.store import StoreConfig, open_store
from freshidx.tools import bench


def test_bench_build_json(spark: SparkSession, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["build", "--docs", "2000", "--shards", "2", "--rounds", "2", "--warmup", "1", "--json"]
    assert bench.main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"spark_docs_per_s", "single_docs_per_s", "ratio"} <= set(out)
    assert len(out["rounds"]) == 2 and all(r["spark_s"] > 0 and r["single_s"] > 0 for r in out["rounds"])
    assert out["warmup_rounds"] == 1 and all(isinstance(r["started_quiet"], bool) for r in out["rounds"])
    assert out["floor_seconds"] > 0 and all(r["floor_s"] > 0 for r in out["rounds"])
    assert out["spark_seconds"] == round(statistics.median(r["spark_s"] for r in out["rounds"]), 3)
    assert out["docs"] == 2000 and 0 < out["indexed_docs"] <= 2000
    assert out["spark_docs_per_s"] > 0 and out["single_docs_per_s"] > 0 and out["ratio"] > 0
    assert not spark.sparkContext._jsc.sc().isStopped()  # a borrowed session is not stopped


def test_bench_delta_json(spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``bench delta``'s JSON shape; every measured micro-batch is incremental (the first one after the full build
    too: it rests on the full index's state) and built with the segment shards asked for, and the borrowed
    session is left running."""
    args = ["delta", "--window-docs", "3000", "--changes", "40", "--segment-shards", "2",
            "--workdir", str(tmp_path / "w"), "--json"]
    assert bench.main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["segment_shards"] == 2
    store = open_store(StoreConfig(uri=(tmp_path / "w" / "store-3000").as_uri()))
    history = sorted(store.list("indexes/delta/history/").objects, key=lambda o: o.key)
    segmented = [m for m in (store.get_json(store.get_json(o.key)[0]["manifest"])[0] for o in history)
                 if m["inputs"]["build"] == "incremental"]
    assert len(segmented) == 5 and all(len(m["segments"][-1]["shards"]) == 2 for m in segmented)
    r = out["sizes"]["3000"]
    assert r["incremental_s"] > 0 and r["rebuild_s"] > 0 and r["rebuild_docs"] > r["incremental_docs"] > 0
    runs = r["incremental_runs_s"]
    assert len(runs) == 3 and sorted(runs) == runs and runs[1] == r["incremental_s"]
    assert {"state", "merge", "index"} <= set(r["incremental_steps"]), r["incremental_steps"]
    assert r["full_s"] > 0 and r["full_state_s"] > 0  # the bench fails unless the second was from state
    assert not spark.sparkContext._jsc.sc().isStopped()


def test_bench_query_json(spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["query", "--docs", "2000", "--queries", "30", "--shards", "2", "--workdir", str(tmp_path / "w"), "--json"]
    assert bench.main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"p50_ms", "p95_ms"} <= set(out)
    assert 0 < out["p50_ms"] <= out["p95_ms"]
    assert out["shards"] == {"full": 2, "delta": 1} and out["kill_list"] > 0 and out["avg_hits"] > 0
    # at least the hits it returned were fetched; the shards' searches were timed
    assert out["docs_fetched_avg"] >= out["avg_hits"] and out["shard_searches_ms_p50"] > 0
    assert not out["build_reused"]
    assert bench.main(args) == 0  # the second run reuses the published build
    assert json.loads(capsys.readouterr().out)["build_reused"]


def test_quiesce_tells_a_quiet_tree_from_a_busy_one() -> None:
    assert bench.quiesce(deadline_s=10.0)  # this test process alone: quiet within a few windows
    # A child burning one core. It says when its loop starts (under load its interpreter start-up can
    # sit in I/O for longer than a window), and the window is long enough that a starved scheduler
    # slice on a loaded box still shows far more than the quiet share.
    burn = "import sys; sys.stdout.write('burning\\n'); sys.stdout.flush()\nwhile True: pass"
    busy = subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE, text=True)
    try:
        assert busy.stdout is not None and busy.stdout.readline() == "burning\n"
        assert not bench.quiesce(deadline_s=2.0, window_s=0.5)
    finally:
        busy.kill()
        busy.wait()
    assert bench.quiesce(deadline_s=10.0)


def test_queries_and_percentile() -> None:
    qs = bench.realistic_queries(100)
    assert qs == bench.realistic_queries(100) and all(1 <= len(q.split()) <= 3 for q in qs)
    assert bench.percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert bench.percentile([float(i) for i in range(1, 101)], 95) == 95.0


def test_bench_floor_json(tmp_path: Path) -> None:
    """``bench floor`` on its own Connect server: the floor indexes exactly the documents the micro-batch
    indexed, and the ratio is the printed seconds' (no timing assertion)."""
    args = [sys.executable, "-m", "freshidx.cli", "bench", "floor", "--window-docs", "3000", "--changes", "200",
            "--rounds", "2", "--warm-builds", "1", "--idle-minutes", "1", "--workdir", str(tmp_path / "w"), "--json"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["window_docs"] == 3000 and out["changes"] == 200 and out["records"] > 0
    assert out["keep_alive_jobs"] == 2  # one per 30 s of the loop's idle minute
    assert out["warm_builds"] == 1
    assert out["indexed_docs"] == out["spark_indexed_docs"] > 0
    assert len(out["rounds"]) == 2 and out["spark_s"] > 0
    assert all(r["floor_s"] == round(r["parse_s"] + r["index_s"], 3) for r in out["rounds"])
    assert out["floor_s"] == round(sum(r["floor_s"] for r in out["rounds"]) / 2, 3)  # the median of two
    assert out["ratio"] == round(out["spark_s"] / out["floor_s"], 2)
    assert {"parse_seconds", "state_seconds", "merge_seconds", "index_seconds"} <= set(out["spark_steps"])
    # The minutes between seeding and the measured rounds say where they are.
    for shown in ("full index published", "warm-up build 1/1", "micro-batch 4/4 (measured)",
                  "idle keep-alive job 3/3"):
        assert f"floor: {shown}" in proc.stderr, proc.stderr[-3000:]


def test_bench_delta_table_says_when_the_rebuild_was_not_run() -> None:
    from freshidx.tools.bench_delta import table

    row = {"incremental_s": 2.0, "incremental_spark_s": 1.5, "incremental_docs": 10, "incremental_shards": 2,
           "rebuild_s": None, "rebuild_spark_s": None, "rebuild_docs": None, "full_s": 9.0, "full_state_s": 3.0}
    lines = table({"10000000": row, "1000": {**row, "rebuild_s": 8.0, "rebuild_spark_s": 7.0, "rebuild_docs": 99}})
    assert "   10000000 |    2.00 (1.50, 10, 2 shards) | not run | –" in lines.splitlines()
    assert "       1000 |    2.00 (1.50, 10, 2 shards) |    8.00 (7.00, 99) | 4.0x" in lines.splitlines()
