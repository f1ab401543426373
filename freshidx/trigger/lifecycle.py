"""The trigger lifecycle in one place: ledger decisions, trigger ids, attempt state.

A trigger (a delta partition ``P`` = ``20261121T1405``, or a catch-up hour ``H`` = ``20261121T14``)
moves through create-once ledger entries whose ids say where it is::

    P.aN  accepted ──▶ P.aN.run  started ──▶ P  published / refused / superseded   (final)
      │                  ├──▶ P.aN.lost / H.aN.failed / H.aN.expired   failed / expired (retried)
      │                  └──▶ H.aN.interrupted   a shutdown ended it (never counts towards parking)
      └─ attempts exhausted ──▶ P.parked-N  parked ──▶ P.grant-K  retry_granted ──▶ P.a(N+1) …

Late data for a processed hour opens a correction ``H.cK`` whose attempts are ``H.cK.aN`` (settled by
``H.cK.aN.done``; parked as ``H.cK.parked``). Other entries of a trigger: ``.invalid-R`` /
``.refused-R`` / ``.published-R`` / ``.backfill-R`` (run ``R``'s outcome, ``R`` = 8 chars of its id),
``.gap`` (partitions before ``P`` not listed), ``.notready``, ``.out_of_range``.

Stored ledgers are read back by these strings, so :class:`Decision` values and the id grammar are
the on-disk format: change them only with a migration. Like Quickwit's ``SplitState``, the states
are one enum and the moves between them are methods here, not string concatenation at each site.
No Dagster or Spark here (the planners and their tests use it without either).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from freshidx.publish.requirements import Outcome
from freshidx.store.records import LedgerEntry

#: An accepted attempt with no run after this long was lost (the daemon never created the run): the
#: planner settles it and moves on. 90 s was the catch-up value (the delta sensor used 60 s); the
#: longer one is kept for both because declaring a request lost too early starts a second run for
#: the same trigger, while waiting longer only delays the retry of a request that really was lost.
LOST_REQUEST_GRACE = dt.timedelta(seconds=90)


class Decision(StrEnum):
    """Every ``decision`` a ledger entry carries (byte-identical to what stored ledgers hold)."""

    ACCEPTED = "accepted"  # an attempt was claimed and its run requested
    STARTED = "started"  # the run executing an attempt began
    PUBLISHED = "published"
    PROCESSED = "processed"  # catch-up: the hour's first version is published
    CORRECTED = "corrected"  # catch-up: a correction version is published
    REBUILT = "rebuilt"  # a backfill / manual run republished an hour
    SUPERSEDED = "superseded"  # a newer trigger made this one moot (never built)
    FOLDED = "folded"  # delta: no run of its own; the micro-batch for a newer partition read it
    REFUSED = "refused"  # built (or probed), but not newer than what serves
    VALIDATION_FAILED = "validation_failed"  # the validation gate refused the version (retried)
    FAILED = "failed"
    EXPIRED = "expired"  # stuck past the timeout, or its request was lost
    INTERRUPTED = "interrupted"  # ended by a shutdown: not the trigger's fault
    PARKED = "parked"  # attempts exhausted: waits for a newer trigger or a grant
    RETRY_GRANTED = "retry_granted"
    NOT_LISTED = "not_listed"  # partitions too far behind to list (``.gap``)
    NOT_READY = "not_ready"
    LATE_DATA = "late_data"  # a processed hour changed: a correction is opened
    OUT_OF_RANGE = "out_of_range"
    CHECK_STATE_CHANGED = "check_state_changed"  # SLA
    REMEDIATION_LAUNCHED = "remediation_launched"  # SLA


#: Final decisions that say a partition was dealt with (``parked`` is not final but explains it too).
FINAL = frozenset({Decision.SUPERSEDED, Decision.FOLDED, Decision.PUBLISHED, Decision.REFUSED,
                   Decision.VALIDATION_FAILED})

#: What :func:`freshidx.publish.commit.publish` can answer (defined once, by publication).
PublishOutcome = Outcome

#: The one mapping from a publish outcome to the ledger decision. ``publish()`` (and the refusal file)
#: say ``superseded`` where the ledger has always said ``refused`` (a built version that lost the
#: compare, unlike a partition superseded before any build); ``unchanged`` (a full rebuild of exactly
#: the serving inputs) is a refusal whose reason starts with "unchanged:"; ``invalid`` is stored as
#: ``validation_failed``. Both spellings are on disk, so the mapping is kept, not the words unified.
PUBLISH_DECISION: Mapping[str, Decision] = {
    "published": Decision.PUBLISHED,
    "superseded": Decision.REFUSED,
    "unchanged": Decision.REFUSED,
    "invalid": Decision.VALIDATION_FAILED,
}


def decision_for(outcome: str) -> Decision:
    return PUBLISH_DECISION[outcome]


class Mark(StrEnum):
    """The last segment of a trigger id (after the attempt, if any)."""

    RUN = "run"  # P.aN.run: the run executing attempt N
    LOST = "lost"  # P.aN.lost: its worker died (run health)
    FAILED = "failed"
    EXPIRED = "expired"
    INTERRUPTED = "interrupted"
    DONE = "done"  # H.aN.done / H.cK.aN.done: the claim ended without (or after) publishing
    PARKED = "parked"  # P.parked-N, H.parked-N, H.cK.parked
    GRANT = "grant"  # P.grant-K
    INVALID = "invalid"  # P.invalid-R
    REFUSED = "refused"  # P.refused-R
    PUBLISHED = "published"  # P.published-R
    GAP = "gap"
    NOT_READY = "notready"
    OUT_OF_RANGE = "out_of_range"


#: Attempt marks that end an attempt of the catch-up (a delta attempt ends with its run).
ENDING = (Mark.FAILED, Mark.EXPIRED, Mark.INTERRUPTED)

_SEGMENT_C = re.compile(r"^c(\d+)$")
_SEGMENT_A = re.compile(r"^a(\d+)$")


@dataclass(frozen=True)
class TriggerId:
    """``<base>[.cK][.aN][.<mark>[-<tag>]]``; ``TriggerId(base)`` alone is the final decision.

    ``tag`` is a number (``parked-N``, ``grant-K``) or 8 characters of a run id (``invalid-R``), or a
    run kind (``backfill-R`` keeps the kind in ``mark``)."""

    base: str
    correction: int | None = None
    attempt: int | None = None
    mark: str | None = None
    tag: str | None = None

    def __str__(self) -> str:
        return self.base + (f".{self.suffix}" if self.suffix else "")

    @property
    def suffix(self) -> str:
        """What follows ``<base>.`` (``""`` for the final decision): the key of
        :func:`freshidx.trigger.ledger.trigger_entries` and of the catch-up's run tag claims."""
        parts = [f"c{self.correction}"] if self.correction is not None else []
        if self.attempt is not None:
            parts.append(f"a{self.attempt}")
        if self.mark is not None:
            parts.append(self.mark if self.tag is None else f"{self.mark}-{self.tag}")
        return ".".join(parts)

    @property
    def is_attempt(self) -> bool:
        """``.aN`` or ``.cK.aN`` itself (the accepted claim), not an event after it."""
        return self.attempt is not None and self.mark is None

    # -------------------------------------------------------------- transitions (new ids)

    def claim(self, attempt: int) -> TriggerId:
        return TriggerId(self.base, self.correction, attempt)

    def in_correction(self, k: int) -> TriggerId:
        return TriggerId(self.base, k)

    def then(self, mark: str, tag: str | int | None = None) -> TriggerId:
        """The entry that follows this one: ``P.aN`` → ``P.aN.run``, ``P`` → ``P.parked-3``, …"""
        return replace(self, mark=mark, tag=None if tag is None else str(tag))

    def by_run(self, mark: str, run_id: str) -> TriggerId:
        """A run's own entry (``.invalid-R``, ``.refused-R``, ``.published-R``, ``.backfill-R``)."""
        return self.then(mark, run_id[:8])

    def final(self) -> TriggerId:
        return TriggerId(self.base)

    # -------------------------------------------------------------- parsing

    @classmethod
    def parse(cls, text: str) -> TriggerId:
        base, _, suffix = text.partition(".")
        return cls.from_suffix(base, suffix)

    @classmethod
    def from_suffix(cls, base: str, suffix: str) -> TriggerId:
        """Inverse of :attr:`suffix` (ValueError for a form this module does not write)."""
        segments = suffix.split(".") if suffix else []
        correction = attempt = None
        if segments and (m := _SEGMENT_C.match(segments[0])):
            correction = int(m[1])
            segments.pop(0)
        if segments and (m := _SEGMENT_A.match(segments[0])):
            attempt = int(m[1])
            segments.pop(0)
        if len(segments) > 1:
            raise ValueError(f"not a trigger id: {base}.{suffix}")
        mark = tag = None
        if segments:
            mark, _, rest = segments[0].partition("-")
            tag = rest or None
        return cls(base, correction, attempt, mark, tag)


def parse_suffix(base: str, suffix: str) -> TriggerId | None:
    """:meth:`TriggerId.from_suffix`, or None for a key this module does not know (left alone)."""
    try:
        return TriggerId.from_suffix(base, suffix)
    except ValueError:
        return None


def started_claim(trigger_id: str) -> str | None:
    """``X.aN`` for the entry ``X.aN.run`` (a run linking itself to the claim it executes), else None."""
    base, _, suffix = trigger_id.partition(".")
    tid = parse_suffix(base, suffix)
    if tid is None or tid.attempt is None or tid.mark != Mark.RUN:
        return None
    return str(replace(tid, mark=None, tag=None))


def full_trigger_id(cutoff: dt.datetime, version: str) -> str:
    """The full index's trigger: one per built version (``<cutoff minute>-<version>``)."""
    return f"{cutoff:%Y%m%dT%H%M}-{version}"


def remediation_trigger_id(of_version: str, attempt: int) -> str:
    """The SLA's remediation trigger (``remediate-full-<version>-aN``)."""
    return f"remediate-full-{of_version}-a{attempt}"


# ------------------------------------------------------------------ attempt state


@dataclass(frozen=True)
class AttemptState:
    """Attempts of one trigger (or one correction of it) as its ledger entries tell them."""

    claims: Mapping[int, LedgerEntry]  # attempt number → its accepted entry
    ended: frozenset[int]  # settled by an ending entry (failed / expired / interrupted)
    interrupted: frozenset[int]
    grants: int  # operator grants (``.grant-K``): each allows one more attempt
    final: LedgerEntry | None = None  # the trigger's final decision, if any
    numbers: tuple[int, ...] = field(default=())

    @property
    def last(self) -> int | None:
        return self.numbers[-1] if self.numbers else None

    @property
    def next_attempt(self) -> int:
        return (self.last or 0) + 1

    @property
    def open(self) -> int | None:
        """The last attempt if nothing has ended it yet (its run decides)."""
        return self.last if self.last is not None and self.last not in self.ended else None

    @property
    def failures(self) -> int:
        return len(self.ended - self.interrupted)

    def allowed(self, max_attempts: int) -> int:
        return max_attempts + self.grants


def attempt_state(entries: Mapping[str, LedgerEntry], base: str = "",
                  correction: int | None = None) -> AttemptState:
    """From the entries of one trigger keyed by suffix (:func:`freshidx.trigger.ledger.trigger_entries`).

    ``correction`` selects a correction's attempts (``cK.aN``); grants count only for the trigger's
    own attempts (a correction parks without a grant path)."""
    ids = [(tid, e) for k, e in entries.items() if (tid := parse_suffix(base, k)) is not None]
    mine = [(t, e) for t, e in ids if t.correction == correction and t.attempt is not None]
    claims = {t.attempt: e for t, e in mine if t.is_attempt and t.attempt is not None}
    ended = {t.attempt for t, _ in mine if t.mark in ENDING and t.attempt is not None}
    interrupted = {t.attempt for t, _ in mine if t.mark == Mark.INTERRUPTED and t.attempt is not None}
    grants = sum(1 for t, _ in ids if t.mark == Mark.GRANT and t.correction is None and t.attempt is None)
    # Only entries of accepted attempts count (an ending entry without its claim explains nothing).
    return AttemptState(claims, frozenset(ended & claims.keys()), frozenset(interrupted & claims.keys()), grants,
                        entries.get(""), tuple(sorted(claims)))
