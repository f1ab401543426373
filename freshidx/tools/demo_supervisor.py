"""How ``freshidx demo`` keeps its parts running: every child it starts (code server, webserver, daemon,
generator, Spark server) is restarted when it exits, with back-off, and nothing the children leave
behind ends up outside the demo.

* Decisions are pure: :class:`RestartPolicy` and :func:`after_exit` say when a crashed child starts
  again (1 s, doubling up to 30 s; a child that stayed up :attr:`RestartPolicy.stable_s` starts over at
  1 s), :func:`describe_exit` how its exit reads.
* :class:`Supervised` and :class:`Supervisor` do the process effects: start, poll, restart, signal.
* :func:`become_subreaper` makes the demo a child subreaper (Linux): a process whose parent dies (the
  run worker of a crashed code server) is re-parented to the demo instead of init, so it stays in the
  demo's tree; :meth:`Supervisor.poll` reports and reaps such adopted processes, and the stop's sweep
  by ``FRESHIDX_DEMO_ID`` ends them (:mod:`freshidx.tools.demo_stop`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

#: The line :meth:`Supervised._exited` prints for each restart (what, how it exited), as readers of the demo's
#: output find it.
RESTART_LINE = re.compile(r"(\S+) exited \((.+?)\) after \d+s; restart #\d+ in")

#: Linux ``prctl`` option (``<linux/prctl.h>``): orphaned descendants re-parent to this process.
PR_SET_CHILD_SUBREAPER = 36

#: Called with (event kind, one line of text, fields) for every restart and adoption.
Report = Callable[..., None]


# ------------------------------------------------------------------------------------ decisions (pure)


@dataclass(frozen=True)
class RestartPolicy:
    """When a crashed child starts again: ``first_s`` after its first quick crash, doubling per further
    quick crash up to ``cap_s``; an exit after ``stable_s`` of uptime counts as a first crash again."""

    first_s: float = 1.0
    factor: float = 2.0
    cap_s: float = 30.0
    stable_s: float = 60.0

    def delay(self, quick_crashes: int) -> float:
        return min(self.cap_s, self.first_s * self.factor ** max(0, quick_crashes - 1))


@dataclass(frozen=True)
class RestartState:
    """A child's history: restarts so far, and how many exits in a row came before it was stable."""

    restarts: int = 0
    quick_crashes: int = 0


def after_exit(state: RestartState, policy: RestartPolicy, uptime_s: float) -> tuple[RestartState, float]:
    """The state after an exit following ``uptime_s`` seconds up, and the seconds to wait before the restart."""
    quick = state.quick_crashes + 1 if uptime_s < policy.stable_s else 1
    return replace(state, restarts=state.restarts + 1, quick_crashes=quick), policy.delay(quick)


def describe_exit(returncode: int) -> str:
    """``exit 1`` or ``signal 9 (SIGKILL)`` (Popen reports a signal as a negative code)."""
    if returncode >= 0:
        return f"exit {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = "?"
    return f"signal {-returncode} ({name})"


# ------------------------------------------------------------------------------------------- effects


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux ``prctl``); False (nothing changed) elsewhere or on error."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


class Supervised:
    """One child: ``start(restarts)`` makes its process (in a session of its own); :meth:`poll` notices
    its exit and restarts it after the policy's delay."""

    def __init__(self, name: str, start: Callable[[int], subprocess.Popen[bytes]], log: Path,
                 policy: RestartPolicy) -> None:
        self.name, self._start, self.log, self.policy = name, start, log, policy
        self.proc: subprocess.Popen[bytes] | None = None
        self.state = RestartState()
        self._started_at = 0.0
        self._restart_at: float | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self._restart_at is None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.running and self.proc is not None else None

    def start(self) -> None:
        self.proc = self._start(self.state.restarts)
        self._started_at, self._restart_at = time.monotonic(), None

    def poll(self, report: Report) -> None:
        """Restart the child when its back-off is over; schedule (and report) the restart when it exited."""
        now = time.monotonic()
        if self._restart_at is not None:
            if now >= self._restart_at:
                try:
                    self.start()
                except OSError as exc:  # could not even start: the next attempt waits longer
                    self._exited(now, f"start failed: {exc}", report)
            return
        if self.proc is None or self.proc.poll() is None:
            return
        self._exited(now, describe_exit(self.proc.returncode), report)

    def _exited(self, now: float, how: str, report: Report) -> None:
        uptime = now - self._started_at
        self.state, delay = after_exit(self.state, self.policy, uptime)
        self._restart_at = now + delay
        report("restart", f"{self.name} exited ({how}) after {uptime:.0f}s; restart #{self.state.restarts} in "
               f"{delay:g}s (log: {self.log})", child=self.name, exit=how, restarts=self.state.restarts,
               delay_seconds=delay)

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the child's process group (it leads its own session)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)


def stop_children(children: Iterable[Supervised], grace_s: float, sig: int = signal.SIGINT) -> None:
    """Stop children at once: ``sig`` to each group, up to ``grace_s`` for all, then SIGKILL the groups left."""
    live = [c for c in children if c.proc is not None and c.proc.poll() is None]
    for child in live:
        child._restart_at = None  # a stopped child is never restarted
        child.signal_group(sig)
    deadline = time.monotonic() + grace_s
    for child in live:
        assert child.proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(max(0.1, deadline - time.monotonic()))
    for child in live:
        assert child.proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.proc.pid, signal.SIGKILL)  # the group: what the child started stays in it
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(10)


class Supervisor:
    """The demo's children by name; :meth:`poll` restarts the exited ones and reaps adopted orphans."""

    def __init__(self, report: Report, policy: RestartPolicy | None = None) -> None:
        self.report, self.policy = report, policy or RestartPolicy()
        self.children: dict[str, Supervised] = {}
        self.adopted: set[int] = set()
        self.subreaper = become_subreaper()

    def add(self, name: str, start: Callable[[int], subprocess.Popen[bytes]], log: Path) -> Supervised:
        """Start a child now and supervise it from then on."""
        child = Supervised(name, start, log, self.policy)
        self.children[name] = child
        child.start()
        return child

    def get(self, name: str) -> Supervised | None:
        return self.children.get(name)

    def poll(self) -> None:
        for child in list(self.children.values()):
            child.poll(self.report)
        self.reap()

    def restarts(self) -> dict[str, int]:
        return {name: c.state.restarts for name, c in self.children.items() if c.state.restarts}

    def reap(self) -> None:
        """Report processes adopted since the last poll (their parent died) and reap the adopted ones that
        exited. Only pids that are not the supervised children's own: Popen reaps those, and reaping them
        here would lose their exit status."""
        own = {c.proc.pid for c in self.children.values() if c.proc is not None}
        try:
            kids = psutil.Process().children()
        except psutil.Error:
            return
        for kid in kids:
            if kid.pid in own:
                continue
            try:
                status, cmd = kid.status(), " ".join(kid.cmdline())[:120]
            except psutil.Error:
                status, cmd = psutil.STATUS_ZOMBIE, ""
            if status == psutil.STATUS_ZOMBIE:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(kid.pid, os.WNOHANG)
                self.adopted.discard(kid.pid)
            elif kid.pid not in self.adopted:
                self.adopted.add(kid.pid)
                self.report("adopted", f"adopted pid {kid.pid} ({cmd}) after its parent exited; it runs on "
                            "under the demo and is stopped with it", pid=kid.pid, cmdline=cmd)
