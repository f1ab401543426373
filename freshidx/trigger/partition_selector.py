"""What a ``--partition`` (or a launchpad partition value) names: one minute partition, or every
partition of one UTC hour, in any of the forms :data:`PARTITION_FORMS` lists. The ledger reads entries by
it (:mod:`freshidx.trigger.ledger`)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from freshidx.store.partitions import PartitionError, PartitionId

PARTITION_FORMS = (
    "20261124T0148 (compact minute)",
    "year=2026/month=11/day=24/hour=01/minute=48 (path)",
    "2026-11-24-01:00 (Dagster hour key: every partition of that hour)",
    "20261124T01 or year=2026/month=11/day=24/hour=01 (hour)",
)


@dataclass(frozen=True)
class PartitionSelector:
    """What ``--partition`` names: one minute partition, or every partition of one UTC hour.

    Entries store ``partition`` as a path (a minute for the delta, an hour for ``ads_hourly``), so
    matching is on paths; ``date`` is the ledger date directory every matching entry lives under
    (entries are keyed by their partition's date), which bounds the read to one day.
    """

    at: dt.datetime
    hour: bool  # True: the whole hour (its minutes and the hour's own entries)

    @property
    def date(self) -> dt.date:
        return self.at.date()

    @property
    def path(self) -> str:
        p = PartitionId(self.at)
        return p.hour_path if self.hour else p.path

    def matches(self, entry_partition: str | None) -> bool:
        if not entry_partition:
            return False
        text = entry_partition.rstrip("/")
        if self.hour:
            return text == self.path or text.startswith(self.path + "/")
        return text == self.path

    def minute(self) -> PartitionId:
        if self.hour:
            raise PartitionError(f"{self.path} is an hour; a single minute partition is needed here")
        return PartitionId(self.at)


def parse_partition(text: str) -> PartitionSelector:
    """Parse any accepted ``--partition`` form (:data:`PARTITION_FORMS`); PartitionError otherwise."""
    value = text.strip()
    formats = (("%Y%m%dT%H%M", False, 13), ("%Y%m%dT%H", True, 11), ("%Y-%m-%d-%H:%M", True, 16))
    for fmt, hour, width in formats:
        # strptime accepts unpadded fields ("2026111T1"); the fixed width keeps the forms strict.
        if len(value) != width:
            continue
        try:
            at = dt.datetime.strptime(value, fmt).replace(tzinfo=dt.UTC)
        except ValueError:
            continue
        if fmt == "%Y-%m-%d-%H:%M" and at.minute:
            break  # a Dagster hourly key always ends in :00
        return PartitionSelector(at, hour)
    if value.startswith("year="):
        stripped = value.rstrip("/")
        if stripped.count("/") == 3:  # year/month/day/hour: an hour path (ads_hourly entries)
            try:
                return PartitionSelector(PartitionId.parse(stripped + "/minute=00").at, True)
            except PartitionError:
                pass
        else:
            try:
                return PartitionSelector(PartitionId.parse(stripped).at, False)
            except PartitionError:
                pass
    raise PartitionError(f"cannot read partition {text!r}; accepted forms: " + "; ".join(PARTITION_FORMS))
