"""Retention: roll the pointer back to an earlier published version, and garbage-collect versions.

**Rollback** (:func:`rollback`) is a compare-and-swap of ``CURRENT`` to a version that was published
before (it appears in ``history/``) and whose files are all still there. It is recorded like a
publication: a new pointer with ``action="rollback"``, the next ``seq`` and a create-once history
entry. The pointer's position becomes the older version's, so the next normal publication that is
newer than *that* proceeds (monotonicity is checked against what readers see).

**GC** (:func:`gc`) deletes, per call at most ``max_versions`` version directories:

* versions that are neither the current pointer's nor among the ``keep_last`` most recent distinct
  versions in the history, once older than ``grace`` (published, superseded or refused alike);
* staged versions without a manifest (failed or abandoned builds) older than ``grace``;
* attempt-orphan shard directories (``shard-NNNNN-aK`` not listed in the manifest, left by retried
  Spark tasks) of versions with a manifest, once older than ``grace``. Files a manifest lists are
  never deleted from a kept version, the current one included.

A delta version's segments live under the versions that built them (``freshidx.delta.segments``): a version
whose segment a kept version serves is kept too, with its manifest (a rollback target needs both).

"Older than ``grace``" is measured from the newest object under the version's prefix *and*, for
versions that ever were served, from the time they stopped being served, so a reader that resolved
the pointer just before it moved can still download. The latter is bounded conservatively: a
version outside the kept ones was replaced no later than the publication of the oldest kept entry.
Deleting a version removes its manifest first, so a crash half-way leaves a manifest-less staged
version that the next sweep finishes (and that :func:`rollback` refuses).

Listing is fine here (a sweeper, not the hot path) but bounded per call.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from freshidx.publish.commit import Pointer, ensure_history, iso, parse_iso, read_pointer, utcnow
from freshidx.store import NotFound, ObjectStore, PreconditionFailed, WriteOutcomeUnknown, layout

MAX_HISTORY_WALK = 10_000
DEFAULT_MAX_VERSIONS = 100
DEFAULT_GRACE_MINUTES = 60
_SHARD_DIR_RE = re.compile(r"^shard-(\d{5,})-a(\d+)/$")


class RetentionError(RuntimeError):
    """A rollback or GC request that must not proceed (unknown version, missing files, race)."""


# --------------------------------------------------------------------------- history


def _check_index(index: str) -> None:
    if index not in layout.INDEX_NAMES:
        raise ValueError(f"index must be one of {layout.INDEX_NAMES}, got {index!r}")


def history_entries(
    store: ObjectStore, index: str, *, current: Pointer | None = None, limit: int = MAX_HISTORY_WALK
) -> list[Pointer]:
    """History entries from the current pointer's ``seq`` downwards (newest first), at most ``limit``.

    Reads entries by key (``history/<seq>.json``), no listing. The current pointer (read here unless
    given) stands in for its own entry if a crash left that out. Stops at the first missing ``seq``.
    """
    if current is None:
        current, _ = read_pointer(store, index)
    if current is None:
        return []
    out: list[Pointer] = [current]
    for seq in range(current.seq - 1, max(0, current.seq - limit), -1):
        try:
            data, _ = store.get_json(layout.history_key(index, seq))
        except NotFound:
            break
        out.append(Pointer.from_dict(data))
    return out


def _published(entries: list[Pointer], version: str) -> Pointer | None:
    """The entry of ``version``'s own publication (action ``publish``), or any entry pointing at it."""
    hits = [e for e in entries if e.version == version]
    for e in hits:
        if e.action == "publish":
            return e
    return hits[0] if hits else None


def missing_files(store: ObjectStore, index: str, version: str) -> list[str]:
    """What is missing for ``version`` to be served: its manifest or any file the manifest lists."""
    try:
        manifest, _ = store.get_json(layout.manifest_key(index, version))
    except NotFound:
        return [layout.manifest_key(index, version)]
    problems: list[str] = []
    shards = [sh for seg in manifest["segments"] for sh in seg["shards"]] if manifest.get("segments") \
        else manifest.get("shards", [])
    for s in shards:
        for f in s.get("files", []):
            try:
                info = store.head(f["key"])
            except NotFound:
                problems.append(f["key"])
                continue
            if info.size != int(f["bytes"]):
                problems.append(f"{f['key']} (size {info.size} != {f['bytes']})")
    return problems


# --------------------------------------------------------------------------- rollback


def rollback(store: ObjectStore, index: str, to_version: str | None = None) -> Pointer:
    """Point ``index`` back at ``to_version`` (default: the version published before the current one).

    Refuses (``RetentionError``) a version that was never published, the current version, and a
    version whose manifest or any listed file is gone. One compare-and-swap; losing it (somebody
    published meanwhile) raises instead of rolling back something the operator has not seen.

    A lost response (``WriteOutcomeUnknown``, or the 412 a client retry of our own applied write
    gets) is resolved by re-reading, like :func:`freshidx.publish.commit.publish` does: if ``CURRENT`` (or
    the history entry of our generation, when a publisher already replaced it) is our rollback, it
    succeeded. Re-running it instead would roll back one version further.
    """
    _check_index(index)
    pointer_now, etag = read_pointer(store, index)
    entries = history_entries(store, index, current=pointer_now) if pointer_now else []
    if not entries:
        raise RetentionError(f"{index}: nothing published, nothing to roll back")
    current = entries[0]
    if to_version is None:
        published = [e.version for e in entries if e.action == "publish"]
        order = list(dict.fromkeys(published))  # distinct, newest first
        if current.version in order:
            later = order[order.index(current.version) + 1:]
        else:  # pragma: no cover - the current version was always published once
            later = [v for v in order if v != current.version]
        if not later:
            raise RetentionError(f"{index}: no published version before {current.version}")
        to_version = later[0]
    if to_version == current.version:
        raise RetentionError(f"{index}: {to_version} is already current")
    target = _published(entries, to_version)
    if target is None:
        raise RetentionError(f"{index}: version {to_version!r} was never published (not in history)")
    missing = missing_files(store, index, to_version)
    if missing:
        raise RetentionError(
            f"{index}: cannot roll back to {to_version}: {len(missing)} file(s) gone, e.g. {missing[:3]}"
        )
    pointer = Pointer(
        index=index, version=target.version, seq=current.seq + 1, position=target.position,
        manifest=layout.manifest_key(index, target.version), doc_count=target.doc_count,
        published_at=iso(utcnow()), run_id=None, source_partition=target.source_partition,
        window_start=target.window_start, window_end=target.window_end, cutoff=target.cutoff,
        previous_version=current.version, action="rollback",
    )
    # Like publish(): the pointer being replaced gets its create-once history entry first (a crash
    # may have left it out), so the history stays walkable from any seq.
    ensure_history(store, current)
    try:
        store.swap_json(layout.pointer_key(index), pointer.to_dict(), etag)
    except (PreconditionFailed, WriteOutcomeUnknown) as exc:
        landed = _rollback_landed(store, pointer)
        if landed is None:
            raise RetentionError(
                f"{index}: the pointer moved while rolling back (not by this rollback); check "
                f"`freshidx status` before re-running it"
            ) from exc
        pointer = landed
    ensure_history(store, pointer)
    return pointer


def _same_rollback(a: Pointer, b: Pointer) -> bool:
    return (a.action == b.action == "rollback" and a.version == b.version and a.seq == b.seq
            and a.previous_version == b.previous_version)


def _rollback_landed(store: ObjectStore, ours: Pointer) -> Pointer | None:
    """Did our rollback swap land although we did not hear so? Returns our pointer as stored, else None.

    ``CURRENT`` holds it, or moved on past its ``seq`` with our rollback as that generation's history
    entry (the next publisher writes the entry of the pointer it replaces, see ``publish``).
    """
    now, _ = read_pointer(store, ours.index)
    if now is None:
        return None
    if _same_rollback(now, ours):
        return now
    if now.seq <= ours.seq:
        return None
    try:
        data, _ = store.get_json(layout.history_key(ours.index, ours.seq))
    except NotFound:
        return None
    entry = Pointer.from_dict(data)
    return entry if _same_rollback(entry, ours) else None


# --------------------------------------------------------------------------- gc


@dataclass
class GcReport:
    index: str
    dry_run: bool
    current: str | None
    kept: list[str] = field(default_factory=list)  # protected: current + last K
    deleted_versions: list[str] = field(default_factory=list)
    deleted_orphans: list[str] = field(default_factory=list)  # shard attempt prefixes
    deleted_objects: int = 0
    deleted_bytes: int = 0
    young: list[str] = field(default_factory=list)  # candidates still inside the grace period
    truncated: bool = False  # more versions left than this call may examine

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ensure_utc(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=dt.UTC)


def gc(
    store: ObjectStore, index: str, keep_last: int, grace: dt.timedelta, now: dt.datetime | None = None,
    *, dry_run: bool = False, max_versions: int = DEFAULT_MAX_VERSIONS,
) -> GcReport:
    """Delete old versions, abandoned staged versions and attempt orphans of ``index`` (module docstring)."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    _check_index(index)
    now = _ensure_utc(now or utcnow())
    root = layout.index_root(index)
    entries = history_entries(store, index)
    current = entries[0].version if entries else None
    kept: list[str] = []
    oldest_kept_entry: Pointer | None = None
    for e in entries:
        if e.version not in kept:
            if len(kept) >= keep_last:
                break
            kept.append(e.version)
        oldest_kept_entry = e
    protected = set(kept) | _segment_versions(store, index, kept)
    # A version not protected stopped being served no later than this (None: never served).
    served_until = parse_iso(oldest_kept_entry.published_at) if oldest_kept_entry else None
    report = GcReport(index=index, dry_run=dry_run, current=current, kept=kept)

    versions_root = root + "versions/"
    version_prefixes = store.list(versions_root, delimiter="/").prefixes
    examined = 0
    for vp in version_prefixes:
        version = vp[len(versions_root):].rstrip("/")
        if examined >= max_versions:
            report.truncated = True
            break
        examined += 1
        objects = store.list(vp).objects
        if not objects:
            if version not in protected and not dry_run:
                _prune_local_dirs(store, vp)  # empty directories left by an interrupted sweep
            continue
        newest = max(_ensure_utc(o.last_modified) for o in objects)
        try:
            manifest: dict[str, Any] | None = store.get_json(layout.manifest_key(index, version))[0]
        except NotFound:
            manifest = None
        if version in protected:
            if manifest is not None:
                _sweep_orphans(store, index, version, manifest, objects, now, grace, report)
            continue
        age_ref = newest
        if served_until is not None and manifest is not None:  # may have been served: see module docstring
            age_ref = max(age_ref, served_until)
        if now - age_ref <= grace:
            report.young.append(version)
            if manifest is not None:
                _sweep_orphans(store, index, version, manifest, objects, now, grace, report)
            continue
        report.deleted_versions.append(version)
        report.deleted_objects += len(objects)
        report.deleted_bytes += sum(o.size for o in objects)
        if not dry_run:
            mkey = layout.manifest_key(index, version)
            if manifest is not None:
                store.delete(mkey)  # first: a half-deleted version is never a "complete" one
            for o in objects:
                if o.key != mkey:
                    store.delete(o.key)
            _prune_local_dirs(store, vp)
    return report


def _segment_versions(store: ObjectStore, index: str, versions: list[str]) -> set[str]:
    """Versions that built a segment one of ``versions`` serves (their files must stay)."""
    out: set[str] = set()
    for version in versions:
        try:
            manifest = store.get_json(layout.manifest_key(index, version))[0]
        except NotFound:
            continue
        out.update(str(seg["version"]) for seg in manifest.get("segments") or [])
    return out


def _sweep_orphans(
    store: ObjectStore, index: str, version: str, manifest: dict[str, Any], objects: list[Any],
    now: dt.datetime, grace: dt.timedelta, report: GcReport,
) -> None:
    """Delete shard attempt directories of ``version`` that its manifest does not list."""
    listed_keys = {f["key"] for s in manifest.get("shards", []) for f in s.get("files", [])}
    listed_dirs = {
        layout.shard_prefix(index, version, int(s["shard"]), int(s["attempt"])) for s in manifest.get("shards", [])
    }
    shards_root = layout.version_prefix(index, version) + "shards/"
    by_dir: dict[str, list[Any]] = {}
    for o in objects:
        if not o.key.startswith(shards_root):
            continue
        rest = o.key[len(shards_root):]
        d = rest.split("/", 1)[0] + "/"
        if not _SHARD_DIR_RE.match(d):
            continue
        by_dir.setdefault(shards_root + d, []).append(o)
    for d, objs in sorted(by_dir.items()):
        if d in listed_dirs or any(o.key in listed_keys for o in objs):
            continue
        if now - max(_ensure_utc(o.last_modified) for o in objs) <= grace:
            continue
        report.deleted_orphans.append(d)
        report.deleted_objects += len(objs)
        report.deleted_bytes += sum(o.size for o in objs)
        if not report.dry_run:
            for o in objs:
                store.delete(o.key)
            _prune_local_dirs(store, d)


def _prune_local_dirs(store: ObjectStore, prefix: str) -> None:
    """A directory store keeps empty directories after its files are deleted; remove them."""
    from freshidx.store.local import LocalStore

    if not isinstance(store, LocalStore):
        return
    top = store.path(prefix.rstrip("/"))
    if not top.is_dir():
        return
    for dirpath, _, _ in sorted(os.walk(top), key=lambda t: -len(t[0])):
        with contextlib.suppress(OSError):  # not empty (a file appeared meanwhile): leave it
            os.rmdir(dirpath)
