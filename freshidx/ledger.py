"""The trigger ledger: one create-once object per trigger decision, in the object store.

It lives next to the data (``ledger/<pipeline>/<date>/<trigger-id>.json``, DESIGN §3) so it
survives a wiped Dagster instance, and create-once writes make run creation idempotent: two
sensors (or a sensor and a retry) racing on the same trigger cannot both win.

Trigger ids used by the delta pipeline, for partition ``P`` (compact form ``20261121T1405``):

* ``P``        the partition's final decision: ``superseded`` / ``published`` / ``refused`` / ``parked``
* ``P.aN``     attempt ``N`` accepted: a run was requested for it (run key ``delta:<P>:aN``)
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from freshidx import layout
from freshidx.partitions import PartitionId
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


def attempts(store: ObjectStore, pipeline: str, partition: PartitionId) -> list[dict[str, Any]]:
    """Accepted attempts for a partition, oldest first (one LIST call)."""
    prefix = partition_key(pipeline, partition, ".a")[: -len(".json")]
    out = []
    for obj in store.list(prefix).objects:
        try:
            out.append(store.get_json(obj.key)[0])
        except NotFound:
            continue
    return sorted(out, key=lambda e: int(e.get("attempt") or 0))


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
