"""The chaos bench's measurements and checks, as pure functions of what it observed.

* the delta pointer, polled a few times a second (:class:`Observation`): :func:`backwards` counts moves
  back (``seq`` or ``position`` lower than an earlier reading: the pointer's own order, a compaction
  keeps ``position`` and raises ``seq``), :func:`publications` lists each move to newer data;
* each kill's recovery (:func:`recoveries`): seconds from the kill to the first publication of a delta
  newer than the one served at the kill; the baseline (:func:`baseline_gaps`): the gaps between two
  publications with no kill between them;
* :func:`unrestarted`: kills of a part the demo supervises that its output shows no restart for;
* :func:`summarize` puts everything into the result ``--json`` prints and :func:`failures` names each
  check that failed (``lost``, ``wrong``, ``backwards``, ``unexplained``, ``unrestarted``, ``outside``,
  ``leftover``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from freshidx.tools.chaos.kill_plan import RUN_TARGETS, SPARK_JVM, SUPERVISED, TARGETS

#: The counts that must be 0 for the run to pass.
CHECKS = ("lost", "wrong", "backwards", "unexplained", "unrestarted", "outside", "leftover")


@dataclass(frozen=True)
class Observation:
    """One reading of the delta pointer that differs from the one before."""

    t: float  # seconds since the bench started
    seq: int
    position: str  # ISO time the version covers up to: comparable as text
    version: str


@dataclass
class Kill:
    t: float
    target: str
    pid: int | None  # None: nothing to kill (skipped)
    recovery_s: float | None = None


def backwards(obs: Sequence[Observation]) -> int:
    """How many readings were older than an earlier one (by ``seq`` or by ``position``)."""
    count = 0
    best_seq, best_pos = -1, ""
    for o in obs:
        if o.seq < best_seq or o.position < best_pos:
            count += 1
        best_seq, best_pos = max(best_seq, o.seq), max(best_pos, o.position)
    return count


def publications(obs: Sequence[Observation]) -> list[Observation]:
    """The readings that showed newer data than every earlier one (the first reading included)."""
    out: list[Observation] = []
    for o in obs:
        if not out or o.position > out[-1].position:
            out.append(o)
    return out


def recoveries(kills: Sequence[Kill], obs: Sequence[Observation]) -> None:
    """Set each kill's ``recovery_s`` (None: no newer delta was published after it)."""
    pubs = publications(obs)
    for k in kills:
        if k.pid is None:
            continue
        served = max((p.position for p in pubs if p.t <= k.t), default="")
        after = next((p for p in pubs if p.t > k.t and p.position > served), None)
        k.recovery_s = None if after is None else round(after.t - k.t, 2)


def baseline_gaps(obs: Sequence[Observation], kills: Sequence[Kill]) -> list[float]:
    """Seconds between consecutive publications with no kill between them."""
    pubs = publications(obs)
    kill_times = [k.t for k in kills if k.pid is not None]
    return [round(b.t - a.t, 2) for a, b in itertools.pairwise(pubs)
            if not any(a.t < t <= b.t for t in kill_times)]


def unrestarted(kills: Sequence[Kill], restarts: Mapping[str, int]) -> int:
    """Kills of a supervised part (the demo's direct children) beyond the restarts the demo printed for it."""
    return sum(max(0, sum(1 for k in kills if k.target == kind and k.pid is not None) - restarts.get(kind, 0))
               for kind in SUPERVISED)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def stats(values: Iterable[float | None]) -> dict[str, Any]:
    vals = [v for v in values if v is not None]
    return {"n": len(vals), "p50": percentile(vals, 50), "p95": percentile(vals, 95),
            "max": max(vals) if vals else None}


def recovery_stats(kills: Sequence[Kill]) -> dict[str, Any]:
    """``run`` (run-worker kills: continuous and other), ``jvm``, ``all``, and one entry per target."""
    done = [k for k in kills if k.pid is not None]
    out: dict[str, Any] = {
        "run": stats(k.recovery_s for k in done if k.target in RUN_TARGETS),
        "jvm": stats(k.recovery_s for k in done if k.target == SPARK_JVM),
        "all": stats(k.recovery_s for k in done),
    }
    out["by_target"] = {t: stats(k.recovery_s for k in done if k.target == t) for t in TARGETS}
    return out


def per_target(kills: Sequence[Kill]) -> dict[str, list[float | None]]:
    """Every recovery, per target (None: no newer delta after that kill)."""
    return {t: [k.recovery_s for k in kills if k.target == t and k.pid is not None] for t in TARGETS}


def summarize(*, kills: Sequence[Kill], obs: Sequence[Observation], counts: Mapping[str, int],
              extra: Mapping[str, Any]) -> dict[str, Any]:
    """The bench's result: the check counts, recoveries, the baseline, the kills and ``extra`` facts."""
    out: dict[str, Any] = {k: int(counts.get(k, 0)) for k in CHECKS}
    out["backwards"] = backwards(obs)
    out["recovery_s"] = recovery_stats(kills)
    out["recoveries"] = per_target(kills)
    out["unrecovered"] = sum(1 for k in kills if k.pid is not None and k.recovery_s is None)
    out["baseline_gap_s"] = stats(baseline_gaps(obs, kills))
    out["publications"] = len(publications(obs))
    out["kills"] = [asdict(k) for k in kills]
    out.update(extra)
    out["failed"] = failures(out)
    return out


def failures(result: Mapping[str, Any]) -> list[str]:
    """The checks that failed (an empty list: the run passed)."""
    failed = [f"{c} {result[c]}" for c in CHECKS if result.get(c)]
    failed += [str(e) for e in result.get("errors", [])]
    return failed
