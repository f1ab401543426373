"""The seeded scheduler: actors in greenlets, exactly one running, handed over at every store call.

Each store call of an actor switches back here (:meth:`Scheduler.hook`). The scheduler then picks, with its
seeded RNG, which actor goes on (so calls of different actors are reordered), and what happens to that
actor's pending call: answered, failed with a transient error, its response lost after it was applied, or the
actor killed there for good (like ``kill -9``: no handler or ``finally`` of the actor runs again; what it
staged stays). Simulated time moves one step per call. Same seed, same choices, same trace.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import greenlet

from freshidx.tools.simulation.memstore import Fault

#: One step of the trace: actor, store operation, key, what happened to the call.
Step = tuple[str, str, str, str]
#: Each fault's word in the trace (an Enum's ``.value`` is a slow property, read at every step).
_WORD = {fault: fault.value for fault in Fault}
_OK = _WORD[Fault.NONE]  # the word of nearly every step (looked up once: an Enum's hash is Python code too)


@dataclass(frozen=True)
class FaultRates:
    """Per store call of a faulty actor: the chance it is killed there, that a write's response is lost,
    that the call fails with a transient error."""

    crash: float = 0.004
    lost: float = 0.02
    transient: float = 0.004


class SimClock:
    """The simulated clock: every ``utcnow()`` of the code under test reads it (see ``seams``)."""

    def __init__(self, start: dt.datetime, step: dt.timedelta = dt.timedelta(seconds=1)) -> None:
        self.at = start
        self.step = step

    def now(self) -> dt.datetime:
        return self.at

    def tick(self, steps: int = 1) -> None:
        self.at += self.step if steps == 1 else self.step * steps

    def seconds(self) -> float:
        return self.at.timestamp()


@dataclass
class Actor:
    name: str
    fn: Callable[[], str | None]
    faulty: bool = True
    glet: greenlet.greenlet | None = None
    pending: tuple[str, str, bool] | None = None
    started: bool = False
    crashed: bool = False
    outcome: str = "not run"


class ActorKilled(greenlet.GreenletExit):
    """Raised into a killed actor's greenlet when the schedule is torn down (never caught by the code)."""


@dataclass
class Scheduler:
    rng: random.Random
    clock: SimClock
    rates: FaultRates = field(default_factory=FaultRates)
    max_steps: int = 5000
    trace: list[Step] = field(default_factory=list)
    actors: list[Actor] = field(default_factory=list)
    current: Actor | None = None
    closed: bool = False

    def spawn(self, name: str, fn: Callable[[], str | None], *, faulty: bool = True) -> Actor:
        actor = Actor(name, fn, faulty)
        self.actors.append(actor)
        return actor

    # ---- the store's hook (runs in the actor's greenlet)
    def hook(self, op: str, key: str, write: bool) -> Fault:
        actor = self.current
        if self.closed:
            raise ActorKilled(op)
        if actor is None or actor.glet is None or greenlet.getcurrent() is not actor.glet:
            return Fault.NONE  # setup, recovery and checks call the store directly
        actor.pending = (op, key, write)
        fault: Fault = actor.glet.parent.switch()
        if self.closed:
            raise ActorKilled(op)
        return fault

    # ---- the loop (runs in the main greenlet)
    def run(self, check: Callable[[], None]) -> None:
        live = list(self.actors)
        steps = 0
        decide, clock, step = self._decide, self.clock, self.clock.step
        getrandbits = self.rng.getrandbits
        while live and steps < self.max_steps:
            steps += 1
            # live[rng.randrange(len(live))], inlined: the same draws (Random._randbelow_with_getrandbits)
            n = len(live)
            k = n.bit_length()
            r = getrandbits(k)
            while r >= n:
                r = getrandbits(k)
            actor = live[r]
            fault = decide(actor)
            if fault is None:  # killed at its pending call
                live.remove(actor)
                continue
            clock.at += step
            self.current = actor
            glet = actor.glet
            if glet is None:
                actor.started = True
                glet = actor.glet = greenlet.greenlet(self._body(actor))
                glet.switch()
            else:
                glet.switch(fault)
            self.current = None
            if glet.dead:
                live.remove(actor)
            check()
        for actor in live:  # out of steps: whoever is left is cut off like a killed one
            actor.crashed, actor.outcome = True, "cut off (step limit)"

    def _body(self, actor: Actor) -> Callable[[], None]:
        def body() -> None:
            try:
                actor.outcome = actor.fn() or "done"
            except Exception as exc:  # a failed run: its error is its outcome
                actor.outcome = f"error {type(exc).__name__}: {str(exc)[:160]}"
        return body

    def _decide(self, actor: Actor) -> Fault | None:
        pending = actor.pending
        if pending is None:
            return Fault.NONE
        op, key, write = pending
        actor.pending = None
        fault, word = Fault.NONE, _OK
        if actor.faulty:
            r = self.rng.random()
            rates = self.rates
            if r < rates.crash:
                actor.crashed, actor.outcome = True, f"killed at {op} {key}"
                self.trace.append((actor.name, op, key, "crash"))
                return None
            if write and r < rates.crash + rates.lost and op != "sleep":
                fault = Fault.LOST_RETRIED if op in ("create", "swap") and self.rng.random() < 0.5 else \
                    Fault.LOST_UNKNOWN
                word = _WORD[fault]
            elif r > 1.0 - rates.transient and op != "sleep":
                fault, word = Fault.TRANSIENT, _WORD[Fault.TRANSIENT]
        self.trace.append((actor.name, op, key, word))
        return fault

    def close(self) -> None:
        """Tear down the actors still suspended (killed or cut off): their greenlets end without effects."""
        self.closed = True
        for actor in self.actors:
            if actor.glet is not None and not actor.glet.dead:
                actor.glet.throw(ActorKilled("torn down"))
