"""The chaos bench's view of the store while it runs: the delta pointer polled a few times a second in a
thread (:class:`PointerWatch`), and the continuous run's heartbeat (:func:`looping_run_id`). It reads the
store directly, never through the fault proxy: the faults are for the system under test, not for the
measurement. Read-only."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from freshidx.publish.commit import read_pointer
from freshidx.store import ObjectStore, layout
from freshidx.store.partitions import PartitionError, PartitionId
from freshidx.store.records import Heartbeat
from freshidx.tools.chaos.verdict import Observation

POLL_S = 0.25


def source_partition(store: ObjectStore, index: str = "delta") -> PartitionId | None:
    """The partition the index's pointer says it covers up to (read now), None if none or unreadable."""
    pointer, _ = read_pointer(store, index)
    if pointer is None or not pointer.source_partition:
        return None
    try:
        return PartitionId.parse(pointer.source_partition)
    except PartitionError:
        return None


class PointerWatch:
    """``with PointerWatch(store, clock) as watch: ... watch.observations()``; ``clock`` gives the
    bench's seconds."""

    def __init__(self, store: ObjectStore, clock: Callable[[], float], index: str = "delta") -> None:
        self.store = store
        self.clock = clock
        self.index = index
        self.read_errors = 0
        self._obs: list[Observation] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-pointer-watch", daemon=True)

    def __enter__(self) -> PointerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def observations(self) -> list[Observation]:
        with self._lock:
            return list(self._obs)

    def latest(self) -> Observation | None:
        with self._lock:
            return self._obs[-1] if self._obs else None

    def source_partition(self) -> PartitionId | None:
        """The partition the served delta covers up to (read now)."""
        return source_partition(self.store, self.index)

    def _run(self) -> None:
        last: tuple[int, str] | None = None
        while not self._stop.wait(POLL_S):
            t = self.clock()
            try:
                pointer, _ = read_pointer(self.store, self.index)
            except Exception:  # a read error is counted, and the next poll tries again
                self.read_errors += 1
                continue
            if pointer is None or (pointer.seq, pointer.version) == last:
                continue
            last = (pointer.seq, pointer.version)
            with self._lock:
                self._obs.append(Observation(round(t, 2), pointer.seq, pointer.position, pointer.version))


def looping_run_id(store: ObjectStore) -> str | None:
    """The run id in the continuous heartbeat (None: no heartbeat yet, or it ended)."""
    try:
        hb, _ = Heartbeat.read_if_exists(store, layout.continuous_heartbeat_key())
    except Exception:  # unreadable now: the caller falls back to the job name
        return None
    if hb is None or hb.ended:
        return None
    return hb.run_id


def wait_until(done: Callable[[], bool], timeout_s: float, every_s: float = 1.0) -> bool:
    """Poll ``done`` until it is true or ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if done():
                return True
        except Exception:  # a transient read error: poll again
            pass
        time.sleep(every_s)  # polling interval
    return False
