"""The trigger ledger: one create-once object per trigger decision, in the object store.

It lives next to the data (``ledger/<pipeline>/<date>/<trigger-id>.json``,
docs/architecture.md#object-store-layout) so it
survives a wiped Dagster instance, and create-once writes make run creation idempotent: two
sensors (or a sensor and a retry) racing on the same trigger cannot both win.

Trigger ids the delta pipeline writes, for partition ``P`` (compact form ``20261121T1405``; the
grammar, the decisions and the attempt state are :mod:`freshidx.trigger.lifecycle`):

* ``P``               the partition's final decision: ``folded`` (read by the micro-batch for a newer
                      partition) / ``superseded`` / ``published`` / ``refused``
* ``P.aN``            attempt ``N`` accepted: a run was requested for it (run key ``delta:<P>:aN``)
* ``P.aN.run``        the run that executes attempt ``N`` (its run id)
* ``P.aN.lost``       that run's worker died (run health): ``failed``
* ``P.invalid-R``     run ``R`` built a version that failed the validation gate (not final: retried)
* ``P.refused-R``     run ``R`` was for a partition not newer than the serving one (not built)
* ``P.published-R``   run ``R`` published ``P`` after another final decision had been recorded
* ``P.parked-N``      ``N`` attempts exhausted; waiting for a newer partition or an explicit retry
* ``P.grant-K``       an operator granted one more attempt (``freshidx ledger retry``)
* ``P.gap``           partitions after the watermark and before ``P`` were not listed (too far behind)

The full index writes one ``<cutoff minute>-<version>`` per built version; the catch-up's hour
entries are listed in :mod:`freshidx.catchup.planner`.

**Every visible partition is explained** (docs/architecture.md#nothing-visible-is-lost): it has a final
decision ``P``, is parked, or lies in a gap. Whoever moves the delta's pointer settles what the sensor did not see
(:func:`settle_publication`: partitions a manual or queued run jumped over, late partitions inside
its window); the full index settles late partitions no delta window can read any more
(:func:`settle_full`). :func:`unexplained` is the check (the end-to-end tests use it on the output
of ``freshidx ledger --json``).
"""

from __future__ import annotations

import datetime as dt
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from freshidx.store import NotFound, ObjectInfo, ObjectStore, PreconditionFailed, layout
from freshidx.store.partitions import PartitionError, PartitionId
from freshidx.store.records import LedgerEntry
from freshidx.trigger.lifecycle import FINAL, Decision, Mark, TriggerId, attempt_state, parse_suffix
from freshidx.trigger.listing import partitions_after
from freshidx.trigger.partition_selector import PARTITION_FORMS, PartitionSelector, parse_partition

# Short names for the decisions this module's callers (and tests) use most; the values are
# :class:`~freshidx.trigger.lifecycle.Decision`'s.
SUPERSEDED = Decision.SUPERSEDED
FOLDED = Decision.FOLDED
ACCEPTED = Decision.ACCEPTED
PUBLISHED = Decision.PUBLISHED
REFUSED = Decision.REFUSED
INVALID = Decision.VALIDATION_FAILED
PARKED = Decision.PARKED
UNLISTED = Decision.NOT_LISTED
# Re-exported for callers of the ledger API (the CLI reads entries by a partition selector).
__all__ = ["FINAL", "PARTITION_FORMS", "Decision", "PartitionSelector", "TriggerId", "parse_partition"]


#: A ledger entry (the record model; ``Entry`` is its name in the ledger's API).
Entry = LedgerEntry


def partition_key(pipeline: str, partition: PartitionId, suffix: str | TriggerId = "") -> str:
    """Key of ``partition``'s entry: a :class:`TriggerId` of it, or a raw ``.suffix`` string."""
    tid = suffix if isinstance(suffix, TriggerId) else partition.compact + suffix
    return layout.ledger_key(pipeline, partition.at.strftime("%Y-%m-%d"), str(tid))


def record(store: ObjectStore, key: str, entry: Entry) -> bool:
    """Create-once. Returns False if a decision for this trigger was already recorded."""
    try:
        entry.create(store, key)
    except PreconditionFailed:
        return False
    return True


def record_partition(store: ObjectStore, pipeline: str, partition: PartitionId, decision: str,
                     reason: str, *, tid: TriggerId | None = None, **kw: Any) -> bool:
    """Create-once entry ``tid`` of ``partition`` (default: its final decision ``P``)."""
    tid = tid or TriggerId(partition.compact)
    return record(store, partition_key(pipeline, partition, tid),
                  Entry(pipeline, str(tid), decision, reason, partition=partition.path, **kw))


def partition_entries(store: ObjectStore, pipeline: str, partition: PartitionId) -> dict[str, dict[str, Any]]:
    """Every entry of one partition keyed by suffix ("" = final decision, "a1", "a1.run", …): one LIST."""
    return trigger_entries(store, pipeline, partition.at.strftime("%Y-%m-%d"), partition.compact)


#: Entries are create-once, so one read under a listed ``(store, key, etag)`` stays true: a sensor that
#: re-lists a waiting trigger every tick (the catch-up scans up to ``hourly_lookahead_hours`` hours)
#: does not GET its entries again. Per process (a code server keeps it across ticks), bounded.
_ENTRY_CACHE: OrderedDict[tuple[str, str, str], Entry] = OrderedDict()
_ENTRY_CACHE_SIZE = 4096
_ENTRY_CACHE_LOCK = threading.Lock()


def _read_entry(store: ObjectStore, obj: ObjectInfo) -> Entry:
    """``obj``'s entry (raises NotFound), from the cache when this version of it was read before."""
    cache_key = (store.uri, obj.key, obj.etag)
    with _ENTRY_CACHE_LOCK:
        hit = _ENTRY_CACHE.get(cache_key)
        if hit is not None:
            _ENTRY_CACHE.move_to_end(cache_key)
            return hit
    entry = Entry.read(store, obj.key)[0]
    if obj.etag:
        with _ENTRY_CACHE_LOCK:
            _ENTRY_CACHE[cache_key] = entry
            while len(_ENTRY_CACHE) > _ENTRY_CACHE_SIZE:
                _ENTRY_CACHE.popitem(last=False)
    return entry


def trigger_entries(store: ObjectStore, pipeline: str, date: str, trigger_id: str) -> dict[str, Entry]:
    """Every entry whose trigger id is ``trigger_id`` or ``trigger_id.<suffix>``, keyed by suffix: one LIST
    (and a GET of each entry not read before)."""
    base = layout.ledger_key(pipeline, date, trigger_id)[: -len(".json")]
    out: dict[str, Entry] = {}
    for obj in store.list(base).objects:
        rest = obj.key[len(base):].removesuffix(".json")
        if rest and not rest.startswith("."):
            continue  # another partition sharing the prefix (cannot happen with fixed-width ids)
        try:
            out[rest.removeprefix(".")] = _read_entry(store, obj)
        except NotFound:
            continue
    return out


#: The reason of a ``P.aN.run`` entry a sensor-requested run writes (:func:`start_attempt`).
RUN_STARTED = "run started for accepted trigger"


def start_attempt(store: ObjectStore, pipeline: str, partition: PartitionId, attempt: int, *, run_id: str,
                  run_key: str | None, reason: str = RUN_STARTED) -> bool:
    """The run executing accepted attempt ``attempt`` of ``partition`` links itself to the claim: ``P.aN.run``,
    ``started`` (create-once). A sensor-requested run writes it when it begins; the continuous loop, which
    runs its own requests, when it claims (:func:`freshidx.trigger.latest_only.apply`)."""
    return record_partition(store, pipeline, partition, Decision.STARTED, reason,
                            tid=TriggerId(partition.compact).claim(attempt).then(Mark.RUN), run_id=run_id,
                            run_key=run_key, attempt=attempt)


def grants(store: ObjectStore, pipeline: str, partition: PartitionId) -> int:
    return attempt_state(partition_entries(store, pipeline, partition)).grants


def grant_retry(store: ObjectStore, pipeline: str, partition: PartitionId, reason: str) -> str:
    """Explicitly allow one more attempt for a partition (a new attempt number, a new run key)."""
    n = grants(store, pipeline, partition) + 1
    while not record_partition(store, pipeline, partition, Decision.RETRY_GRANTED, reason,
                               tid=TriggerId(partition.compact).then(Mark.GRANT, n)):
        n += 1
    return str(TriggerId(partition.compact).then(Mark.GRANT, n))


def decision(store: ObjectStore, pipeline: str, partition: PartitionId) -> Entry | None:
    return Entry.read_if_exists(store, partition_key(pipeline, partition))[0]


def read(store: ObjectStore, pipeline: str, since: dt.date | None = None,
         until: dt.date | None = None) -> Iterator[Entry]:
    """Entries of a pipeline, in key order, limited to dates in [since, until] when given."""
    root = f"ledger/{pipeline}/"
    start_after = f"{root}{(since - dt.timedelta(days=1)).isoformat()}~" if since else None
    for obj in store.iter_objects(root, start_after=start_after):
        date = obj.key[len(root):].split("/", 1)[0]
        if until is not None and date > until.isoformat():
            return
        try:
            yield Entry.read(store, obj.key)[0]
        except NotFound:
            continue


# ------------------------------------------------------------------ every partition explained


_GAP_SCOPE = re.compile(r"^before (?P<before>\S+), after (?P<after>\S+)$")


@dataclass
class Explained:
    """What the ledger of one pipeline explains: final decisions, parked partitions, unlisted gaps."""

    final: set[str] = field(default_factory=set)  # compact ids with a final decision
    parked: set[str] = field(default_factory=set)
    gaps: list[tuple[str | None, str]] = field(default_factory=list)  # (after path or None, before path)

    def covers(self, p: PartitionId) -> bool:
        if p.compact in self.final or p.compact in self.parked:
            return True
        return any((after is None or p.path > after) and p.path < before for after, before in self.gaps)

    def add(self, trigger_id: str, body: Entry | None = None) -> None:
        compact, _, suffix = trigger_id.partition(".")
        tid = parse_suffix(compact, suffix)
        if not suffix:
            self.final.add(compact)
        elif tid is None:
            return  # a form this version does not write
        elif tid.mark == Mark.PARKED and tid.attempt is None and tid.correction is None:
            self.parked.add(compact)
        elif tid.mark == Mark.GAP and tid.attempt is None and body is not None:
            gap = gap_range(body)
            if gap is not None:
                self.gaps.append(gap)

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]]) -> Explained:
        """From ledger entries as ``freshidx ledger --json`` prints them."""
        out = cls()
        for r in rows:
            entry = Entry.from_json(r)
            out.add(entry.trigger_id, entry)
        return out


def gap_range(entry: Entry) -> tuple[str | None, str] | None:
    """``(after, before)`` partition paths of a ``.gap`` entry (older entries only have the scope text)."""
    recorded = entry.gap()
    if recorded is not None:
        return recorded
    m = _GAP_SCOPE.match(entry.scope or "")
    if m is None:
        return None
    return (None if m["after"] == "-" else m["after"]), m["before"]


def explained(store: ObjectStore, pipeline: str, since: dt.date | None, until: dt.date | None) -> Explained:
    """The :class:`Explained` of ``pipeline`` for dates in [since, until]: one paginated LIST, and a
    read only of the few ``.gap`` entries (decisions are told from their keys)."""
    root = f"ledger/{pipeline}/"
    start_after = f"{root}{(since - dt.timedelta(days=1)).isoformat()}~" if since else None
    out = Explained()
    for obj in store.iter_objects(root, start_after=start_after):
        date, _, name = obj.key[len(root):].partition("/")
        if until is not None and date > until.isoformat():
            break
        trigger_id = name.removesuffix(".json")
        body = None
        if trigger_id.endswith(f".{Mark.GAP}"):
            try:
                body = Entry.read(store, obj.key)[0]
            except NotFound:
                continue
        out.add(trigger_id, body)
    return out


def unexplained(ex: Explained, partitions: Iterable[PartitionId]) -> list[PartitionId]:
    return sorted(p for p in partitions if not ex.covers(p))


def record_gap(store: ObjectStore, pipeline: str, before: PartitionId, after: PartitionId | None, why: str) -> bool:
    """Partitions in (after, before) were never listed: one entry for the range (``P.gap``)."""
    scope = f"before {before.path}, after {after.path if after else '-'}"
    tid = TriggerId(before.compact).then(Mark.GAP)
    return record(store, partition_key(pipeline, before, tid), Entry(
        pipeline, str(tid), UNLISTED, why, scope=scope,
        extra={"before": before.path, "after": after.path if after else None}))


def settle_publication(store: ObjectStore, pipeline: str, source: str, published: PartitionId,
                       previous: PartitionId | None, window_start: dt.datetime | None, *, scan_hours: int,
                       version: str, run_id: str) -> list[str]:
    """After ``published`` became the watermark, give every visible partition the sensor can no longer
    list a final decision (create-once: what the sensor or another run already decided stays):

    * partitions in (``previous``, ``published``): the run jumped over them (a UI/CLI materialize, a
      run requested while they arrived under overlap ``queue``, a parked partition): ``folded``;
    * partitions in the window (``window_start``, ``previous``] without a decision: they became
      visible after the watermark had passed them and this delta read them: ``folded`` (late);
    * without a previous watermark (first publication), only the last ``scan_hours`` are listed and
      the rest is one ``.gap`` entry, as the sensor does.

    Cost: one listing of the raw keys after the lower bound and one of the ledger keys of those
    dates. Returns the compact ids recorded.
    """
    lower = previous
    if previous is not None and window_start is not None:
        lower = min(previous, PartitionId(window_start))
    found = partitions_after(store, source, lower, max_scan_hours=scan_hours, newest=published)
    first = found.unlisted_before or lower
    ex = explained(store, pipeline, first.at.date() if first else None, published.at.date())
    done: list[str] = []
    for p in found.partitions:
        if p >= published or p.compact in ex.final:
            continue
        if previous is None or p > previous:
            why = (f"folded into the micro-batch for {published.path}: read by run {run_id[:8]} (version "
                   f"{version}), which was requested for a newer partition (a manual materialize, or a run "
                   "requested before it arrived)")
            extra: dict[str, Any] = {"folded_into": published.path, "version": version}
        else:
            why = (f"late: visible only after the delta had passed it; read by the delta of {published.path} "
                   f"(version {version}, run {run_id[:8]})")
            extra = {"folded_into": published.path, "version": version, "late": True}
        if record_partition(store, pipeline, p, FOLDED, why, run_id=run_id, extra=extra):
            done.append(p.compact)
    if found.unlisted_before is not None:
        record_gap(store, pipeline, found.unlisted_before, previous,
                   f"no watermark before {published.path}: older partitions were not listed "
                   "(the full rebuild covers them)" if previous is None else
                   f"more than {scan_hours} h between {previous.path} and {published.path}; older "
                   "partitions were not listed (the full rebuild covers them)")
    return done


def settle_full(store: ObjectStore, source: str, *, cutoff: PartitionId, delta_watermark: PartitionId | None,
                window: dt.timedelta, listed_at: dt.datetime, version: str, run_id: str,
                pipeline: str = "delta") -> list[str]:
    """After a full version published: late partitions that no delta window can read any more (at or
    before ``delta_watermark - window``, and before ``cutoff``) and that the delta ledger does not
    explain were read by this full version only: recorded ``superseded`` (late, read by the full
    index). Only partitions whose objects were all visible at ``listed_at`` (the build's listing) are
    attributed. O(history) like the full build itself (one pass over raw keys and delta ledger keys);
    in steady state it writes nothing."""
    if delta_watermark is None:
        return []  # the sensor's first listing (or its gap entry) will explain them
    bound = min(cutoff, PartitionId(delta_watermark.at - window))
    seen: dict[PartitionId, bool] = {}
    root = layout.raw_root(source)
    for obj in store.iter_objects(root):
        part_path, _, name = obj.key[len(root):].rpartition("/")
        try:
            pid = PartitionId.parse(part_path)
        except PartitionError:
            continue
        if pid > bound:
            break  # keys are in chronological order
        if not name.startswith((".", "_")):
            seen[pid] = seen.get(pid, True) and obj.last_modified <= listed_at
    ex = explained(store, pipeline, None, bound.at.date())
    done: list[str] = []
    for p, visible in sorted(seen.items()):
        if not visible or ex.covers(p):
            continue
        why = (f"late: visible only after every delta window had passed it; read by the full index "
               f"(version {version}, cutoff {cutoff.path}, run {run_id[:8]})")
        if record_partition(store, pipeline, p, SUPERSEDED, why, run_id=run_id,
                            extra={"late": True, "read_by": f"full:{version}"}):
            done.append(p.compact)
    return done
