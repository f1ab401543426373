"""``freshidx bench freshness`` / ``soak``: stats and report code (fast), and real runs (``daemon``).

The real end-to-end runs need ``FRESHIDX_BENCH_E2E=1`` (each costs minutes of a 2-core box, which
the default suite's 20-minute budget cannot pay): ``freshidx bench freshness`` in Connect mode (a
supervised Spark Connect server + ``dagster dev``) for one partition of a tiny window, as a
subprocess (its supervisor talks to the server through an in-process Connect client, which would
switch this worker's ``pyspark.sql.functions`` to Connect); the local-mode run; the soak. The same
sensor → Connect run → publication path is covered by test_daemon_e2e.py, the continuous one (watchdog
→ long-lived run → publication) by test_continuous_e2e.py; the bench's continuous-mode run
(``--delta-modes continuous``, 2 partitions, ~3.5 min under load) is gated like the others.
Nothing asserts on timings: only on the shape of the result and on the order of the events.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import mmap
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from freshidx.store.partitions import PartitionId
from freshidx.tools import bench_freshness as bf
from freshidx.tools.bench_report import SEARCHABLE_PARTS, parts_line
from freshidx.tools.generate import history_partitions, partition_records
from freshidx_tests.conftest import CONNECT_ENV

P = PartitionId(dt.datetime(2026, 11, 21, 14, 5, tzinfo=dt.UTC))
REPO = Path(__file__).resolve().parents[2]
E2E = pytest.mark.skipif(not os.environ.get("FRESHIDX_BENCH_E2E"),
                         reason="heavy on the shared 2-core box (another JVM / a SparkSession per run); "
                                "set FRESHIDX_BENCH_E2E=1")



# ----------------------------------------------------------------------------------------- statistics


def test_percentile_interpolates_and_summarize_skips_missing() -> None:
    assert bf.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert bf.percentile([1.0, 2.0], 50) == 1.5
    assert bf.percentile([0.0, 10.0], 95) == pytest.approx(9.5)
    assert bf.percentile([4.0], 95) == 4.0
    assert math.isnan(bf.percentile([], 50))
    assert bf.summarize([1.0, None, 3.0, float("nan")]) == {"p50": 2.0, "p95": 2.9, "max": 3.0, "n": 2}
    assert bf.summarize([None]) == {"p50": None, "p95": None, "max": None, "n": 0}


def _events(t0: float, *, noticed: float | None = 2.0, searchable: float | None = 9.0) -> dict[str, float | None]:
    rel = {"arrival": 0.0, "noticed": noticed, "run_created": 2.5, "run_start": 4.0, "body_start": 4.5,
           "listed": 5.0, "built": 7.5, "published": 7.6, "searchable": searchable}
    return {k: (t0 + v if v is not None else None) for k, v in rel.items()}


def test_sample_stages_are_consecutive_and_add_up() -> None:
    st = bf.sample_stages(_events(1_000.0))
    assert st["arrival_to_run_created"] == 2.5
    assert st["arrival_to_noticed"] == 2.0 and st["noticed_to_run_created"] == 0.5
    assert st["session_and_listing"] == 0.5 and st["spark_build"] == 2.5 and st["publish"] == pytest.approx(0.1)
    assert sum(st[n] for n in bf.MAIN_STAGES) == pytest.approx(st["arrival_to_searchable"]) == 9.0
    assert st["arrival_to_published"] == pytest.approx(7.6)
    missing = bf.sample_stages(_events(0.0, noticed=None, searchable=None))
    assert missing["arrival_to_noticed"] is None and missing["arrival_to_searchable"] is None
    assert missing["run_created_to_start"] == 1.5


def _result() -> dict[str, Any]:
    samples = []
    for i, (t0, searchable) in enumerate([(0.0, 9.0), (100.0, 12.0), (200.0, None)]):
        ev = _events(t0, searchable=searchable)
        samples.append({"partition": f"year=2026/month=11/day=21/hour=14/minute=0{i}", "events": ev,
                        "stages": bf.sample_stages(ev), "error": None if searchable else "not searchable after 5s",
                        "delay_before_drop_s": 1.0, "load_avg_1m": 2.0})
    connect = {"mode": "connect", "partitions": 3, "samples": samples, "spark": "sc://127.0.0.1:1",
               "delta_docs": 100, "full_docs": 100, "searchable_method": "searcher", "load_avg_range": [1, 2]}
    connect.update(bf.mode_summary(samples))
    connect["goal"] = bf.goal_verdict(connect)
    local = {"mode": "local", "partitions": 3, "phase": "warm-up", "error": "TimeoutError: warm-up not done"}
    return {"config": {"partitions": 3, "window_docs": 1000}, "connect": connect, "local": local}


def test_mode_summary_goal_and_dominant_stage() -> None:
    r = _result()["connect"]
    assert r["completed"] == 2 and r["failed"] == 1
    assert r["arrival_to_searchable"] == {"p50": 10.5, "p95": 11.85, "max": 12.0, "n": 2}
    assert set(r["stages"]) == {name for name, *_ in bf.STAGES}
    # Spark job → published is 3.1 s in both samples; published → searchable 1.4 / 4.4 s (p50 2.9 s).
    assert r["dominant_stage_p50"] == "spark_job_to_published"
    assert r["worst_sample"].endswith("minute=01")
    assert r["dominant_stage_worst_sample"] == "published_to_searchable"
    assert r["goal"] == {"p50_goal_s": 6.0, "max_goal_s": 10.0, "met": False, "p50_met": False, "max_met": False}
    assert bf.goal_verdict(r, 11.0, 12.0) == {"p50_goal_s": 11.0, "max_goal_s": 12.0, "met": True, "p50_met": True,
                                              "max_met": True}
    assert bf.goal_verdict(r, 10.0, 12.0)["p50_met"] is False  # p50 10.5
    json.dumps(r)  # JSON-able


def test_render_freshness_shows_every_stage_and_failures() -> None:
    text = bf.render_freshness(_result())
    for *_, label, _ in bf.STAGES:
        assert label in text
    assert "connect p50" in text and "MISSED" in text
    assert "local: FAILED during warm-up" in text
    assert "not searchable after 5s" in text  # the failed sample is listed
    assert "10.50" in text and "12.00" in text


def test_published_to_searchable_parts_are_summarized_and_printed() -> None:
    parts = {"wait_s": 0.1, "pointers_s": 0.001, "manifests_s": 0.002, "download_s": 0.05, "open_s": 0.01,
             "kill_list_s": 0.03, "downloaded_bytes": 3 * 2**20, "parts_loaded": 1}
    samples = [{"partition": p, "events": {"searchable": 1.0}, "stages": {"arrival_to_searchable": 1.0},
                "searchable_parts": sp} for p, sp in (("p", parts), ("q", None))]
    summary = bf.mode_summary(samples, bf.CONTINUOUS_STAGES)
    assert summary["searchable_parts"]["kill_list_s"] == {"p50": 0.03, "p95": 0.03, "max": 0.03, "n": 1}
    assert parts_line(summary) == (
        "published → searchable p50 by part (s): wait for the refresh 0.10, pointers 0.00, manifests 0.00, "
        "download + sha256 0.05, tantivy open 0.01, kill-list (within the download) 0.03; 3.0 MiB downloaded")
    assert parts_line(bf.mode_summary(samples[1:], bf.CONTINUOUS_STAGES)) is None


def _continuous_result() -> dict[str, Any]:
    rel = {"arrival": 0.0, "micro_batch": 0.6, "body_start": 0.65, "listed": 0.9, "built": 1.8, "published": 2.0,
           "searchable": 2.3}
    samples = []
    for i in range(2):
        ev = {k: 100.0 * i + v for k, v in rel.items()}
        samples.append({"partition": f"year=2026/month=11/day=21/hour=14/minute=0{i}", "events": ev,
                        "stages": bf.sample_stages(ev, bf.CONTINUOUS_STAGES), "error": None,
                        "delay_before_drop_s": 0.5, "load_avg_1m": 2.0})
    connect = {"mode": "connect", "delta_mode": "continuous", "partitions": 2, "samples": samples,
               "spark": "sc://127.0.0.1:1", "delta_docs": 100, "full_docs": None, "searchable_method": "searcher"}
    connect.update(bf.mode_summary(samples, bf.CONTINUOUS_STAGES))
    connect["goal"] = bf.goal_verdict(connect, 3.0, 6.0)
    return {**_result(), "continuous": {"connect": connect}}


def test_continuous_stages_summary_and_table() -> None:
    r = _continuous_result()
    c = r["continuous"]["connect"]
    assert set(c["stages"]) == {name for name, *_ in bf.CONTINUOUS_STAGES}
    assert c["arrival_to_searchable"] == {"p50": 2.3, "p95": 2.3, "max": 2.3, "n": 2}
    st = c["samples"][0]["stages"]
    main = [n for n, _, _, _, depth in bf.CONTINUOUS_STAGES if depth == 0]
    assert sum(st[n] for n in main) == pytest.approx(st["arrival_to_searchable"])
    assert st["arrival_to_micro_batch"] == 0.6 and st["spark_build"] == pytest.approx(0.9)
    assert c["dominant_stage_p50"] == "spark_job_to_published"
    assert c["goal"] == {"p50_goal_s": 3.0, "max_goal_s": 6.0, "met": True, "p50_met": True, "max_met": True}
    text = bf.render_freshness(r)
    sensor, continuous = text.split("delta mode continuous")
    assert "delta mode sensor" in sensor and "arrival → run created (sensor)" in sensor
    for *_, label, _ in bf.CONTINUOUS_STAGES:
        assert label in continuous
    assert "goal p50 ≤ 3 s, max ≤ 6 s: met" in continuous and "goal p50 ≤ 6 s, max ≤ 10 s" in sensor
    # A seed-sized window (a million documents) is held to a tighter worst case.
    assert bf.continuous_goals(1_000_000) == (3.0, 5.0) and bf.continuous_goals(100_000) == (3.0, 6.0)
    c_seed = {**c, "goal": bf.goal_verdict(c, *bf.continuous_goals(1_000_000))}
    seed_sized = {**r, "config": {**r["config"], "window_docs": 1_000_000}, "continuous": {"connect": c_seed}}
    assert "goal p50 ≤ 3 s, max ≤ 5 s: met" in bf.render_freshness(seed_sized)
    json.dumps(r)


class _Log:
    def __init__(self, t: float, msg: str) -> None:
        self.timestamp, self.user_message = t, msg


class _Instance:
    """The two DagsterInstance calls the continuous measurement makes."""

    def __init__(self, logs: list[_Log]) -> None:
        from types import SimpleNamespace

        self.logs = logs
        self.run = SimpleNamespace(run_id="r1", status=SimpleNamespace(value="STARTED"))

    def get_runs(self, filters: Any, limit: int) -> list[Any]:
        return [self.run]

    def all_logs(self, run_id: str) -> list[_Log]:
        return self.logs


def test_continuous_events_come_from_the_partitions_micro_batch_and_a_retry_starts_over() -> None:
    from freshidx.tools.bench_continuous import _micro_batch_events

    other = PartitionId(P.at - dt.timedelta(minutes=1))
    logs = [_Log(1.0, f"micro-batch for {other.path} (attempt 1, folded [])"),
            _Log(1.1, f"building delta for {other.path} (watermark None)"), _Log(1.2, "list_seconds: 0.1s"),
            _Log(5.0, f"micro-batch for {P.path} (attempt 1, folded [])"),
            _Log(5.1, f"building delta for {P.path} (watermark {other.path})"),
            _Log(5.3, "list_seconds: 0.2s"), _Log(5.4, f"micro-batch for {P.path} (attempt 1) failed: boom"),
            _Log(20.0, f"micro-batch for {P.path} (attempt 2, folded [])"),
            _Log(20.1, f"building delta for {P.path} (watermark {other.path})"),
            _Log(20.3, "list_seconds: 0.2s"), _Log(21.0, "build_seconds: 0.7s"),
            _Log(21.2, f"published delta d-123 for {P.path} (ok)")]
    ev, info = _micro_batch_events(_Instance(logs[:-1]), P)
    assert ev == {"micro_batch": 20.0, "body_start": 20.1, "listed": 20.3, "built": 21.0}
    assert info["outcome"] is None  # not ended yet: the bench waits
    ev, info = _micro_batch_events(_Instance(logs), P)
    assert info == {"run_id": "r1", "run_status": "STARTED", "outcome": "published"}
    assert _micro_batch_events(_Instance(logs[:3]), P)[0]["micro_batch"] is None


def test_render_soak() -> None:
    row = {"batch": 0, "elapsed_s": 3.0, "batch_s": 3.0, "server_pid": 42, "heap_used_bytes": 100 * 2**20,
           "heap_max_bytes": 2**31, "jvm_rss_bytes": 2**30, "session_rss_bytes": 2**31, "session_processes": 7,
           "restarts": 1}
    r = {"config": {"window_minutes": 300, "window_docs": 2000, "restart_every_s": 600, "restart_every_batches": 1},
         "batches": 2, "ran": 2, "completed": 1, "failed": 1, "wall_s": 9.0, "stopped_early": False,
         "batch_seconds": bf.summarize([3.0]), "timeline": [row],
         "per_server": [{"pid": 42, "first_batch": 0, "last_batch": 1, "heap_used_bytes_first": 2**20,
                         "heap_used_bytes_last": 2**21, "heap_used_bytes_max": 2**21}],
         "restarts": [{"restarts": 1, "reason": "planned-manual", "at": "t", "seen_at_batch": 1,
                       "batch_lease_wait_s": 5.0, "duration_s": 12.0, "old_pid": 41, "new_pid": 42}],
         "failures": [{"batch": 1, "error": "boom"}]}
    text = bf.render_soak(r)
    assert "1/2 batches ok (1 failed)" in text
    assert "planned-manual" in text and "pid 41 → 42" in text and "batch 2 failed: boom" in text
    assert "1024" in text and "2048" in text  # RSS in MiB


# ------------------------------------------------------------------------------------- data helpers


def test_generator_config_for_hits_the_window_size() -> None:
    cfg = bf.generator_config_for(2_000, seed=1)
    assert cfg.burst_probability == 0.0  # one file per partition: arrival is one put
    now = dt.datetime(2026, 11, 21, 14, 0, tzinfo=dt.UTC)
    latest: set[str] = set()
    for p in history_partitions(now, dt.timedelta(minutes=bf.WINDOW_MINUTES)):
        _, stats = partition_records(cfg, p)
        latest.update(stats.ad_ids)
    assert 1_700 <= len(latest) <= 2_300


def test_a_record_whose_timestamp_is_no_instant_is_never_a_probe() -> None:
    # the shape of a timestamp, not an instant: quarantined by the pipeline, so never searchable
    bad = {"ad_id": "ad-1", "campaign_id": "c", "product_id": "p", "title": "t", "bid": 1.0, "status": "active",
           "updated_at": "2026-11-21T25:61:00.000Z", "version": 1}
    assert not bf.looks_valid(bad)
    assert bf.looks_valid({**bad, "updated_at": "2026-11-21T23:59:00.000Z"})
    # the partition where that record was picked before, in a bench run that then waited for it in vain
    cfg = bf.generator_config_for(100_000)
    probe = bf.pick_probe(cfg, PartitionId.parse("year=2026/month=12/day=06/hour=22/minute=07"))
    assert probe is not None and probe.ad_id != "ad-022089"


def test_pick_probe_is_the_newest_active_record_of_its_ad() -> None:
    cfg = bf.generator_config_for(2_000, seed=3)
    probe = bf.pick_probe(cfg, P, seed=3)
    assert probe is not None
    assert probe.word in probe.title.split() and probe.query == f'+title:{probe.word} +ad_id:"{probe.ad_id}"'
    lines, _ = partition_records(cfg, P)
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    mine = [r for r in records if isinstance(r, dict) and r.get("ad_id") == probe.ad_id]
    assert mine and all(bf.looks_valid(r) for r in mine)
    newest = max(mine, key=lambda r: r["version"])
    assert newest["version"] == probe.version and newest["status"] == "active" and newest["title"] == probe.title
    assert bf.pick_probe(cfg, P, seed=3) == probe  # deterministic


def test_cli_registers_under_an_existing_bench_group() -> None:
    from freshidx.cli import parse

    a = parse(["bench", "freshness", "--partitions", "3", "--modes", "local", "--json"])
    p = a.params
    assert (p["partitions"], p["window_docs"], p["modes"], p["as_json"], a.command.load()) == (
        3, 100_000, ["local"], True, bf.cmd_bench_freshness)
    assert p["delta_modes"] == ["sensor", "continuous"]
    from freshidx.cli import bench as cli_bench

    assert cli_bench.DELTA_MODES == bf.DELTA_MODES  # the CLI mirrors it (imports nothing heavy)
    assert parse(["bench", "freshness", "--delta-modes", "continuous"]).params["delta_modes"] == ["continuous"]
    with pytest.raises(SystemExit):
        parse(["bench", "freshness", "--delta-modes", "cron"])
    s = parse(["bench", "soak", "--restart-every-batches", "4"])
    assert (s.params["batches"], s.params["restart_every_batches"], s.command.load()) == (500, 4, bf.cmd_bench_soak)
    assert parse(["bench", "freshness", "--no-full-warm-up"]).params["full_warmup"] is False
    with pytest.raises(SystemExit):
        parse(["bench", "freshness", "--modes", "yarn"])


def test_freshidx_bench_cli_has_all_four_subcommands() -> None:
    from freshidx.cli import parse

    for argv, func in ((["bench", "freshness", "--partitions", "2"], bf.cmd_bench_freshness),
                       (["bench", "soak", "--batches", "3"], bf.cmd_bench_soak)):
        assert parse(argv).command.load() is func
    from freshidx.tools import bench

    assert parse(["bench", "build", "--docs", "10"]).command.load() is bench.cmd_bench_build
    assert parse(["bench", "query", "--docs", "10"]).command.load() is bench.cmd_bench_query


# ----------------------------------------------------------------------------------------- real runs


def _check_mode(r: dict[str, Any], mode: str, partitions: int) -> None:
    m = r[mode]
    assert not m.get("error"), m.get("error")
    assert set(m["arrival_to_searchable"]) == {"p50", "p95", "max", "n"}
    assert set(m["stages"]) == {name for name, *_ in bf.STAGES}
    assert m["completed"] == partitions and m["failed"] == 0 and len(m["samples"]) == partitions
    assert m["searchable_method"] == "searcher"
    for s in m["samples"]:
        ev = s["events"]
        assert s["error"] is None and s["run_status"] == "SUCCESS", s
        assert s["covered_partition"] == s["partition"]
        assert None not in ev.values(), ev
        assert ev["arrival"] <= ev["run_created"] <= ev["run_start"] <= ev["published"] <= ev["searchable"]
        assert ev["run_start"] <= ev["body_start"] <= ev["listed"] <= ev["built"] <= ev["published"]
        assert ev["noticed"] <= ev["run_created"]


def _bench(tmp_path: Path, *argv: str) -> tuple[int, dict[str, Any], str]:
    """``python -m freshidx.tools.bench_freshness ... --json`` in a subprocess; (rc, JSON, stderr)."""
    env = {k: v for k, v in os.environ.items() if k not in CONNECT_ENV}
    proc = subprocess.run(
        [sys.executable, "-m", "freshidx.tools.bench_freshness", *argv, "--json", "--workdir", str(tmp_path / "bench")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=540,
    )
    try:
        result = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"no JSON (rc {proc.returncode}): {proc.stdout[-2000:]}\n{proc.stderr[-4000:]}") from None
    return proc.returncode, result, proc.stderr


@pytest.mark.daemon
@E2E  # ~3 min (its own supervised JVM + dagster dev): outside the suite's 20-minute budget
def test_freshness_connect_mode_end_to_end(tmp_path: Path) -> None:
    """The real path: generator → sensor → run on the supervised Connect server → pointer → Searcher."""
    rc, r, err = _bench(tmp_path, "freshness", "--partitions", "1", "--modes", "connect", "--window-docs", "300",
                        "--window-minutes", "5", "--max-delay", "0", "--no-full-warm-up", "--driver-memory", "1g",
                        "--delta-modes", "sensor")
    assert rc == 0, err[-4000:]
    assert set(r) == {"config", "connect"} and r["config"]["full_warmup"] is False
    _check_mode(r, "connect", 1)
    c = r["connect"]
    assert c["spark"].startswith("sc://127.0.0.1:") and c["spark_server"]["restarts"] == 0
    assert set(c["goal"]) >= {"met", "p50_met", "max_met"}
    assert "arrival → searchable" in err and "connect p50" in err  # the table goes to stderr with --json


@pytest.mark.daemon
@E2E
def test_freshness_local_mode_end_to_end(tmp_path: Path) -> None:
    rc, r, err = _bench(tmp_path, "freshness", "--partitions", "2", "--modes", "local", "--window-docs", "300",
                        "--window-minutes", "5", "--max-delay", "1", "--delta-modes", "sensor")
    assert rc == 0, err[-4000:]
    assert set(r) == {"config", "local"}
    _check_mode(r, "local", 2)


@E2E  # ~3.5 min under load: outside the suite's 20-minute budget
@pytest.mark.daemon
def test_freshness_continuous_mode_end_to_end(tmp_path: Path) -> None:
    """Continuous mode through the real daemon: the watchdog starts delta_continuous on the supervised
    Connect server, each dropped partition becomes one micro-batch of that run and is searchable."""
    rc, r, err = _bench(tmp_path, "freshness", "--partitions", "2", "--modes", "connect", "--window-docs", "300",
                        "--window-minutes", "5", "--max-delay", "0.5", "--no-full-warm-up", "--driver-memory", "1g",
                        "--delta-modes", "continuous")
    assert rc == 0, err[-4000:]
    assert set(r) == {"config", "continuous"} and r["config"]["delta_modes"] == ["continuous"]
    assert set(r["continuous"]) == {"connect"}
    c = r["continuous"]["connect"]
    assert not c.get("error"), c.get("error")
    assert set(c["arrival_to_searchable"]) == {"p50", "p95", "max", "n"}
    assert set(c["stages"]) == {name for name, *_ in bf.CONTINUOUS_STAGES}
    assert c["completed"] == 2 and c["failed"] == 0 and c["searchable_method"] == "searcher"
    assert c["delta_mode"] == "continuous" and set(c["goal"]) >= {"met", "p50_met", "max_met"}
    run_ids = set()
    for s in c["samples"]:
        ev = s["events"]
        assert s["error"] is None and s["outcome"] == "published", s
        assert s["covered_partition"] == s["partition"]
        assert None not in ev.values(), ev
        assert ev["arrival"] <= ev["micro_batch"] <= ev["body_start"] <= ev["listed"] <= ev["built"]
        assert ev["built"] <= ev["published"] <= ev["searchable"]
        run_ids.add(s["run_id"])
        # published → searchable split into the reader's parts, which add up to it
        parts = s["searchable_parts"]
        assert parts["downloaded_bytes"] > 0 and parts["parts_loaded"] >= 1 and parts["open_s"] > 0
        timed = sum(parts[name] for name, _ in SEARCHABLE_PARTS)
        assert timed == pytest.approx(ev["searchable"] - ev["published"], abs=0.01)
    assert len(run_ids) == 1  # both micro-batches in the one long-lived run
    assert "delta mode continuous" in err and "connect p50" in err
    assert "published → searchable p50 by part (s): wait for the refresh" in err


@pytest.mark.daemon
@E2E
def test_soak_against_a_supervised_connect_server(capsys: pytest.CaptureFixture[str]) -> None:
    rc = bf.main(["soak", "--batches", "2", "--window-minutes", "30", "--window-docs", "300",
                  "--samples", "2", "--driver-memory", "1g", "--json"])
    out = capsys.readouterr()
    r = json.loads(out.out)
    assert rc == 0, out.err[-3000:]
    assert r["completed"] == 2 and r["failed"] == 0 and r["ran"] == 2
    assert set(r["batch_seconds"]) == {"p50", "p95", "max", "n"} and r["batch_seconds"]["n"] == 2
    assert [t["batch"] for t in r["timeline"]] == [0, 1]
    for t in r["timeline"]:
        assert t["server_pid"] and t["jvm_rss_bytes"] > 0 and t["session_processes"] >= 1
    assert r["per_server"] and isinstance(r["restarts"], list)
    assert "batch seconds" in out.err  # the table goes to stderr with --json


@pytest.mark.skipif(sys.platform != "linux", reason="the file-backed resident size is Linux's")
def test_the_file_backed_part_of_a_resident_set_counts_the_mapped_pages_touched(tmp_path: Path) -> None:
    from freshidx.procs import file_rss_bytes

    path = tmp_path / "mapped"
    path.write_bytes(b"x" * (64 << 20))
    before = file_rss_bytes(os.getpid())
    assert before is not None
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        touched = sum(m[i] for i in range(0, len(m), mmap.PAGESIZE))  # one byte a page
        after = file_rss_bytes(os.getpid())
    assert touched == ord("x") * (len(range(0, 64 << 20, mmap.PAGESIZE)))
    assert after is not None and after - before >= 48 << 20  # most of the 64 MiB (a few may be reclaimed)
