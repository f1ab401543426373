"""A ledger entry: one create-once trigger decision, ``ledger/<pipeline>/<date>/<trigger-id>.json``
(the ledger itself: :mod:`freshidx.trigger.ledger`; the decisions: :mod:`freshidx.trigger.lifecycle`)."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from pydantic.dataclasses import dataclass

from freshidx.store.records.base import CONFIG, Record, iso, utcnow, version_field


@dataclass(frozen=True, eq=False, config=CONFIG)
class LedgerEntry(Record):
    """One decision about one trigger (a partition, an hour, a full build, an SLA check, …)."""

    KIND = "ledger entry"

    pipeline: str
    trigger_id: str
    decision: str  # a lifecycle Decision, stored as its plain value
    reason: str
    partition: str | None = None  # partition path as written upstream
    scope: str | None = None  # for triggers that are not a single partition
    run_id: str | None = None
    run_key: str | None = None
    attempt: int | None = None
    at: str = field(default_factory=lambda: iso(utcnow()))
    extra: dict[str, Any] = field(default_factory=dict)
    format_version: int = version_field()

    def gap(self) -> tuple[str | None, str] | None:
        """``(after, before)`` partition paths of a ``.gap`` entry that records them (``extra``); None:
        an older entry that only has the scope text (:func:`freshidx.trigger.ledger.gap_range` reads it)."""
        before = self.extra.get("before")
        if not before:
            return None
        after = self.extra.get("after")
        return (None if after is None else str(after)), str(before)
