"""Which runs may skip Dagster's run queue (pure; :mod:`freshidx.defs.run_coordinator` applies it).

The queue (dagster.yaml: ``concurrency.runs``) is where the per-lane limits live, and its daemon dequeues
once a second: every queued run waits 0.5–1 s on average before its worker starts, a sixth of a
sensor-triggered micro-batch's freshness. A run tagged ``freshidx/launch=direct`` (the delta sensor's
runs) is launched as it is submitted **only when the queue would launch it at its next pass anyway**:
every tag concurrency limit it falls under has room, counting the runs already queued or running under
that limit (a queued run of the same lane goes first), and the instance's run cap has room. Otherwise it
is queued like any other run, so the limits hold for it exactly as before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: The tag that asks for the direct lane, and its value.
TAG_LAUNCH = "freshidx/launch"
DIRECT = "direct"


@dataclass(frozen=True)
class LimitCheck:
    """One tag concurrency limit a run falls under: at most ``limit`` runs tagged ``tags`` at once."""

    tags: Mapping[str, str]
    limit: int

    def describe(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.tags.items()) + f" (limit {self.limit})"


@dataclass(frozen=True)
class Lane:
    direct: bool
    reason: str


def wants_direct(tags: Mapping[str, str]) -> bool:
    return tags.get(TAG_LAUNCH) == DIRECT


def limit_checks(tags: Mapping[str, str], limits: Sequence[Mapping[str, Any]]) -> list[LimitCheck] | None:
    """The limits (Dagster's ``tag_concurrency_limits`` entries) a run with ``tags`` falls under, as tag
    filters whose runs can be counted. ``None`` when one cannot be counted by an exact tag filter (a limit on
    a tag key whatever its value): such a run is left to the queue, which can."""
    checks: list[LimitCheck] = []
    for entry in limits:
        key, limit = entry["key"], int(entry["limit"])
        if key not in tags:
            continue
        value = entry.get("value")
        if value is None:
            return None
        if isinstance(value, Mapping):  # {"applyLimitPerUniqueValue": true}: a limit per value of the key
            if not value.get("applyLimitPerUniqueValue"):
                return None
            checks.append(LimitCheck({key: tags[key]}, limit))
        elif tags[key] == value:
            checks.append(LimitCheck({key: str(value)}, limit))
    return checks


def choose_lane(
    tags: Mapping[str, str],
    limits: Sequence[Mapping[str, Any]],
    max_concurrent_runs: int,
    *,
    count_active: Callable[[Mapping[str, str]], int],
    count_running: Callable[[], int],
) -> Lane:
    """Direct or queued for a run with ``tags``. ``count_active(tags)``: other runs carrying ``tags`` that
    are queued or running; ``count_running()``: runs holding a slot of ``max_concurrent_runs`` (-1: no cap).
    The counts are asked for only when they can change the answer."""
    if not wants_direct(tags):
        return Lane(False, "not tagged for the direct lane")
    checks = limit_checks(tags, limits)
    if checks is None:
        return Lane(False, "a limit on a tag key (any value) applies: left to the queue")
    for check in checks:
        if count_active(check.tags) >= check.limit:
            return Lane(False, f"the limit {check.describe()} is full or has queued runs")
    if max_concurrent_runs >= 0 and count_running() >= max_concurrent_runs:
        return Lane(False, f"{max_concurrent_runs} runs already running")
    return Lane(True, "the queue would launch it at once")
