"""The vocabulary both planners speak: the latest-only rule of the delta index
(:mod:`freshidx.trigger.latest_only`) and the catch-up of ``ads_hourly`` (:mod:`freshidx.catchup.planner`).

Every evaluation is observe → plan → apply, without Dagster. ``plan_tick`` reads the store and a
:class:`RunIndex` (questions about runs: the Dagster adapters in ``freshidx.defs`` answer them from the
instance, the continuous loop and the tests from memory) and returns a :class:`TickPlan`; ``apply``
writes it, create-once, and returns what became of it (:class:`Applied`).

The types here are what the two planners share. What only one of them needs (a delta run's target
partition, an hourly run's start time for its stuck timeout, the catch-up's frontier state, the
delta's cursor, …) is declared by that planner, on top of these:

============  ===================================  =====================================
here          latest-only (``latest_only``)        catch-up (``catchup.planner``)
============  ===================================  =====================================
RunView       ``DeltaRun``                         ``CatchupRun``
RunIndex      ``DeltaRunIndex``                    ``CatchupRunIndex``
Record        ``PartitionRecord`` (a partition)    ``HourRecord`` (an hour)
Request       ``DeltaRequest``                     ``CatchupRequest``
TickPlan      ``DeltaPlan``                        ``CatchupPlan``
Applied       ``DeltaApplied``                     ``CatchupApplied``
============  ===================================  =====================================
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from freshidx.trigger.lifecycle import Decision, TriggerId


class RunView(Protocol):
    """What a planner needs of one run, whoever answers (a Dagster run, a micro-batch of the continuous
    loop, a test's fake)."""

    @property
    def run_id(self) -> str: ...

    @property
    def status(self) -> str:
        """How the run stands, as the planner's skip reasons and ledger entries spell it."""
        ...

    @property
    def in_flight(self) -> bool:
        """Queued or running: its attempt is not over."""
        ...

    @property
    def interrupted(self) -> bool:
        """Ended by a shutdown of the system, not by its own failure: not a failed attempt."""
        ...


RunT_co = TypeVar("RunT_co", bound=RunView, covariant=True)


class RunIndex(Protocol[RunT_co]):
    """Questions about runs, never effects. Each planner's index adds the questions only it asks."""

    def by_run_key(self, run_key: str) -> RunT_co | None:
        """The run requested under ``run_key`` (a claim in the ledger names it); None if there is none
        (yet: a request the daemon has not turned into a run is given ``LOST_REQUEST_GRACE``)."""
        ...


class Request(Protocol):
    """One run to request. Its run key names the attempt(s) it was claimed for, so Dagster never runs the
    same claim twice and the ledger's claim finds its run (:meth:`RunIndex.by_run_key`)."""

    @property
    def run_key(self) -> str: ...


SubjectT = TypeVar("SubjectT")


@dataclass(frozen=True)
class Record(Generic[SubjectT]):
    """A create-once ledger entry to write about ``subject`` (a raw partition, an hour): ``tid`` names it
    (a claim ``P.a2``, a mark ``H.c1.parked``, the final decision ``P``), ``fields`` go into the entry
    (run_id, run_key, attempt, extra). An entry another evaluation created first is not written again,
    and earns this evaluation nothing."""

    subject: SubjectT
    tid: TriggerId
    decision: Decision
    reason: str
    fields: Mapping[str, Any] = field(default_factory=dict)


RecordT = TypeVar("RecordT", bound=Record[Any])
RequestT = TypeVar("RequestT", bound=Request)
RequestT_co = TypeVar("RequestT_co", bound=Request, covariant=True)


@dataclass(kw_only=True)
class TickPlan(Generic[RecordT, RequestT]):
    """What one evaluation decided; nothing of it is written yet. ``request`` stands only if this
    evaluation creates every one of its ``claims`` (the ``accepted`` entries: :func:`claims_won`);
    otherwise ``skip_reason`` says why nothing is requested."""

    claims: list[RecordT] = field(default_factory=list)
    request: RequestT | None = None
    skip_reason: str | None = None


class Applied(Protocol[RequestT_co]):
    """What ``apply`` did with a plan: the runs to request now (the plan's, if its claims were won), or why none."""

    @property
    def requests(self) -> Sequence[RequestT_co]: ...

    @property
    def skip_reason(self) -> str | None: ...


def claims_won(plan: TickPlan[RecordT, Any], write: Callable[[RecordT], bool]) -> bool:
    """Create the plan's claims in order with ``write`` (create-once: False when the entry existed),
    stopping at the first one another evaluation created first. True when they are all this evaluation's:
    then, and only then, its request stands, so a run is never requested twice for one claim. A plan without
    a request or without claims wins nothing."""
    return plan.request is not None and bool(plan.claims) and all(write(c) for c in plan.claims)
