"""``freshidx bench chaos`` end to end: the demo on a real moto S3 server behind the fault proxy, its parts
SIGKILLed every 20-40 s for 5 minutes; nothing lost, nothing wrong, the pointer never back, every partition
explained, a restart printed for each kill of a part the demo supervises (webserver, daemon, code server,
generator), the UI serving again afterwards, a clean stop (exit 0) that leaves nothing, and the kills of a
few kinds each followed by a newer delta.

The pure parts (fault choice, kill plan, process kinds, the oracle, the verdict) are checked first, on
their own. Recovery times are printed, not asserted (``freshidx bench chaos`` is the measurement).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from freshidx.tools import bench_chaos
from freshidx.tools.chaos.fault_proxy import FaultRates, choose_fault
from freshidx.tools.chaos.kill_plan import (
    CODE_SERVER,
    CONTINUOUS_WORKER,
    GENERATOR,
    RUN_WORKER,
    SPARK_JVM,
    TARGETS,
    WEBSERVER,
    KillPlan,
)
from freshidx.tools.chaos.oracle import compare, oracle
from freshidx.tools.chaos.targets import Proc, RunWorker, classify, kind_of
from freshidx.tools.chaos.verdict import (
    CHECKS,
    Kill,
    Observation,
    backwards,
    baseline_gaps,
    recoveries,
    unrestarted,
)

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

#: With this seed and --kill-every 20 40, five minutes hold ten kills whose first draws cover every target.
SEED = 13
#: Kinds whose kills the run must show, each followed by a newer delta.
MUST_RECOVER = (CONTINUOUS_WORKER, SPARK_JVM)
#: Kinds whose every kill must be followed by a newer delta: no data flows through them.
OFF_THE_DATA_PATH = (WEBSERVER, CODE_SERVER)


def test_pure_parts() -> None:
    rates = FaultRates(error=0.1, drop=0.1, lost=0.1, delay=0.1)
    assert [choose_fault(d, rates) for d in (0.05, 0.15, 0.25, 0.35, 0.5)] == [
        "error", "drop", "lost", "delay", "forward"]
    with pytest.raises(ValueError):
        FaultRates(error=0.9, drop=0.2)
    plan = KillPlan(1, 30, 90)
    assert all(30 <= plan.next_delay() <= 90 for _ in range(50))
    assert plan.choose([]) is None and plan.choose([GENERATOR]) == GENERATOR
    assert bench_chaos.TARGET_NAMES == TARGETS

    assert kind_of(["python", "-m", "dagster", "code-server", "start", "--port", "1"]) == "code-server"
    assert kind_of(["python", "-m", "dagster._daemon", "run"]) == "daemon"
    assert kind_of(["python", "-m", "dagster", "api", "grpc"]) is None
    procs = [Proc(10, None), Proc(11, None), Proc(12, "daemon")]
    workers = [RunWorker("a", "delta_continuous", 10), RunWorker("b", "ads_hourly", 11), RunWorker("c", "x", 99)]
    assert classify(procs, workers, "a") == {"daemon": [12], CONTINUOUS_WORKER: [10], RUN_WORKER: [11]}

    obs = [Observation(1, 1, "p1", "v1"), Observation(5, 2, "p2", "v2"), Observation(6, 3, "p2", "v3"),
           Observation(9, 1, "p1", "v1"), Observation(12, 4, "p3", "v4")]
    assert backwards(obs) == 1
    kills = [Kill(5.5, SPARK_JVM, 7), Kill(13, GENERATOR, 8)]
    recoveries(kills, obs)
    assert [k.recovery_s for k in kills] == [6.5, None]
    assert baseline_gaps(obs, kills) == [4]
    # the JVM is no child of the demo's (its Spark server takes a spare): only the generator's kill needs a restart
    assert unrestarted(kills, {}) == 1 and unrestarted(kills, {GENERATOR: 1}) == 0
    assert unrestarted([*kills, Kill(20, GENERATOR, None)], {GENERATOR: 1}) == 0  # skipped: nothing killed

    recs = [{"ad_id": "a", "version": 1, "updated_at": 1, "status": "active", "campaign_id": "c", "product_id": "p",
             "title": "t", "keywords": [], "bid": 1.0},
            {"ad_id": "a", "version": 2, "updated_at": 1, "status": "deleted", "campaign_id": "c", "product_id": "p",
             "title": "t", "keywords": [], "bid": 1.0},
            {"ad_id": "b", "version": 3, "updated_at": 1, "status": "active", "campaign_id": "c", "product_id": "p",
             "title": "u", "keywords": [], "bid": 2.0}]
    want = oracle(recs)
    assert set(want) == {"b"}
    doc = {"version": 3, "campaign_id": "c", "product_id": "p", "title": "u", "bid": 2.0}
    assert compare({"b": [doc]}, want).lost == [] and compare({"b": [doc]}, want).wrong == []
    assert compare({}, want).lost == ["b"]
    assert compare({"b": [doc], "a": [doc]}, want).wrong == ["a"]
    assert compare({"b": [{**doc, "version": 2}]}, want).wrong == ["b"]


# Start-up, 5 minutes of kills, settling and the stop: ~7 min alone, 11-12 min beside the suite's other
# JVMs and Dagster processes on a 2-core box (pytest-timeout's 600 s default cut one short there). The
# suite's longest test file: it starts first (conftest.MODULE_SECONDS).
@pytest.mark.timeout(2400)
def test_five_minutes_of_chaos(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRESHIDX_") and k != "DAGSTER_HOME"}
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    proc = subprocess.run(
        [sys.executable, "-m", "freshidx.cli", "bench", "chaos", "--minutes", "5", "--seed", str(SEED),
         "--kill-every", "20", "40", "--every", "10", "--history-minutes", "10", "--workdir", str(tmp_path / "chaos"),
         "--json"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=2300,
    )
    print(proc.stderr[-6000:])  # the kills table and the summary (-s shows them)
    assert proc.stdout.strip(), proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    checks = {k: result[k] for k in CHECKS}  # unrestarted: each kill of a supervised part has its restart line
    assert checks == dict.fromkeys(checks, 0), (checks, result.get("lost_ads"), result.get("wrong_ads"),
                                                 result.get("unexplained_partitions"))
    assert not result["errors"], result["errors"]
    assert proc.returncode == 0, result["failed"]
    done = [k for k in result["kills"] if k["pid"] is not None]
    assert len({k["target"] for k in done}) >= 3, done
    for kind in MUST_RECOVER:
        recovered = [k for k in done if k["target"] == kind and k["recovery_s"] is not None]
        assert recovered, (kind, done)
    # the last kill may come after the newest partition was published: nothing newer is to come
    assert all(k["recovery_s"] is not None for k in done[:-1] if k["target"] in OFF_THE_DATA_PATH), done
    assert result["faults"]["error"] > 0 and result["faults"]["lost"] > 0, result["faults"]
    assert result["recovery_s"]["all"]["n"] >= 1
