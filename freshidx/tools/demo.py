"""``freshidx demo``: the main job on the embedded default.

Starts the upstream simulator, a supervised Spark Connect server and ``dagster dev`` (UI + daemon,
sensors running) on a local store, then prints every publication (index, version, partition, lag),
the catch-up progress and every failed run with its reason as they happen. Everything lives under
``./.freshidx/`` (store, Dagster instance, logs). The delta runs in continuous mode (one long-lived
``delta_continuous`` run) unless ``FRESHIDX_DELTA_MODE`` is set; the start-up lines say which.

Stops (Ctrl-C / SIGTERM, at any moment, also during start-up) are clean: in-flight runs are tagged
``freshidx/interrupted`` and terminated (then marked canceled/failed "interrupted by shutdown" if
they did not end by themselves), so a stop never counts as a failed attempt; every process the demo
started is gone afterwards (each child carries ``FRESHIDX_DEMO_ID``, swept at the end). Runs that a
previous demo left unfinished (it was killed) are ended the same way at the next start.
"""


from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from freshidx.settings import Settings, SettingsError
from freshidx.store import open_store
from freshidx.tools.demo_stop import DEMO_ID_ENV, shutdown
from freshidx.tools.demo_watch import Printer, Watcher
from freshidx.tools.devserver import DagsterDev, WaitAborted, WebserverPortTaken, packaged_dagster_yaml, prepare_home

if TYPE_CHECKING:
    import dagster as dg

    from freshidx.store import ObjectStore

# Part of this module's API though defined beside it (callers and tests use them here).
__all__ = ["DEMO_ID_ENV", "DemoArgs", "Printer", "Watcher", "cmd_demo", "data_start", "shutdown"]

DELTA_MODE_ENV = "FRESHIDX_DELTA_MODE"
#: The demo's delta mode unless FRESHIDX_DELTA_MODE is set (docs/architecture.md#continuous-mode).
DEFAULT_DELTA_MODE = "continuous"


@dataclass(frozen=True)
class DemoArgs:
    """The options of ``freshidx demo`` (declared in :mod:`freshidx.cli.demo`)."""

    store: str | None
    home: str
    port: int
    every: float
    history_minutes: int
    duration: float | None
    seed: int
    as_json: bool
    spark: str
    spark_port: int


def data_start(store: ObjectStore, source: str, history_minutes: int, now: dt.datetime) -> str:
    """The first hour of the demo's data, as FRESHIDX_PARTITIONS_START: the oldest raw hour already in the
    store, or the hour the generator's history begins in (a few LIST calls)."""
    from freshidx.catchup.state import oldest_hour

    history = (now - dt.timedelta(minutes=history_minutes)).replace(minute=0, second=0, microsecond=0)
    oldest = oldest_hour(store, source)
    start = history if oldest is None else min(oldest, history)
    return f"{start:%Y-%m-%dT%H}:00"


@dataclass
class _Children:
    """The processes the demo started so far: what the stop must end, whenever it comes."""

    server: subprocess.Popen[bytes] | None = None
    generator: subprocess.Popen[bytes] | None = None


def cmd_demo(**options: Any) -> int:
    args = DemoArgs(**options)
    home = Path(args.home).resolve()
    # One demo home holds everything of one demo: `--home X` never writes into ./.freshidx/store.
    store_uri = args.store or os.environ.get("FRESHIDX_STORE") or str(home / "store")
    delta_mode = os.environ.get(DELTA_MODE_ENV) or DEFAULT_DELTA_MODE
    try:
        settings = Settings.from_env(store=store_uri, delta_mode=delta_mode)
    except SettingsError as exc:
        print(exc, file=sys.stderr)
        return 2
    home.mkdir(parents=True, exist_ok=True)
    dagster_home = prepare_home(home / "dagster_home", packaged_dagster_yaml())
    demo_id = os.environ.get(DEMO_ID_ENV) or uuid.uuid4().hex
    store = open_store(settings.store_config())
    state_dir = home / "spark-server"
    env = _children_env(args, settings, store, demo_id, state_dir)
    out = Printer(args.as_json)
    stopping = _stop_on_signals()
    dev = DagsterDev(home=dagster_home, port=args.port, module="freshidx.definitions",
                     env=env, log_path=home / "dagster-dev.log")
    try:
        dev.check_port()  # before anything starts
    except WebserverPortTaken as exc:
        print(f"--port {args.port}: {exc}", file=sys.stderr)
        return 2
    instance = _open_instance(dagster_home)
    _interrupt_stale_runs(instance, out)
    children = _Children()
    gen_log = open(home / "generator.log", "ab")  # noqa: SIM115 - lives as long as the demo
    try:
        if stopping():
            return 0
        _start_children(args, home, state_dir, settings, store, env, children, gen_log)
        dev.start()
        try:
            dev.wait_ready(timeout=900, abort=stopping)  # a loaded box can take minutes
        except WaitAborted:
            return 0
        except WebserverPortTaken as exc:  # taken after the check
            print(f"--port {args.port}: {exc}", file=sys.stderr)
            return 2
        print(f"  Dagster UI: {dev.url}   (sensors running; Ctrl-C to stop)", flush=True)
        print("  publications, catch-up progress and failed runs are printed below as they happen; the "
              "first delta usually lands within 1-3 min (longer on a busy machine)", flush=True)
        watch = Watcher(store, settings.source, instance, out)
        return _watch(args, home, dev, children.generator, children.server, watch, stopping)
    finally:
        # Whoever read our output may be gone (closed terminal, killed pipe reader): a print must not
        # abort the stop and leave the JVM and the generator behind.
        with contextlib.suppress(OSError):
            print("stopping … (ending in-flight runs, then dagster dev, the generator and the Spark server)",
                  flush=True)
        summary = shutdown(dev, children.generator, children.server, state_dir, instance, demo_id)
        gen_log.close()
        instance.dispose()
        with contextlib.suppress(OSError):
            out.event("stopped", "stopped: " + ", ".join(f"{k} {v}" for k, v in summary.items()), **summary)


def _children_env(args: DemoArgs, settings: Settings, store: ObjectStore, demo_id: str,
                  state_dir: Path) -> dict[str, str]:
    """What the demo's children (dagster dev and its runs, the generator, the Spark server) get beside
    the demo's own environment."""
    env = {"FRESHIDX_STORE": settings.store, DEMO_ID_ENV: demo_id, DELTA_MODE_ENV: settings.delta_mode}
    env.setdefault("PYSPARK_PYTHON", os.environ.get("PYSPARK_PYTHON") or sys.executable)
    if not os.environ.get("FRESHIDX_PARTITIONS_START"):  # the UI's hourly partitions begin with the data
        env["FRESHIDX_PARTITIONS_START"] = data_start(store, settings.source, args.history_minutes,
                                                      dt.datetime.now(dt.UTC))
    if args.spark == "connect":
        # The runs' environment points at the supervised server (started later): set before DagsterDev
        # copies ``env``. Runs started before the server is up wait for it (lease).
        env["FRESHIDX_SPARK_REMOTE"] = f"sc://127.0.0.1:{args.spark_port}"
        env["FRESHIDX_SPARK_SERVER_STATE"] = str(state_dir)
    return env


def _start_children(args: DemoArgs, home: Path, state_dir: Path, settings: Settings, store: ObjectStore,
                    env: dict[str, str], children: _Children, gen_log: IO[bytes]) -> None:
    """Start the Spark server (``--spark connect``) and the generator, and say what starts."""
    if args.spark == "connect":
        children.server = _start_spark_server(args, home, env, state_dir, store)
    children.generator = _start_generator(args, settings.store, env, gen_log)
    print(f"freshidx demo: store {settings.store}")
    print(f"  generator writes a partition every {args.every:.0f}s  (log: {home / 'generator.log'})")
    print(f"  delta mode: {_describe_mode(settings)}")
    print(f"  starting dagster dev on 127.0.0.1:{args.port} … (log: {home / 'dagster-dev.log'})")


def _describe_mode(settings: Settings) -> str:
    if settings.delta_mode == "continuous":
        return (f"continuous (one long-lived delta_continuous run, started by delta_continuous_watchdog, "
                f"checks for new partitions every {settings.continuous_trigger_seconds:g}s; "
                f"{DELTA_MODE_ENV}=sensor for a run per micro-batch)")
    return f"sensor (delta_index_sensor requests a run per micro-batch; set by {DELTA_MODE_ENV})"


def _stop_on_signals() -> Callable[[], bool]:
    """Ctrl-C, SIGTERM and SIGHUP (the terminal went away) all ask for the same clean stop: the main
    loop (or wait_ready's abort) polls the returned function and notices within a poll."""
    stop = {"now": False}

    def on_signal(signum: int, _: Any) -> None:
        stop["now"] = True

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    return lambda: stop["now"]


def _interrupt_stale_runs(instance: dg.DagsterInstance, out: Printer) -> None:
    """Runs a previous demo left unfinished end as interrupted (never counted as failed attempts)."""
    from freshidx.defs.runs.health import interrupt_runs

    left = interrupt_runs(instance, reason="interrupted by shutdown (left unfinished by a previous demo)",
                          kill_workers=True)
    if left:
        out.event("stale_runs", f"marked {len(left)} run(s) left unfinished by a previous demo as interrupted "
                  "(not counted as failed attempts)", runs=left)


def _start_generator(args: DemoArgs, store_uri: str, env: dict[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    """The data generator, writing a partition every ``args.every`` seconds (in its own session: a
    terminal Ctrl-C reaches only the demo, whose shutdown stops it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "freshidx.tools.generate", "--store", store_uri, "--every", str(args.every),
         "--history-minutes", str(args.history_minutes), "--seed", str(args.seed)],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env}, start_new_session=True,
    )


def _start_spark_server(args: DemoArgs, home: Path, env: dict[str, str], state_dir: Path,
                        store: ObjectStore) -> subprocess.Popen[bytes]:
    """Start the supervised Spark Connect server (``env`` already points the runs at it)."""
    server = subprocess.Popen(
        [sys.executable, "-m", "freshidx.spark_server.server", "--port", str(args.spark_port),
         "--state-dir", str(state_dir), "--no-cds-dump"],  # first start fast: map `spark-cds`'s archive, never dump
        stdout=open(home / "spark-server.out", "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115
        env={**os.environ, **env}, start_new_session=True,
    )
    from freshidx.serve.status import record_spark_server_state

    # `freshidx status --store` finds this demo's server state from any directory / --home.
    record_spark_server_state(store, state_dir)
    print(f"  starting Spark Connect server on 127.0.0.1:{args.spark_port} (state: {state_dir})")
    return server


def _watch(args: DemoArgs, home: Path, dev: DagsterDev, generator: subprocess.Popen[bytes] | None,
           server: subprocess.Popen[bytes] | None, watch: Watcher, stopped: Callable[[], bool]) -> int:
    """Print what happens until a stop, ``--duration`` or a child's exit; returns the exit code."""
    deadline = time.monotonic() + args.duration if args.duration else None
    while not stopped() and (deadline is None or time.monotonic() < deadline):
        if generator is not None and generator.poll() is not None:
            print(f"generator exited with {generator.returncode}; see {home / 'generator.log'}",
                  file=sys.stderr)
            return 1
        if server is not None and server.poll() is not None:
            print(f"spark-server exited with {server.returncode}; see {home / 'spark-server'}", file=sys.stderr)
            return 1
        if not dev.is_running:
            print(f"dagster dev exited; see {home / 'dagster-dev.log'}", file=sys.stderr)
            return 1
        watch.poll()
        time.sleep(2)  # display refresh cadence, not synchronisation
    return 0

def _open_instance(dagster_home: Path) -> dg.DagsterInstance:
    import dagster as dg

    os.environ["DAGSTER_HOME"] = str(dagster_home)  # the demo process reads the instance it runs
    return dg.DagsterInstance.get()
