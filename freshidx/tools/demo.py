"""``freshidx demo``: the main job on the embedded default.

Starts the upstream simulator, a supervised Spark Connect server and ``dagster dev`` (UI + daemon,
sensors running) on a local store, then prints every publication (index, version, partition, lag),
the catch-up progress and every failed run with its reason as they happen. Everything lives under
``./.freshidx/`` (store, Dagster instance, logs). The delta runs in continuous mode (one long-lived
``delta_continuous`` run, issue 14) unless ``FRESHIDX_DELTA_MODE`` is set; the start-up lines say which.

Stops (Ctrl-C / SIGTERM, at any moment, also during start-up) are clean: in-flight runs are tagged
``freshidx/interrupted`` and terminated (then marked canceled/failed "interrupted by shutdown" if
they did not end by themselves), so a stop never counts as a failed attempt; every process the demo
started is gone afterwards (each child carries ``FRESHIDX_DEMO_ID``, swept at the end). Runs that a
previous demo left unfinished (it was killed) are ended the same way at the next start.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
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
from freshidx.tools.devserver import DagsterDev, WaitAborted, packaged_dagster_yaml, prepare_home

if TYPE_CHECKING:
    import dagster as dg

    from freshidx.store import ObjectStore


DEMO_ID_ENV = "FRESHIDX_DEMO_ID"
DELTA_MODE_ENV = "FRESHIDX_DELTA_MODE"
#: The demo's delta mode unless FRESHIDX_DELTA_MODE is set (issue 14: the demo uses continuous).
DEFAULT_DELTA_MODE = "continuous"
TERMINATE_GRACE_S = 20.0  # runs get this long to end after Terminate, before dagster dev stops
SUPERVISOR_GRACE_S = 45.0  # the Spark supervisor drains/stops its JVM within its own stop timeout


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


class Printer:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def event(self, kind: str, text: str, **fields: Any) -> None:
        if self.as_json:
            print(json.dumps({"event": kind, "at": time.strftime("%H:%M:%S"), **fields}, default=str), flush=True)
        else:
            print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


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
    env = {"FRESHIDX_STORE": settings.store, DEMO_ID_ENV: demo_id, DELTA_MODE_ENV: settings.delta_mode}
    env.setdefault("PYSPARK_PYTHON", os.environ.get("PYSPARK_PYTHON") or sys.executable)
    store = open_store(settings.store_config())
    if not os.environ.get("FRESHIDX_PARTITIONS_START"):  # the UI's hourly partitions begin with the data
        env["FRESHIDX_PARTITIONS_START"] = data_start(store, settings.source, args.history_minutes,
                                                      dt.datetime.now(dt.UTC))
    out = Printer(args.as_json)
    stopping = _stop_on_signals()
    instance = _open_instance(dagster_home)
    _interrupt_stale_runs(instance, out)

    state_dir = home / "spark-server"
    server: subprocess.Popen[bytes] | None = None
    generator: subprocess.Popen[bytes] | None = None
    if args.spark == "connect":
        # The runs' environment points at the supervised server (started below): set before DagsterDev
        # copies ``env``. Runs started before the server is up wait for it (lease).
        env["FRESHIDX_SPARK_REMOTE"] = f"sc://127.0.0.1:{args.spark_port}"
        env["FRESHIDX_SPARK_SERVER_STATE"] = str(state_dir)
    dev = DagsterDev(home=dagster_home, port=args.port, module="freshidx.definitions",
                     env=env, log_path=home / "dagster-dev.log")
    gen_log = open(home / "generator.log", "ab")  # noqa: SIM115 - lives as long as the demo
    try:
        if stopping():
            return 0
        if args.spark == "connect":
            server = _start_spark_server(args, home, env, state_dir, store)
        generator = _start_generator(args, settings.store, env, gen_log)
        print(f"freshidx demo: store {settings.store}")
        print(f"  generator writes a partition every {args.every:.0f}s  (log: {home / 'generator.log'})")
        print(f"  delta mode: {_describe_mode(settings)}")
        print(f"  starting dagster dev on 127.0.0.1:{args.port} … (log: {home / 'dagster-dev.log'})")
        dev.start()
        try:
            dev.wait_ready(timeout=900, abort=stopping)  # a loaded box can take minutes
        except WaitAborted:
            return 0
        print(f"  Dagster UI: {dev.url}   (sensors running; Ctrl-C to stop)", flush=True)
        print("  publications, catch-up progress and failed runs are printed below as they happen; the "
              "first delta usually lands within 1-3 min (longer on a busy machine)", flush=True)
        watch = Watcher(store, settings.source, instance, out)
        return _watch(args, home, dev, generator, server, watch, stopping)
    finally:
        # Whoever read our output may be gone (closed terminal, killed pipe reader): a print must not
        # abort the stop and leave the JVM and the generator behind.
        with contextlib.suppress(OSError):
            print("stopping … (ending in-flight runs, then dagster dev, the generator and the Spark server)",
                  flush=True)
        summary = shutdown(dev, generator, server, state_dir, instance, demo_id)
        gen_log.close()
        instance.dispose()
        with contextlib.suppress(OSError):
            out.event("stopped", "stopped: " + ", ".join(f"{k} {v}" for k, v in summary.items()), **summary)


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


def _watch(args: DemoArgs, home: Path, dev: DagsterDev, generator: subprocess.Popen[bytes],
           server: subprocess.Popen[bytes] | None, watch: Watcher, stopped: Callable[[], bool]) -> int:
    """Print what happens until a stop, ``--duration`` or a child's exit; returns the exit code."""
    deadline = time.monotonic() + args.duration if args.duration else None
    while not stopped() and (deadline is None or time.monotonic() < deadline):
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
        watch.poll()
        time.sleep(2)  # display refresh cadence, not synchronisation
    return 0


# ------------------------------------------------------------------------------------------ watching


class Watcher:
    """Prints publications, catch-up progress and failed runs; a few small reads every poll."""

    def __init__(self, store: ObjectStore, source: str, instance: dg.DagsterInstance, out: Printer) -> None:
        self.store, self.source, self.instance, self.out = store, source, instance, out
        self.versions: dict[str, str | None] = {}
        self.partitions: dict[str, str | None] = {}
        self.frontier: tuple[str | None, tuple[str, ...]] | None = None
        self.failed_seen: set[str] = set()
        self.since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)

    def poll(self) -> None:
        for step in (self._publications, self._catchup, self._failures):
            try:
                step()
            except Exception as exc:  # a display glitch (store or SQLite busy) must not stop the demo
                print(f"  (watch: {type(exc).__name__}: {exc})", file=sys.stderr)

    def _publications(self) -> None:
        from freshidx.publish.commit import parse_iso, read_pointer, utcnow
        from freshidx.trigger.listing import newest_partition

        for index in ("delta", "full"):
            pointer, _ = read_pointer(self.store, index)
            if pointer is None or self.versions.get(index) == pointer.version:
                continue
            self.versions[index] = pointer.version
            lag = (utcnow() - parse_iso(pointer.position)).total_seconds()
            newest, _ = newest_partition(self.store, self.source)
            partition = pointer.source_partition or pointer.cutoff or pointer.position
            # only for a partition published for the first time (a compaction re-publishes the same one later)
            first = pointer.source_partition is not None and self.partitions.get(index) != pointer.source_partition
            self.partitions[index] = pointer.source_partition
            published = parse_iso(pointer.published_at)
            took = self._arrival_to_published(pointer.source_partition, published) if first else None
            self.out.event(
                "published", f"{index} v{pointer.seq} {pointer.version} → {partition}  docs {pointer.doc_count}"
                f"  lag {lag:.0f}s behind the partition's time"
                + (f", {took:.1f}s after its files arrived" if took is not None else "")
                + f"  (newest visible {newest.path if newest else None})",
                index=index, version=pointer.version, seq=pointer.seq, partition=partition,
                doc_count=pointer.doc_count, lag_seconds=round(lag, 1),
                arrival_to_published_seconds=None if took is None else round(took, 1),
                newest=newest.path if newest else None)

    def _arrival_to_published(self, partition: str | None, published: dt.datetime) -> float | None:
        """Seconds from the partition's last file landing to the publication: the freshness the pipeline
        adds. The lag from the partition's time also counts the upstream writer (the demo's generator writes
        minute M at M:55, so that lag never reads under ~60 s)."""
        from freshidx.store import layout
        from freshidx.store.partitions import PartitionId

        if partition is None:
            return None
        prefix = layout.raw_partition_prefix(self.source, PartitionId.parse(partition))
        times = [o.last_modified for o in self.store.iter_objects(prefix)]
        return (published - max(times)).total_seconds() if times else None

    def _catchup(self) -> None:
        from freshidx.catchup.planner import ASSET
        from freshidx.catchup.state import CatchupState

        state, etag = CatchupState.load(self.store, ASSET)
        now = (state.frontier, tuple(state.parked))
        if etag is None or now == self.frontier:
            return
        self.frontier = now
        self.out.event("catchup", f"ads_hourly: every hour before {state.frontier} processed"
                       + (f"; parked: {', '.join(state.parked)}" if state.parked else ""),
                       frontier=state.frontier, parked=state.parked)

    def _failures(self) -> None:
        import dagster as dg

        records = self.instance.get_run_records(
            dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE], updated_after=self.since), limit=20)
        for rec in reversed(records):
            run = rec.dagster_run
            if run.run_id in self.failed_seen or run.tags.get("freshidx/interrupted"):  # a stop is not news
                continue
            self.failed_seen.add(run.run_id)
            what = (run.tags.get("freshidx/pipeline") or ",".join(k.to_user_string() for k in run.asset_selection or ())
                    or run.job_name)
            where = run.tags.get("freshidx/source_partition") or run.tags.get("dagster/partition") or ""
            from freshidx.defs.runs.health import failure_reason

            reason = failure_reason(self.instance, run.run_id)
            self.out.event("run_failed", f"run {run.run_id[:8]} ({what} {where}) FAILED: {reason}".replace("  ", " "),
                           run_id=run.run_id, what=what, partition=where, reason=reason)


# ------------------------------------------------------------------------------------------ stopping


def shutdown(dev: DagsterDev, generator: subprocess.Popen[bytes] | None, server: subprocess.Popen[bytes] | None,
             state_dir: Path, instance: dg.DagsterInstance, demo_id: str) -> dict[str, int]:
    """Stop everything the demo started; never raises. Returns counts for the closing line."""
    from freshidx.defs.runs.health import interrupt_runs
    from freshidx.procs import kill_all, processes_with_env

    summary = {"runs_terminated": 0, "runs_marked_interrupted": 0, "processes_killed": 0}
    if generator is not None:
        _stop_group(generator, signal.SIGTERM, 10)
    with contextlib.suppress(Exception):
        summary["runs_terminated"] = _terminate_runs(dev, instance)
    with contextlib.suppress(Exception):
        dev.stop()
    with contextlib.suppress(Exception):  # created meanwhile, or the worker never acknowledged
        summary["runs_marked_interrupted"] = len(interrupt_runs(instance))
    if server is not None:
        _stop_supervisor(server, state_dir)
    # Last resort, whatever state anything was in: every process that carries this demo's id.
    for _ in range(3):
        left = processes_with_env(DEMO_ID_ENV, demo_id)
        if not left:
            break
        summary["processes_killed"] += len(left)
        kill_all(left)
        _wait(lambda: not processes_with_env(DEMO_ID_ENV, demo_id), 5)
    return summary


def _terminate_runs(dev: DagsterDev, instance: dg.DagsterInstance) -> int:
    """Tag unfinished runs interrupted, then Terminate them through dagster dev (like the UI), so
    workers end their Spark work and record CANCELED; waits at most :data:`TERMINATE_GRACE_S`."""
    import dagster as dg

    from freshidx.defs.runs.health import NOT_FINISHED, tag_interrupted

    if not dev.is_running:
        return 0
    ids = [r.run_id for r in instance.get_runs(dg.RunsFilter(statuses=NOT_FINISHED), limit=100)]
    if not ids:
        return 0
    tag_interrupted(instance, ids)  # before they end: no sensor may count them as failures
    with contextlib.suppress(Exception):
        dev.terminate_runs(ids)

    def all_finished() -> bool:
        return all((r := instance.get_run_by_id(i)) is None or r.is_finished for i in ids)

    _wait(all_finished, TERMINATE_GRACE_S)
    return len(ids)


def _stop_supervisor(server: subprocess.Popen[bytes], state_dir: Path) -> None:
    """SIGTERM the supervisor (it stops its JVM); after its grace kill its group, then the JVM's
    session through the pid in state.json (the JVM runs in its own session)."""
    from freshidx.procs import kill_all

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(server.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.wait(SUPERVISOR_GRACE_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(server.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.wait(10)
    try:
        from freshidx.procs import cmdline, session_members
        from freshidx.spark_server.server_state import read_state

        state = read_state(state_dir) or {}
        pid = state.get("pid")
        if isinstance(pid, int) and pid > 0 and "SparkConnectServer" in cmdline(pid):
            kill_all([*session_members(pid), pid])
    except Exception as exc:  # the sweep by demo id still follows
        print(f"  (could not check the Spark JVM: {exc})", file=sys.stderr)


def _stop_group(proc: subprocess.Popen[bytes], sig: int, grace: float) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)


def _wait(done: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if done():
                return True
        except Exception:  # a transient read error (SQLite busy) is retried until the deadline
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.25)


def _open_instance(dagster_home: Path) -> dg.DagsterInstance:
    import dagster as dg

    os.environ["DAGSTER_HOME"] = str(dagster_home)  # the demo process reads the instance it runs
    return dg.DagsterInstance.get()
