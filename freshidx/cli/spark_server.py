"""``freshidx spark-server``: run a supervised Spark Connect server in the foreground.

The supervisor is :class:`freshidx.spark_server.supervisor.SparkConnectSupervisor` (its docstring says what it
watches and when it restarts); ``python -m freshidx.spark_server.server`` runs this same command.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from freshidx.cli.base import LazyCommand, json_option, run

if TYPE_CHECKING:
    from freshidx.spark_server.server_config import ServerConfig

DEFAULT_PORT = 15002  # freshidx.spark_server.server_config.DEFAULT_PORT
DEFAULT_STATE_DIR = Path(".freshidx") / "spark-server"  # freshidx.spark_server.server_config.DEFAULT_STATE_DIR


def server_config(*, host: str, port: int, master: str, state_dir: Path, restart_every: float,
                  max_heap_fraction: float, max_session_processes: int, driver_memory: str, drain_timeout: float,
                  health_interval: float, hang_timeout: float, cds_dir: Path | None, no_class_data_sharing: bool,
                  no_cds_dump: bool, conf: Sequence[str], no_warm_up: bool, control_port: int | None = 0,
                  lease_ttl: float = 30.0, spare: bool = False) -> ServerConfig:
    """The supervisor's configuration from the command's options."""
    from freshidx.spark_server.server_config import ServerConfig

    spark_conf: dict[str, str] = {}
    for item in conf:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--conf expects KEY=VALUE, got {item!r}")
        spark_conf[key.strip()] = value
    return ServerConfig(
        host=host, port=port, master=master, conf=spark_conf, state_dir=state_dir,
        restart_every_s=restart_every, max_heap_fraction=max_heap_fraction,
        max_session_processes=max_session_processes,
        driver_memory=driver_memory, drain_timeout_s=drain_timeout, health_interval_s=health_interval,
        hang_timeout_s=hang_timeout,
        class_data_sharing=not no_class_data_sharing, cds_dir=cds_dir, cds_dump=not no_cds_dump,
        warm_up=not no_warm_up, control_port=port + 1 if control_port is None else control_port,
        lease_ttl_s=lease_ttl, spare=spare,
    )


def _render(state: dict[str, Any]) -> str:
    return (
        f"[{state.get('updated_at')}] spark-server {state.get('status')}: {state.get('url')} pid={state.get('pid')} "
        f"restarts={state.get('restarts')} last={state.get('last_restart_reason')}"
        + (f" control={state.get('control_url')}" if state.get("control_url") else "")
        + (f" error={state.get('last_error')}" if state.get("status") == "down" and state.get("last_error") else "")
    )


def cmd_spark_server(*, status: bool, as_json: bool, **options: Any) -> int:
    """Run the supervisor in the foreground until SIGINT/SIGTERM; then stop the JVM cleanly."""
    from freshidx.spark_server.server_process import ServerStartError
    from freshidx.spark_server.server_state import read_state
    from freshidx.spark_server.supervisor import SparkConnectSupervisor

    if status:
        state_dir = options["state_dir"]
        state = read_state(state_dir)
        if state is None:
            print(json.dumps({"status": "none", "state_dir": str(state_dir)}) if as_json
                  else f"no supervisor state in {state_dir}")
            return 1
        print(json.dumps(state, indent=1, default=str) if as_json else _render(state))
        return 0

    cfg = server_config(**options)

    def emit(state: dict[str, Any]) -> None:
        print(json.dumps(state, sort_keys=True, default=str) if as_json else _render(state), flush=True)

    sup = SparkConnectSupervisor(cfg, on_state=emit)
    if cfg.control_port:
        try:
            sup.serve_control()
        except ServerStartError as exc:
            if options.get("control_port") is not None:  # asked for: a port it cannot have is an error
                print(f"freshidx spark-server: {exc}", file=sys.stderr)
                return 2
            # the default (port + 1) taken: run without, as before the endpoint existed
            print(f"freshidx spark-server: no control endpoint: {exc}", file=sys.stderr)
    stop = threading.Event()

    def on_signal(signum: int) -> None:
        if signum == signal.SIGHUP:
            sup.request_restart("planned-manual")
        else:
            stop.set()
            sup.request_stop()  # the JVM gets SIGTERM now, whatever run_forever is in the middle of

    previous = relay_signals((signal.SIGINT, signal.SIGTERM, signal.SIGHUP), on_signal)
    # `kill -USR1 <supervisor>` prints every thread's stack to stderr: a stop that hangs is diagnosable
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    rc = 0
    try:
        sup.run_forever(stop)
    except ServerStartError as exc:
        print(f"freshidx spark-server: {exc}", file=sys.stderr)
        rc = 1
    finally:
        sup.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    _exit_without_joining_client_threads(rc)
    return rc


def relay_signals(signums: Sequence[int], act: Callable[[int], None]) -> dict[int, Any]:
    """Act on ``signums`` in a thread of their own; returns the previous handlers.

    A Python signal handler runs in the main thread between two bytecodes, possibly while that thread
    sits in ``Event.wait()`` holding the event's lock: ``Event.set()`` on the same event from the handler
    then deadlocks (seen: SIGTERM while the supervisor waited for a drain, never exited). The handler only
    writes the signal number to a pipe, which cannot block on a lock; the relay thread acts on it."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)

    def handler(signum: int, _frame: Any) -> None:
        with contextlib.suppress(OSError):  # a full pipe: signals are already waiting to be handled
            os.write(write_end, bytes([signum]))

    def relay() -> None:
        while data := os.read(read_end, 64):
            for signum in data:
                act(signum)

    threading.Thread(target=relay, name="freshidx-signal-relay", daemon=True).start()
    return {sig: signal.signal(sig, handler) for sig in signums}


def _exit_without_joining_client_threads(rc: int) -> NoReturn:
    """Once the JVM is stopped and ``down`` is written, exit without joining pyspark's client threads.

    A warm-up or probe stopped mid-query leaves its (daemon) thread inside a gRPC call to the dead server;
    when that call fails, pyspark submits a ``ReleaseExecute`` to its release thread pool, whose new
    (non-daemon) worker retries against the dead server for minutes, and the interpreter's exit joins it.
    That can happen at any moment after the stop, so no check of the threads alive now is enough (seen:
    a supervisor still running 60 s after SIGTERM during warm-up, no thread lingering at the check).
    Nothing is left to do at this point: the state is written, the state dir unlocked, the JVM reaped."""
    lingering = [t.name for t in threading.enumerate() if not t.daemon and t is not threading.main_thread()]
    if lingering:
        print(f"freshidx spark-server: exiting without waiting for client threads {lingering}", file=sys.stderr)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    faulthandler.unregister(signal.SIGUSR1)
    os._exit(rc)


def _opt(*decls: str, **kw: Any) -> click.Option:
    return click.Option(list(decls), **kw)


PATH = click.Path(path_type=Path)

spark_server = LazyCommand(
    "spark-server", cmd_spark_server,
    _opt("--host", default="127.0.0.1", help="gRPC bind address (default 127.0.0.1)"),
    _opt("--port", type=int, default=DEFAULT_PORT, help=f"gRPC port (default {DEFAULT_PORT})"),
    _opt("--master", default="local[2,4]", help="Spark master (default local[2,4])"),
    _opt("--state-dir", type=PATH, default=DEFAULT_STATE_DIR,
         help=f"state.json, server.log and leases/ (default ./{DEFAULT_STATE_DIR})"),
    _opt("--restart-every", type=float, default=24 * 3600.0, metavar="SECONDS",
         help="planned restart cadence (default 86400)"),
    _opt("--max-heap-fraction", type=float, default=0.85,
         help="planned restart when the live heap exceeds this fraction of -Xmx (default 0.85)"),
    _opt("--max-session-processes", type=int, default=48,
         help="planned restart when the JVM's session (JVM + Python workers) has more processes (default 48; 0 = off)"),
    _opt("--driver-memory", default="2g", help="JVM heap (default 2g)"),
    _opt("--drain-timeout", type=float, default=120.0, metavar="SECONDS",
         help="how long a planned restart waits for leases to be released (default 120)"),
    _opt("--health-interval", type=float, default=5.0, metavar="SECONDS"),
    _opt("--hang-timeout", type=float, default=300.0, metavar="SECONDS",
         help="while runs hold leases, restart (drained) only after their jobs made no progress "
         "for this long; failed health probes alone never restart a leased server (default 300)"),
    _opt("--cds-dir", type=PATH, default=None, help="AppCDS archive directory (default STATE_DIR/cds)"),
    _opt("--no-class-data-sharing", is_flag=True, help="do not use/write an AppCDS archive"),
    _opt("--no-cds-dump", is_flag=True,
         help="map an archive if there is one (own or `freshidx spark-cds`'s), never dump one (a fast first start)"),
    _opt("--conf", multiple=True, metavar="KEY=VALUE", help="extra Spark conf (repeatable)"),
    _opt("--no-warm-up", is_flag=True,
         help="report up as soon as the port accepts (the first client then pays the warm-up)"),
    _opt("--control-port", type=int, default=None,
         help="HTTP control endpoint on --host for clients that share no state dir (FRESHIDX_SPARK_SERVER_URL="
         "http://HOST:PORT): status, leases, kept sessions (default: --port + 1, skipped if taken; 0 = off)"),
    _opt("--lease-ttl", type=float, default=30.0, metavar="SECONDS",
         help="an endpoint lease its client stops renewing is dropped after this long (default 30)"),
    _opt("--spare", is_flag=True,
         help="keep a second JVM warmed up and promote it when the serving one dies: seconds instead of a "
         "~30 s restart, for twice the memory (docs/operations.md)"),
    _opt("--status", is_flag=True, help="print the state of a running supervisor and exit"),
    json_option("print state changes as JSON lines"),
    short_help="run a supervised Spark Connect server (health checks, planned restarts)",
    help="A supervised Spark Connect server: health checks, crash restarts, planned restarts with draining.",
)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m freshidx.spark_server.server [options]``."""
    return run(spark_server, argv, "python -m freshidx.spark_server.server")
