"""The deterministic simulation of the commit protocol (docs/architecture.md#deterministic-simulation).

Schedules of the real publish / ledger / compaction / gc / rollback code over the in-memory store hold every
invariant; the same seed gives the same trace; and bugs planted through the simulator's seams (the store an
actor's calls go through, the gc the actors run) are found.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest

from freshidx.publish import retention
from freshidx.store import ListPage, ObjectInfo, ObjectStore, StoredObject
from freshidx.tools.bench_simulate import simulate
from freshidx.tools.simulation import memos, seams, world
from freshidx.tools.simulation.world import Protocol

#: Schedules the fast lane runs, as two items (seed ranges) that `pytest -n 2` runs on both workers
#: (docs/benchmarks.md has the rate; `freshidx bench simulate` runs more).
SCHEDULES = 10_000
PARTS = 2
#: Within how many schedules a planted bug must be found.
FIND_WITHIN = 400


@pytest.fixture(autouse=True)
def simulation() -> Iterator[None]:
    with seams.installed():
        yield


class View(ObjectStore):
    """An actor's view of the store that passes every call on (a planted bug overrides one)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner, self.uri, self.stats = inner, inner.uri, inner.stats

    def get(self, key: str) -> StoredObject:
        return self.inner.get(key)

    def head(self, key: str) -> ObjectInfo:
        return self.inner.head(key)

    def put(self, key: str, data: bytes) -> str:
        return self.inner.put(key, data)

    def create(self, key: str, data: bytes) -> str:
        return self.inner.create(key, data)

    def swap(self, key: str, data: bytes, expected_etag: str | None) -> str:
        return self.inner.swap(key, data, expected_etag)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def _list_page(self, prefix: str, *, delimiter: str | None, start_after: str | None, max_keys: int,
                   continuation: str | None) -> tuple[ListPage, str | None]:
        return self.inner._list_page(prefix, delimiter=delimiter, start_after=start_after, max_keys=max_keys,
                                     continuation=continuation)


class PlainPutOfCurrent(View):
    """Planted bug (a): the pointer is written with a plain PUT, its compare-and-swap precondition skipped."""

    def swap(self, key: str, data: bytes, expected_etag: str | None) -> str:
        return self.inner.put(key, data) if key.endswith("/CURRENT") else self.inner.swap(key, data, expected_etag)


class CurrentBeforeManifest(View):
    """Planted bug (c): the manifest is written only after the pointer moved to its version."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.held: list[tuple[str, bytes]] = []

    def create(self, key: str, data: bytes) -> str:
        if key.startswith("indexes/") and key.endswith("/manifest.json"):
            self.held.append((key, data))
            return "held"
        return self.inner.create(key, data)

    def get(self, key: str) -> StoredObject:
        for held, data in self.held:  # the writer reads its own manifest back (create_or_same)
            if held == key:
                return StoredObject(key, data, "held")
        return self.inner.get(key)

    def swap(self, key: str, data: bytes, expected_etag: str | None) -> str:
        etag = self.inner.swap(key, data, expected_etag)
        while self.held:
            self.inner.create(*self.held.pop(0))
        return etag


def _gc_without_grace(store: ObjectStore, keep_last: int, grace: dt.timedelta, now: dt.datetime) -> object:
    """Planted bug (b): gc plans with no grace at all."""
    return retention.gc(store, "delta", keep_last, dt.timedelta(0), now)


def first_violation(protocol: Protocol) -> tuple[int, str] | None:
    for seed in range(FIND_WITHIN):
        r = world.run_schedule(seed, protocol)
        if r.violation is not None:
            return seed, r.violation.invariant
    return None


@pytest.mark.parametrize("part", range(PARTS))
def test_schedules_hold_every_invariant(part: int) -> None:
    """Interleavings, lost responses, transient errors and kills at any store call: no invariant breaks."""
    told: list[int] = []
    count = SCHEDULES // PARTS
    r = simulate(count, seed=part * count, workers=1, progress=lambda done, found, seconds: told.append(done))
    print(f"seeds {part * count}..{(part + 1) * count - 1}: {r['schedules_per_s']} schedules/s in {r['seconds']} s")
    assert r["schedules"] == count
    assert r["violations"] == [], r["violations"][:3]
    assert told == sorted(told) and told[-1] == count  # a long run says how far it is


def test_the_same_seed_gives_the_same_trace() -> None:
    first = [world.run_schedule(seed) for seed in range(30)]
    again = [world.run_schedule(seed) for seed in range(30)]
    assert [r.digest for r in first] == [r.digest for r in again]
    assert [r.outcomes for r in first] == [r.outcomes for r in again]
    assert len({r.digest for r in first}) == 30  # and the seeds do give different schedules


def test_the_parse_cache_changes_no_schedule() -> None:
    """The store hands out shared parsed JSON (memstore.py): were some code to change what it read in place,
    the schedules would go otherwise than with every body parsed anew."""
    cached = [world.run_schedule(seed) for seed in range(200)]
    fresh = [world.run_schedule(seed, parse_cache=False) for seed in range(200)]
    assert [(r.digest, r.outcomes, r.violation) for r in cached] == [(r.digest, r.outcomes, r.violation) for r in fresh]


def test_the_memos_change_no_schedule() -> None:
    """The simulator memoizes pure computations of the code under test and shares the records it reads
    (memos.py): with the product's own functions and every body parsed anew, the schedules go the same."""
    memoized = [world.run_schedule(seed) for seed in range(200)]
    with memos.suspended():
        plain = [world.run_schedule(seed, parse_cache=False) for seed in range(200)]
    outcome = [(r.digest, r.outcomes, r.violation) for r in memoized]
    assert outcome == [(r.digest, r.outcomes, r.violation) for r in plain]


@pytest.mark.parametrize(("plant", "protocol", "invariants"), [
    ("publish without compare-and-swap", Protocol(store_view=lambda s, actor: PlainPutOfCurrent(s)),
     {"pointer-monotonic"}),
    ("gc ignoring the grace", Protocol(gc=_gc_without_grace), {"gc-deleted-young", "visible-intact"}),
    ("CURRENT before the manifest", Protocol(store_view=lambda s, actor: CurrentBeforeManifest(s)),
     {"visible-intact"}),
])
def test_a_planted_bug_is_found(plant: str, protocol: Protocol, invariants: set[str]) -> None:
    found = first_violation(protocol)
    assert found is not None, f"{plant}: not found within {FIND_WITHIN} schedules"
    seed, invariant = found
    assert invariant in invariants, (plant, seed, invariant)
    again = world.run_schedule(seed, protocol)  # the printed seed reproduces it
    assert again.violation is not None and again.violation.invariant == invariant
