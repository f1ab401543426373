"""The processes of a running ``freshidx demo`` that the chaos bench can kill, by kind.

Everything the demo runs is in its process tree: it starts each part itself and is a child subreaper,
so run workers whose code server died stay below it (:mod:`freshidx.tools.demo_supervisor`). A process
is told by its command line (:func:`kind_of`, pure):

* ``dagster code-server start`` (the code server; its gRPC child is not a target of its own),
  ``dagster_webserver``, ``dagster._daemon``, ``freshidx.tools.generate``;
* the Spark Connect JVM (``SparkConnectServer`` on a ``java`` command line);
* run workers: the pid each run in flight records in its ``freshidx/worker`` tag (``<pid>@<host>/<ns>``,
  written by the worker itself: :func:`freshidx.trigger.run_health.worker_identity`), read from the demo's
  Dagster instance, and only if that pid is in the demo's tree. (The code server starts each run in a
  ``multiprocessing`` child whose command line names no run.) The continuous run's worker is the one
  whose run id is in the continuous heartbeat in the store (``continuous/delta/heartbeat.json``: the run
  that is looping now, whatever runs wait beside it); before any heartbeat, the worker of a
  ``delta_continuous`` run.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from freshidx.tools.chaos.kill_plan import (
    CODE_SERVER,
    CONTINUOUS_WORKER,
    DAEMON,
    GENERATOR,
    RUN_WORKER,
    SPARK_JVM,
    WEBSERVER,
)

CONTINUOUS_JOB = "delta_continuous"


@dataclass(frozen=True)
class Proc:
    pid: int
    kind: str | None  # a :mod:`~freshidx.tools.chaos.kill_plan` target (run workers excepted), or None


@dataclass(frozen=True)
class RunWorker:
    run_id: str
    job_name: str
    pid: int


def kind_of(cmdline: Sequence[str]) -> str | None:
    """The target kind of a process of the demo's tree, from its command line (None: not a target, or a
    run worker: those are known by their runs)."""
    args = list(cmdline)
    if args and args[0].endswith("java") and "org.apache.spark.sql.connect.service.SparkConnectServer" in args:
        return SPARK_JVM
    if _follows(args, "code-server", "start"):
        return CODE_SERVER
    for module, kind in (("dagster_webserver", WEBSERVER), ("dagster._daemon", DAEMON),
                         ("freshidx.tools.generate", GENERATOR)):
        if _follows(args, "-m", module):
            return kind
    return None


def _follows(args: list[str], first: str, second: str) -> bool:
    return any(a == first and b == second for a, b in itertools.pairwise(args))


def worker_pid(tag: str | None) -> int | None:
    """The pid of a ``freshidx/worker`` tag value ``<pid>@<host>/<ns>``."""
    head = (tag or "").partition("@")[0]
    return int(head) if head.isdigit() else None


def classify(procs: Sequence[Proc], workers: Sequence[RunWorker], looping_run_id: str | None) -> dict[str, list[int]]:
    """Pids per target kind; run workers (those in the tree) split into the continuous run's and the others."""
    out: dict[str, list[int]] = {}
    in_tree = {p.pid for p in procs}
    for p in procs:
        if p.kind is not None:
            out.setdefault(p.kind, []).append(p.pid)
    mine = [w for w in workers if w.pid in in_tree]
    looping = [w for w in mine if w.run_id == looping_run_id]
    if not looping and not any(w.run_id == looping_run_id for w in workers):
        looping = [w for w in mine if w.job_name == CONTINUOUS_JOB][:1]
    for w in mine:
        out.setdefault(CONTINUOUS_WORKER if w in looping else RUN_WORKER, []).append(w.pid)
    return out


def run_workers(instance: Any) -> list[RunWorker]:
    """Runs in flight (starting or started) whose worker has tagged its pid, from the Dagster instance."""
    import dagster as dg

    from freshidx.trigger.run_health import TAG_WORKER

    runs = instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]),
                             limit=100)
    out = []
    for r in runs:
        pid = worker_pid(r.tags.get(TAG_WORKER))
        if pid is not None:
            out.append(RunWorker(r.run_id, r.job_name, pid))
    return out


def demo_tree(demo_pid: int) -> list[Proc]:
    """Every live process below the demo, with its kind (processes that vanish meanwhile are skipped)."""
    try:
        children = psutil.Process(demo_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out: list[Proc] = []
    for child in children:
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            cmd = child.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        out.append(Proc(child.pid, kind_of(cmd)))
    return out


def find_targets(demo_pid: int, instance: Any, looping_run_id: str | None) -> dict[str, list[int]]:
    """Pids per target kind in the demo's tree now (of the Spark JVMs, the serving one)."""
    found = classify(demo_tree(demo_pid), run_workers(instance), looping_run_id)
    if len(found.get(SPARK_JVM, [])) > 1:
        found[SPARK_JVM] = serving_jvms(found[SPARK_JVM])
    return found


def option_value(args: Sequence[str], name: str) -> str | None:
    """The value of ``name VALUE`` or ``name=VALUE`` in a command line."""
    for a, b in itertools.pairwise([*args, ""]):
        if a == name:
            return b or None
        if a.startswith(name + "="):
            return a.partition("=")[2]
    return None


def serving_jvms(pids: list[int]) -> list[int]:
    """The JVMs among ``pids`` that their supervisor's state.json names as serving: a warm spare
    (``freshidx spark-server --spare``) is not the target a JVM kill means. All of them if none is named."""
    from pathlib import Path

    from freshidx.spark_server.server_state import read_state

    serving = []
    for pid in pids:
        try:
            parent = psutil.Process(pid).parent()
            args, cwd = (parent.cmdline(), parent.cwd()) if parent is not None else ([], "/")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        state_dir = option_value(args, "--state-dir")
        state = read_state(Path(cwd) / state_dir) if state_dir else None
        if state is not None and state.get("pid") == pid:
            serving.append(pid)
    return serving or pids


def kill(pid: int) -> bool:
    """SIGKILL one process; False if it was gone already."""
    try:
        psutil.Process(pid).kill()
    except psutil.NoSuchProcess:
        return False
    return True


__all__ = ["CODE_SERVER", "CONTINUOUS_WORKER", "DAEMON", "GENERATOR", "RUN_WORKER", "SPARK_JVM", "WEBSERVER", "Proc",
           "RunWorker", "classify", "demo_tree", "find_targets", "kill", "kind_of", "option_value", "run_workers",
           "serving_jvms", "worker_pid"]
