"""SLA evaluation: data-aware freshness checks that Dagster's built-in policy cannot express.

Dagster's ``FreshnessPolicy`` only looks at when an asset was last written (a backfill of an old
partition makes it "fresh"). These checks look at the data: which partition the delta covers,
whether its window still reaches the full index's cutoff, whether upstream is silent, whether
publication is stuck. Each returns a :class:`CheckOutcome`; the SLA sensor reports them as asset
check results and launches remediation where the outcome calls for it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Literal

from freshidx.listing import newest_partition
from freshidx.partitions import PartitionId
from freshidx.publish import Pointer, parse_iso, read_pointer
from freshidx.settings import Settings
from freshidx.store import ObjectStore

Severity = Literal["WARN", "ERROR"]


@dataclass(frozen=True)
class CheckOutcome:
    asset: str
    check: str
    passed: bool
    severity: Severity
    description: str
    metadata: dict[str, Any] = field(default_factory=dict)
    remediate: str | None = None  # "full_index" when a rebuild is the fix

    @property
    def state(self) -> str:
        return "PASS" if self.passed else f"FAIL_{self.severity}"


@dataclass(frozen=True)
class Observed:
    """Everything the checks look at, read once per evaluation."""

    now: dt.datetime
    newest: PartitionId | None
    delta: Pointer | None
    full: Pointer | None
    delta_failures: int = 0  # consecutive failed delta runs, newest first


def observe(store: ObjectStore, settings: Settings, now: dt.datetime, delta_failures: int = 0) -> Observed:
    newest, _ = newest_partition(store, settings.source)
    return Observed(now, newest, read_pointer(store, "delta")[0], read_pointer(store, "full")[0], delta_failures)


def _graded(value: float, warn: float, fail: float) -> tuple[bool, Severity]:
    if value >= fail:
        return False, "ERROR"
    if value >= warn:
        return False, "WARN"
    return True, "WARN"


def source_silence(o: Observed, s: Settings) -> CheckOutcome:
    if o.newest is None:
        return CheckOutcome("raw_ad_updates", "source_silence", False, "ERROR",
                            f"no partition under raw/{s.source}/ at all")
    silent = (o.now - o.newest.at).total_seconds()
    passed, sev = _graded(silent, s.silence_warn_seconds, s.silence_fail_seconds)
    return CheckOutcome(
        "raw_ad_updates", "source_silence", passed, sev,
        f"newest partition {o.newest.path} is {silent:.0f}s old"
        + ("" if passed else " — upstream is silent (an upstream outage, not a freshidx failure)"),
        {"silence_seconds": round(silent, 3), "newest_partition": o.newest.path},
    )


def data_lag(o: Observed, s: Settings) -> CheckOutcome:
    if o.delta is None or not o.delta.source_partition:
        return CheckOutcome("delta_index", "data_lag", False, "ERROR", "no delta version published yet")
    lag = (o.now - parse_iso(o.delta.position)).total_seconds()
    passed, sev = _graded(lag, s.lag_warn_seconds, s.lag_fail_seconds)
    return CheckOutcome("delta_index", "data_lag", passed, sev,
                        f"delta covers {o.delta.source_partition}, {lag:.0f}s ago",
                        {"lag_seconds": round(lag, 3), "source_partition": o.delta.source_partition})


def coverage(o: Observed, s: Settings) -> CheckOutcome:
    """The delta window must reach back to (or past) the full cutoff, else updates in between are
    visible in neither index (seed 000's argument for why skipping is safe)."""
    if o.full is None:
        return CheckOutcome("delta_index", "coverage", False, "ERROR",
                            "no full index published: nothing covers data before the delta window",
                            remediate="full_index")
    if o.delta is None or not o.delta.window_start:
        return CheckOutcome("delta_index", "coverage", True, "WARN",
                            f"no delta yet; full covers up to {o.full.cutoff}")
    start, cutoff = parse_iso(o.delta.window_start), parse_iso(o.full.position)
    gap = (start - cutoff).total_seconds()
    passed = gap <= 0
    return CheckOutcome(
        "delta_index", "coverage", passed, "ERROR",
        f"delta window starts {o.delta.window_start}, full cutoff {o.full.cutoff}: "
        + ("covered" if passed else f"{gap:.0f}s of updates are in neither index"),
        {"gap_seconds": round(max(gap, 0.0), 3), "window_start": o.delta.window_start,
         "full_cutoff": o.full.cutoff or o.full.position},
        remediate=None if passed else "full_index",
    )


def publication_stuck(o: Observed, s: Settings) -> CheckOutcome:
    if o.newest is None:
        return CheckOutcome("delta_index", "publication_stuck", True, "WARN", "no partitions yet")
    behind_from = parse_iso(o.delta.position) if o.delta else None
    behind = (o.newest.at - behind_from).total_seconds() if behind_from else float("inf")
    passed = behind < s.stuck_seconds
    return CheckOutcome(
        "delta_index", "publication_stuck", passed, "ERROR",
        f"newest visible {o.newest.path} is {behind:.0f}s ahead of the published delta"
        + ("" if passed else f"; {o.delta_failures} consecutive failed delta runs"),
        {"behind_seconds": round(behind, 3) if behind != float("inf") else -1.0,
         "consecutive_failures": o.delta_failures},
    )


def delta_failures(o: Observed, s: Settings) -> CheckOutcome:
    n = o.delta_failures
    passed, sev = (True, "WARN") if n == 0 else (False, "ERROR" if n >= s.max_attempts else "WARN")
    return CheckOutcome("delta_index", "run_failures", passed, sev,
                        f"{n} consecutive failed delta runs", {"consecutive_failures": n})


def full_age(o: Observed, s: Settings) -> CheckOutcome:
    if o.full is None:
        return CheckOutcome("full_index", "age", False, "ERROR", "no full index published yet",
                            remediate="full_index")
    age = (o.now - parse_iso(o.full.position)).total_seconds()
    passed = age <= s.full_max_age_seconds
    return CheckOutcome("full_index", "age", passed, "ERROR",
                        f"full cutoff {o.full.cutoff} is {age:.0f}s old (limit {s.full_max_age_seconds}s)",
                        {"age_seconds": round(age, 3)}, remediate=None if passed else "full_index")


CHECKS = (source_silence, data_lag, coverage, publication_stuck, delta_failures, full_age)
CHECK_NAMES = {
    "raw_ad_updates": ["source_silence"],
    "delta_index": ["data_lag", "coverage", "publication_stuck", "run_failures"],
    "full_index": ["age"],
}


def evaluate(o: Observed, s: Settings) -> list[CheckOutcome]:
    return [check(o, s) for check in CHECKS]
