"""One Spark Connect server JVM: started, warmed up, probed and stopped, with its state on disk.

:class:`ServerProcess` runs the server of the installed pyspark wheel (:mod:`freshidx.spark_server.server_launch`)
as a *foreground* child in its own session and reports ``up`` only once a real query and a Python job
have run (the warm-up). The decisions when to restart it are the supervisor's
(:mod:`freshidx.spark_server.supervisor`); everything here is about doing one start or one stop right.

**State** is ``state_dir/state.json`` (:mod:`freshidx.spark_server.server_state`). The JVM's stdout/stderr
go to ``state_dir/server.log``. Only one supervisor may own a ``state_dir`` (an ``flock`` on
``state_dir/supervisor.lock``); a JVM left behind by a supervisor that was killed with ``SIGKILL`` is
found through the recorded pid and its command line and killed on the next start. On stop the whole
session of the JVM (the JVM *and* its Python worker daemons, which put themselves in their own
process group) gets ``SIGTERM``, then ``SIGKILL`` after ``stop_timeout_s``.

**Stopping at any moment.** :meth:`ServerProcess.request_stop` (safe in a signal handler): the
current JVM's session gets ``SIGTERM`` at once, whatever is happening (starting, warming up, dumping
the class archive (:mod:`freshidx.spark_server.cds`), draining, restarting), every wait in a start polls the
request (a JVM spawned just before it is killed right after ``Popen``), no JVM is spawned after it,
the JVM gets at most :data:`STOP_GRACE_S` before ``SIGKILL``, and the last status written is
``down`` (with ``stopped_at``). The JVM is also started with ``PR_SET_PDEATHSIG`` = ``SIGTERM``
(:data:`~freshidx.spark_server.server_launch.PDEATHSIG_SHIM`): if the supervisor is killed with
``SIGKILL``, its JVM shuts down with it (the worker daemons exit when the JVM's pipes close), and the
recorded-pid check above remains for anything else. The death signal follows the *thread* that
spawned the JVM: start and supervise from one long-lived thread.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from freshidx import procs
from freshidx.spark.class_archive import parse_memory
from freshidx.spark.local_archive import find_archive
from freshidx.spark.session import close_session
from freshidx.spark_server import cds, server_launch
from freshidx.spark_server.connect_client import call_with_timeout, connect_session, select_one
from freshidx.spark_server.job_progress import SparkStatusClient, ui_port_from_log
from freshidx.spark_server.jvm import MemorySample, sample_memory
from freshidx.spark_server.server_config import ServerConfig
from freshidx.spark_server.server_state import HOSTNAME, STATE_FILE, atomic_write_json, now_iso, read_state
from freshidx.spark_server.state_dir import kill_leftover_jvm, lock_state_dir, unlock_state_dir
from freshidx.spark_server.warm_up import WarmUpFailed, warm_up

#: After a stop request the JVM gets at most this long to exit on SIGTERM (callers such as the demo
#: SIGKILL the supervisor ~30 s after their SIGTERM; the JVM must be gone well before).
STOP_GRACE_S = 10.0


class ServerStartError(RuntimeError):
    """The Spark Connect server could not be started (or warmed up)."""


class StateDirBusy(ServerStartError):
    """Another live supervisor owns the state directory."""


class ServerProcess:
    """One Spark Connect server JVM at a time: owns the state dir, starts, warms up, probes and stops
    the JVM, and records all of it in ``state.json``. Thread-safe. The watchdog that decides when to
    restart it is the subclass :class:`~freshidx.spark_server.supervisor.SparkConnectSupervisor`."""

    def __init__(
        self, config: ServerConfig, *, on_state: Callable[[dict[str, Any]], None] | None = None
    ) -> None:
        self.config = config
        self.state_dir = config.state_dir
        self.state_path = self.state_dir / STATE_FILE
        self.log_path = self.state_dir / "server.log"
        self.properties_path = self.state_dir / "spark-connect.properties"
        self._on_state = on_state
        self._proc: subprocess.Popen[bytes] | None = None
        self._proc_lock = threading.RLock()
        self._state_lock = threading.RLock()
        self._state: dict[str, Any] = {}
        self._stop = threading.Event()  # stop requested (request_stop / stop): no JVM may outlive it
        self._stop_at: float | None = None
        self._run_stop: threading.Event | None = None  # run_forever's stop event
        self._status_client: SparkStatusClient | None = None  # the JVM's UI REST API (progress.py)
        self._lock_file: IO[str] | None = None
        self._health_session: Any = None
        self._started_mono: float | None = None
        self._max_heap_cache: dict[int, int] = {}  # MaxHeapSize by JVM pid (jcmd VM.flags, once per JVM)
        self._cds_pending: tuple[Path, Path] | None = None  # (temp file of the dump, final archive)
        self._cds_in_use: Path | None = None
        self._xmx = parse_memory(config.driver_memory)
        self.last_timings: dict[str, float] = {}

    # ---- state ------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None else None

    def state(self) -> dict[str, Any]:
        with self._state_lock:
            return dict(self._state)

    def _stopping(self) -> bool:
        return self._stop.is_set() or (self._run_stop is not None and self._run_stop.is_set())

    def _update_state(self, **changes: Any) -> dict[str, Any]:
        if self._stop.is_set() and changes.get("status") not in (None, "down"):
            changes.pop("status")  # once a stop is requested, the last status written is "down"
        with self._state_lock:
            status_changed = "status" in changes and changes["status"] != self._state.get("status")
            self._state.update(changes)
            self._state["updated_at"] = now_iso()
            if self._started_mono is not None and self._state.get("pid"):
                self._state["uptime_s"] = round(time.monotonic() - self._started_mono, 1)
            snapshot = dict(self._state)
            atomic_write_json(self.state_path, snapshot)
        if status_changed and self._on_state is not None:
            with contextlib.suppress(Exception):
                self._on_state(snapshot)
        return snapshot

    # ---- ownership of the state dir (freshidx.spark_server.state_dir) -----------------------

    def _take_lock(self) -> None:
        if self._lock_file is not None:
            return
        lock = lock_state_dir(self.state_dir)
        if lock is None:
            other = read_state(self.state_dir) or {}
            raise StateDirBusy(f"another supervisor owns {self.state_dir} (pid {other.get('supervisor_pid')})")
        self._lock_file = lock

    def _release_lock(self) -> None:
        if self._lock_file is not None:
            unlock_state_dir(self._lock_file)
            self._lock_file = None

    def kill_leftover(self) -> None:
        """A JVM recorded by a previous supervisor of this state dir that was killed itself."""
        kill_leftover_jvm(self.state_dir, self.properties_path)

    # ---- start / stop ------------------------------------------------------------------------

    def start(self) -> dict[str, Any]:
        """Start the server and wait until it answers a real query. Returns timings (seconds).

        The JVM is killed when the thread that calls this ends (``PR_SET_PDEATHSIG``): call it from
        the thread that keeps supervising (as :meth:`run_forever` does)."""
        self._stop.clear()
        self._stop_at = None
        return self._start()

    def _start(self) -> dict[str, Any]:
        self._take_lock()
        with self._state_lock:
            if "supervisor_pid" not in self._state:  # (the control endpoint may have added its fields)
                self._state = {**self._state,
                    "status": None, "restarts": 0, "supervisor_pid": os.getpid(),
                    "supervisor_started_at": now_iso(), "hostname": HOSTNAME, "url": self.config.url,
                    "host": self.config.host, "port": self.config.port, "master": self.config.master,
                    "log": str(self.log_path), "state_dir": str(self.state_dir),
                    "last_restart_at": None, "last_restart_reason": None, "pid": None,
                }
        with self._proc_lock:
            if self._proc is not None and self._proc.poll() is None:
                return dict(self.last_timings)
            self.kill_leftover()
            self._update_state(status="starting" if not self._state.get("restarts") else "restarting")
            return self._spawn_and_wait()

    def _dump_cds(self, pid: int, deadline: float) -> float | None:
        """Write the class archive of the warmed-up JVM (``jcmd VM.cds dynamic_dump``), before it is
        reported up: the first start pays 10–50 s once, no later restart has to."""
        pending, self._cds_pending = self._cds_pending, None
        if pending is None:
            return None
        t = time.monotonic()
        changes = cds.dump_archive(pid, pending, deadline, cancel=self._stopping)
        if changes is None:
            raise ServerStartError("stop requested while dumping the class archive")
        self._update_state(**changes)
        return round(time.monotonic() - t, 3)

    def _spawn_and_wait(self, when_up: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
        """Spawn the JVM, wait for the port, warm up; ``when_up`` adds fields to the "up" state write."""
        cfg = self.config
        if self._stopping():
            raise ServerStartError("stop requested")
        if not server_launch.port_free(cfg.host if cfg.host not in ("", "::") else "0.0.0.0", cfg.port):
            raise ServerStartError(f"port {cfg.host}:{cfg.port} is already in use")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        workdir = self.state_dir / "work"  # spark-warehouse etc. land here, not in the caller's cwd
        workdir.mkdir(exist_ok=True)
        archive = cds.plan_archive(cfg, find_archive(cfg.driver_memory) if cfg.class_data_sharing else None)
        self._cds_pending, self._cds_in_use = archive.pending, archive.in_use
        server_launch.write_fair_scheduler(cfg.fair_scheduler_path)
        server_launch.write_properties(self.properties_path, cfg.spark_conf(), archive.options)
        log = server_launch.open_log(self.log_path)
        offset = log.tell()
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(
                server_launch.command(cfg, self.properties_path), cwd=workdir, env=server_launch.environment(cfg),
                stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        finally:
            log.close()
        self._proc = proc
        self._started_mono = t0
        self._max_heap_cache.clear()
        try:
            # (a stop requested between Popen and the line above did not see this JVM: it is killed below)
            self._update_state(pid=proc.pid, started_at=now_iso(), heap_used_bytes=None, heap_max_bytes=None,
                               rss_bytes=None, ui_url=None)
            self._wait_listening(proc, offset, t0 + cfg.start_timeout_s)
            t_port = time.monotonic()
            timings = {"port_open_s": round(t_port - t0, 3)}
            if cfg.warm_up:
                timings.update(self._warm_up(t0 + cfg.start_timeout_s))
            if (dumped := self._dump_cds(proc.pid, t0 + cfg.start_timeout_s)) is not None:
                timings["cds_dump_s"] = dumped
            self._reset_health_session()
            timings["ready_s"] = round(time.monotonic() - t0, 3)
        except BaseException as exc:
            tail = server_launch.log_tail(self.log_path, offset)
            died = proc.poll() is not None
            self._terminate()
            if died and self._cds_in_use is not None:  # never let a bad archive keep the server down
                self._cds_in_use.unlink(missing_ok=True)
            self._update_state(status="down", pid=None, last_pid=proc.pid, last_error=f"start failed: {exc}")
            if isinstance(exc, ServerStartError | KeyboardInterrupt):
                raise
            raise ServerStartError(
                f"Spark Connect server did not become ready: {exc}\n--- server.log ---\n{tail}"
            ) from exc
        self.last_timings = timings
        self._update_state(status="up", last_error=None, consecutive_health_failures=0,
                           last_start_timings=timings, last_health_at=now_iso(), **(when_up() if when_up else {}))
        return dict(timings)

    def _wait_listening(self, proc: subprocess.Popen[bytes], offset: int, deadline: float) -> None:
        cfg = self.config
        probe_host = "127.0.0.1" if cfg.host in ("0.0.0.0", "::", "") else cfg.host
        scanned = offset
        while True:
            if self._stopping():
                raise ServerStartError("stop requested while starting")
            rc = proc.poll()
            if rc is not None:
                tail = server_launch.log_tail(self.log_path, offset)
                raise ServerStartError(f"server exited with code {rc} while starting\n{tail}")
            # Spark retries a busy port on port+1 …: make sure it is listening where we expect.
            with contextlib.suppress(OSError), open(self.log_path, "rb") as f:
                f.seek(scanned)
                chunk = f.read()
                chunk = chunk[: chunk.rfind(b"\n") + 1]  # whole lines only (a port number may be cut)
                if (bound := server_launch.bound_port(chunk)) is not None and bound != cfg.port:
                    raise ServerStartError(f"server bound port {bound} instead of {cfg.port}")
                if (ui_port := ui_port_from_log(chunk)) is not None:  # logged before the Connect port opens
                    self._status_client = SparkStatusClient(f"http://{probe_host}:{ui_port}",
                                                            timeout_s=min(10.0, cfg.health_timeout_s))
                    self._update_state(ui_url=self._status_client.base)
                scanned += len(chunk)
            if server_launch.port_accepts(probe_host, cfg.port):
                return
            if time.monotonic() > deadline:
                raise ServerStartError(f"port {cfg.port} not open after {cfg.start_timeout_s}s")
            time.sleep(0.1)

    def _warm_up(self, deadline: float) -> dict[str, float]:
        """The first query on a fresh server takes seconds (JIT, class loading): pay it here."""
        try:
            return warm_up(self.config.url, deadline, self._stopping)
        except WarmUpFailed as exc:
            raise ServerStartError(str(exc)) from exc

    def _terminate(self) -> None:
        """SIGTERM the JVM's whole session, SIGKILL after ``stop_timeout_s``; reap."""
        with self._proc_lock:
            self._reset_health_session(create=False)
            proc = self._proc
            if proc is None:
                return
            sid = proc.pid
            self._status_client = None
            if proc.poll() is None:
                procs.signal_session(sid, signal.SIGTERM)
                give_up = time.monotonic() + self.config.stop_timeout_s
                while proc.poll() is None:
                    if self._stopping():  # a stop request shortens a restart's grace too
                        give_up = min(give_up, (self._stop_at or time.monotonic()) + STOP_GRACE_S)
                    if time.monotonic() >= give_up:
                        procs.signal_session(sid, signal.SIGKILL)
                        with contextlib.suppress(subprocess.TimeoutExpired):
                            proc.wait(10)
                        break
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(0.1)
            # Python worker daemons (own process groups, same session) that outlived the JVM
            for sig, grace in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
                if not procs.session_members(sid):
                    break
                procs.signal_session(sid, sig)
                deadline = time.monotonic() + grace
                while procs.session_members(sid) and time.monotonic() < deadline:
                    time.sleep(0.05)
            self._proc = None
            self._started_mono = None

    def request_stop(self) -> None:
        """Ask for a stop from any thread (not from a signal handler: ``Event.set`` takes the event's
        lock, which the interrupted main thread may hold in ``wait``; the CLI relays signals to a thread).
        Whatever the supervisor is doing, the current JVM gets SIGTERM now, every start or restart in
        progress gives up, and no JVM is spawned after this. :meth:`stop` finishes the job (SIGKILL after
        the grace, reaping)."""
        if self._stop_at is None:
            self._stop_at = time.monotonic()
        self._stop.set()
        proc = self._proc
        if proc is not None and proc.returncode is None:  # not reaped: the pid is still this JVM's
            procs.signal_session(proc.pid, signal.SIGTERM)

    def stop(self) -> None:
        """Stop supervising and stop the server (no JVM or Python worker is left behind)."""
        self.request_stop()
        with self._proc_lock:  # waits for a start/restart in progress to notice the request
            self._terminate()
            if "supervisor_pid" in self._state:  # this supervisor started (it owns the state dir)
                self._update_state(status="down", pid=None, restarting_reason=None, stopped_at=now_iso())
            self._release_lock()

    # ---- health ------------------------------------------------------------------------------

    def _reset_health_session(self, *, create: bool = True) -> None:
        # Never a ReleaseSession RPC here: the server may be hung, and it is about to go anyway.
        old, self._health_session = self._health_session, None
        close_session(old, release=False)
        if create:
            self._health_session = connect_session(self.config.url, quick_retries=True)

    def health_check(self, timeout_s: float | None = None) -> bool:
        """True if the process lives and a Spark Connect session answers ``SELECT 1`` in time."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return False
        session = self._health_session
        if session is None:
            try:
                session = self._health_session = connect_session(self.config.url, quick_retries=True)
            except Exception:
                return False

        try:
            ok = call_with_timeout(lambda: select_one(session), timeout_s or self.config.health_timeout_s,
                                   lambda: close_session(session, release=False))
        except Exception:
            ok = False
        if not ok and self._health_session is session:
            self._health_session = None
            close_session(session, release=False)
        return ok

    def _sample_memory(self) -> MemorySample | None:
        """Sample the JVM's heap (:mod:`freshidx.spark_server.jvm`) and record it in the state."""
        pid = self.pid
        if pid is None:
            return None
        sample = sample_memory(pid, self._xmx, self._max_heap_cache)
        self._update_state(heap_used_bytes=sample.heap_used_bytes, heap_max_bytes=sample.heap_max_bytes,
                           rss_bytes=sample.rss_bytes, heap_source=sample.source, heap_sampled_at=now_iso())
        return sample

