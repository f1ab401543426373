"""Questions about local processes, answered through psutil: alive, started when, in which session,
with what command line, memory and CPU; plus signalling a session or a list of pids.

The Spark supervisor, the progress detector, run health and the demo all ask these; one home means
one way of reading ``/proc`` (psutil's, which also knows the zombie and permission cases) instead of a
hand-written parser per module. Every helper answers "gone" (``False``/``None``/empty) rather than
raising when a process exits between two reads: callers poll processes that die at any moment.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import psutil


def pid_alive(pid: int | None) -> bool:
    """The process exists and is not a zombie (our own dead child not yet reaped still answers
    ``kill(pid, 0)``, so existence alone would call a crashed JVM alive until it is reaped)."""
    if not pid or pid <= 0:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # ZombieProcess included
        return False
    except psutil.AccessDenied:  # someone else's process: it exists
        return True


def process_start_time(pid: int) -> float | None:
    """Epoch seconds the process started, or None if it is gone or a zombie."""
    if pid <= 0:
        return None
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return float(proc.create_time())
    except psutil.Error:
        return None


def _live_with(key: Callable[[int], int], value: int) -> list[int]:
    """Pids of live (non-zombie) processes with ``key(pid) == value``, sorted."""
    out: list[int] = []
    for pid in psutil.pids():
        try:
            if key(pid) != value:
                continue
        except OSError:  # gone meanwhile
            continue
        if pid_alive(pid):
            out.append(pid)
    return sorted(out)


def session_members(sid: int) -> list[int]:
    """Pids whose session id is ``sid`` (a process started with ``setsid`` and its descendants), zombies
    excluded. psutil has no session id: ``os.getsid`` (a syscall, cheaper than a read) gives it."""
    return _live_with(os.getsid, sid)


def group_members(pgid: int) -> list[int]:
    """Pids of live (non-zombie) processes in process group ``pgid``, sorted (``dagster dev`` and the
    children it started, which stay in its group unless they make a session of their own)."""
    return _live_with(os.getpgid, pgid)


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system) of ``pid`` and all its live descendants; None if ``pid`` is gone.
    A descendant that exits between the listing and the read is skipped (its seconds are lost)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0.0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            t = proc.cpu_times()
            total += t.user + t.system
    return total


def signal_session(sid: int, sig: signal.Signals) -> None:
    """Signal every process of session ``sid``: its process group at once, then each member (Spark's
    Python worker daemons put themselves in process groups of their own inside the session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, sig)
    kill_all(session_members(sid), sig)


def kill_all(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to each pid; one already gone (or not ours) is skipped."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def cmdline(pid: int) -> str:
    """The process's arguments joined by spaces; ``""`` if it is gone, a zombie or not readable."""
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except (psutil.Error, ValueError):
        return ""


def rss_bytes(pid: int) -> int | None:
    """Resident set size in bytes; None if the process is gone or has no memory of its own (a zombie
    or a kernel thread, which show 0)."""
    try:
        return int(psutil.Process(pid).memory_info().rss) or None
    except (psutil.Error, ValueError):
        return None


def file_rss_bytes(pid: int) -> int | None:
    """The part of its resident set that maps files and shared memory (pages the page cache holds, shared
    with every process that maps them, reclaimable when clean); None if the process is gone or the platform
    does not say."""
    try:
        shared = getattr(psutil.Process(pid).memory_info(), "shared", None)
    except (psutil.Error, ValueError):
        return None
    return None if shared is None else int(shared)


def pss_bytes(pid: int) -> int | None:
    """Proportional set size in bytes (pages shared with other processes split between them); None if the
    process is gone or its memory map cannot be read."""
    try:
        return int(psutil.Process(pid).memory_full_info().pss) or None
    except (psutil.Error, ValueError, AttributeError):
        return None


def tree_rss_bytes(pid: int) -> int | None:
    """Summed RSS of ``pid`` and its live descendants (a local-mode JVM is a child of a run worker);
    None if ``pid`` is gone."""
    try:
        members = [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    except psutil.Error:
        return None
    rss = [r for r in (rss_bytes(m) for m in members) if r is not None]
    return sum(rss) if rss else None


def cpu_times(pid: int) -> Any | None:
    """psutil's ``pcputimes`` of the process (``user``, ``system``, ``children_user``,
    ``children_system`` in seconds), or None if it is gone."""
    try:
        return psutil.Process(pid).cpu_times()
    except (psutil.Error, ValueError):
        return None


def processes_with_env(name: str, value: str) -> list[int]:
    """Pids of live processes (of this user: others' environments are not readable) whose
    environment has ``name=value``.

    The demo marks every child with a unique id, so this finds its whole tree even after processes
    were re-parented to init (a JVM whose supervisor died, a run worker whose code server died)."""
    me = os.getpid()
    out: list[int] = []
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            found = proc.environ().get(name) == value
        except psutil.Error:
            continue
        if found and process_start_time(proc.pid) is not None:
            out.append(proc.pid)
    return sorted(out)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops a command the way Ctrl-C does (a supervisor stops its children with SIGTERM, and a
    command started as ``cmd &`` from a script ignores SIGINT). Main thread only; restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
