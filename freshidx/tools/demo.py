"""``freshidx demo``: the main job on the embedded default.

Starts the upstream simulator, a supervised Spark Connect server and what ``dagster dev`` would start
(a code server, the webserver and the daemon, as separate processes: :mod:`freshidx.tools.demo_dagster`)
on a local store, then prints every publication (index, version, partition, lag), the catch-up progress
and every failed run with its reason as they happen. Everything lives under ``./.freshidx/`` (store,
Dagster instance, workspace, logs). The delta runs in continuous mode (one long-lived ``delta_continuous``
run) unless ``FRESHIDX_DELTA_MODE`` is set; the start-up lines say which.

The demo outlives a crash of any part: each child that exits is restarted with back-off and the restart
is printed (one line) and counted in the closing line; the UI is not on the data path, so a dead
webserver never stops a publication. Run workers whose code server died are re-parented to the demo (a
child subreaper) and stay under it (:mod:`freshidx.tools.demo_supervisor`; docs/deployment.md, "What
restarts what").

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
from typing import TYPE_CHECKING, Any

from freshidx.settings import Settings, SettingsError
from freshidx.store import open_store
from freshidx.tools.demo_dagster import DagsterCommands, DagsterParts, dagster_env, port_in_use
from freshidx.tools.demo_stop import DEMO_ID_ENV, shutdown
from freshidx.tools.demo_supervisor import Supervisor
from freshidx.tools.demo_watch import Printer, Watcher
from freshidx.tools.devserver import (
    DagsterDevError,
    WaitAborted,
    WebserverPortTaken,
    free_port,
    packaged_dagster_yaml,
    prepare_home,
)

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
    if port_in_use(args.port):  # before anything starts
        print(f"--port {args.port}: 127.0.0.1:{args.port} is already in use", file=sys.stderr)
        return 2
    home.mkdir(parents=True, exist_ok=True)
    dagster_home = prepare_home(home / "dagster_home", packaged_dagster_yaml())
    demo_id = os.environ.get(DEMO_ID_ENV) or uuid.uuid4().hex
    store = open_store(settings.store_config())
    state_dir = home / "spark-server"
    env = _children_env(args, settings, store, demo_id, state_dir)
    out = Printer(args.as_json)
    stopping = _stop_on_signals()  # before any child starts: they inherit SIGINT's default, not an "ignore"
    instance = _open_instance(dagster_home)
    _interrupt_stale_runs(instance, out)
    sup = Supervisor(out.event)
    parts = _dagster_parts(args, home, dagster_home, env, instance, sup)
    try:
        if stopping():
            return 0
        _start_children(args, home, state_dir, settings, store, env, sup)
        code = _start_dagster(args, parts, stopping)
        if code is not None:
            return code
        print(f"  Dagster UI: {parts.url}   (sensors running; Ctrl-C to stop)", flush=True)
        print("  publications, catch-up progress and failed runs are printed below as they happen; the "
              "first delta usually lands within 1-3 min (longer on a busy machine)", flush=True)
        watch = Watcher(store, settings.source, instance, out)
        return _watch(args, sup, watch, stopping)
    finally:
        _stop(parts, sup, state_dir, instance, demo_id, out)


def _dagster_parts(args: DemoArgs, home: Path, dagster_home: Path, env: dict[str, str],
                   instance: dg.DagsterInstance, sup: Supervisor) -> DagsterParts:
    """The code server, webserver and daemon (not started yet), their workspace and logs in ``home``."""
    import dagster as dg

    commands = DagsterCommands(web_port=args.port, code_port=free_port(), workspace=home / "workspace.yaml",
                               instance_ref=dg.serialize_value(instance.get_ref()),
                               startup_timeout=instance.code_server_process_startup_timeout)
    return DagsterParts(sup, commands, dagster_env(env, dagster_home), home)


def _start_dagster(args: DemoArgs, parts: DagsterParts, stopping: Callable[[], bool]) -> int | None:
    """Code server, then (once it serves) webserver and daemon; None when all are ready, else the exit code."""
    print(f"  starting the Dagster code server, then the UI on 127.0.0.1:{args.port} and the daemon … "
          f"(logs: {parts.logs}/{{code-server,webserver,daemon}}.log)", flush=True)
    try:
        parts.start_code_server()
        parts.wait_code_server(timeout=900, abort=stopping)  # a loaded box can take minutes
        parts.start_ui_and_daemon()
        parts.wait_ready(timeout=900, abort=stopping)
    except WaitAborted:
        return 0
    except WebserverPortTaken as exc:  # taken after the check
        print(f"--port {args.port}: {exc}", file=sys.stderr)
        return 2
    except (DagsterDevError, TimeoutError) as exc:  # a code location that does not load, or no start at all
        print(f"freshidx demo: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    return None


def _stop(parts: DagsterParts, sup: Supervisor, state_dir: Path, instance: dg.DagsterInstance, demo_id: str,
          out: Printer) -> None:
    # Whoever read our output may be gone (closed terminal, killed pipe reader): a print must not
    # abort the stop and leave the JVM and the generator behind.
    with contextlib.suppress(OSError):
        print("stopping … (ending in-flight runs, then the daemon, webserver and code server, the generator "
              "and the Spark server)", flush=True)
    restarts = sup.restarts()
    summary = shutdown(parts, _live(sup, "generator"), _live(sup, "spark-server"), state_dir, instance, demo_id)
    sup.reap()
    instance.dispose()
    summary["restarts"] = sum(restarts.values())
    text = ", ".join(f"{k} {v}" for k, v in summary.items())
    if restarts:
        text += " (" + ", ".join(f"{name} {n}" for name, n in restarts.items()) + ")"
    with contextlib.suppress(OSError):
        out.event("stopped", "stopped: " + text, **summary, restarts_by_child=restarts)


def _live(sup: Supervisor, name: str) -> subprocess.Popen[bytes] | None:
    child = sup.get(name)
    return child.proc if child is not None and child.running else None


def _children_env(args: DemoArgs, settings: Settings, store: ObjectStore, demo_id: str,
                  state_dir: Path) -> dict[str, str]:
    """What the demo's children (code server and its runs, webserver, daemon, generator, Spark server) get beside
    the demo's own environment."""
    env = {"FRESHIDX_STORE": settings.store, DEMO_ID_ENV: demo_id, DELTA_MODE_ENV: settings.delta_mode}
    env.setdefault("PYSPARK_PYTHON", os.environ.get("PYSPARK_PYTHON") or sys.executable)
    if not os.environ.get("FRESHIDX_PARTITIONS_START"):  # the UI's hourly partitions begin with the data
        env["FRESHIDX_PARTITIONS_START"] = data_start(store, settings.source, args.history_minutes,
                                                      dt.datetime.now(dt.UTC))
    if args.spark == "connect":
        # The runs' environment points at the supervised server (started later): set before the Dagster
        # processes' environment is made from ``env``. Runs started before the server is up wait for it (lease).
        env["FRESHIDX_SPARK_REMOTE"] = f"sc://127.0.0.1:{args.spark_port}"
        env["FRESHIDX_SPARK_SERVER_STATE"] = str(state_dir)
    return env


def _start_children(args: DemoArgs, home: Path, state_dir: Path, settings: Settings, store: ObjectStore,
                    env: dict[str, str], sup: Supervisor) -> None:
    """Start the Spark server (``--spark connect``) and the generator under ``sup``, and say what starts."""
    if args.spark == "connect":
        sup.add("spark-server", lambda _: _start_spark_server(args, home, env, state_dir), state_dir / "server.log")
        from freshidx.serve.status import record_spark_server_state

        # `freshidx status --store` finds this demo's server state from any directory / --home.
        record_spark_server_state(store, state_dir)
        print(f"  starting Spark Connect server on 127.0.0.1:{args.spark_port} (state: {state_dir})")
    sup.add("generator", lambda restarts: _start_generator(args, settings.store, env, home, restarts),
            home / "generator.log")
    print(f"freshidx demo: store {settings.store}")
    print(f"  generator writes a partition every {args.every:.0f}s  (log: {home / 'generator.log'})")
    print(f"  delta mode: {_describe_mode(settings)}")
    print("  every part (code server, UI, daemon, generator, Spark server) is restarted when it exits "
          "(1 s, doubling to 30 s)")


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


def _start_generator(args: DemoArgs, store_uri: str, env: dict[str, str], home: Path,
                     restarts: int) -> subprocess.Popen[bytes]:
    """The data generator, writing a partition every ``args.every`` seconds (in its own session: a
    terminal Ctrl-C reaches only the demo, whose shutdown stops it). A restart writes no history again
    (it would rewrite hours already processed)."""
    history = args.history_minutes if restarts == 0 else 0
    with open(home / "generator.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "freshidx.tools.generate", "--store", store_uri, "--every", str(args.every),
             "--history-minutes", str(history), "--seed", str(args.seed)],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env}, start_new_session=True,
        )


def _start_spark_server(args: DemoArgs, home: Path, env: dict[str, str], state_dir: Path) -> subprocess.Popen[bytes]:
    """The supervised Spark Connect server (``env`` already points the runs at it); a restarted one kills
    the JVM its predecessor left (freshidx.spark_server.state_dir)."""
    with open(home / "spark-server.out", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "freshidx.spark_server.server", "--port", str(args.spark_port),
             "--state-dir", str(state_dir), "--no-cds-dump",  # first start fast: map `spark-cds`'s archive
             "--spare"],  # a killed JVM costs seconds: a warm one is promoted (freshidx.spark_server.spare)
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env}, start_new_session=True,
        )


def _watch(args: DemoArgs, sup: Supervisor, watch: Watcher, stopped: Callable[[], bool]) -> int:
    """Restart what exited and print what happens, until a stop or ``--duration``; returns the exit code."""
    deadline = time.monotonic() + args.duration if args.duration else None
    last_watch = 0.0
    while not stopped() and (deadline is None or time.monotonic() < deadline):
        sup.poll()
        if time.monotonic() - last_watch >= 2:  # display refresh cadence
            watch.poll()
            last_watch = time.monotonic()
        time.sleep(0.5)  # restart reaction time, not synchronisation
    return 0


def _open_instance(dagster_home: Path) -> dg.DagsterInstance:
    import dagster as dg

    os.environ["DAGSTER_HOME"] = str(dagster_home)  # the demo process reads the instance it runs
    return dg.DagsterInstance.get()
