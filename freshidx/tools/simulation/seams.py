"""What makes the code under test deterministic inside a simulation: its clock, ids, backoff and caches.

The product code reads the wall clock (``utcnow()``), draws version ids from ``uuid4`` and backs off with
``time.sleep(random())`` after losing a compare-and-swap. While :func:`installed` is active these names, in
the modules that bound them, read the simulation's :class:`Context` instead: the simulated clock, a seeded
RNG, and a sleep that is a scheduling point (the other actors run meanwhile). The Spark step of a compaction
(``write_merged_segment``) writes a tiny synthetic merged segment through the store instead. The ledger's
per-process entry cache is emptied at each schedule, so a schedule never depends on the ones before it.
:func:`installed` also puts :mod:`~freshidx.tools.simulation.memos` in place (pure computations memoized).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import random
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from freshidx.store import ObjectStore
from freshidx.tools.simulation import memos
from freshidx.tools.simulation.scheduler import SimClock

#: Modules whose calls the simulation drives; imported before patching so every binding is replaced.
MODULES = ("freshidx.store.records.base", "freshidx.store.records.index", "freshidx.store.records.ledger_entry",
           "freshidx.publish.commit", "freshidx.publish.retention", "freshidx.delta.compaction_run",
           "freshidx.delta.delta_build", "freshidx.delta.after_build", "freshidx.trigger.ledger",
           "freshidx.trigger.latest_only")


@dataclass
class Context:
    """The current schedule's clock, RNG and store (the store an actor's writes go through)."""

    clock: SimClock
    rng: random.Random
    store: ObjectStore | None = None
    sleeps: list[float] = field(default_factory=list)


_context: Context | None = None


def context() -> Context:
    if _context is None:
        raise RuntimeError("no simulation context: use seams.installed() and seams.begin()")
    return _context


def begin(ctx: Context) -> None:
    """Start a schedule: its context, and no cached ledger entry of an earlier one."""
    global _context
    _context = ctx
    ledger = sys.modules["freshidx.trigger.ledger"]
    with ledger._ENTRY_CACHE_LOCK:  # a per-process cache keyed by store URI
        ledger._ENTRY_CACHE.clear()


def _utcnow() -> Any:
    return context().clock.now()


class _Uuid:
    """``uuid.uuid4`` from the schedule's RNG (version ids are part of keys, so of the schedule)."""

    UUID = uuid.UUID

    @staticmethod
    def uuid4() -> uuid.UUID:
        return uuid.UUID(int=context().rng.getrandbits(128), version=4)


class _Random:
    @staticmethod
    def random() -> float:
        return context().rng.random()


class _Time:
    """``time`` for the publish backoff: monotonic is the simulated clock, a sleep lets the others run."""

    @staticmethod
    def monotonic() -> float:
        return context().clock.seconds()

    @staticmethod
    def sleep(seconds: float) -> None:
        ctx = context()
        ctx.sleeps.append(seconds)
        store = ctx.store
        hook = getattr(store, "hook", None)
        if hook is not None:
            hook("sleep", "", False)


def _merged_writer(_spark: Any, _cfg: Any, inputs: Any, *, index: str, version: str, num_shards: int,
                   written: Any = None) -> list[Any]:
    """The compaction's Spark step: one shard with the files the gate requires, written through the store."""
    from freshidx.tools.simulation.synthetic_build import stage_shard

    store = context().store
    assert store is not None
    return [stage_shard(store, index, version, 0, docs=2, covered=3, commit=True)]


def _targets() -> list[tuple[Any, str, Any]]:
    mods = {name: importlib.import_module(name) for name in MODULES}
    base_now = mods["freshidx.store.records.base"].utcnow
    out: list[tuple[Any, str, Any]] = [
        (m, "utcnow", _utcnow) for name, m in sorted(sys.modules.items())
        if name.startswith("freshidx.") and m is not None and getattr(m, "utcnow", None) is base_now]
    commit, compact = mods["freshidx.publish.commit"], mods["freshidx.delta.compaction_run"]
    out += [(commit, "uuid", _Uuid), (commit, "random", _Random), (commit, "time", _Time),
            (compact, "time", _Time), (compact, "write_merged_segment", _merged_writer)]
    return out


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """Route the code's clock, ids, backoff and the compaction's build through the simulation; undo after."""
    saved = [(m, attr, getattr(m, attr)) for m, attr, _ in _targets()]
    quiet = logging.getLogger("freshidx")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # a lost response makes the code under test warn; thousands of times
    for m, attr, value in _targets():
        setattr(m, attr, value)
    try:
        with memos.installed():
            yield
    finally:
        global _context
        for m, attr, value in saved:
            setattr(m, attr, value)
        quiet.setLevel(level)
        _context = None
