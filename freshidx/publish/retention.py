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

GC is a plan and its application: :func:`survey_gc` reads, :func:`freshidx.publish.gc_plan.plan_gc`
decides (pure: what is deleted and why, what is kept and why), :func:`apply_gc` deletes; a dry run
stops at the plan. Listing is fine here (a sweeper, not the hot path) but bounded per call.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os

from freshidx.publish.commit import Pointer, ensure_history, iso, read_pointer, utcnow
from freshidx.publish.gc_plan import GcPlan as GcPlan
from freshidx.publish.gc_plan import GcReport as GcReport
from freshidx.publish.gc_plan import GcSurvey, VersionListing, kept_versions
from freshidx.publish.gc_plan import plan_gc as plan_gc
from freshidx.store import NotFound, ObjectStore, PreconditionFailed, WriteOutcomeUnknown, layout
from freshidx.store.records import Manifest

MAX_HISTORY_WALK = 10_000
DEFAULT_MAX_VERSIONS = 100
DEFAULT_GRACE_MINUTES = 60


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
            out.append(Pointer.history(store, index, seq))
        except NotFound:
            break
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
        manifest = Manifest.of(store, index, version)
    except NotFound:
        return [layout.manifest_key(index, version)]
    problems: list[str] = []
    for s in manifest.served_shards():
        for f in s["files"]:
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
        pointer.swap(store, layout.pointer_key(index), etag)
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
        entry = Pointer.history(store, ours.index, ours.seq)
    except NotFound:
        return None
    return entry if _same_rollback(entry, ours) else None


# --------------------------------------------------------------------------- gc


def gc(
    store: ObjectStore, index: str, keep_last: int, grace: dt.timedelta, now: dt.datetime | None = None,
    *, dry_run: bool = False, max_versions: int = DEFAULT_MAX_VERSIONS,
) -> GcReport:
    """Delete old versions, abandoned staged versions and attempt orphans of ``index`` (module docstring)."""
    plan = planned_gc(store, index, keep_last, grace, now, max_versions=max_versions)
    if not dry_run:
        apply_gc(store, plan)
    return plan.report(dry_run)


def planned_gc(
    store: ObjectStore, index: str, keep_last: int, grace: dt.timedelta, now: dt.datetime | None = None,
    *, max_versions: int = DEFAULT_MAX_VERSIONS,
) -> GcPlan:
    """What :func:`gc` would do, and why (reads only)."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    _check_index(index)
    now = now or utcnow()
    now = now if now.tzinfo is not None else now.replace(tzinfo=dt.UTC)
    return plan_gc(survey_gc(store, index, keep_last, max_versions=max_versions), keep_last=keep_last,
                   grace=grace, now=now)


def survey_gc(store: ObjectStore, index: str, keep_last: int, *, max_versions: int = DEFAULT_MAX_VERSIONS
              ) -> GcSurvey:
    """Read what :func:`plan_gc` decides from: the history, the segments the kept versions serve, and the
    first ``max_versions`` version directories with their objects and manifests."""
    entries = history_entries(store, index)
    kept, _ = kept_versions(entries, keep_last)
    segments_served: dict[str, tuple[str, ...]] = {}
    for version in kept:
        try:
            served = Manifest.of(store, index, version)
        except NotFound:
            continue
        segments_served[version] = tuple(seg.version for seg in served.segment_list() or [])
    versions_root = layout.index_root(index) + "versions/"
    prefixes = store.list(versions_root, delimiter="/").prefixes
    listings: list[VersionListing] = []
    for vp in prefixes[:max_versions]:
        version = vp[len(versions_root):].rstrip("/")
        objects = tuple(store.list(vp).objects)
        manifest: Manifest | None = None
        if objects:
            with contextlib.suppress(NotFound):
                manifest = Manifest.of(store, index, version)
        listings.append(VersionListing(version, vp, objects, manifest))
    return GcSurvey(index, tuple(entries), segments_served, tuple(listings), len(prefixes) > max_versions)


def apply_gc(store: ObjectStore, plan: GcPlan) -> None:
    """Delete what ``plan`` says, in its order: a version's manifest first (a half-deleted version is never
    a "complete" one), then its other objects; a kept version's attempt orphans."""
    for d in plan.decisions:
        if d.action == "delete":
            mkey = layout.manifest_key(plan.index, d.version)
            if d.listing.manifest is not None:
                store.delete(mkey)
            for o in d.listing.objects:
                if o.key != mkey:
                    store.delete(o.key)
            _prune_local_dirs(store, d.listing.prefix)
        elif d.action == "prune":  # empty directories left by an interrupted sweep
            _prune_local_dirs(store, d.listing.prefix)
        for orphan in d.orphans:
            for o in orphan.objects:
                store.delete(o.key)
            _prune_local_dirs(store, orphan.prefix)


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
