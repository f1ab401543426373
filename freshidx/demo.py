"""``freshidx demo``: the main job on the embedded default.

Starts the upstream simulator and ``dagster dev`` (UI + daemon, sensors running) on a local store,
then prints the delta pointer every time it moves, so a new user sees the index advancing by
itself. Everything lives under ``./.freshidx/`` (store, Dagster instance, logs).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from freshidx.devserver import DagsterDev, prepare_home
from freshidx.settings import DEFAULT_HOME, Settings, SettingsError
from freshidx.status import collect
from freshidx.store import open_store

REPO_ROOT = Path(__file__).resolve().parents[1]


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("demo", help="run generator + dagster dev (UI and daemon) on a local store")
    p.add_argument("--store", help="store URI (default: FRESHIDX_STORE or ./.freshidx/store)")
    p.add_argument("--home", default=DEFAULT_HOME, help="working directory for instance and logs")
    p.add_argument("--port", type=int, default=3000, help="UI port on 127.0.0.1 (default 3000)")
    p.add_argument("--every", type=float, default=60.0, help="seconds between upstream partitions")
    p.add_argument("--history-minutes", type=int, default=120, help="back-dated history to seed")
    p.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print status changes as JSON lines")
    p.add_argument("--spark", choices=("connect", "local"), default="connect",
                   help="connect (default): a supervised Spark Connect server shared by all runs; "
                   "local: a SparkSession per run (~8-20 s start-up each)")
    p.add_argument("--spark-port", type=int, default=15002, help="Spark Connect port on 127.0.0.1")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    try:
        settings = Settings.from_env(store=args.store)
    except SettingsError as exc:
        print(exc, file=sys.stderr)
        return 2
    home = Path(args.home).resolve()
    home.mkdir(parents=True, exist_ok=True)
    dagster_home = prepare_home(home / "dagster_home", _dagster_yaml())
    env = {"FRESHIDX_STORE": settings.store}
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    store = open_store(settings.store_config())

    server: subprocess.Popen[bytes] | None = None
    if args.spark == "connect":
        state_dir = home / "spark-server"
        server = subprocess.Popen(
            [sys.executable, "-m", "freshidx.spark.server", "--port", str(args.spark_port),
             "--state-dir", str(state_dir), "--no-class-data-sharing"],  # first start fast
            stdout=open(home / "spark-server.out", "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115
            env={**os.environ, **env}, start_new_session=True,
        )
        # Runs started before the server is up wait for it (lease), so nothing else waits here.
        env["FRESHIDX_SPARK_REMOTE"] = f"sc://127.0.0.1:{args.spark_port}"
        env["FRESHIDX_SPARK_SERVER_STATE"] = str(state_dir)
        print(f"  starting Spark Connect server on 127.0.0.1:{args.spark_port} (state: {state_dir})")
    gen_log = open(home / "generator.log", "ab")  # noqa: SIM115 - lives as long as the demo
    generator = subprocess.Popen(
        [sys.executable, "-m", "freshidx.generate", "--store", settings.store, "--every", str(args.every),
         "--history-minutes", str(args.history_minutes), "--seed", str(args.seed)],
        stdout=gen_log, stderr=subprocess.STDOUT, env={**os.environ, **env}, start_new_session=True,
    )
    dev = DagsterDev(home=dagster_home, port=args.port, module="freshidx.definitions",
                     env=env, cwd=REPO_ROOT, log_path=home / "dagster-dev.log")
    stop = {"now": False}

    def on_signal(signum: int, _: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        print(f"freshidx demo: store {settings.store}")
        print(f"  generator writes a partition every {args.every:.0f}s  (log: {home / 'generator.log'})")
        print(f"  starting dagster dev on 127.0.0.1:{args.port} … (log: {home / 'dagster-dev.log'})")
        dev.start()
        dev.wait_ready(timeout=180)
        print(f"  Dagster UI: {dev.url}   (delta_index_sensor is running; Ctrl-C to stop)")
        deadline = time.monotonic() + args.duration if args.duration else None
        last: str | None = None
        while not stop["now"] and (deadline is None or time.monotonic() < deadline):
            if generator.poll() is not None:
                print(f"generator exited with {generator.returncode}; see {home / 'generator.log'}",
                      file=sys.stderr)
                return 1
            if server is not None and server.poll() is not None:
                print(f"spark-server exited with {server.returncode}; see {home / 'spark-server'}", file=sys.stderr)
                return 1
            if not dev.is_running:
                print(f"dagster dev exited; see {home / 'dagster-dev.log'}", file=sys.stderr)
                return 1
            s = collect(store, settings.source, spark_server_state=env.get("FRESHIDX_SPARK_SERVER_STATE"))
            delta = s["delta"]
            if delta and delta["version"] != last:
                last = delta["version"]
                if args.json:
                    print(json.dumps({"event": "delta_published", **delta}), flush=True)
                else:
                    print(f"[{time.strftime('%H:%M:%S')}] delta → {delta['source_partition']}  "
                          f"docs {delta['doc_count']}  lag {delta['lag_seconds']:.0f}s  "
                          f"(newest visible {s['newest_visible_partition']})", flush=True)
            time.sleep(2)  # display refresh cadence, not synchronisation
        return 0
    finally:
        print("stopping …")
        os.killpg(generator.pid, signal.SIGTERM)
        try:
            generator.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(generator.pid, signal.SIGKILL)
        dev.stop()
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)  # the supervisor stops its JVM and workers
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
        gen_log.close()


def _dagster_yaml() -> Path | None:
    p = REPO_ROOT / "dagster.yaml"
    return p if p.exists() else None
