"""One schedule: a starting state, the actors running the real code, the invariants, and its trace.

The actors call the functions the pipeline calls after a build (:class:`Protocol`, the seam a planted bug
replaces): the latest-only planner and its ledger (``plan_tick``/``apply``), the micro-batch's refusal and
publication (``refusal_unless_newer``, ``publish_index_draft``: gate, create-once manifest, compare-and-swap,
ledger), a background compaction (``compact_delta``: plan, splice and the rebase), gc (``retention.gc``
against the simulated clock) and rollback (``retention.rollback``). Builds are synthetic
(:mod:`~freshidx.tools.simulation.synthetic_build`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from freshidx.delta.after_build import publish_index_draft, refusal_unless_newer
from freshidx.delta.compaction_run import compact_delta
from freshidx.publish import retention
from freshidx.publish.commit import DraftManifest, PublishResult
from freshidx.settings import Settings
from freshidx.store import ObjectStore, layout
from freshidx.store.partitions import PartitionId
from freshidx.tools.simulation import seams, synthetic_build
from freshidx.tools.simulation.invariants import Checker, Violated, Violation
from freshidx.tools.simulation.memstore import MemStore
from freshidx.tools.simulation.scheduler import FaultRates, Scheduler, SimClock, Step
from freshidx.trigger import ledger
from freshidx.trigger.latest_only import DeltaRun, apply, plan_tick
from freshidx.trigger.lifecycle import Decision, Mark, TriggerId

#: The simulated start (the setup runs two hours before it, so its versions are past the grace).
START = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.UTC)
GRACE = dt.timedelta(minutes=30)
KEEP_LAST = 2
ACTORS = ("loop", "sensor", "backfill", "compaction", "gc", "rollback")


def _identity(store: ObjectStore, actor: str) -> ObjectStore:
    return store


def _gc(store: ObjectStore, keep_last: int, grace: dt.timedelta, now: dt.datetime) -> Any:
    return retention.gc(store, "delta", keep_last, grace, now)


@dataclass(frozen=True)
class Protocol:
    """The code the actors run: the real functions, unless a test plants a bug through this seam."""

    publish_draft: Callable[[ObjectStore, DraftManifest, str], PublishResult] = publish_index_draft
    refusal: Callable[[ObjectStore, DraftManifest, str], PublishResult | None] = refusal_unless_newer
    gc: Callable[[ObjectStore, int, dt.timedelta, dt.datetime], Any] = _gc
    #: The store an actor's calls go through (a planted bug wraps it).
    store_view: Callable[[ObjectStore, str], ObjectStore] = _identity


@dataclass
class Result:
    seed: int
    actors: list[str]
    trace: list[Step]
    outcomes: dict[str, str]
    violation: Violation | None = None

    @property
    def digest(self) -> str:
        text = "\n".join(map("|".join, self.trace)) + "\n" + repr(sorted(self.outcomes.items()))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def short_trace(self, last: int = 12) -> list[str]:
        return [" ".join(s) for s in self.trace[-last:]]


@dataclass
class SimRuns:
    """The runs one trigger (loop or sensor) knows: those it ran itself, none in flight (it runs them inline)."""

    ended: dict[str, str] = field(default_factory=dict)

    def by_run_key(self, run_key: str) -> DeltaRun | None:
        how = self.ended.get(run_key)
        return None if how is None else DeltaRun(run_key, "SUCCESS" if how == "ok" else "FAILURE", False)

    def in_flight(self) -> list[DeltaRun]:
        return []

    def ended_how(self, run_key: str) -> str | None:
        how = self.ended.get(run_key)
        return None if how in (None, "ok") else how

    def last_requested(self) -> str | None:
        return None


@dataclass
class World:
    """The store, the clock and the settings one schedule runs against."""

    seed: int
    protocol: Protocol
    rng: random.Random
    clock: SimClock
    store: MemStore
    settings: Settings
    given: list[PartitionId] = field(default_factory=list)

    def run_id(self, actor: str) -> str:
        return f"{self.rng.getrandbits(32):08x}-{actor}"

    def view(self, actor: str) -> ObjectStore:
        return self.protocol.store_view(self.store, actor)

    # ---- what actors do
    def tick(self, store: ObjectStore, runs: SimRuns, trigger: str, cursor: dict[str, Any]) -> str:
        """One evaluation of the latest-only rule and, if it requests one, the micro-batch."""
        plan = plan_tick(store, self.settings, runs, self.clock.now(), cursor)
        applied = apply(store, plan)
        cursor.update(plan.cursor)
        if applied.request is None:
            return "idle"
        req = applied.request
        run_id = self.run_id(trigger)
        ledger.record_partition(store, "delta", req.partition, Decision.STARTED, f"micro-batch ({trigger})",
                                tid=TriggerId(req.partition.compact).claim(req.attempt).then(Mark.RUN),
                                run_id=run_id, run_key=req.run_key, attempt=req.attempt)
        try:
            outcome = self.publish_partition(store, req.partition, run_id, trigger, req.run_key)
        except Exception as exc:
            runs.ended[req.run_key] = f"{type(exc).__name__}: {str(exc)[:80]}"
            raise
        runs.ended[req.run_key] = "ok" if outcome == "published" else outcome
        return outcome

    def publish_partition(self, store: ObjectStore, p: PartitionId, run_id: str, trigger: str,
                          run_key: str | None = None) -> str:
        draft = synthetic_build.micro_batch(store, self.settings, p, run_id, trigger, run_key)
        refused = self.protocol.refusal(store, draft, run_id)
        result = refused if refused is not None else self.protocol.publish_draft(store, draft, run_id)
        return result.outcome


#: The partitions the upstream writes during a schedule, and the one a backfill rebuilds (published by the setup).
_FRESH = tuple(PartitionId(START - dt.timedelta(minutes=100 - k)) for k in (1, 2, 3))
_BACKFILL = PartitionId(START - dt.timedelta(hours=2, minutes=6))


def actor_bodies(w: World) -> dict[str, Callable[[], str | None]]:
    """What each actor does (each a few store calls long)."""
    s, fresh, backfill = w.settings, _FRESH, _BACKFILL
    w.given += fresh

    def upstream() -> str:
        store = w.view("upstream")
        for p in fresh:
            synthetic_build.write_partition(store, s.source, p)
        return "wrote 3 partitions"

    def loop() -> str:
        store, runs, cursor = w.view("loop"), SimRuns(), {}
        return ",".join(w.tick(store, runs, "continuous", cursor) for _ in range(2))

    def sensor() -> str:  # a run the sensor requested for a partition, racing the loop's micro-batches
        store = w.view("sensor")
        synthetic_build.write_partition(store, s.source, fresh[1])
        return w.publish_partition(store, fresh[1], w.run_id("sensor"), "sensor", f"delta:{fresh[1].compact}:a1")

    def backfill_run() -> str:
        outcome = w.publish_partition(w.view("backfill"), backfill, w.run_id("backfill"), "manual")
        if outcome == "published":
            raise Violated(Violation("backfill-published", f"a backfill of {backfill.path} was published"))
        return outcome

    def compaction() -> str:
        return compact_delta(None, w.view("compaction"), None, s, run_id=w.run_id("compaction")).outcome  # type: ignore[arg-type]

    def gc() -> str:
        report = w.protocol.gc(w.view("gc"), KEEP_LAST, GRACE, w.clock.now())
        return f"gc deleted {len(report.deleted_versions)}"

    def rollback() -> str:
        return f"rolled back to {retention.rollback(w.view('rollback'), 'delta').version}"

    return {"loop": loop, "sensor": sensor, "backfill": backfill_run, "compaction": compaction, "gc": gc,
            "rollback": rollback, "upstream": upstream}


def setup(w: World) -> None:
    """The starting state, fault-free: two hours before START a full version, three delta versions (three
    segments) with their ledger and a staged version abandoned by a crashed build; ten minutes before START a
    compaction and a micro-batch over it (the segments it merged stopped serving then: inside the grace)."""
    s, store = w.settings, w.store
    base = START - dt.timedelta(hours=2)
    w.clock.at = base
    full = synthetic_build.full_version(store, s, base - dt.timedelta(minutes=10), w.run_id("full"))
    publish_index_draft(store, full, full.run_id or "full")
    for k in (8, 6, 4):
        p = PartitionId(base - dt.timedelta(minutes=k))
        synthetic_build.write_partition(store, s.source, p)
        w.publish_partition(store, p, w.run_id("setup"), "sensor")
    synthetic_build.stage_shard(store, "delta", "20300101T0900-20300101T095900-abandon0", 0, docs=1, covered=1)
    w.clock.at = START - dt.timedelta(minutes=10)
    compact_delta(None, store, None, s, run_id=w.run_id("compaction"))  # type: ignore[arg-type]
    w.clock.at = START - dt.timedelta(minutes=5)
    p = PartitionId(base - dt.timedelta(minutes=2))
    synthetic_build.write_partition(store, s.source, p)
    w.publish_partition(store, p, w.run_id("setup"), "sensor")
    w.clock.at = START


def recover(w: World) -> None:
    """After the schedule, fault-free: a newer partition arrives and the loop runs until idle (whatever the
    actors left, the next micro-batch must publish and settle the ledger)."""
    p = PartitionId(START - dt.timedelta(minutes=90))
    synthetic_build.write_partition(w.store, w.settings.source, p)
    w.given.append(p)
    runs, cursor = SimRuns(), {}
    for _ in range(4):
        w.clock.tick(200)  # past LOST_REQUEST_GRACE: requests of killed actors are given up
        if w.tick(w.store, runs, "continuous", cursor) == "idle":
            break


def run_schedule(seed: int, protocol: Protocol | None = None, *, rates: FaultRates | None = None,
                 actors: tuple[str, ...] | None = None, parse_cache: bool = True) -> Result:
    """Run schedule ``seed``: the same seed gives the same actors, choices, trace and result (``parse_cache``:
    the store's cache of parsed JSON, which must not change any of them)."""
    rng = random.Random(seed)
    clock = SimClock(START)
    store = MemStore(clock.now, page_size=rng.choice((2, 5, 1000)), uri=f"sim://{seed}")
    store.parse_cache = parse_cache
    store.objects, store.keys = dict(_starting_state().objects), list(_starting_state().keys)
    w = World(seed, protocol or Protocol(), rng, clock, store, _settings())
    seams.begin(seams.Context(clock, random.Random(rng.getrandbits(64)), store))
    chosen = actors if actors is not None else tuple(a for a in ACTORS if a == "loop" or rng.random() < 0.5)
    sched = Scheduler(random.Random(rng.getrandbits(64)), clock, rates or FaultRates())
    checker = Checker(store, clock, GRACE, KEEP_LAST)
    result = Result(seed, list(chosen), sched.trace, {})
    try:
        checker.start()
        bodies = actor_bodies(w)
        sched.spawn("upstream", bodies["upstream"], faulty=False)
        for name in chosen:
            sched.spawn(name, bodies[name])
        store.hook = sched.hook
        try:
            sched.run(checker.check)
        finally:
            sched.close()
            store.hook = None
        result.outcomes = {a.name: a.outcome for a in sched.actors}
        _backfill_violation(result)
        if not checker.explained(w.given):
            recover(w)
        checker.check()
        checker.final(w.given, result.outcomes)
    except Violated as exc:
        result.violation = exc.violation
    result.outcomes = result.outcomes or {a.name: a.outcome for a in sched.actors}
    return result


_CACHE: dict[str, Any] = {}


def prepare() -> None:
    """Build what every schedule shares (the settings, the starting state) now, with the seams installed."""
    _starting_state()


def _settings() -> Settings:
    """Built once per process (pydantic settings are slow to build)."""
    if "settings" not in _CACHE:
        _CACHE["settings"] = Settings.from_env({}, store="file:///nonexistent-simulation", delta_compact_segments=2,
                                               delta_max_drop_fraction=None)
    return _CACHE["settings"]


def _starting_state() -> MemStore:
    """The state every schedule starts from (:func:`setup`), built once per process with a fixed seed."""
    if "start" not in _CACHE:
        clock = SimClock(START)
        store = MemStore(clock.now, uri="sim://start")
        rng = random.Random(0)
        seams.begin(seams.Context(clock, random.Random(1), store))
        setup(World(-1, Protocol(), rng, clock, store, _settings()))
        _CACHE["start"] = store
    start: MemStore = _CACHE["start"]
    return start


def _backfill_violation(result: Result) -> None:
    outcome = result.outcomes.get("backfill", "")
    if outcome.startswith("error Violated"):
        raise Violated(Violation("backfill-published", outcome))


def pointer_key() -> str:
    return layout.pointer_key("delta")
