"""The Connect session's memory through a bench run, not only at its end (docs/benchmarks.md).

The end of a run is one instant: a worker mid-task then, or a worker of another session not yet gone idle,
moves the figure by GiBs from one run to the next. A sampler on a thread of the bench's own reads the
session's summed RSS every second and keeps the highest, with the bench's phase then: what a host must have
for the session, where the end says what it keeps.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from freshidx.tools.bench_common import session_usage

#: Seconds between two samples: a micro-batch's peak lasts several (its tasks' merge and index steps).
INTERVAL_S = 1.0


class SessionPeak:
    """The highest summed RSS of the session whose leader ``pid()`` names (``None``: no server up), sampled
    every ``interval_s`` from :meth:`start` to :meth:`stop`; ``phase()`` labels a sample."""

    def __init__(self, pid: Callable[[], int | None], phase: Callable[[], str], *,
                 interval_s: float = INTERVAL_S) -> None:
        self._pid = pid
        self._phase = phase
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._peak: dict[str, Any] | None = None
        self._samples = 0

    def sample(self) -> None:
        """One sample: the session's summed RSS now, kept if it is the highest so far."""
        pid = self._pid()
        if not isinstance(pid, int):
            return
        rss, processes = session_usage(pid)
        if rss is None:
            return
        with self._lock:
            self._samples += 1
            if self._peak is None or rss > self._peak["bytes"]:
                self._peak = {"bytes": rss, "processes": processes, "phase": self._phase()}

    def start(self) -> SessionPeak:
        def loop() -> None:
            while not self._stop.wait(self._interval_s):  # the interval's timer, not a synchronisation
                self.sample()

        self._thread = threading.Thread(target=loop, name="freshidx-bench-session-peak", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, Any] | None:
        """Stop sampling; the peak (``bytes``, ``processes``, ``phase``, and ``samples`` taken), or ``None``
        if no sample found the session."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            return None if self._peak is None else {**self._peak, "samples": self._samples}
