"""A supervised Spark Connect server: health checks, crash restarts, planned restarts with draining.

``freshidx spark-server`` (or ``python -m freshidx.spark_server.server``) runs :class:`SparkConnectSupervisor`
in the foreground: one Spark Connect server JVM (:mod:`freshidx.spark_server.server_process` starts and stops
it) and the watchdog the design asks for:

* **liveness** – the process is polled every ``poll_interval_s``; if it died (OOM killer,
  ``kill -9``) it is restarted at once (reason ``crash``);
* **health and progress** – every ``health_interval_s`` a Spark Connect client session runs
  ``SELECT 1`` under a short timeout, and the progress of the server's jobs is sampled
  (:mod:`freshidx.spark_server.job_progress`: task/stage counters and live I/O metrics from the driver's UI REST
  API on a random loopback port, plus the CPU time of the server's Python workers; *not* the JVM's
  CPU, which a starved JVM cannot get and an idle one spends on heartbeats and probes). While runs
  hold leases (:mod:`freshidx.spark_server.lease`), probes do not decide anything (a failed one is recorded
  as ``health_busy_since`` / ``health_busy_failures``): the server is restarted (reason ``hung``) only
  once its jobs made no progress for ``hang_timeout_s``. A server nobody leases is restarted (reason
  ``health``) after ``health_failures`` failed probes in a row;
* **planned restarts** – when the JVM is older than ``restart_every_s`` (reason ``planned-age``) or
  its heap stays over ``max_heap_fraction`` of ``-Xmx`` even after a full GC (``planned-heap``,
  measured as :mod:`freshidx.spark_server.jvm` says), the supervisor *drains* first (so do ``hung`` and
  ``health``; only a dead JVM is restarted at once): it marks the state ``draining`` and waits (up to
  ``drain_timeout_s``) until no client holds a lease, then restarts. ``SIGHUP`` (CLI) requests one
  (``planned-manual``). More than ``max_session_processes`` processes in the JVM's session (Python
  worker daemons that Spark Connect leaks per client session) is a planned restart too
  (``planned-processes``).

With ``--spare`` (``ServerConfig.spare``) a second, warmed-up JVM waits beside the serving one and is
*promoted* when the serving JVM dies (``last_restart_promoted``); planned restarts drain and restart as
above (:mod:`freshidx.spark_server.spare`).

``SIGTERM``/``SIGINT`` to ``freshidx spark-server`` call :meth:`~ServerProcess.request_stop` from the
handler (what a stop guarantees: :mod:`freshidx.spark_server.server_process`).

**Clients cut off by a restart** see a ``pyspark.errors.PySparkException`` (e.g.
``SparkConnectGrpcException`` or ``Cannot call methods on a stopped SparkContext``), an ordinary
exception: the assets' Dagster ``RetryPolicy`` retries it, and the retry leases again (waiting while
the server restarts).
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from freshidx import procs
from freshidx.spark_server.control_client import DirectoryControl
from freshidx.spark_server.control_server import ControlPlane, ControlServer
from freshidx.spark_server.job_progress import ProgressTracker, python_worker_cpu_s
from freshidx.spark_server.jvm import run_jcmd
from freshidx.spark_server.lease import active_leases
from freshidx.spark_server.server_config import ServerConfig
from freshidx.spark_server.server_process import STOP_GRACE_S, ServerProcess, ServerStartError, StateDirBusy
from freshidx.spark_server.server_state import now_iso
from freshidx.spark_server.spare import SpareKeeper, kill_leftover_spares, promotion_fields


class SparkConnectSupervisor(ServerProcess):
    """Starts, watches and restarts one Spark Connect server. Thread-safe; see the module docstring."""

    def __init__(
        self, config: ServerConfig, *, on_state: Callable[[dict[str, Any]], None] | None = None
    ) -> None:
        super().__init__(config, on_state=on_state)
        self._health_failures = 0
        self._busy_since: str | None = None
        self._busy_failures = 0
        self._restart_requested: str | None = None
        self._pending_reason: str | None = None  # a restart that failed and must be retried
        # Leases and kept sessions behind the control endpoint; a lease is granted under the state lock,
        # under which _drain writes "draining" before it lists leases (control_server.py).
        self.control = ControlPlane(self.state, self._usable, self._state_lock, DirectoryControl(self.state_dir),
                                    ttl_s=config.lease_ttl_s)
        self._control_server: ControlServer | None = None
        self._spares = SpareKeeper(config, self._spare_changed) if config.spare else None

    # ---- the control endpoint (freshidx.spark_server.control_server) ------------------------

    def _usable(self, state: dict[str, Any]) -> bool:
        proc = self._proc
        return state.get("status") == "up" and proc is not None and proc.poll() is None

    def serve_control(self, port: int | None = None) -> str:
        """Serve the control endpoint on the Connect server's host and ``port`` (default the config's);
        returns its URL, recorded in the state as ``control_url``. :class:`ServerStartError` if it cannot bind."""
        port = self.config.control_port if port is None else port
        if self._control_server is None:
            try:
                self._control_server = ControlServer(self.control, self.config.host, port).start()
            except OSError as exc:
                raise ServerStartError(f"control endpoint: cannot listen on {self.config.host}:{port} "
                                       f"(--control-port): {exc}") from None
            with self._state_lock:  # written with the next state change (once this supervisor owns the dir)
                self._state.update(control_url=self._control_server.url, lease_ttl_s=self.control.ttl_s)
        return self._control_server.url

    def held_leases(self) -> list[dict[str, Any]]:
        """Every lease held: lease files of the state dir and leases taken over the endpoint."""
        return active_leases(self.state_dir) + self.control.leases()

    def kill_leftover(self) -> None:
        """The primary's leftover JVM and spares (or a promoted one) a supervisor killed with SIGKILL left."""
        super().kill_leftover()
        kill_leftover_spares(self.state_dir)  # (one may hold the configured port)

    def request_stop(self) -> None:
        """:meth:`ServerProcess.request_stop`, and the spare JVM (if any) gets SIGTERM at the same moment."""
        super().request_stop()
        if self._spares is not None:
            self._spares.request_stop()

    def stop(self) -> None:
        """Stop the server (:meth:`ServerProcess.stop`) and the spare, then the control endpoint."""
        super().stop()
        if self._spares is not None:
            self._spares.stop(STOP_GRACE_S + 20.0)  # (SIGTERMed with the serving JVM: the same grace)
        server, self._control_server = self._control_server, None
        if server is not None:
            server.stop()

    def request_restart(self, reason: str = "planned-manual") -> None:
        """Ask :meth:`run_forever` for a drained restart at its next tick."""
        self._restart_requested = reason

    def planned_restart_reason(self, *, check_heap: bool = True) -> str | None:
        """``planned-age`` / ``-heap`` / ``-processes`` / a requested reason, or None if none is due."""
        if self._restart_requested:
            return self._restart_requested
        if self._started_mono is not None and time.monotonic() - self._started_mono > self.config.restart_every_s:
            return "planned-age"
        if check_heap:
            sample = self._sample_memory()
            frac = sample.fraction if sample else None
            if frac is not None and frac > self.config.max_heap_fraction:
                if sample is not None and sample.source == "jcmd" and self.pid is not None:
                    run_jcmd(self.pid, "GC.run", timeout=60)  # only a live set over the line counts
                    sample = self._sample_memory()
                    frac = sample.fraction if sample else None
                if frac is not None and frac > self.config.max_heap_fraction:
                    return "planned-heap"
            pid = self.pid
            if pid is not None:
                count = len(procs.session_members(pid))  # the JVM was started with setsid: sid == pid
                self._update_state(session_processes=count)
                if self.config.max_session_processes and count > self.config.max_session_processes:
                    return "planned-processes"
        return None

    # ---- restarts ----------------------------------------------------------------------------

    def _drain(self, reason: str) -> bool:
        """Mark draining, wait until no lease is held (or the timeout). False if asked to stop."""
        self._update_state(status="draining", drain_started_at=now_iso(), draining_reason=reason)
        deadline = time.monotonic() + self.config.drain_timeout_s
        while True:
            leases = self.held_leases()
            if not leases:
                self._update_state(drain_timed_out_leases=[])
                return True
            if self._proc is None or self._proc.poll() is not None:
                return True  # it died meanwhile: nothing left to drain
            if time.monotonic() >= deadline:
                self._update_state(drain_timed_out_leases=[d.get("run_id") for d in leases])
                return True
            held = [d.get("run_id") for d in leases]
            if held != self._state.get("leases"):
                self._update_state(leases=held)
            if self._stop.wait(0.2) or self._stopping():
                return False

    def _restart(self, reason: str) -> dict[str, Any]:
        """Stop the JVM (if any) and start a new one; counted once it is up."""
        t0 = time.monotonic()
        self._restart_requested = None  # one asked for while this runs is honoured afterwards
        with self._proc_lock:
            old_pid = self.pid or self._state.get("last_pid")
            self._update_state(status="restarting", restarting_reason=reason, leases=[])
            self._terminate()

            def restarted() -> dict[str, Any]:
                return {
                    "restarts": int(self._state.get("restarts") or 0) + 1, "last_restart_at": now_iso(),
                    "last_restart_reason": reason, "last_restart_duration_s": round(time.monotonic() - t0, 3),
                    "last_restart_old_pid": old_pid, "restarting_reason": None, "last_restart_promoted": False,
                    # (after a promotion the serving JVM ran elsewhere: this one runs from state_dir)
                    "url": self.config.url, "port": self.config.port, "log": str(self.log_path),
                }

            timings = self._spawn_and_wait(restarted)
        self._pending_reason = None
        return {**timings, "restart_s": self._state["last_restart_duration_s"]}

    def _promote(self) -> bool:
        """Make the ready spare the serving JVM (:mod:`freshidx.spark_server.spare`) in place of a dead one:
        state.json points at its URL from now on. False if there is no ready spare (then restart)."""
        if self._spares is None or self._stopping():
            return False
        t0 = time.monotonic()
        with self._proc_lock:
            old_pid = self.pid or self._state.get("last_pid")
            handover = self._spares.take()
            if handover is None:
                return False
            dead, self._proc = self._proc, handover.proc
            self._started_mono, self._status_client = handover.started_mono, handover.status_client
            self._max_heap_cache.clear()
            self.config = dataclasses.replace(self.config, port=handover.config.port)
            self.last_timings = handover.timings
            self._update_state(**promotion_fields(self._state, handover, self.config.url, old_pid,
                                                  took_s=time.monotonic() - t0))
            if dead is not None:  # (reaped) its Python workers, orphaned: no grace for them
                procs.signal_session(dead.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):  # (else the next probe connects)
                self._reset_health_session()
        self._pending_reason = None
        return True

    def _spare_changed(self, changes: dict[str, Any]) -> None:
        if not self._stop.is_set():  # after a stop the last state written is the supervisor's "down"
            self._update_state(**changes)

    def run_forever(self, stop_event: threading.Event | None = None) -> None:
        """Supervise until ``stop_event`` is set (or :meth:`request_stop` / :meth:`stop`). Starts the
        server if needed.

        Does not stop the server on return; call :meth:`stop` for that. Raises
        :class:`StateDirBusy` if another supervisor owns the state dir; every other failure to
        start is retried with exponential backoff (status ``down``, ``last_error``).
        """
        stop = stop_event or threading.Event()
        self._run_stop = stop
        cfg = self.config
        now = time.monotonic()
        watch = _Watch(ProgressTracker(cfg.hang_timeout_s), next_health=now + cfg.health_interval_s,
                       next_heap=now + min(cfg.heap_check_interval_s, cfg.health_interval_s))
        try:
            while not self._stopping():
                try:
                    step = self._tick(stop, watch)
                    if step == "stop":
                        break
                    if step == "again":  # a JVM was (re)started, or its start failed: no pause
                        continue
                except StateDirBusy:
                    raise
                except Exception as exc:  # keep supervising whatever goes wrong in one tick
                    self._update_state(last_error=f"supervisor: {type(exc).__name__}: {exc}"[:4000])
                stop.wait(cfg.poll_interval_s)
        finally:
            self._run_stop = None

    def _tick(self, stop: threading.Event, watch: _Watch) -> Literal["stop", "again", "wait"]:
        """One look at the JVM: start it if there is none, restart it if it died or a restart is due
        (draining first), else nothing (``wait``)."""
        proc = self._proc
        if proc is None:  # first start, or a restart that failed: retry with backoff
            if not self._start_with_backoff(stop, watch):
                return "stop"
            self._fresh_jvm(watch)
            return "again"
        if proc.poll() is not None:  # dead: the spare promoted, or restarted at once; nothing to drain
            self._update_state(last_exit_code=proc.returncode)
            if not self._promote():
                self._restart_or_mark_down("crash")
            self._fresh_jvm(watch)
            return "again"
        reason = self._restart_due(watch)
        if reason is None:
            if self._spares is not None:
                self._spares.ensure(self.config, serving_up=self._state.get("status") == "up")
            return "wait"
        if not self._drain(reason):  # every restart of a live JVM drains first
            return "stop"
        dead = self._proc is None or self._proc.poll() is not None
        if not (dead and self._promote()):
            self._restart_or_mark_down("crash" if dead else reason)
        self._fresh_jvm(watch)
        return "again"

    def _start_with_backoff(self, stop: threading.Event, watch: _Watch) -> bool:
        """Start (or retry the pending restart); after a failure wait 2^n s (at most 60). False if a stop
        was requested meanwhile."""
        try:
            if self._pending_reason:
                self._restart(self._pending_reason)
            else:
                self._start()
            watch.failed_starts = 0
        except StateDirBusy:
            raise
        except ServerStartError as exc:
            if self._stopping():
                return False
            watch.failed_starts += 1
            self._update_state(status="down", last_error=str(exc)[:4000])
            stop.wait(min(60.0, 2.0**watch.failed_starts))
        return True

    def _fresh_jvm(self, watch: _Watch) -> None:
        self._health_failures, self._busy_since, self._busy_failures = 0, None, 0
        # the probes' record describes the running JVM: a new one starts without the old one's failures
        self._update_state(consecutive_health_failures=0, health_busy_since=None, health_busy_failures=0)
        watch.tracker.reset(time.monotonic())
        watch.next_health = time.monotonic() + self.config.health_interval_s

    def _restart_due(self, watch: _Watch) -> str | None:
        """The reason of a (drained) restart if one is due: the health probe's when it is time for one,
        else a planned one (the heap checked when it is time for that)."""
        cfg = self.config
        now = time.monotonic()
        reason: str | None = None
        if now >= watch.next_health:
            reason = self._health_tick(watch.tracker)
            watch.next_health = time.monotonic() + cfg.health_interval_s
        if reason is None:
            check_heap = now >= watch.next_heap
            if check_heap:
                watch.next_heap = now + cfg.heap_check_interval_s
            reason = self.planned_restart_reason(check_heap=check_heap)
        return reason

    def _health_tick(self, tracker: ProgressTracker) -> str | None:
        """Probe, sample progress, record both; ``hung`` / ``health`` if a (drained) restart is due.

        With leases held only progress counts (a failed probe is recorded as ``health_busy_*``); the
        probe failure count applies to a server nobody is using."""
        proc = self._proc
        if proc is None:
            return None
        t0 = time.monotonic()
        ok = self.health_check()
        t1 = time.monotonic()
        leased = bool(self.held_leases())
        client = self._status_client
        status = client.sample() if client is not None else None
        t2 = time.monotonic()
        cpu = python_worker_cpu_s(proc.pid, procs.session_members(proc.pid))
        tracker.hang_timeout_s = self.config.hang_timeout_s  # (the config may be changed while running)
        verdict = tracker.observe(time.monotonic(), leased=leased, probe_ok=ok, status=status, python_cpu_s=cpu)
        changes: dict[str, Any] = {
            "progress": verdict.why, "progress_stalled_s": round(verdict.stalled_s, 1),
            "active_tasks": status.active_tasks if status else None,
            "status_api_error": status.error if status else "no UI",
            "probe_s": round(t1 - t0, 2), "status_api_s": round(t2 - t1, 2),
        }
        if verdict.progressed:
            changes["progress_at"] = now_iso()
        if leased and not ok:
            if self._busy_since is None:
                self._busy_since, self._busy_failures = now_iso(), 0
            self._busy_failures += 1
            changes.update(health_busy_since=self._busy_since, health_busy_failures=self._busy_failures)
        elif self._busy_since is not None:
            # the busy episode is over: state.json shows none (not the last episode's count)
            self._busy_since, self._busy_failures = None, 0
            changes.update(health_busy_since=None, health_busy_failures=0)
        if ok:
            self._health_failures = 0
            changes.update(last_health_at=now_iso(), consecutive_health_failures=0)
        elif not leased:
            self._health_failures += 1
            changes.update(consecutive_health_failures=self._health_failures)
        self._update_state(**changes)
        if verdict.hung:
            return "hung"
        if not leased and self._health_failures >= self.config.health_failures and proc.poll() is None:
            self._health_failures = 0
            return "health"
        return None

    def _restart_or_mark_down(self, reason: str) -> None:
        try:
            self._restart(reason)
        except ServerStartError as exc:
            # run_forever sees no process and retries this restart with backoff
            self._pending_reason = reason
            self._update_state(status="down", last_error=str(exc)[:4000])


@dataclass
class _Watch:
    """:meth:`SparkConnectSupervisor.run_forever`'s clock: when the next probe and heap check are due
    (monotonic), the hang detector, and the starts that failed in a row."""

    tracker: ProgressTracker
    next_health: float
    next_heap: float
    failed_starts: int = 0
