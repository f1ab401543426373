"""A reader that follows the published pointers (docs/operations.md#serving-a-reader-that-follows-the-pointers).

:class:`PointerFollower` calls :meth:`Searcher.refresh <freshidx.serve.searcher.Searcher.refresh>` every
``interval_s`` in a background thread, so a new version is served one load after it is published plus at
most the interval, without the application polling. A refresh that fails (a store that does not answer, a
version that cannot be served) leaves the current versions serving and is tried again at the next tick.
Each tick reads the two small pointer objects: at the default interval that is 20 reads a second per reader.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from freshidx.serve.refresh_timings import RefreshTimings
    from freshidx.serve.searcher import Searcher
    from freshidx.serve.versions import VersionSet

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 0.05

#: Called after each swap with the new version set, where the refresh spent its time and the wall time it
#: started.
OnSwap = Callable[["VersionSet", "RefreshTimings", float], None]


class PointerFollower:
    """Refresh ``searcher`` every ``interval_s`` until :meth:`stop`; use as a context manager."""

    def __init__(self, searcher: Searcher, interval_s: float = DEFAULT_INTERVAL_S, on_swap: OnSwap | None = None
                 ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.searcher = searcher
        self.interval_s = interval_s
        self.on_swap = on_swap
        self.last_error: BaseException | None = None  # the last refresh's error; None once one succeeds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="freshidx-pointer-follower", daemon=True)

    def start(self) -> PointerFollower:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def __enter__(self) -> PointerFollower:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def tick(self) -> bool:
        """One refresh; True if it swapped in new versions. Errors are kept in :attr:`last_error`, not raised."""
        started = time.time()
        try:
            changed = self.searcher.refresh()
        except Exception as exc:
            if self.last_error is None or str(self.last_error) != str(exc):
                log.warning("refresh failed, still serving %s: %s", self.searcher.versions(), exc)
            self.last_error = exc
            return False
        self.last_error = None
        timings = self.searcher.last_refresh
        if changed and self.on_swap is not None and timings is not None:
            self.on_swap(self.searcher.current, timings, started)
        return changed

    def _run(self) -> None:
        while not self._stop.is_set():
            self.tick()
            self._stop.wait(self.interval_s)
