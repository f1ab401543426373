"""When the chaos bench kills, and what (pure, seeded): :class:`KillPlan`.

The targets are the parts of ``freshidx demo`` (:mod:`freshidx.tools.chaos.targets` finds their
processes). A target with no process at the moment (no other run in flight) is not chosen: the choice
is drawn again among those that have one.
"""

from __future__ import annotations

import random
from collections.abc import Collection
from dataclasses import dataclass, field

CONTINUOUS_WORKER = "continuous-worker"
RUN_WORKER = "run-worker"
SPARK_JVM = "spark-jvm"
DAEMON = "daemon"
WEBSERVER = "webserver"
CODE_SERVER = "code-server"
GENERATOR = "generator"
TARGETS: tuple[str, ...] = (CONTINUOUS_WORKER, RUN_WORKER, SPARK_JVM, DAEMON, WEBSERVER, CODE_SERVER, GENERATOR)
#: Kills whose recovery the summary groups as ``run`` (a run worker, the continuous one or another).
RUN_TARGETS = frozenset({CONTINUOUS_WORKER, RUN_WORKER})
#: The demo's own children: it restarts each (the JVM is its Spark server's child: a spare takes over).
SUPERVISED: tuple[str, ...] = (DAEMON, WEBSERVER, CODE_SERVER, GENERATOR)


@dataclass
class KillPlan:
    """Seeded: the same seed, interval and availabilities give the same kills."""

    seed: int
    min_s: float = 30.0
    max_s: float = 90.0
    targets: tuple[str, ...] = TARGETS
    _rng: random.Random = field(init=False, repr=False)
    _redraw: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.min_s <= self.max_s:
            raise ValueError(f"the kill interval must satisfy 0 < MIN <= MAX, got {self.min_s} {self.max_s}")
        unknown = set(self.targets) - set(TARGETS)
        if not self.targets or unknown:
            raise ValueError(f"targets must be a non-empty subset of {', '.join(TARGETS)}, got {self.targets}")
        self._rng = random.Random(self.seed)
        # Redraws come from their own sequence: what is there at one kill does not shift later choices.
        self._redraw = random.Random(self.seed + 1)

    def next_delay(self) -> float:
        """Seconds until the next kill."""
        return self._rng.uniform(self.min_s, self.max_s)

    def choose(self, available: Collection[str]) -> str | None:
        """The target of this kill among those with a process now (``None``: none has one). The draw is
        made over every target first, so a seed's sequence does not depend on what happens to be there."""
        first = self._rng.choice(self.targets)
        if first in available:
            return first
        left = [t for t in self.targets if t in available]
        return self._redraw.choice(left) if left else None


def kill_times(plan: KillPlan, duration_s: float) -> list[float]:
    """Offsets (seconds from the start of the kill phase) of every kill a phase of ``duration_s`` holds."""
    out: list[float] = []
    at = plan.next_delay()
    while at <= duration_s:
        out.append(at)
        at += plan.next_delay()
    return out
