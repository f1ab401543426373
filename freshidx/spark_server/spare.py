"""A warm spare Spark Connect JVM (``freshidx spark-server --spare``): promoted when the serving JVM dies.

A restarted JVM costs ~30 s before it is ``up`` (port, warm-up SQL, warm-up Python job) and then the
clients' first jobs on a cold JVM. With ``ServerConfig.spare`` the supervisor
(:mod:`freshidx.spark_server.supervisor`) keeps a second JVM of the same configuration started and
warmed up, handed out to nobody; when the serving JVM dies it *promotes* the spare (it becomes the
serving JVM: ``state.json`` points at its URL, so do new leases) and starts a new spare in the
background. Planned restarts (age, heap, processes, manual, hung, health) drain and restart as without
a spare.

Each spare is a :class:`SpareProcess` (a :class:`~freshidx.spark_server.server_process.ServerProcess`)
with a state dir of its own, ``state_dir/spare/a`` or ``state_dir/spare/b`` (whichever the serving JVM
does not run from: a promoted JVM keeps its log and work dir there), its own free Connect port (the
configured one when it is free, so ports alternate between two) and its own UI port. Its state dir
records its pid like the primary's, so a spare left behind by a supervisor killed with ``SIGKILL`` is
killed on the next start (:func:`kill_leftover_spares`, before the primary starts: it may hold the configured
port).

**Why a keeper thread per spare.** The JVM gets ``SIGTERM`` when the *thread* that spawned it ends
(``PR_SET_PDEATHSIG``, :mod:`freshidx.spark_server.server_process`). Each spare is spawned by a thread
that then waits until its JVM has exited: a promoted JVM lives on after its start, its thread with it,
and a supervisor killed with ``SIGKILL`` still takes every JVM with it. A spare that was not promoted
is stopped by its thread when the supervisor stops (same grace as the serving JVM's).

Memory: two JVMs, each with ``driver_memory`` of heap (docs/operations.md, docs/deployment.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from freshidx.spark_server import server_launch
from freshidx.spark_server.job_progress import SparkStatusClient
from freshidx.spark_server.server_config import ServerConfig
from freshidx.spark_server.server_process import ServerProcess
from freshidx.spark_server.server_state import now_iso
from freshidx.spark_server.state_dir import kill_leftover_jvm

SPARE_SLOTS = ("a", "b")
#: After a spare failed to start, the next attempt waits this long (the serving JVM is unaffected).
RETRY_AFTER_S = 30.0


# ---- decisions (pure) --------------------------------------------------------------------------


def spare_dirs(state_dir: Path) -> list[Path]:
    """The state dirs a spare may run from."""
    return [state_dir / "spare" / slot for slot in SPARE_SLOTS]


def pick_slot(state_dir: Path, busy: set[Path]) -> Path | None:
    """The spare dir for a new spare: one no keeper holds (a promoted JVM's keeper holds its dir until the
    JVM has exited), None if both are held."""
    for d in spare_dirs(state_dir):
        if d not in busy:
            return d
    return None


def pick_port(configured: int, serving: int, configured_free: bool) -> int | None:
    """The spare's Connect port: the configured one when the serving JVM is elsewhere and it is free,
    else None (an ephemeral one)."""
    return configured if configured != serving and configured_free else None


def spare_config(config: ServerConfig, state_dir: Path, port: int) -> ServerConfig:
    """The spare's config: the serving one's, with its own port and state dir, no control endpoint, and the
    serving JVM's class archive mapped (never a dump of its own: two dumps of one archive would race)."""
    return dataclasses.replace(config, port=port, state_dir=state_dir, control_port=0, spare=False,
                               cds_dir=config.cds_dir or config.state_dir / "cds", cds_dump=False)


def start_due(*, enabled: bool, serving_up: bool, stopping: bool, have_spare: bool, retry_at: float,
              now: float) -> bool:
    """Whether to start a spare now: enabled, the serving JVM up (a spare never competes with its start),
    none running or starting, and not within the pause after a failed start."""
    return enabled and serving_up and not stopping and not have_spare and now >= retry_at


def promotion_fields(state: dict[str, Any], handover: Handover, url: str, old_pid: int | None, *,
                     took_s: float) -> dict[str, Any]:
    """What the supervisor's state says once ``handover`` serves at ``url`` in place of dead JVM ``old_pid``:
    ``up`` there, counted as a crash restart that was a promotion."""
    now = now_iso()
    return {
        "status": "up", "url": url, "port": handover.config.port, "pid": handover.proc.pid,
        "ui_url": handover.status_client.base if handover.status_client else None, "log": str(handover.log_path),
        "started_at": now, "last_error": None, "leases": [], "heap_used_bytes": None, "heap_max_bytes": None,
        "rss_bytes": None, "last_start_timings": handover.timings,
        "restarts": int(state.get("restarts") or 0) + 1, "last_restart_at": now, "last_restart_reason": "crash",
        "last_restart_duration_s": round(took_s, 3), "last_restart_old_pid": old_pid, "restarting_reason": None,
        "last_restart_promoted": True, "promotions": int(state.get("promotions") or 0) + 1, "last_promoted_at": now,
    }


# ---- effects -----------------------------------------------------------------------------------


def free_port(host: str) -> int:
    """A free TCP port on ``host`` (the spare's Connect port when the configured one is taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def kill_leftover_spares(state_dir: Path) -> None:
    """Spare JVMs (or a promoted one) a supervisor killed with ``SIGKILL`` left behind."""
    for d in spare_dirs(state_dir):
        kill_leftover_jvm(d, d / "spark-connect.properties")


@dataclass(frozen=True)
class Handover:
    """A warmed-up spare JVM given to the supervisor: from now on the supervisor stops it."""

    proc: subprocess.Popen[bytes]
    config: ServerConfig
    started_mono: float
    status_client: SparkStatusClient | None
    log_path: Path
    timings: dict[str, float]


class SpareProcess(ServerProcess):
    """One spare JVM, its own state dir; :meth:`handover` gives its JVM away without stopping it."""

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        return self._proc

    def start_spare(self) -> dict[str, Any]:
        """Start and warm up (unlike :meth:`start`, a stop requested before this is kept: no JVM then)."""
        return self._start()

    def ready(self) -> bool:
        proc = self._proc
        return self._state.get("status") == "up" and proc is not None and proc.poll() is None

    def handover(self) -> Handover | None:
        """The JVM, if it is up; afterwards this object never signals it (its keeper only waits for its exit)."""
        if not self._proc_lock.acquire(blocking=False):  # held through a whole start: never wait for one
            return None
        try:
            proc = self._proc
            if not self.ready() or proc is None or self._started_mono is None:
                return None
            self._update_state(status="promoted", promoted_at=now_iso())
            return Handover(proc, self.config, self._started_mono, self._status_client, self.log_path,
                            dict(self.last_timings))
        finally:
            self._proc_lock.release()


class SpareKeeper:
    """Keeps at most one spare JVM starting or ready, each spawned by a keeper thread of its own."""

    def __init__(self, config: ServerConfig, on_change: Callable[[dict[str, Any]], None]) -> None:
        self.config = config
        self._on_change = on_change  # records the spare's fields in the supervisor's state
        self._lock = threading.Lock()
        self._spare: SpareProcess | None = None  # starting or ready, not handed over
        self._keepers: dict[Path, threading.Thread] = {}
        self._stop = threading.Event()
        self._retry_at = 0.0

    def ensure(self, serving: ServerConfig, *, serving_up: bool) -> None:
        """Start a spare in the background if one is due (:func:`start_due`)."""
        with self._lock:
            self._keepers = {d: t for d, t in self._keepers.items() if t.is_alive()}
            if not start_due(enabled=True, serving_up=serving_up, stopping=self._stop.is_set(),
                             have_spare=self._spare is not None, retry_at=self._retry_at, now=time.monotonic()):
                return
            slot = pick_slot(self.config.state_dir, set(self._keepers))
            if slot is None:
                return
            host = serving.host if serving.host not in ("", "::") else "0.0.0.0"
            port = pick_port(self.config.port, serving.port, server_launch.port_free(host, self.config.port))
            spare = SpareProcess(spare_config(serving, slot, port or free_port(host)))
            self._spare = spare
            thread = threading.Thread(target=self._keep, args=(spare,), name=f"freshidx-spare-{slot.name}",
                                      daemon=True)
            self._keepers[slot] = thread
            thread.start()
        self._on_change({"spare_status": "starting", "spare_url": spare.config.url, "spare_pid": None})

    def take(self) -> Handover | None:
        """The ready spare, handed over (None if there is none ready)."""
        with self._lock:
            spare = self._spare
            handover = spare.handover() if spare is not None else None
            if handover is not None:
                self._spare = None
        if handover is not None:
            self._on_change({"spare_status": None, "spare_url": None, "spare_pid": None})
        return handover

    def request_stop(self) -> None:
        """The spare (not a handed-over JVM) gets SIGTERM now; its keeper reaps it."""
        with self._lock:  # (an ensure() in progress has set its spare, or sees the stop)
            self._stop.set()
            spare = self._spare
        if spare is not None:
            spare.request_stop()

    def stop(self, timeout_s: float) -> None:
        """Stop the spare and wait for every keeper whose JVM is gone (a promoted JVM is the supervisor's)."""
        self.request_stop()
        deadline = time.monotonic() + timeout_s
        for thread in list(self._keepers.values()):
            thread.join(max(0.0, deadline - time.monotonic()))

    def _keep(self, spare: SpareProcess) -> None:
        """The keeper thread: spawn the spare, then live as long as its JVM (see the module docstring)."""
        try:
            timings = spare.start_spare()
        except Exception as exc:  # (a start that fails is retried later; the serving JVM is unaffected)
            with self._lock:
                if self._spare is spare:
                    self._spare = None
                self._retry_at = time.monotonic() + RETRY_AFTER_S
            with contextlib.suppress(Exception):
                spare.stop()
            if not self._stop.is_set():
                self._on_change({"spare_status": "down", "spare_error": str(exc)[:2000]})
            return
        self._on_change({"spare_status": "ready", "spare_pid": spare.pid, "spare_ready_s": timings.get("ready_s")})
        proc = spare.process
        while proc is not None and proc.poll() is None:
            if self._stop.is_set() and self._spare is spare:
                break  # stopping, and not handed over: stop it below
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(0.2)  # (a promoted JVM: the supervisor reaps it, or this does)
        with self._lock:
            mine = self._spare is spare
            if mine:
                self._spare = None
        if mine and not self._stop.is_set():  # a spare that died on its own
            self._on_change({"spare_status": "down", "spare_pid": None, "spare_error": "spare JVM exited"})
        with contextlib.suppress(Exception):
            spare.stop()  # reaps (a handed-over JVM has exited by now), records down, unlocks its dir
