"""``freshidx bench soak --mode continuous``: the soak's decisions, summary, verdict and curve (fast), the
CLI dispatch, and one real soak (``FRESHIDX_BENCH_E2E=1``, ~5 min: a Connect server + ``dagster dev``).

Nothing asserts on timings: the real run is checked for the shape of its result, its verdict and that
every written partition is explained.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from freshidx.store.partitions import PartitionId
from freshidx.tools import bench_freshness as bf
from freshidx.tools import bench_soak_continuous as sc
from freshidx.tools.bench_report import render_soak_continuous, soak_curve_rows
from freshidx_tests.conftest import CONNECT_ENV

REPO = Path(__file__).resolve().parents[2]
T = dt.datetime(2026, 11, 24, 12, 0, tzinfo=dt.UTC)
E2E = pytest.mark.skipif(not os.environ.get("FRESHIDX_BENCH_E2E"),
                         reason="heavy on the shared 2-core box (a JVM + dagster dev for minutes); "
                                "set FRESHIDX_BENCH_E2E=1")


def p(minute: int) -> str:
    return PartitionId(T + dt.timedelta(minutes=minute)).path


# ------------------------------------------------------------------------------------- decisions


def test_next_partition_is_the_current_minute_or_one_after_the_last() -> None:
    assert sc.next_partition(None, T + dt.timedelta(seconds=42)).path == p(0)
    assert sc.next_partition(PartitionId.parse(p(-3)), T).path == p(0)
    # drops every 30 s outrun the clock: the next minute after the last drop
    assert sc.next_partition(PartitionId.parse(p(0)), T + dt.timedelta(seconds=30)).path == p(1)
    assert sc.next_partition(PartitionId.parse(p(5)), T).path == p(6)


def test_cadence_skips_missed_slots_instead_of_bunching_them() -> None:
    assert sc._next_slot(100.0, 30.0, 101.0) == 130.0
    assert sc._next_slot(100.0, 30.0, 195.0) == 220.0  # 130, 160, 190 were missed while busy


def test_sample_lag_is_the_wait_of_the_oldest_uncovered_partition() -> None:
    written = [{"partition": p(0), "arrival": 1000.0}, {"partition": p(1), "arrival": 1030.0},
               {"partition": p(2), "arrival": 1060.0}]
    assert sc.sample_lag(1000.0, [], p(0)) is None
    assert sc.sample_lag(1070.0, written, p(2)) == 0.0
    assert sc.sample_lag(1070.0, written, p(0)) == 40.0
    assert sc.sample_lag(1070.0, written, None) == 70.0


def test_run_end_says_planned_restart_memory_crash_or_still_running() -> None:
    assert sc.run_end("SUCCESS", "max_runtime") == "planned restart (runtime)"
    assert sc.run_end("STARTED", "max_memory") == "planned restart (memory)"  # tagged, still ending
    assert sc.run_end("FAILURE", None) == "crash"
    assert sc.run_end("STARTED", None) == "running at the end of the soak"
    assert sc.run_end("CANCELED", None) == "canceled"
    assert sc.run_end("SUCCESS", None) == "ended SUCCESS without a reason tag"


def test_scan_run_log_reads_the_loops_lines() -> None:
    from freshidx.trigger.continuous_rules import decide
    from freshidx.trigger.latest_only import DeltaApplied, DeltaRequest

    started = decide(DeltaApplied([], DeltaRequest(PartitionId.parse(p(1)), 1, 2), None)).reason  # what the loop logs
    lines = [(1.0, "continuous delta: trigger every 1.0 s, planned restart at …"),
             (2.0, started), (3.0, f"building delta for {p(1)} (watermark {p(0)})"),
             (4.0, f"published delta d-1 for {p(1)} (newer than serving)"),
             (5.0, f"micro-batch for {p(2)} (attempt 1, folded 0)"),
             (6.0, f"micro-batch for {p(2)} (attempt 1) failed: RuntimeError: boom"),
             (7.0, "continuous delta ends: planned restart (max_runtime): ran 300 s, limit 300 s; 2 micro-batches")]
    got = sc.scan_run_log(lines)
    assert got["micro_batches"] == 2 and got["published"] == 1
    assert got["failures"] == [{"partition": p(2), "attempt": 1, "error": "RuntimeError: boom", "at": 6.0}]
    assert got["end_message"].startswith("planned restart (max_runtime)")


def test_the_failure_line_the_loop_logs_is_the_one_counted() -> None:
    from freshidx.defs.delta.continuous_job import failed_attempt
    from freshidx.trigger.latest_only import DeltaRequest

    logged: list[str] = []
    context = SimpleNamespace(log=SimpleNamespace(error=logged.append))
    runs = SimpleNamespace(record=lambda *a: None)
    failed_attempt(context, runs, DeltaRequest(PartitionId.parse(p(3)), 2, 0), ValueError("bad\nmore"))  # type: ignore[arg-type]
    assert sc.scan_run_log([(1.0, logged[0])])["failures"] == [
        {"partition": p(3), "attempt": 2, "error": "ValueError: bad", "at": 1.0}]


def test_explain_takes_the_first_publication_covering_each_partition() -> None:
    written = [{"partition": p(i), "arrival": 1000.0 + 30 * i, "records": 5} for i in range(3)]
    history = [(p(-10), 500.0), (p(0), 1002.0), (p(2), 1065.0), (p(2), 1500.0)]  # p(1) folded into p(2)
    decisions = {p(0): {"decision": "published", "reason": "ok"}, p(1): {"decision": "folded", "reason": "into"},
                 p(2): None}
    rows = sc.explain(written, decisions, {p(0), p(1)}, history)
    assert [r["lag_s"] for r in rows] == [2.0, 35.0, 5.0]
    assert [r["decision"] for r in rows] == ["published", "folded", None]
    assert [r["explained"] for r in rows] == [True, True, False]
    assert sc.first_publication(p(3), history) is None


def _result(*, failed: bool = False, unexplained: bool = False, samples: int = 4) -> dict[str, Any]:
    written = [{"partition": p(i), "arrival": 1000.0 + 30 * i, "records": 5} for i in range(3)]
    decisions = {p(0): {"decision": "published", "reason": "ok"}, p(1): {"decision": "folded", "reason": "into p2"},
                 p(2): {"decision": "published", "reason": "ok"}}
    explained = {p(0), p(1)} | (set() if unexplained else {p(2)})
    parts = sc.explain(written, decisions, explained, [(p(0), 1003.0), (p(2), 1064.0)])
    runs = [
        {"run_id": "bbbbbbbb-2", "status": "STARTED", "ended_tag": None, "start": 2000.0, "micro_batches": 1,
         "published": 1, "failures": [], "started_because": "previous ended: SUCCESS (max_runtime)"},
        {"run_id": "aaaaaaaa-1", "status": "SUCCESS", "ended_tag": "max_runtime", "start": 900.0, "micro_batches": 2,
         "published": 1, "started_because": "none at start-up",
         "failures": [{"partition": p(1), "attempt": 1, "error": "boom", "at": 1.0}] if failed else []},
    ]
    rows = [{"t": 10.0 * i, "run_id": "aaaaaaaa-1" if i < samples - 1 else "bbbbbbbb-2",
             "run_rss_bytes": (300 + 10 * i) * 2**20, "server_rss_bytes": 900 * 2**20, "seq": 10 + i,
             "lag_s": 1.5 * i, "runs": 1 if i < samples - 1 else 2} for i in range(samples)]
    summarized = sc.summarize_runs(runs, rows)
    summary = sc.soak_summary(parts, summarized, rows)
    return {"mode": "continuous", "error": None, "samples": rows, "runs": summarized, "partitions": parts,
            "summary": summary, "verdict": sc.verdict(summary, None),
            "config": {"minutes": 1.5, "interval_s": 30.0, "window_minutes": 300, "window_docs": 2000,
                       "max_runtime": "20m", "max_rss_mb": 2048}}


def test_summary_counts_runs_restarts_rss_and_partitions() -> None:
    r = _result(samples=4)
    s = r["summary"]
    assert [x["run_id"] for x in r["runs"]] == ["aaaaaaaa-1", "bbbbbbbb-2"]  # oldest first
    assert [x["ended"] for x in r["runs"]] == ["planned restart (runtime)", "running at the end of the soak"]
    assert [x["max_rss_bytes"] for x in r["runs"]] == [320 * 2**20, 330 * 2**20]
    assert (s["written"], s["published"], s["covered_by_pointer"]) == (3, 2, 3)
    assert s["decisions"] == {"published": 2, "folded": 1}
    assert s["not_published"] == [{"partition": p(1), "decision": "folded", "reason": "into p2"}]
    assert (s["runs"], s["planned_restarts"], s["crashes"], s["micro_batches"]) == (2, 1, 0, 3)
    assert s["failed_micro_batches"] == 0 and s["unexplained"] == []
    assert s["arrival_to_published"] == {"p50": 4.0, "p95": 31.0, "max": 34.0, "n": 3}  # p1 waited for p2
    assert s["max_run_rss_bytes"] == 330 * 2**20 and s["max_server_rss_bytes"] == 900 * 2**20
    assert r["verdict"] == {"passed": True, "why": []}
    json.dumps(r)


def test_verdict_fails_on_a_failed_micro_batch_an_unexplained_partition_or_an_error() -> None:
    assert sc.verdict(_result(failed=True)["summary"], None) == {"passed": False, "why": ["1 failed micro-batches"]}
    v = sc.verdict(_result(unexplained=True)["summary"], None)
    assert v["passed"] is False and v["why"] == ["1 partitions not explained in the ledger"]
    empty = sc.soak_summary([], [], [])
    assert sc.verdict(empty, "TimeoutError: warm-up not done")["why"] == [
        "error: TimeoutError: warm-up not done", "no partition written"]


def test_curve_rows_thin_out_long_curves_but_keep_restarts_and_the_end() -> None:
    samples = [{"t": float(i), "run_id": "a" if i < 150 else "b"} for i in range(400)]
    assert soak_curve_rows(samples[:50], 80) == samples[:50]
    rows = soak_curve_rows(samples, 80)
    ts = [s["t"] for s in rows]
    assert 80 <= len(rows) <= 83 and ts[0] == 0 and ts[-1] == 399 and 150 in ts


def test_render_shows_the_verdict_runs_and_curve() -> None:
    text = render_soak_continuous(_result(failed=True))
    assert "verdict: FAILED: 1 failed micro-batches" in text
    assert "run aaaaaaaa SUCCESS: 2 micro-batches (1 failed), max RSS 320 MiB" in text
    assert "ended: planned restart (runtime)" in text and "1 planned restarts" in text
    assert f"FAILED micro-batch for {p(1)} (attempt 1): boom" in text
    assert f"{p(1)}: folded (into p2)" in text
    curve = text.split("curve (")[1].splitlines()
    assert curve[0].startswith("4 of 4 samples")
    assert curve[2].split() == ["0:00", "aaaaaaaa", "300", "900", "10", "0.00", "1"]
    assert curve[-1].split() == ["0:30", "bbbbbbbb", "330", "900", "13", "4.50", "2"]
    assert "PASSED" in render_soak_continuous(_result())
    broken = {"config": {}, "error": "RuntimeError: dagster dev exited", "summary": sc.soak_summary([], [], []),
              "verdict": sc.verdict(sc.soak_summary([], [], []), "RuntimeError: dagster dev exited")}
    assert "error: RuntimeError: dagster dev exited" in render_soak_continuous(broken)


# ------------------------------------------------------------------------------------------- CLI


def test_cli_soak_mode_options_and_dispatch(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from freshidx.cli import parse

    a = parse(["bench", "soak", "--mode", "continuous", "--minutes", "15", "--max-runtime", "5m", "--json"])
    assert a.command.load() is bf.cmd_bench_soak
    assert {k: a.params[k] for k in ("mode", "minutes", "interval", "max_runtime", "max_rss_mb", "sample_every",
                                     "full_warmup")} == {
        "mode": "continuous", "minutes": 15.0, "interval": 30.0, "max_runtime": "5m", "max_rss_mb": 2048,
        "sample_every": 10.0, "full_warmup": True}
    assert parse(["bench", "soak"]).params["mode"] == "connect"  # the default: the Connect soak, as before
    for bad in (["--mode", "sensor"], ["--max-runtime", "soon"]):
        with pytest.raises(SystemExit):
            parse(["bench", "soak", *bad])

    seen: dict[str, Any] = {}

    def fake(minutes: float, **kw: Any) -> dict[str, Any]:
        seen.update(kw, minutes=minutes)
        return _result()

    monkeypatch.setattr(sc, "bench_soak_continuous", fake)
    params = dict(a.params)
    assert bf.cmd_bench_soak(**params) == 0
    assert (seen["minutes"], seen["max_runtime"], seen["interval_s"], seen["full_warmup"]) == (15.0, "5m", 30.0, True)
    out = capsys.readouterr()
    assert json.loads(out.out)["verdict"]["passed"] is True and "curve (" in out.err
    monkeypatch.setattr(sc, "bench_soak_continuous", lambda minutes, **kw: _result(failed=True))
    assert bf.cmd_bench_soak(**{**params, "as_json": False}) == 1
    assert "verdict: FAILED" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------- real run


@E2E  # ~5 min (its own supervised JVM + dagster dev, 2 minutes of drops): outside the suite's budget
@pytest.mark.daemon
def test_continuous_soak_end_to_end(tmp_path: Path) -> None:
    """Two minutes of continuous mode through the real daemon, a planned restart due after 60 s: a curve,
    no failed micro-batch, every written partition explained in the ledger."""
    env = {k: v for k, v in os.environ.items() if k not in CONNECT_ENV}
    proc = subprocess.run(
        [sys.executable, "-m", "freshidx.tools.bench_freshness", "soak", "--mode", "continuous", "--minutes", "2",
         "--interval", "20", "--sample-every", "5", "--max-runtime", "60s", "--window-docs", "300",
         "--window-minutes", "5", "--driver-memory", "1g", "--no-full-warm-up", "--json",
         "--workdir", str(tmp_path / "bench")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1500,
    )
    try:
        r = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"no JSON (rc {proc.returncode}): {proc.stdout[-2000:]}\n{proc.stderr[-4000:]}") from None
    print(proc.stderr[-6000:])  # the curve and summary (-s shows them)
    s = r["summary"]
    assert proc.returncode == 0, (r.get("error"), r["verdict"], proc.stderr[-4000:])
    assert r["error"] is None and r["verdict"] == {"passed": True, "why": []}
    assert s["written"] >= 1 and s["failed_micro_batches"] == 0 and s["unexplained"] == []
    assert all(x["explained"] and x["decision"] for x in r["partitions"]), r["partitions"]
    assert r["samples"] and any(x["run_rss_bytes"] for x in r["samples"])
    assert any(x["server_rss_bytes"] for x in r["samples"])
    assert r["runs"] and s["runs"] == len(r["runs"]) and s["crashes"] == 0
    for run in r["runs"]:
        assert run["ended"] in ("planned restart (runtime)", "running at the end of the soak"), run
    assert "curve (" in proc.stderr and "verdict: PASSED" in proc.stderr
