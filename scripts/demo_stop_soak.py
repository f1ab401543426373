"""Stop the demo at random moments, N times, and count what a stop leaves behind.

    .venv/bin/python scripts/demo_stop_soak.py --stops 20 [--hogs 4] [--seed 1] [--json]

Each round starts the README's main command (``bash scripts/demo.sh``) on one home, waits a random
time (some rounds: until the Spark supervisor is mid-restart, requested with SIGHUP), sends SIGINT or
SIGTERM, waits for the demo to exit, and then counts:

* processes left: any process whose environment carries this round's marker (the demo's children
  inherit it: webserver, daemon, code servers, run workers, generator, supervisor, JVM, Python
  workers);
* runs left ``STARTED``/``STARTING``/``CANCELING`` in the demo's Dagster instance;
* ``ads_hourly`` hours parked, and delta partitions parked, in the store.

A last round runs until the delta pointer moves ("the next start publishes"). Prints one line per
round and a summary (``--json``: one object). Tooling, not a test: it takes ~1–2 min per round.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
MARK = "FRESHIDX_STOP_SOAK"
HOG = "import time\nend = time.monotonic() + {limit}\nwhile time.monotonic() < end:\n    pass\n"


def marked(tag: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get(MARK) == tag:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def delta_version(store: Path) -> str | None:
    try:
        return json.loads((store / "indexes" / "delta" / "CURRENT").read_text()).get("version")
    except (OSError, ValueError):
        return None


def leftovers(home: Path) -> dict[str, Any]:
    import dagster as dg

    from freshidx.catchup.state import CatchupState
    from freshidx.store import StoreConfig, open_store

    os.environ["DAGSTER_HOME"] = str(home / "dagster_home")
    with dg.DagsterInstance.get() as instance:
        live = instance.get_runs(dg.RunsFilter(statuses=[
            dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.CANCELING]))
        live_ids = [r.run_id[:8] for r in live]
    store = open_store(StoreConfig(uri=(home / "store").as_uri()))
    state, _ = CatchupState.load(store, "ads_hourly")
    parked_delta = []
    for obj in store.iter_objects("ledger/delta/"):
        if ".parked-" in obj.key:
            parked_delta.append(obj.key)
    return {"runs_live": live_ids, "hours_parked": list(state.parked), "delta_parked": parked_delta}


def supervisor_state(home: Path) -> dict[str, Any]:
    try:
        return json.loads((home / "spark-server" / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def one_round(i: int, home: Path, rng: random.Random, port: int, spark_port: int, *, until_publish: bool,
              log: Any) -> dict[str, Any]:
    tag = uuid.uuid4().hex
    env = {**os.environ, MARK: tag}
    before = delta_version(home / "store")
    cmd = ["bash", str(REPO / "scripts" / "demo.sh"), "--home", str(home), "--store", (home / "store").as_uri(),
           "--port", str(port),
           "--spark-port", str(spark_port), "--every", "20"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    started = time.monotonic()
    moment = "until-publish" if until_publish else rng.choice(["random", "random", "random", "restart"])
    if until_publish:
        deadline = started + 900
        while time.monotonic() < deadline and delta_version(home / "store") in (None, before):
            if proc.poll() is not None:
                break
            time.sleep(1)
    elif moment == "restart":
        # wait for the server to be up, ask for a planned restart, and stop while it is under way
        deadline = started + 600
        while time.monotonic() < deadline and supervisor_state(home).get("status") != "up":
            time.sleep(0.5)
        st = supervisor_state(home)
        if st.get("supervisor_pid"):
            os.kill(int(st["supervisor_pid"]), signal.SIGHUP)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and supervisor_state(home).get("status") == "up":
                time.sleep(0.1)
        moment = f"restart ({supervisor_state(home).get('status')})"
    else:
        wait = rng.uniform(3, 150)
        time.sleep(wait)  # the random moment itself, not synchronisation
        moment = f"after {wait:.0f}s"
    sig = signal.SIGINT if i % 2 else signal.SIGTERM
    stopped_at = time.monotonic()
    if proc.poll() is None:
        os.killpg(proc.pid, sig) if sig == signal.SIGINT else proc.send_signal(sig)
    try:
        rc = proc.wait(300)
    except subprocess.TimeoutExpired:
        rc = None
    stop_s = time.monotonic() - stopped_at
    # the demo has exited: anything still carrying the marker was left behind
    left = marked(tag)
    names = sorted({" ".join(p.cmdline()[:3])[:80] for p in left if p.is_running()})
    for p in left:
        p.kill()
    return {"round": i, "moment": moment, "signal": sig.name, "rc": rc, "stop_seconds": round(stop_s, 1),
            "processes_left": len(left), "left": names, "published": delta_version(home / "store") != before,
            "ran_seconds": round(stopped_at - started, 1), **leftovers(home)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stops", type=int, default=20)
    ap.add_argument("--hogs", type=int, default=0, help="CPU hog processes during the soak")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--home", default=None, help="demo home (default: a fresh temp dir)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import tempfile

    home = Path(args.home or tempfile.mkdtemp(prefix="freshidx-soak-")).resolve()
    rng = random.Random(args.seed)
    from freshidx_tests.conftest import free_port

    hogs = [subprocess.Popen([sys.executable, "-c", HOG.format(limit=7200)]) for _ in range(args.hogs)]
    rounds = []
    try:
        with open(home.parent / f"{home.name}.log", "ab") as log:
            for i in range(1, args.stops + 2):
                r = one_round(i, home, rng, free_port(), free_port(), until_publish=i > args.stops, log=log)
                rounds.append(r)
                print(json.dumps(r) if args.json else
                      f"round {i:2d} {r['signal']:7s} {r['moment']:22s} rc={r['rc']} stop {r['stop_seconds']}s "
                      f"left={r['processes_left']} live_runs={len(r['runs_live'])} "
                      f"parked={len(r['hours_parked'])}/{len(r['delta_parked'])} published={r['published']}",
                      flush=True)
    finally:
        for h in hogs:
            h.kill()
    summary = {
        "stops": args.stops, "hogs": args.hogs, "home": str(home),
        "processes_left": sum(r["processes_left"] for r in rounds),
        "runs_left_live": len(rounds[-1]["runs_live"]) if rounds else None,
        "max_runs_live_after_a_stop": max((len(r["runs_live"]) for r in rounds), default=0),
        "hours_parked": rounds[-1]["hours_parked"] if rounds else None,
        "delta_parked": rounds[-1]["delta_parked"] if rounds else None,
        "last_start_published": rounds[-1]["published"] if rounds else None,
    }
    print(json.dumps(summary, indent=None if args.json else 1))
    ok = (summary["processes_left"] == 0 and summary["max_runs_live_after_a_stop"] == 0
          and not summary["hours_parked"] and not summary["delta_parked"] and summary["last_start_published"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
