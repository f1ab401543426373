"""Is a run's worker process still there? Pure decisions plus the small ``/proc`` probes they need.

Dagster's ``DefaultRunLauncher`` has no worker health check: a run whose worker died (``kill -9``,
OOM killer, ``dagster dev`` stopped without cleanup) stays ``STARTED`` until ``max_runtime``. The
gRPC server that starts a run records ``Started process for run (pid: N)`` as the run's engine event
(``dagster/_grpc/impl.py``), and that server also evaluates our sensors, so the pid is in our pid
namespace. :func:`judge` decides from those facts; ``freshidx.defs.run_health`` does the Dagster
side (reads events, reports the run failed, writes the ledger). No Dagster import here.

Also the shutdown vocabulary shared by the demo and the attempt counters: a run tagged
:data:`TAG_INTERRUPTED` ended because the operator stopped the system, so it is never a failed
attempt (no hour or partition is parked because someone pressed Ctrl-C).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

TAG_INTERRUPTED = "freshidx/interrupted"
INTERRUPTED_BY_SHUTDOWN = "shutdown"
SHUTDOWN_REASON = "interrupted by shutdown"
PID_EVENT_RE = re.compile(r"Started process for run \(pid: (\d+)\)")
EXIT_EVENT_RE = re.compile(r"Process for run exited \(pid: (\d+)\)")
# A process created this long after the pid was recorded is another process that reused the pid
# (clock-tick rounding of /proc starttime is 10 ms; the event is written after the process started).
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


@dataclass(frozen=True)
class Verdict:
    run_id: str
    action: str  # "fail" (STARTING/STARTED) | "cancel" (CANCELING)
    reason: str


def judge(runs: Iterable[RunFacts], alive: Callable[[int, float], bool]) -> list[Verdict]:
    """Runs whose recorded worker is gone. A run without a recorded pid is left alone (it is either
    still being launched, which run monitoring's start timeout covers, or was executed in-process
    by a test or CLI, where no worker pid exists)."""
    out: list[Verdict] = []
    for r in runs:
        if r.pid is None or r.pid_recorded_at is None:
            continue
        if r.exited_event:
            why = f"run worker (pid {r.pid}) exited without reporting an outcome"
        elif not alive(r.pid, r.pid_recorded_at):
            why = f"run worker (pid {r.pid}) is gone (killed or crashed); detected by freshidx run health"
        else:
            continue
        out.append(Verdict(r.run_id, "cancel" if r.status == "CANCELING" else "fail", why))
    return out


# ------------------------------------------------------------------------------------ /proc probes


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise OSError("no btime in /proc/stat")


def _stat_fields(pid: int) -> list[str]:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2:].split()  # comm may contain spaces and parens


def process_start_time(pid: int) -> float | None:
    """Epoch seconds the process started, or None if it is gone or a zombie."""
    try:
        fields = _stat_fields(pid)
        if fields[0] == "Z":
            return None
        return _boot_time() + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def pid_alive(pid: int, recorded_at: float) -> bool:
    """The process that had ``pid`` at ``recorded_at`` still runs (not a zombie, not a reused pid)."""
    if pid <= 0:
        return False
    if not Path("/proc/self/stat").exists():  # no /proc: existence only
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    started = process_start_time(pid)
    return started is not None and started <= recorded_at + PID_REUSE_SLACK_S


def processes_with_env(name: str, value: str) -> list[int]:
    """Pids of live processes (of this user) whose environment has ``name=value``.

    The demo marks every child with a unique id, so this finds its whole tree even after processes
    were re-parented to init (a JVM whose supervisor died, a run worker whose code server died)."""
    needle = f"{name}={value}".encode()
    me = os.getpid()
    out: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0") and process_start_time(int(entry.name)) is not None:
            out.append(int(entry.name))
    return sorted(out)


def kill_all(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
