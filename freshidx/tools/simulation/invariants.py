"""The protocol's invariants (docs/architecture.md#invariants), checked against the store after every step.

Reads the in-memory store directly (no scheduling point). After every step that changed the store:

* ``pointer-monotonic``: each ``CURRENT`` is the next generation of the one before (seq + 1, replacing the
  version it read: no lost update) and a publication never moves the position back (the same position only
  for a compaction); a rollback is the one recorded way back;
* ``visible-intact``: the serving version, the versions a reader may still hold (served within the grace) and
  the ones gc keeps (the last ``keep_last`` of the history) have their manifest and every file it lists;

at every delete: ``gc-deleted-reachable`` (a file of the serving version), ``gc-deleted-young`` (an object or
a version served within the grace). At the end (:meth:`Checker.final`): ``ledger-unexplained`` (a partition
given to an actor without a final decision) and ``refused-version-served``.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from freshidx.publish.commit import parse_iso
from freshidx.publish.gc_plan import kept_versions
from freshidx.store import layout
from freshidx.store.partitions import PartitionId
from freshidx.store.records import Manifest, Pointer
from freshidx.tools.simulation import memstore
from freshidx.tools.simulation.memstore import MemStore
from freshidx.tools.simulation.scheduler import SimClock
from freshidx.trigger import ledger

INDEXES = ("delta", "full")
#: Keys the checker builds again at every step, built once per process.
_POINTER_KEYS = tuple((index, layout.pointer_key(index)) for index in INDEXES)
_manifest_key = functools.lru_cache(maxsize=1 << 12)(layout.manifest_key)
_history_key = functools.lru_cache(maxsize=1 << 12)(layout.history_key)


# Parsed once per process by content (the records the code under test reads of the same bytes): every schedule
# starts from the same records, and the checker reads each pointer and manifest again and again (read-only).
def _pointer(raw: bytes) -> Pointer:
    return memstore.read_record(Pointer, raw)


@functools.lru_cache(maxsize=4096)
def _served_files(raw: bytes) -> Mapping[str, int]:
    """The files a reader of the manifest ``raw`` downloads, with their sizes."""
    manifest = memstore.read_record(Manifest, raw)  # the record the code under test reads of these bytes
    return MappingProxyType({f["key"]: int(f["bytes"]) for s in manifest.served_shards() for f in s["files"]})


@dataclass(frozen=True)
class Violation:
    invariant: str
    detail: str


class Violated(Exception):
    def __init__(self, violation: Violation) -> None:
        super().__init__(f"{violation.invariant}: {violation.detail}")
        self.violation = violation


@dataclass
class Checker:
    store: MemStore
    clock: SimClock
    grace: dt.timedelta
    keep_last: int
    found: list[Violation] = field(default_factory=list)
    pointers: dict[str, tuple[str, Pointer] | None] = field(default_factory=dict)
    stopped: dict[tuple[str, str], dt.datetime] = field(default_factory=dict)  # version -> when it stopped serving
    served: set[tuple[str, str]] = field(default_factory=set)
    kept: dict[str, list[str]] = field(default_factory=dict)
    _manifests: dict[tuple[str, str], Mapping[str, int]] = field(default_factory=dict)
    _seen: int = -1
    _removed: int = -1

    def start(self) -> None:
        """Take the starting state as given, then watch every change and delete."""
        for index in INDEXES:
            self.pointers[index] = self._read_pointer(index)
            if self.pointers[index] is not None:
                self.served.add((index, self.pointers[index][1].version))  # type: ignore[index]
            self._refresh_kept(index)
            self._stopped_before(index)
        self.store.on_delete = self.on_delete
        self._seen = self.store.mutations

    def _stopped_before(self, index: str) -> None:
        """When each version the history names stopped serving (the publication of the next entry)."""
        entry = self.pointers.get(index)
        after = entry[1] if entry is not None else None
        while after is not None and after.seq > 1:
            raw = self.store.raw(_history_key(index, after.seq - 1))
            if raw is None:
                return
            before = _pointer(raw)
            if before.version != after.version:
                at = parse_iso(after.published_at)
                self.stopped[(index, before.version)] = max(at, self.stopped.get((index, before.version), at))
            self.served.add((index, before.version))
            after = before

    def violate(self, invariant: str, detail: str) -> None:
        self.found.append(Violation(invariant, detail))

    # ---- after every step
    def check(self) -> None:
        store = self.store
        if store.mutations != self._seen:
            self._seen = store.mutations
            objects, pointers = store.objects, self.pointers
            moved = [self._check_pointer(index) if (found := objects.get(key)) is None
                     or (before := pointers.get(index)) is None or before[0] != found[1] else False
                     for index, key in _POINTER_KEYS]
            # A version can only lose a file by a delete or an overwrite of that file or its manifest, and only
            # a moved pointer adds versions that must be intact: otherwise the last full check still holds.
            removed, first = store.removed, self._removed < 0
            if any(moved) or first or (len(removed) != self._removed and self._touches(removed[self._removed:])):
                for index in INDEXES:
                    self._check_intact(index)
            self._removed = len(removed)
        if self.found:
            raise Violated(self.found[0])

    def _touches(self, keys: list[str]) -> bool:
        """Whether a deleted or overwritten key is a manifest or a file of a version checked before (every
        version that must be intact was, at the last full check: its files are cached)."""
        cached = self._manifests.values()
        return any(key.endswith("/manifest.json") or any(key in files for files in cached) for key in keys)

    def _read_pointer(self, index: str) -> tuple[str, Pointer] | None:
        found = self.store.objects.get(layout.pointer_key(index))
        return None if found is None else (found[1], _pointer(found[0]))

    def _check_pointer(self, index: str) -> bool:
        """Check ``index``'s ``CURRENT`` against the one seen before; True: it moved."""
        before = self.pointers.get(index)
        key = layout.pointer_key(index)
        found = self.store.objects.get(key)
        if found is None:
            if before is not None:
                self.violate("pointer-monotonic", f"{key} disappeared")
            return False
        if before is not None and before[0] == found[1]:
            return False
        now = _pointer(found[0])
        self.pointers[index] = (found[1], now)
        self.served.add((index, now.version))
        if before is None:
            return True
        old = before[1]
        self.stopped[(index, old.version)] = self.clock.now()
        if now.seq != old.seq + 1 or now.previous_version != old.version:
            self.violate("pointer-monotonic", f"{key} went from seq {old.seq} ({old.version}) to seq {now.seq} "
                         f"({now.version}, written over {now.previous_version}): not a compare-and-swap of what "
                         "it read (lost update)")
        elif now.action == "publish" and (now.position < old.position or (
                now.position == old.position and not self._is_compaction(index, now.version))):
            self.violate("pointer-monotonic", f"{key} moved from position {old.position} to {now.position} "
                         f"(version {now.version}) by a publication")
        self._refresh_kept(index)
        return True

    def _is_compaction(self, index: str, version: str) -> bool:
        raw = self.store.raw(_manifest_key(index, version))
        return raw is not None and (json.loads(raw).get("inputs") or {}).get("build") == "compaction"

    def _refresh_kept(self, index: str) -> None:
        entry = self.pointers.get(index)
        if entry is None:
            self.kept[index] = []
            return
        entries = [entry[1]]
        for seq in range(entry[1].seq - 1, 0, -1):
            raw = self.store.raw(_history_key(index, seq))
            if raw is None:
                break
            entries.append(_pointer(raw))
        self.kept[index] = kept_versions(entries, self.keep_last)[0]

    def _files(self, index: str, version: str) -> Mapping[str, int] | None:
        """The files a reader of ``version`` downloads, with their sizes (None: no manifest), cached
        (manifests are create-once)."""
        cached = self._manifests.get((index, version))
        if cached is None:
            raw = self.store.raw(_manifest_key(index, version))
            if raw is None:
                return None
            cached = self._manifests[(index, version)] = _served_files(raw)
        elif _manifest_key(index, version) not in self.store.objects:
            return None
        return cached

    def _missing(self, index: str, version: str) -> str | None:
        files = self._files(index, version)
        if files is None:
            return _manifest_key(index, version)
        objects = self.store.objects
        for key, size in files.items():
            found = objects.get(key)
            if found is None or len(found[0]) != size:
                return key
        return None

    def _check_intact(self, index: str) -> None:
        entry = self.pointers.get(index)
        now = self.clock.now()
        must: dict[str, str] = {v: "kept by gc (last of the history)" for v in self.kept.get(index, [])}
        must.update({v: "served within the grace" for (i, v), t in self.stopped.items()
                     if i == index and now - t <= self.grace})
        if entry is not None:
            must[entry[1].version] = "serving"
        for version, why in must.items():
            missing = self._missing(index, version)
            if missing is not None:
                self.violate("visible-intact", f"{index} version {version} ({why}) lacks {missing}")
                return

    # ---- every delete
    def on_delete(self, key: str, modified: dt.datetime) -> None:
        now = self.clock.now()
        for index in INDEXES:
            entry = self.pointers.get(index)
            if entry is not None and self._reaches(index, entry[1].version, key):
                self.violate("gc-deleted-reachable", f"{key}: the serving {index} version {entry[1].version} reads it")
            for (i, version), stopped in self.stopped.items():
                if i == index and now - stopped <= self.grace and self._reaches(index, version, key):
                    self.violate("gc-deleted-young", f"{key}: {index} version {version} reads it and stopped "
                                 f"serving {(now - stopped).total_seconds():.0f} s ago, grace {self.grace}")
        if now - modified <= self.grace:
            self.violate("gc-deleted-young", f"{key} written {(now - modified).total_seconds():.0f} s ago, "
                         f"grace {self.grace}")

    def _reaches(self, index: str, version: str, key: str) -> bool:
        if key == _manifest_key(index, version):
            return True
        self._files(index, version)  # cache the manifest's files while it is there
        return key in self._manifests.get((index, version), ())

    # ---- at the end
    def explained(self, given: list[PartitionId]) -> bool:
        return all(ledger.partition_key("delta", p) in self.store.objects or self._parked(p) for p in given)

    def final(self, given: list[PartitionId], outcomes: dict[str, Any]) -> None:
        for p in given:
            if ledger.partition_key("delta", p) not in self.store.objects and not self._parked(p):
                self.violate("ledger-unexplained", f"partition {p.path} has no final decision in the ledger")
        for index in INDEXES:
            prefix = layout.index_root(index) + "refused/"
            for key in self.store.under(prefix):
                version = key[len(prefix):].removesuffix(".json")
                if (index, version) in self.served:
                    self.violate("refused-version-served", f"{index} version {version} was refused and served")
        if self.found:
            raise Violated(self.found[0])

    def _parked(self, p: PartitionId) -> bool:
        prefix = ledger.partition_key("delta", p, ".parked")
        return bool(self.store.under(prefix.removesuffix(".json"), limit=1))
