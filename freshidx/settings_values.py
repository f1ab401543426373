"""Parsers and allowed values of settings given as text (readiness policies, durations), apart from the
model that declares the fields (:mod:`freshidx.settings`)."""

from __future__ import annotations

import re

READINESS_POLICIES = ("visible", "marker", "quiet_period", "manifest")
OVERLAP_POLICIES = ("serialize", "skip", "queue")


def parse_readiness(text: str) -> tuple[str, dict[str, str]]:
    """``"marker"`` or ``"quiet_period,ad_updates=manifest"`` → (default policy, per-source policies)."""
    default = "visible"
    per_source: dict[str, str] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        src, eq, policy = item.rpartition("=")
        if policy not in READINESS_POLICIES:
            raise ValueError(f"unknown readiness policy {policy!r} (one of {', '.join(READINESS_POLICIES)})")
        if eq and not re.match(r"^[a-z][a-z0-9_]{0,62}$", src):
            raise ValueError(f"bad source name {src!r} in readiness")
        if eq:
            per_source[src] = policy
        else:
            default = policy
    return default, per_source


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([hms])")


def parse_duration(text: str) -> float:
    """``"86400"``, ``"90s"``, ``"30m"``, ``"24h"`` or ``"1h30m"`` → seconds."""
    t = text.strip().lower()
    try:
        return float(t)
    except ValueError:
        pass
    parts = _DURATION_PART.findall(t)
    if not parts or "".join(n + u for n, u in parts) != t:
        raise ValueError(f"not a duration: {text!r} (seconds, or like 90s, 30m, 24h, 1h30m)")
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)
