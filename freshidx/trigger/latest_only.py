"""Latest-only triggering of the delta index, without Dagster: observe → plan → act
(docs/architecture.md#latest-only-delta).

:func:`plan_tick` reads the store (pointer, bounded listing, the newest partition's ledger entries)
and a :class:`DeltaRunIndex` that answers questions about runs, and returns a :class:`DeltaPlan`: the
ledger entries to create, the observations each created entry earns, and either ONE run request
(for the newest visible partition, as attempt ``N``) or the reason for skipping. :func:`apply`
writes the plan (create-once, so a racing evaluation loses cleanly); for the continuous loop, which runs its
request itself, also the attempt's start. The sensor
(``freshidx.defs.delta.sensor``) only adapts both to Dagster, like ``freshidx.sla.check_rules`` and
``freshidx.defs.sla.checks``. The types are the vocabulary the catch-up planner speaks too
(:mod:`freshidx.trigger.tick_plan`), with what only this rule needs.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from freshidx.publish.commit import parse_iso, read_pointer
from freshidx.settings import Settings
from freshidx.store import ObjectStore
from freshidx.store.partitions import PartitionId
from freshidx.trigger import ledger
from freshidx.trigger.lifecycle import LOST_REQUEST_GRACE, Decision, Mark, TriggerId, attempt_state
from freshidx.trigger.listing import Ignored, Listing, partitions_after
from freshidx.trigger.tick_plan import Record, RunIndex, TickPlan, claims_won

PIPELINE = "delta"


@dataclass(frozen=True)
class DeltaRun:
    """What the planner needs of one run (a :class:`freshidx.trigger.tick_plan.RunView`; the sensor answers from
    the Dagster instance)."""

    run_id: str
    status: str  # as Dagster spells it ("STARTED", "QUEUED", …): shown in skip reasons
    in_flight: bool
    target: str | None = None  # partition path it builds; None: the newest it sees when it starts
    interrupted: bool = False  # ended by a shutdown: not a failed attempt


class DeltaRunIndex(RunIndex[DeltaRun], Protocol):
    def in_flight(self) -> list[DeltaRun]:
        """In-flight runs that build ``delta_index`` (sensor, UI, CLI), newest first."""
        ...

    def ended_how(self, run_key: str) -> str | None:
        """For a run key whose run failed or was canceled: how it ended (one line); else None."""
        ...

    def last_requested(self) -> str | None:
        """The run key of the newest run this trigger requested, if the runs tell (else the cursor's is used).
        The cursor alone is not enough: a tick whose daemon died before the tick ended never saved it."""
        ...


@dataclass(frozen=True)
class PartitionRecord(Record[PartitionId]):
    """A create-once ledger entry of a raw partition; ``observe`` is the observation it earns if created."""

    observe: Mapping[str, Any] | None = None

    @property
    def partition(self) -> PartitionId:
        return self.subject


@dataclass(frozen=True)
class DeltaRequest:
    partition: PartitionId
    attempt: int
    skipped: int

    @property
    def run_key(self) -> str:
        return f"{PIPELINE}:{self.partition.compact}:a{self.attempt}"


@dataclass
class DeltaPlan(TickPlan[PartitionRecord, DeltaRequest]):
    """``claims``: the accepted attempt (one at most); the request stands only if it is created."""

    records: list[PartitionRecord] = field(default_factory=list)
    gap: tuple[PartitionId, PartitionId | None, str] | None = None  # (before, after, why)
    ignored: list[Ignored] = field(default_factory=list)  # malformed keys to report (set changed)
    cursor: dict[str, Any] = field(default_factory=dict)


@dataclass
class DeltaApplied:
    observations: list[tuple[PartitionId, dict[str, Any]]]
    request: DeltaRequest | None
    skip_reason: str | None

    @property
    def requests(self) -> list[DeltaRequest]:
        """As :class:`freshidx.trigger.tick_plan.Applied` has it: this rule requests one run at most."""
        return [] if self.request is None else [self.request]


def plan_tick(store: ObjectStore, settings: Settings, runs: DeltaRunIndex, now: dt.datetime,
              cursor: Mapping[str, Any] | None = None) -> DeltaPlan:
    """One evaluation of the latest-only rule. Reads only; :func:`apply` writes."""
    pointer, _ = read_pointer(store, PIPELINE)
    watermark = PartitionId.parse(pointer.source_partition) if pointer and pointer.source_partition else None
    found = partitions_after(store, settings.source, watermark, max_scan_hours=settings.scan_hours)
    plan = DeltaPlan(cursor=dict(cursor or {}))
    if found.ignored:
        digest = hashlib.sha1("\n".join(sorted(i.key for i in found.ignored)).encode()).hexdigest()
        if plan.cursor.get("ignored") != digest:  # report a changed set once, not every 5 s
            plan.cursor["ignored"] = digest
            plan.ignored = found.ignored
    newest = found.newest
    if newest is None:
        plan.skip_reason = f"no partition newer than {watermark.path if watermark else '(none)'}"
        return plan
    in_flight = runs.in_flight()
    if in_flight and settings.delta_overlap != "queue":
        _plan_overlap(plan, settings, found, newest, in_flight)
        return plan
    targets = {r.target for r in in_flight}
    skipped = _plan_skipped(plan, runs, settings, found, newest, watermark, targets)
    _plan_attempt(plan, store, settings, runs, now, newest, skipped)
    return plan


def _plan_overlap(plan: DeltaPlan, settings: Settings, found: Listing, newest: PartitionId,
                  in_flight: list[DeltaRun]) -> None:
    """Overlap policy: serialize (wait, then jump to the newest), skip (drop triggers that arrive
    while a run is in flight, with a durable reason); queue never gets here (dagster.yaml's
    freshidx/pipeline=delta limit runs its requests one at a time)."""
    r = in_flight[0]
    targets = {x.target for x in in_flight}
    unknown = None in targets  # a UI/CLI run that picks the newest partition itself when it starts
    if settings.delta_overlap == "skip" and r.target != newest.path and not unknown:
        why = f"skipped: run {r.run_id[:8]} for {r.target} was in flight (overlap policy skip)"
        plan.records += [PartitionRecord(p, TriggerId(p.compact), Decision.SUPERSEDED, why, {"run_id": r.run_id},
                                {"decision": "skipped_overlap"})
                         for p in found.partitions if p.path not in targets]
    what = ("will jump to the newest when it ends" if settings.delta_overlap != "skip"
            else "skipped (overlap policy skip)" if not unknown
            else "not skipped yet: that run builds the newest partition it sees; decided when it ends")
    plan.skip_reason = (f"run {r.run_id[:8]} for {r.target or 'the newest partition'} is {r.status}; "
                        f"newest visible is {newest.path}, {what}")


def _plan_skipped(plan: DeltaPlan, runs: DeltaRunIndex, settings: Settings, found: Listing, newest: PartitionId,
                  watermark: PartitionId | None, targets: set[str | None]) -> list[PartitionId]:
    """Durable reasons for everything skipped on purpose. Under overlap "queue" a partition whose run
    is still in flight is not ours to decide: its run publishes it, or the publication that passes it
    records why not (ledger.settle_publication)."""
    skipped = [p for p in found.partitions[:-1] if p.path not in targets]
    why = f"folded into the micro-batch for {newest.path}" if watermark else \
        f"folded into the micro-batch for {newest.path} (no watermark: first start or reset, jumped to the newest)"
    # The partition our last run was for, if that run ended without publishing: say how it ended.
    last = (runs.last_requested() or plan.cursor.get("last_requested")) if skipped else None
    how = runs.ended_how(last) if last and last.startswith(f"{PIPELINE}:") else None
    ended_for = last.split(":")[1] if how else None
    for p in skipped:
        plan.records.append(PartitionRecord(
            p, TriggerId(p.compact), Decision.FOLDED, f"{why}; {how}" if p.compact == ended_for else why,
            {"extra": {"folded_into": newest.path}},
            {"decision": Decision.FOLDED.value, "folded_into": newest.path}))
    if found.unlisted_before is not None:
        plan.gap = (found.unlisted_before, watermark,
                    (f"more than {settings.scan_hours} h behind the newest partition {newest.path}"
                     if watermark else "no watermark (first start or reset)")
                    + "; older partitions were not listed (the full rebuild covers them)")
    return skipped


def _plan_attempt(plan: DeltaPlan, store: ObjectStore, settings: Settings, runs: DeltaRunIndex, now: dt.datetime,
                  newest: PartitionId, skipped: list[PartitionId]) -> None:
    """Which attempt is this? Explicit attempt numbers make retries visible and idempotent."""
    state = attempt_state(ledger.partition_entries(store, PIPELINE, newest), newest.compact)
    if state.final is not None:  # a final decision (e.g. skipped under overlap policy skip) is never revisited
        plan.skip_reason = (f"{newest.path} already decided: {state.final.decision} "
                            f"({state.final.reason}); waiting for a newer partition")
        return
    failed = 0  # attempts that count towards parking: not those a shutdown interrupted
    for n in state.numbers:
        e = state.claims[n]
        run = runs.by_run_key(e.run_key or "")
        if n == state.last and run is not None and run.in_flight:  # overlap policy queue: never twice
            plan.skip_reason = f"attempt {e.attempt} for {newest.path} is {run.status}"
            return
        if n == state.last and run is None and now - parse_iso(e.at) < LOST_REQUEST_GRACE:
            plan.skip_reason = f"attempt {e.attempt} for {newest.path} requested, waiting for its run"
            return
        if not (run is not None and run.interrupted):
            failed += 1
    attempt = state.next_attempt
    if failed >= state.allowed(settings.max_attempts):
        plan.records.append(PartitionRecord(
            newest, TriggerId(newest.compact).then(Mark.PARKED, attempt - 1), Decision.PARKED,
            f"{failed} attempts failed; waiting for a newer partition or `freshidx ledger retry`",
            observe={"decision": Decision.PARKED.value}))
        plan.skip_reason = f"{newest.path} parked after {failed} failed attempts"
        return
    request = DeltaRequest(newest, attempt, len(skipped))
    plan.claims = [PartitionRecord(
        newest, TriggerId(newest.compact).claim(attempt), Decision.ACCEPTED,
        f"newest visible partition (skipped {len(skipped)})",
        {"run_key": request.run_key, "attempt": attempt, "extra": {"skipped": [p.path for p in skipped]}},
        {"decision": Decision.ACCEPTED.value, "attempt": attempt, "skipped": len(skipped)})]
    plan.request = request


#: The reason of the ``P.aN.run`` entry of an attempt the continuous loop runs itself.
LOOP_STARTED = "micro-batch started for accepted trigger (continuous run)"


def apply(store: ObjectStore, plan: DeltaPlan, *, run_by: str | None = None) -> DeltaApplied:
    """Write the plan (create-once): an entry already written by another evaluation earns nothing;
    a claim already written means another evaluation requested the run.

    ``run_by``: the run that executes the request itself (the continuous loop's id): a claim it wins is
    started at once (:func:`freshidx.trigger.ledger.start_attempt`: the ``P.aN.run`` entry a
    sensor-requested run writes when it begins)."""
    observations = [(r.partition, dict(r.observe)) for r in plan.records if _write(store, r) and r.observe]
    if plan.gap is not None:
        ledger.record_gap(store, PIPELINE, *plan.gap)
    if not plan.claims or plan.request is None:
        return DeltaApplied(observations, None, plan.skip_reason)
    if not claims_won(plan, lambda r: _write(store, r)):
        return DeltaApplied(observations, None, f"{plan.request.run_key} already accepted by another evaluation")
    req = plan.request
    if run_by is not None:
        ledger.start_attempt(store, PIPELINE, req.partition, req.attempt, run_id=run_by, run_key=req.run_key,
                             reason=LOOP_STARTED)
    plan.cursor["last_requested"] = req.run_key
    won = [(c.partition, dict(c.observe or {})) for c in plan.claims]
    return DeltaApplied([*observations, *won], req, None)


def _write(store: ObjectStore, r: PartitionRecord) -> bool:
    return ledger.record_partition(store, PIPELINE, r.partition, r.decision, r.reason, tid=r.tid, **r.fields)
