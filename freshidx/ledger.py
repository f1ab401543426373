"""The trigger ledger: one create-once object per trigger decision, in the object store.

It lives next to the data (``ledger/<pipeline>/<date>/<trigger-id>.json``, DESIGN §3) so it
survives a wiped Dagster instance, and create-once writes make run creation idempotent: two
sensors (or a sensor and a retry) racing on the same trigger cannot both win.

Trigger ids used by the delta pipeline, for partition ``P`` (compact form ``20261121T1405``):

* ``P``             the partition's final decision: ``superseded`` / ``published`` / ``refused``
* ``P.aN``          attempt ``N`` accepted: a run was requested for it (run key ``delta:<P>:aN``)
* ``P.aN.run``      the run that executes attempt ``N`` (its run id)
* ``P.invalid-R``   run ``R`` built a version that failed the validation gate (not final: retried)
* ``P.parked``      attempts exhausted; waiting for a newer partition or an explicit retry
* ``P.grant-K``     an operator granted one more attempt (``freshidx ledger retry``)
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from freshidx import layout
from freshidx.partitions import PartitionError, PartitionId
from freshidx.publish import iso, utcnow
from freshidx.store import NotFound, ObjectStore, PreconditionFailed

SUPERSEDED = "superseded"
ACCEPTED = "accepted"
PUBLISHED = "published"
REFUSED = "refused"
INVALID = "validation_failed"
PARKED = "parked"
UNLISTED = "not_listed"


@dataclass
class Entry:
    pipeline: str
    trigger_id: str
    decision: str
    reason: str
    partition: str | None = None  # partition path as written upstream
    scope: str | None = None  # for triggers that are not a single partition
    run_id: str | None = None
    run_key: str | None = None
    attempt: int | None = None
    at: str = field(default_factory=lambda: iso(utcnow()))
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def partition_key(pipeline: str, partition: PartitionId, suffix: str = "") -> str:
    return layout.ledger_key(pipeline, partition.at.strftime("%Y-%m-%d"), partition.compact + suffix)


def record(store: ObjectStore, key: str, entry: Entry) -> bool:
    """Create-once. Returns False if a decision for this trigger was already recorded."""
    try:
        store.create_json(key, entry.to_dict())
    except PreconditionFailed:
        return False
    return True


def record_partition(store: ObjectStore, pipeline: str, partition: PartitionId, decision: str,
                     reason: str, **kw: Any) -> bool:
    return record(store, partition_key(pipeline, partition),
                  Entry(pipeline, partition.compact, decision, reason, partition=partition.path, **kw))


def partition_entries(store: ObjectStore, pipeline: str, partition: PartitionId) -> dict[str, dict[str, Any]]:
    """Every entry of one partition keyed by suffix ("" = final decision, "a1", "a1.run", …): one LIST."""
    return trigger_entries(store, pipeline, partition.at.strftime("%Y-%m-%d"), partition.compact)


def trigger_entries(store: ObjectStore, pipeline: str, date: str, trigger_id: str) -> dict[str, dict[str, Any]]:
    """Every entry whose trigger id is ``trigger_id`` or ``trigger_id.<suffix>``, keyed by suffix: one LIST."""
    base = layout.ledger_key(pipeline, date, trigger_id)[: -len(".json")]
    out: dict[str, dict[str, Any]] = {}
    for obj in store.list(base).objects:
        rest = obj.key[len(base):].removesuffix(".json")
        if rest and not rest.startswith("."):
            continue  # another partition sharing the prefix (cannot happen with fixed-width ids)
        try:
            out[rest.removeprefix(".")] = dict(store.get_json(obj.key)[0])
        except NotFound:
            continue
    return out


def attempts(store: ObjectStore, pipeline: str, partition: PartitionId) -> list[dict[str, Any]]:
    """Accepted attempts for a partition, oldest first."""
    found = partition_entries(store, pipeline, partition)
    return sorted((e for k, e in found.items() if k[:1] == "a" and k[1:].isdigit()),
                  key=lambda e: int(e.get("attempt") or 0))


def grants(store: ObjectStore, pipeline: str, partition: PartitionId) -> int:
    return sum(1 for k in partition_entries(store, pipeline, partition) if k.startswith("grant-"))


def grant_retry(store: ObjectStore, pipeline: str, partition: PartitionId, reason: str) -> str:
    """Explicitly allow one more attempt for a partition (a new attempt number, a new run key)."""
    n = grants(store, pipeline, partition) + 1
    while not record(store, partition_key(pipeline, partition, f".grant-{n}"),
                     Entry(pipeline, f"{partition.compact}.grant-{n}", "retry_granted", reason,
                           partition=partition.path)):
        n += 1
    return f"{partition.compact}.grant-{n}"


def decision(store: ObjectStore, pipeline: str, partition: PartitionId) -> dict[str, Any] | None:
    try:
        return dict(store.get_json(partition_key(pipeline, partition))[0])
    except NotFound:
        return None


def read(store: ObjectStore, pipeline: str, since: dt.date | None = None,
         until: dt.date | None = None) -> Iterator[dict[str, Any]]:
    """Entries of a pipeline, in key order, limited to dates in [since, until] when given."""
    root = f"ledger/{pipeline}/"
    start_after = f"{root}{(since - dt.timedelta(days=1)).isoformat()}~" if since else None
    for obj in store.iter_objects(root, start_after=start_after):
        date = obj.key[len(root):].split("/", 1)[0]
        if until is not None and date > until.isoformat():
            return
        try:
            yield dict(store.get_json(obj.key)[0])
        except NotFound:
            continue


# ------------------------------------------------------------------ partition selectors (CLI)

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
