"""Is a run's worker process still there? Pure decisions plus the one process probe they need.

Dagster's ``DefaultRunLauncher`` has no worker health check: a run whose worker died (``kill -9``,
OOM killer, ``dagster dev`` stopped without cleanup) stays ``STARTED`` until ``max_runtime``. The
run worker records ``Started process for run (pid: N)`` as the run's engine event
(``dagster/_grpc/impl.py``; ``dagster api execute_run``, which other launchers run in a pod or
container of its own, writes the same line), so the pid alone does not say in which pid namespace it
lives. A freshidx run worker therefore tags its run with :data:`TAG_WORKER` (:func:`worker_identity`:
pid, host name, pid namespace) as its resources are set up, and a pid is checked only where it belongs:
a run whose tag names another host or namespace is never judged here; a run without the tag (killed
before it got that far, or not a freshidx run) only if this code location launched it, whose workers
the ``DefaultRunLauncher`` starts as children of its code server, the process that evaluates the
sensor. :func:`judge` decides from those facts; ``freshidx.defs.runs.health`` does the Dagster
side (reads events, reports the run failed, writes the ledger). No Dagster import here; the process
questions themselves are :mod:`freshidx.procs`.

Also the shutdown vocabulary shared by the demo and the attempt counters: a run tagged
:data:`TAG_INTERRUPTED` ended because the operator stopped the system, so it is never a failed
attempt (no hour or partition is parked because someone pressed Ctrl-C).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from freshidx import procs

TAG_INTERRUPTED = "freshidx/interrupted"
#: ``<pid>@<host>/<pid namespace>`` of the process running the run (written by the run worker itself)
TAG_WORKER = "freshidx/worker"
INTERRUPTED_BY_SHUTDOWN = "shutdown"
SHUTDOWN_REASON = "interrupted by shutdown"
PID_EVENT_RE = re.compile(r"Started process for run \(pid: (\d+)\)")
EXIT_EVENT_RE = re.compile(r"Process for run exited \(pid: (\d+)\)")
# A process created this long after the pid was recorded is another process that reused the pid
# (clock-tick rounding of a process's start time is 10 ms; the event is written after the process started).
PID_REUSE_SLACK_S = 2.0


def is_interrupted(tags: Mapping[str, str]) -> bool:
    """True for runs ended by a stop of the demo/system rather than by their own failure."""
    return bool(tags.get(TAG_INTERRUPTED))


def worker_pid(messages: Iterable[tuple[str, float]]) -> tuple[int | None, float | None, bool]:
    """``(pid, recorded_at, exited)`` from a run's engine-event messages ``(message, timestamp)``."""
    pid: int | None = None
    at: float | None = None
    exited = False
    for message, ts in messages:
        m = PID_EVENT_RE.search(message or "")
        if m:
            pid, at = int(m.group(1)), ts
        elif pid is not None and (e := EXIT_EVENT_RE.search(message or "")) and int(e.group(1)) == pid:
            exited = True
    return pid, at, exited


@dataclass(frozen=True)
class RunFacts:
    run_id: str
    status: str  # STARTING | STARTED | CANCELING
    pid: int | None
    pid_recorded_at: float | None  # epoch seconds of the engine event
    exited_event: bool = False
    worker: str | None = None  # TAG_WORKER, if the worker got far enough to write it
    launched_here: bool = True  # by this code location (its code server started the worker)


@dataclass(frozen=True)
class Verdict:
    run_id: str
    action: str  # "fail" (STARTING/STARTED) | "cancel" (CANCELING)
    reason: str


def pid_namespace() -> str:
    """This process's pid namespace (``pid:[4026531836]``), "" where ``/proc`` does not say."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def here() -> str:
    """Where a pid means this process's pids: host name and pid namespace."""
    return f"{socket.gethostname()}/{pid_namespace()}"


def worker_identity() -> str:
    """The :data:`TAG_WORKER` value of this process."""
    return f"{os.getpid()}@{here()}"


def judged_here(r: RunFacts, place: str) -> bool:
    """Whether ``r``'s recorded pid can be checked in ``place`` (:func:`here`): the worker's tag says it
    ran there; without a tag, only a run this code location launched (never one from elsewhere)."""
    if r.worker:
        return r.worker.partition("@")[2] == place
    return r.launched_here


def judge(runs: Iterable[RunFacts], alive: Callable[[int, float], bool], place: str | None = None) -> list[Verdict]:
    """Runs whose recorded worker is gone. A run without a recorded pid is left alone (it is either
    still being launched, which run monitoring's start timeout covers, or was executed in-process
    by a test or CLI, where no worker pid exists), and so is one whose worker is (or may be) in another
    host or pid namespace (:func:`judged_here`)."""
    place = here() if place is None else place
    out: list[Verdict] = []
    for r in runs:
        if r.pid is None or r.pid_recorded_at is None or not judged_here(r, place):
            continue
        if r.exited_event:
            why = f"run worker (pid {r.pid}) exited without reporting an outcome"
        elif not alive(r.pid, r.pid_recorded_at):
            why = f"run worker (pid {r.pid}) is gone (killed or crashed); detected by freshidx run health"
        else:
            continue
        out.append(Verdict(r.run_id, "cancel" if r.status == "CANCELING" else "fail", why))
    return out


# ------------------------------------------------------------------------------------ the probe


def pid_alive(pid: int, recorded_at: float) -> bool:
    """The process that had ``pid`` at ``recorded_at`` still runs (not a zombie, not a reused pid)."""
    if pid <= 0:
        return False
    started = procs.process_start_time(pid)
    return started is not None and started <= recorded_at + PID_REUSE_SLACK_S
