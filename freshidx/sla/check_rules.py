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

from freshidx.publish.commit import Pointer, parse_iso, read_pointer
from freshidx.settings import Settings
from freshidx.store import ObjectStore
from freshidx.store.partitions import PartitionError, PartitionId
from freshidx.trigger.listing import newest_partition, partitions_after

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
    #: When the oldest partition the delta does not cover yet became visible (its first object's
    #: last-modified); None when the delta covers the newest partition.
    waiting_since: dt.datetime | None = None


def _delta_partition(delta: Pointer | None) -> PartitionId | None:
    if delta is None or not delta.source_partition:
        return None
    try:
        return PartitionId.parse(delta.source_partition)
    except PartitionError:
        return None


def waiting_since(store: ObjectStore, settings: Settings, newest: PartitionId | None,
                  delta: Pointer | None) -> dt.datetime | None:
    """When the oldest partition newer than the delta became visible (None: nothing is waiting).

    The oldest, not the newest: the delta skips to the newest partition, so while publication is
    stuck the newest keeps changing and its own wait never grows; the first uncovered one's does.
    """
    covered = _delta_partition(delta)
    if newest is None or (covered is not None and newest <= covered):
        return None
    listing = partitions_after(store, settings.source, covered, max_scan_hours=settings.scan_hours, newest=newest)
    if not listing.partitions:
        return newest.at
    first = listing.partitions[0]
    # A partition's files can be written before the minute they are named after ends; never count
    # waiting from before its own timestamp.
    return max(min(o.last_modified for o in listing.files[first]), first.at)


def observe(store: ObjectStore, settings: Settings, now: dt.datetime, delta_failures: int = 0) -> Observed:
    newest, _ = newest_partition(store, settings.source)
    delta = read_pointer(store, "delta")[0]
    return Observed(now, newest, delta, read_pointer(store, "full")[0], delta_failures,
                    waiting_since(store, settings, newest, delta))


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
    visible in neither index (the argument for why skipping partitions is safe). A full rebuild is
    launched ahead of that, once the cutoff is within ``coverage_margin`` of the window's start: while
    the cutoff is behind the window every micro-batch rebuilds the window (docs/architecture.md)."""
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
    margin = s.coverage_margin * s.window.total_seconds()
    soon = passed and margin > 0 and gap > -margin
    state = (f"covered; the cutoff leaves the window in {-gap:.0f}s: rebuilding the full index ahead of it"
             if soon else "covered" if passed else f"{gap:.0f}s of updates are in neither index")
    return CheckOutcome(
        "delta_index", "coverage", passed, "ERROR",
        f"delta window starts {o.delta.window_start}, full cutoff {o.full.cutoff}: {state}",
        {"gap_seconds": round(max(gap, 0.0), 3), "window_start": o.delta.window_start,
         "full_cutoff": o.full.cutoff or o.full.position, "leaves_window_in_seconds": round(max(-gap, 0.0), 3)},
        remediate="full_index" if soon or not passed else None,
    )


def publication_stuck(o: Observed, s: Settings) -> CheckOutcome:
    """How long visible data has waited for the delta: now minus when the oldest partition the delta
    does not cover yet became visible. An upstream gap does not count (the wait starts when data
    appears), and neither does the newest partition's timestamp relative to the pointer."""
    if o.newest is None:
        return CheckOutcome("delta_index", "publication_stuck", True, "WARN", "no partitions yet")
    if o.waiting_since is None:
        return CheckOutcome("delta_index", "publication_stuck", True, "ERROR",
                            f"the delta covers the newest visible partition {o.newest.path}",
                            {"waiting_seconds": 0.0, "consecutive_failures": o.delta_failures})
    waited = max(0.0, (o.now - o.waiting_since).total_seconds())
    passed = waited < s.stuck_seconds
    return CheckOutcome(
        "delta_index", "publication_stuck", passed, "ERROR",
        f"visible data has waited {waited:.0f}s for the delta (limit {s.stuck_seconds}s; newest {o.newest.path})"
        + ("" if passed else f"; {o.delta_failures} consecutive failed delta runs"),
        {"waiting_seconds": round(waited, 3), "waiting_since": o.waiting_since.isoformat(),
         "newest_partition": o.newest.path, "consecutive_failures": o.delta_failures},
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


def _env(field_name: str) -> str:
    default = Settings.model_fields[field_name].default
    return f"{Settings.env_name(field_name)} (default {default})"


_SENSOR = f"freshidx_sla_sensor evaluates it every {_env('sla_interval_seconds')} seconds"
#: One paragraph per check, shown as the check's description in the Dagster UI.
DESCRIPTIONS: dict[str, str] = {
    "source_silence": (
        "Seconds since the newest raw partition's minute (now minus its timestamp). Warns at "
        f"{_env('silence_warn_seconds')} and fails at {_env('silence_fail_seconds')}, and fails when no "
        "partition exists at all. A failure means upstream stopped writing (an upstream outage, not a "
        f"freshidx failure); nothing in freshidx can fix it. {_SENSOR}, records state changes in the "
        "sla ledger and launches nothing for it."
    ),
    "data_lag": (
        "Seconds between now and the raw partition the published delta index covers (the delta "
        f"pointer's position): how stale search results are. Warns at {_env('lag_warn_seconds')} and fails "
        f"at {_env('lag_fail_seconds')}; fails when no delta is published. A failure means readers see "
        "data older than the SLA, because upstream is silent (see source_silence) or delta runs are slow or "
        f"failing (see publication_stuck, run_failures). {_SENSOR} and records state changes in the sla "
        "ledger; it launches nothing: delta_index_sensor keeps requesting delta runs."
    ),
    "coverage": (
        "Whether the delta window reaches back to (or past) the full index's cutoff: the gap in seconds "
        "between the delta window start and the full cutoff must be 0, else updates in between are in "
        f"neither index. The window is {_env('window_minutes')} minutes; the full index is rebuilt every "
        f"{_env('full_every_hours')} hours. Fails (ERROR) on any gap or when no full index is published. "
        f"{_SENSOR} and on a failure launches one full_index rebuild (run key per full version, never "
        "while another full_index run is queued or running, at most 3 failed attempts per version); it "
        "launches one ahead of a gap too, while passing, once the cutoff is within "
        f"{_env('coverage_margin')} of the window of leaving it."
    ),
    "publication_stuck": (
        "How long visible data has waited for the delta: now minus the time the oldest raw partition "
        "newer than the delta pointer became visible (its first object's last-modified). An upstream gap "
        "does not count: the wait starts when data appears. Fails (ERROR) at "
        f"{_env('stuck_seconds')}; the metadata also counts consecutive failed delta runs. A failure means "
        "delta runs are failing, queued behind heavy builds, or not being requested. "
        f"{_SENSOR} and records state changes in the sla ledger; it launches nothing (see the delta runs "
        "and delta_index_sensor's ticks)."
    ),
    "run_failures": (
        "Consecutive failed delta_index runs, newest first (interrupted runs and runs in flight do not "
        f"count). Warns at 1 and fails (ERROR) at {_env('max_attempts')}, the runs a partition gets "
        "before it is parked. A failure means the delta is not publishing: read the failed runs' errors. "
        f"{_SENSOR} and records state changes in the sla ledger; it launches nothing (the delta sensor "
        "retries on its own)."
    ),
    "age": (
        "Seconds since the full index's cutoff (now minus the newest raw partition it includes). Fails "
        f"(ERROR) above {_env('full_max_age_seconds')}, or when no full index is published. A failure "
        "means scheduled rebuilds are not publishing, so the delta window will soon stop reaching the "
        f"cutoff. {_SENSOR} and on a failure launches one full_index rebuild, like coverage."
    ),
}


def evaluate(o: Observed, s: Settings) -> list[CheckOutcome]:
    return [check(o, s) for check in CHECKS]


def still_current(o: Observed, s: Settings, last_materialized: dt.datetime | None) -> str | None:
    """Why the serving delta may be confirmed as current now, or None.

    Dagster's freshness policy only sees when ``delta_index`` was last materialized, so a quiet upstream
    would turn it red although nothing is missing. When the delta covers the newest visible partition and
    its last materialization is older than half the warn window, the SLA sensor records a materialization
    with the same version (an unchanged data version): the policy then measures "behind data that
    exists", the meaning the README gives it. Never before a first materialization: the policy is not
    red then (Dagster shows the asset as never materialized), and a confirmation would be the asset's only
    materialization, with nothing built.
    """
    if last_materialized is None or o.delta is None or o.newest is None or o.waiting_since is not None:
        return None
    covered = _delta_partition(o.delta)
    if covered is None or o.newest > covered:
        return None
    if (o.now - last_materialized).total_seconds() < s.lag_warn_seconds / 2:
        return None
    return (f"unchanged: {o.delta.version} still covers the newest visible partition {o.newest.path} "
            "(no newer input)")
