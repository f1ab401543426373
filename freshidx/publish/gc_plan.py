"""What garbage collection deletes, and why: pure decisions over a survey of the store.

:func:`freshidx.publish.retention.survey_gc` reads (the history, the kept versions' segments, the version
directories with their objects and manifests), :func:`plan_gc` decides, and
:func:`freshidx.publish.retention.apply_gc` deletes what the plan says, in its order. The rules are
:mod:`freshidx.publish.retention`'s (module docstring): kept are the current version, the ``keep_last``
most recent distinct versions in the history, the versions that built a segment a kept version serves,
and anything younger than the grace period; the rest is deleted, staged versions without a manifest
included, and so are attempt-orphan shard directories of the versions that stay.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from freshidx.publish.commit import Pointer, parse_iso
from freshidx.store import ObjectInfo, layout

_SHARD_DIR_RE = re.compile(r"^shard-(\d{5,})-a(\d+)/$")

#: Why a version stays or goes: current, last (among the keep_last), segment (a kept version serves a
#: segment it built), young (inside the grace period), empty (no objects left: only directories to
#: remove), abandoned (no manifest, past the grace), expired (not kept, past the grace).
Rule = Literal["current", "last", "segment", "young", "empty", "abandoned", "expired"]
Action = Literal["keep", "delete", "prune"]


@dataclass(frozen=True)
class VersionListing:
    """One version directory as the survey found it."""

    version: str
    prefix: str
    objects: tuple[ObjectInfo, ...]
    manifest: Mapping[str, Any] | None  # None: no manifest (staged, or half deleted by a crashed sweep)


@dataclass(frozen=True)
class GcSurvey:
    """What :func:`plan_gc` decides from."""

    index: str
    entries: tuple[Pointer, ...]  # the history, newest first (the current pointer first)
    segments_served: Mapping[str, tuple[str, ...]]  # kept version -> versions of the segments it serves
    versions: tuple[VersionListing, ...]  # the version directories examined, in listing order
    truncated: bool = False  # more version directories than one call may examine


@dataclass(frozen=True)
class OrphanDir:
    """A shard attempt directory its version's manifest does not list (a retried task's first upload)."""

    prefix: str
    objects: tuple[ObjectInfo, ...]


@dataclass(frozen=True)
class VersionDecision:
    version: str
    action: Action
    rule: Rule
    why: str
    listing: VersionListing
    orphans: tuple[OrphanDir, ...] = ()  # of a version that stays


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


@dataclass(frozen=True)
class GcPlan:
    index: str
    current: str | None
    kept: tuple[str, ...]  # the current version and the last keep_last distinct ones
    decisions: tuple[VersionDecision, ...]  # one per examined version directory, in listing order
    truncated: bool = False

    def report(self, dry_run: bool) -> GcReport:
        """What :func:`freshidx.publish.retention.gc` answers (dry run: what it would delete)."""
        deleted = [d for d in self.decisions if d.action == "delete"]
        orphans = [o for d in self.decisions for o in d.orphans]
        objects = [o for d in deleted for o in d.listing.objects] + [o for od in orphans for o in od.objects]
        return GcReport(
            index=self.index, dry_run=dry_run, current=self.current, kept=list(self.kept),
            deleted_versions=[d.version for d in deleted], deleted_orphans=[o.prefix for o in orphans],
            deleted_objects=len(objects), deleted_bytes=sum(o.size for o in objects),
            young=[d.version for d in self.decisions if d.rule == "young"], truncated=self.truncated)

    def describe(self) -> list[str]:
        """One line per decision: what happens to each version and why."""
        lines = [f"{d.action:<6} {d.version}: {d.why}" for d in self.decisions]
        lines += [f"delete orphan {o.prefix} ({len(o.objects)} objects, not in the manifest)"
                  for d in self.decisions for o in d.orphans]
        return lines + (["(more versions left for the next call)"] if self.truncated else [])


def kept_versions(entries: Sequence[Pointer], keep_last: int) -> tuple[list[str], Pointer | None]:
    """The current version and the ``keep_last`` most recent distinct versions of the history (newest
    first), and the oldest history entry among them (every other version stopped serving before it)."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    kept: list[str] = []
    oldest: Pointer | None = None
    for e in entries:
        if e.version not in kept:
            if len(kept) >= keep_last:
                break
            kept.append(e.version)
        oldest = e
    return kept, oldest


def plan_gc(survey: GcSurvey, *, keep_last: int, grace: dt.timedelta, now: dt.datetime) -> GcPlan:
    """Decide, for every surveyed version directory, whether it stays (and which of its attempt orphans
    go) or is deleted, and why. "Older than ``grace``" counts from the newest object under the version
    and, for a version with a manifest (it may have been served), from when it stopped being served."""
    kept, oldest = kept_versions(survey.entries, keep_last)
    current = survey.entries[0].version if survey.entries else None
    segment_builders = {v for k in kept for v in survey.segments_served.get(k, ())} - set(kept)
    served_until = parse_iso(oldest.published_at) if oldest else None
    decisions: list[VersionDecision] = []
    for listing in survey.versions:
        v = listing.version
        protected = _protection(v, current, kept, segment_builders)
        if not listing.objects:
            decisions.append(VersionDecision(v, "keep", protected[0], f"{protected[1]} (no objects)", listing)
                             if protected else
                             VersionDecision(v, "prune", "empty", "no objects left: empty directories", listing))
            continue
        orphans = tuple(orphan_dirs(survey.index, listing, now, grace)) if listing.manifest is not None else ()
        if protected:
            decisions.append(VersionDecision(v, "keep", protected[0], protected[1], listing, orphans))
            continue
        age_ref = max(_utc(o.last_modified) for o in listing.objects)
        if served_until is not None and listing.manifest is not None:
            age_ref = max(age_ref, served_until)
        if now - age_ref <= grace:
            decisions.append(VersionDecision(v, "keep", "young", f"younger than the grace {grace} "
                                             f"(since {age_ref.isoformat()})", listing, orphans))
        elif listing.manifest is None:
            decisions.append(VersionDecision(v, "delete", "abandoned",
                                             f"no manifest (abandoned build), older than the grace {grace}", listing))
        else:
            decisions.append(VersionDecision(v, "delete", "expired",
                                             f"not among the kept versions, older than the grace {grace}", listing))
    return GcPlan(survey.index, current, tuple(kept), tuple(decisions), survey.truncated)


def _protection(version: str, current: str | None, kept: list[str], segment_builders: set[str]
                ) -> tuple[Rule, str] | None:
    if version == current:
        return "current", "the current version"
    if version in kept:
        return "last", f"among the last {len(kept)} distinct versions of the history"
    if version in segment_builders:
        return "segment", "built a segment a kept version serves"
    return None


def orphan_dirs(index: str, listing: VersionListing, now: dt.datetime, grace: dt.timedelta) -> list[OrphanDir]:
    """Shard attempt directories of a version with a manifest that the manifest does not list, older
    than ``grace``, sorted. Files a manifest lists are never deleted."""
    manifest = listing.manifest or {}
    listed_keys = {f["key"] for s in manifest.get("shards", []) for f in s.get("files", [])}
    listed_dirs = {layout.shard_prefix(index, listing.version, int(s["shard"]), int(s["attempt"]))
                   for s in manifest.get("shards", [])}
    shards_root = layout.version_prefix(index, listing.version) + "shards/"
    by_dir: dict[str, list[ObjectInfo]] = {}
    for o in listing.objects:
        if not o.key.startswith(shards_root):
            continue
        d = o.key[len(shards_root):].split("/", 1)[0] + "/"
        if _SHARD_DIR_RE.match(d):
            by_dir.setdefault(shards_root + d, []).append(o)
    return [OrphanDir(d, tuple(objs)) for d, objs in sorted(by_dir.items())
            if d not in listed_dirs and not any(o.key in listed_keys for o in objs)
            and now - max(_utc(o.last_modified) for o in objs) > grace]


def _utc(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=dt.UTC)
