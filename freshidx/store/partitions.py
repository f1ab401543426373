"""Strict parsing of upstream partition paths ``year=YYYY/month=MM/day=DD/hour=HH/minute=mm``.

A partition is identified by the UTC minute encoded in its path. Anything that does not match the
layout exactly (zero-padded, valid ranges, no extra characters) is rejected with a reason and never
used to build a path of ours: that is what keeps ``..`` or ``year=2026/../../etc`` out of the store.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

_SEGMENTS = ("year", "month", "day", "hour", "minute")
_WIDTH = {"year": 4, "month": 2, "day": 2, "hour": 2, "minute": 2}
_SEGMENT_RE = re.compile(r"^(year|month|day|hour|minute)=([0-9]+)$")
_RANGE = {"year": (1970, 9999), "month": (1, 12), "day": (1, 31), "hour": (0, 23), "minute": (0, 59)}


class PartitionError(ValueError):
    """A partition path or segment that does not follow the layout."""


@dataclass(frozen=True, order=True)
class PartitionId:
    """One upstream partition: a UTC minute. Ordering is chronological."""

    at: dt.datetime

    def __post_init__(self) -> None:
        if self.at.tzinfo is None or self.at.utcoffset() != dt.timedelta(0):
            raise PartitionError("partition time must be timezone-aware UTC")
        if self.at.second or self.at.microsecond:
            raise PartitionError("partition time must be a whole minute")

    @classmethod
    def from_datetime(cls, value: dt.datetime) -> PartitionId:
        if value.tzinfo is None:
            raise PartitionError("naive datetime: partition times are UTC and must say so")
        return cls(value.astimezone(dt.UTC).replace(second=0, microsecond=0))

    @classmethod
    def parse(cls, path: str) -> PartitionId:
        """Parse ``year=…/month=…/day=…/hour=…/minute=…`` (optionally with a trailing ``/``)."""
        text = path[:-1] if path.endswith("/") else path
        parts = text.split("/")
        if len(parts) != len(_SEGMENTS):
            raise PartitionError(f"expected {len(_SEGMENTS)} segments, got {len(parts)}: {path!r}")
        values: dict[str, int] = {}
        for expected, part in zip(_SEGMENTS, parts, strict=True):
            values[expected] = parse_segment(part, expected)
        try:
            at = dt.datetime(
                values["year"], values["month"], values["day"], values["hour"], values["minute"],
                tzinfo=dt.UTC,
            )
        except ValueError as exc:  # e.g. day=31 in a 30-day month
            raise PartitionError(f"not a calendar minute: {path!r} ({exc})") from exc
        return cls(at)

    @property
    def path(self) -> str:
        """The partition path as written upstream, e.g. ``year=2026/month=11/day=21/hour=14/minute=05``."""
        a = self.at
        return f"year={a.year:04d}/month={a.month:02d}/day={a.day:02d}/hour={a.hour:02d}/minute={a.minute:02d}"

    @property
    def hour_path(self) -> str:
        a = self.at
        return f"year={a.year:04d}/month={a.month:02d}/day={a.day:02d}/hour={a.hour:02d}"

    @property
    def hour_start(self) -> dt.datetime:
        return self.at.replace(minute=0)

    @property
    def compact(self) -> str:
        """Sortable, path-safe short form used in version names and ledger keys: ``20261121T1405``."""
        return self.at.strftime("%Y%m%dT%H%M")

    @property
    def dagster_hour_key(self) -> str:
        """Key of the hourly Dagster partition this minute falls in (``%Y-%m-%d-%H:00``)."""
        return self.at.strftime("%Y-%m-%d-%H:00")

    def __str__(self) -> str:
        return self.path


def parse_segment(segment: str, expected: str) -> int:
    """Parse one ``name=value`` segment strictly (name, zero padding and range)."""
    seg = segment[:-1] if segment.endswith("/") else segment
    m = _SEGMENT_RE.match(seg)
    if not m:
        raise PartitionError(f"malformed segment {segment!r}, expected {expected}=<digits>")
    name, digits = m.group(1), m.group(2)
    if name != expected:
        raise PartitionError(f"segment {segment!r} out of order, expected {expected}=")
    if len(digits) != _WIDTH[name]:
        raise PartitionError(f"segment {segment!r} must be zero-padded to {_WIDTH[name]} digits")
    value = int(digits)
    lo, hi = _RANGE[name]
    if not lo <= value <= hi:
        raise PartitionError(f"segment {segment!r} out of range {lo}..{hi}")
    return value


SEGMENT_NAMES = _SEGMENTS
