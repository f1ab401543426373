"""Is the work on a Spark Connect server progressing? (the supervisor's hang detector)

A failed or slow ``SELECT 1`` probe says little on a loaded machine: a JVM starved of CPU by its own
builds (and by everything else on a 2-core box) answers late, and its own CPU time is a poor hint
too (a starved JVM gets little; an idle one still burns some on heartbeats, GC and the probes). What
matters for the runs holding leases is whether *their jobs move*. Two signals, sampled on every
health tick:

* **the driver's status store**, through the Spark UI REST API on a loopback port the supervisor
  picks (``spark.ui.port``): the driver executor's cumulative completed/failed task counts (never
  dropped by UI retention) and, for active stages, the task counts plus the I/O and shuffle metrics
  that running tasks report with every executor heartbeat (input/output/shuffle records and bytes,
  spill). ``jvmGcTime`` and durations are left out on purpose: they change while nothing progresses.
* **CPU time of the server's Python workers** (every process in the JVM's session but the JVM,
  plus the JVM's reaped children): freshidx's builds run their heavy parts in Python (data source
  reads, ``mapInArrow`` writers), and a single long Python task shows no completions for minutes.
  A worker blocked forever (or one whose JVM is stopped) uses none.

:class:`ProgressTracker` turns samples into a verdict: with leases held, the server is *hung* once
neither signal has moved for ``hang_timeout_s`` — and a passing probe counts as progress only while
the status store shows no active task (an idle server that answers is fine; one that answers while a
leased job sits still is not). Without leases there is nothing to judge here: the supervisor's probe
failure count applies. Without the UI (``spark.ui.enabled=false`` in the user's conf) a passing
probe always counts, so a job blocked in a Python UDF is then not detected.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from freshidx import procs

#: Python worker CPU seconds (summed over the session) that count as progress.
PYTHON_CPU_EPSILON_S = 0.2
# Live (heartbeat-updated) stage fields that only move when tasks do real work. Summed over the active
# stages: a stage that is merely submitted (e.g. an abandoned probe waiting for a task slot) adds zeros.
_STAGE_FIELDS = (
    "numCompleteTasks", "numFailedTasks", "numKilledTasks", "inputBytes", "inputRecords",
    "outputBytes", "outputRecords", "shuffleReadBytes", "shuffleReadRecords", "shuffleWriteBytes",
    "shuffleWriteRecords", "memoryBytesSpilled", "diskBytesSpilled",
)


def python_worker_cpu_s(jvm_pid: int, members: list[int]) -> float | None:
    """CPU seconds of the JVM session's processes other than the JVM (workers and the children they
    reaped) plus the children the JVM reaped (worker daemons that exited); None if the JVM is gone."""
    jvm = procs.cpu_times(jvm_pid)
    if jvm is None:
        return None
    total = float(jvm.children_user + jvm.children_system)  # the JVM's own CPU is no progress signal
    for pid in members:
        if pid == jvm_pid:
            continue
        t = procs.cpu_times(pid)
        if t is not None:
            total += t.user + t.system + t.children_user + t.children_system
    return total


def _get_json(url: str, timeout_s: float) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return json.loads(resp.read())


@dataclass
class StatusSample:
    """What the driver's REST API said (``error`` set if it did not answer)."""

    fingerprint: tuple[Any, ...] | None = None
    active_tasks: int | None = None
    active_stages: int | None = None
    error: str | None = None


@dataclass
class SparkStatusClient:
    """Reads the driver's status store through the Spark UI REST API at ``base`` (``http://h:p``)."""

    base: str
    timeout_s: float = 10.0
    _app: str | None = field(default=None, repr=False)

    def sample(self) -> StatusSample:
        try:
            if self._app is None:
                apps = _get_json(f"{self.base}/api/v1/applications", self.timeout_s)
                self._app = str(apps[0]["id"])
            api = f"{self.base}/api/v1/applications/{self._app}"
            executors = _get_json(f"{api}/executors", self.timeout_s)
            stages = _get_json(f"{api}/stages?status=active", self.timeout_s)
        except (OSError, ValueError, KeyError, IndexError, urllib.error.URLError) as exc:
            return StatusSample(error=f"{type(exc).__name__}: {exc}"[:300])
        execs = tuple(sorted((str(e.get("id")), e.get("completedTasks"), e.get("failedTasks"), e.get("totalTasks"))
                             for e in executors))
        live = tuple(sum(int(s.get(k) or 0) for s in stages) for k in _STAGE_FIELDS)
        active = sum(int(e.get("activeTasks") or 0) for e in executors)
        return StatusSample(fingerprint=(execs, live), active_tasks=active, active_stages=len(stages))


@dataclass
class Verdict:
    progressed: bool
    stalled_s: float  # since the last progress (0 when it just progressed or nothing is leased)
    hung: bool
    why: str


class ProgressTracker:
    """Remembers the last time the leased work moved; see the module docstring."""

    def __init__(self, hang_timeout_s: float) -> None:
        self.hang_timeout_s = hang_timeout_s
        self.reset(0.0)

    def reset(self, now: float) -> None:
        """A new JVM (or no leases): the clock starts again."""
        self._last_progress = now
        self._fingerprint: tuple[Any, ...] | None = None
        self._cpu_mark: float | None = None
        self._leased = False

    def observe(self, now: float, *, leased: bool, probe_ok: bool, status: StatusSample | None,
                python_cpu_s: float | None) -> Verdict:
        if not leased:
            self.reset(now)
            return Verdict(False, 0.0, False, "no leases")
        why = []
        if not self._leased:
            self._leased = True
            self._last_progress = now
            why.append("leases appeared")
        fingerprint = status.fingerprint if status is not None else None
        if fingerprint is not None and fingerprint != self._fingerprint:
            if self._fingerprint is not None:
                why.append("tasks/stages moved")
            self._fingerprint = fingerprint
        if python_cpu_s is not None:
            if self._cpu_mark is None or python_cpu_s < self._cpu_mark:  # first sample, or a worker exited
                self._cpu_mark = python_cpu_s
            elif python_cpu_s - self._cpu_mark >= PYTHON_CPU_EPSILON_S:
                why.append(f"python workers used {python_cpu_s - self._cpu_mark:.1f}s CPU")
                self._cpu_mark = python_cpu_s
        active = None if status is None else status.active_tasks
        # Answers and nothing runs: idle, fine. Without a UI we cannot tell, so a passing probe counts;
        # a UI that did not answer this time (a starved JVM) proves nothing either way.
        if probe_ok and (status is None or active == 0):
            why.append("probe ok, no active task" if status is not None else "probe ok (no status API)")
        if why:
            self._last_progress = now
            return Verdict(True, 0.0, False, "; ".join(why))
        stalled = now - self._last_progress
        return Verdict(False, stalled, stalled >= self.hang_timeout_s,
                       f"no progress for {stalled:.0f}s (probe {'ok' if probe_ok else 'failed'}, "
                       f"active tasks {active}, status {'ok' if status and not status.error else 'unavailable'})")


_UI_STARTED_RE = re.compile(rb"Successfully started service '?SparkUI'? on port (\d+)")


def ui_port_from_log(chunk: bytes) -> int | None:
    """The port the starting driver's UI bound (Spark moves to port+1… if the chosen one is taken)."""
    m = _UI_STARTED_RE.search(chunk)
    return int(m.group(1)) if m else None
