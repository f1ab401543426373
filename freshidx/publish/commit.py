"""Publication: stage → validate → manifest (create-once) → compare-and-swap of ``CURRENT``.

Modelled on Quickwit's split lifecycle (staged → published) and Iceberg's optimistic commit:
the pointer is the only mutable object; it carries the version *and* the source position it
covers (pointer = watermark, DESIGN §4.1), so progress and publication cannot diverge. The CAS
loop re-reads after losing a race and refuses, with a durable record, any publish whose position
is not newer than what readers already see (§4.2).

What "newer" means lives in ONE place, :func:`compare_to_serving`: a later position (delta: source
partition; full: cutoff), or, for the full index only, the same cutoff rebuilt from different inputs
listed later than the serving version's (late partitions older than the cutoff). The same cutoff
and the same inputs digest is ``unchanged``: nothing new, refused.

Ambiguous commits (Iceberg's "commit state unknown"): a 412 or a timeout on our own conditional
write does not prove that somebody else won, because the write may have been applied and only its
response lost (the client's retry then gets 412). ``publish`` re-reads ``CURRENT`` (and, if the
pointer already moved on, the history entry our swap would have created) before deciding; the
create-once objects compare content instead (:meth:`ObjectStore.create_or_same`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import os
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from freshidx.delta.segments import BuildKind
from freshidx.store import NotFound, ObjectStore, PreconditionFailed, WriteOutcomeUnknown, layout
from freshidx.trigger.lifecycle import PublishOutcome

# What publish() answers; the ledger decision of each is freshidx.trigger.lifecycle.PUBLISH_DECISION.
Outcome = PublishOutcome
Verdict = Literal["newer", "superseded", "unchanged"]

CAS_MAX_ATTEMPTS = 8
#: ``inputs.build`` of a delta version published by a background compaction (:mod:`freshidx.delta.compaction`).
COMPACTION = "compaction"


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def iso(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_iso(s: str) -> dt.datetime:
    return dt.datetime.fromisoformat(s.replace("Z", "+00:00"))


def new_version(position: dt.datetime) -> str:
    """Unique, sortable, path-safe version id: ``<position>-<created>-<random>``."""
    return f"{position.strftime('%Y%m%dT%H%M')}-{utcnow().strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


@dataclass
class DraftManifest:
    """What a build staged: produced by the asset body from task commit messages, never by listing."""

    index: str
    version: str
    position: str  # ISO time the publication covers up to: source partition (delta) / cutoff (full)
    run_id: str | None
    shards: list[dict[str, Any]]
    doc_count: int
    num_shards: int
    source_partition: str | None = None  # partition path as written upstream (delta)
    window_start: str | None = None  # exclusive (delta)
    window_end: str | None = None  # inclusive (delta)
    cutoff: str | None = None  # (full)
    covered_count: int = 0
    #: A segment-built delta version: every segment it serves, oldest first (``freshidx.delta.segments``);
    #: ``shards`` are the newest segment's, the files this version wrote.
    segments: list[dict[str, Any]] | None = None
    inputs: dict[str, Any] = field(default_factory=dict)
    invalid: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)  # trigger kind/id, tags, code version
    created_at: str = field(default_factory=lambda: iso(utcnow()))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Pointer:
    """Contents of ``indexes/<name>/CURRENT``."""

    index: str
    version: str
    seq: int
    position: str
    manifest: str
    doc_count: int
    published_at: str
    run_id: str | None = None
    source_partition: str | None = None
    window_start: str | None = None
    window_end: str | None = None
    cutoff: str | None = None
    previous_version: str | None = None
    action: str = "publish"  # publish | rollback

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Pointer:
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__ if k in d})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PublishResult:
    outcome: Outcome
    version: str
    reason: str
    pointer: Pointer | None  # the pointer readers see after this call
    cas_attempts: int = 0
    seconds: float = 0.0
    #: The draft :func:`publish` validated and wrote: the caller's, or its rebase onto a compaction
    #: (:func:`rebase_after_compaction`: other segments, doc and covered counts). None: not from publish().
    draft: DraftManifest | None = None


class PublishError(RuntimeError):
    """Publication could not complete (e.g. CAS contention beyond the retry budget)."""


def read_pointer(store: ObjectStore, index: str) -> tuple[Pointer | None, str | None]:
    try:
        data, etag = store.get_json(layout.pointer_key(index))
    except NotFound:
        return None, None
    return Pointer.from_dict(data), etag


def read_manifest(store: ObjectStore, index: str, version: str) -> dict[str, Any]:
    data, _ = store.get_json(layout.manifest_key(index, version))
    return dict(data)


REQUIRED_SHARD_FILES = ("covered.parquet", "index/meta.json")


def validate_draft(store: ObjectStore, draft: DraftManifest, *, allow_empty: bool = False,
                   max_drop_fraction: float | None = None, current: Pointer | None = None) -> list[str]:
    """The gate before the CAS. Returns the reasons the draft must not be published (empty = ok).

    ``max_drop_fraction``: refuse a document count that fell by more than this fraction versus the
    serving version of the same index (a collapsed build), unless the caller forces it (None).
    """
    problems: list[str] = []
    if max_drop_fraction is not None and current is not None and current.doc_count > 0:
        floor = current.doc_count * (1.0 - max_drop_fraction)
        if draft.doc_count < floor:
            problems.append(
                f"document count collapsed: {draft.doc_count} < {floor:.0f} "
                f"({max_drop_fraction:.0%} below the serving {current.doc_count}); force to publish anyway"
            )
    fmt = draft.inputs.get("format")
    if fmt is not None:
        for sh in draft.shards:
            names = {f["key"].split("/shards/", 1)[-1].split("/", 1)[-1] for f in sh["files"]}
            missing = [n for n in REQUIRED_SHARD_FILES if n not in names]
            if missing:
                problems.append(f"shard {sh['shard']} lacks {missing} (format {fmt})")
    if len(draft.shards) != draft.num_shards:
        problems.append(f"expected {draft.num_shards} shards, got {len(draft.shards)}")
    if sorted(s["shard"] for s in draft.shards) != list(range(len(draft.shards))):
        problems.append("shard numbers are not 0..n-1 exactly once")
    if draft.doc_count <= 0 and not allow_empty:
        problems.append("empty document set")
    served = [sh for seg in draft.segments for sh in seg["shards"]] if draft.segments else draft.shards
    if sum(int(s["doc_count"]) for s in served) != draft.doc_count:
        problems.append("doc_count does not equal the sum over shards")
    for s in draft.shards:
        for f in s["files"]:
            try:
                info = store.head(f["key"])
            except NotFound:
                problems.append(f"staged file missing: {f['key']}")
                continue
            if info.size != int(f["bytes"]):
                problems.append(f"staged file size mismatch: {f['key']} {info.size} != {f['bytes']}")
    return problems


def crash_point(name: str) -> None:
    # Fault injection for crash-safety tests: the process really dies here (no cleanup, no
    # exception handlers), exactly like a kill -9 at this step.
    if os.environ.get("FRESHIDX_CRASH_AT") == name:
        os._exit(86)


def record_refusal(store: ObjectStore, draft: DraftManifest, outcome: str, reason: str,
                   current: Pointer | None) -> None:
    body = {
        "index": draft.index, "version": draft.version, "position": draft.position,
        "source_partition": draft.source_partition, "cutoff": draft.cutoff, "run_id": draft.run_id,
        "outcome": outcome, "reason": reason, "at": iso(utcnow()),
        "current_version": current.version if current else None,
        "current_position": current.position if current else None,
    }
    with contextlib.suppress(PreconditionFailed):  # already recorded (retried step)
        store.create_json(layout.refusal_key(draft.index, draft.version), body)


def ensure_history(store: ObjectStore, pointer: Pointer) -> None:
    """Write the create-once history entry of a pointer if a crash left it out."""
    with contextlib.suppress(PreconditionFailed):
        store.create_json(layout.history_key(pointer.index, pointer.seq), pointer.to_dict())


def compare_to_serving(store: ObjectStore, draft: DraftManifest, current: Pointer | None
                       ) -> tuple[Verdict, str]:
    """THE publication rule (DESIGN §4.2): is ``draft`` newer than what readers see?

    * a later position is newer; an earlier one is ``superseded``;
    * the same position is ``superseded`` (delta: the same partition again), except for the full
      index, where a rebuild with the same cutoff may hold late partitions older than the cutoff:
      the same ``inputs.files_sha256`` as the serving version is ``unchanged`` (nothing new); a
      different digest whose listing was taken after the serving version's is ``newer``; a different
      digest listed earlier is a slow rebuild of older inputs, ``superseded`` (it must not regress
      the late data a faster rebuild already published).
    """
    if current is None:
        return "newer", "nothing published yet"
    if (draft.inputs.get("build") == COMPACTION and draft.inputs.get("based_on") == current.version
            and draft.position == current.position):
        # A compaction (freshidx.delta.compaction) rewrites how the serving version stores its segments, not
        # what it covers: newer than exactly the version it compacted (stale_base refuses any other).
        return "newer", f"compaction of serving version {current.version} (position {current.position})"
    if draft.position > current.position:
        return "newer", f"position {draft.position} is newer than published {current.position}"
    not_newer = (f"superseded: position {draft.position} is not newer than published "
                 f"{current.position} (version {current.version})")
    if draft.position < current.position or draft.cutoff is None or current.cutoff is None:
        return "superseded", not_newer
    try:
        serving = read_manifest(store, current.index, current.version)
    except NotFound:
        serving = {}
    theirs: dict[str, Any] = dict(serving.get("inputs") or {})
    ours = draft.inputs.get("files_sha256")
    if ours and ours == theirs.get("files_sha256"):
        return "unchanged", (f"unchanged: cutoff {draft.cutoff} with the same inputs as the serving version "
                             f"{current.version} ({_inputs_text(draft.inputs)}, sha256 {str(ours)[:12]})")
    # A manifest without a listing time (older format) was listed before it was created.
    their_listing = theirs.get("listed_at") or serving.get("created_at") or current.published_at
    our_listing = draft.inputs.get("listed_at")
    if ours and our_listing and our_listing > their_listing:
        return "newer", (f"same cutoff {draft.cutoff}, newer inputs: {_inputs_text(draft.inputs)} "
                         f"vs {_inputs_text(theirs)} in version {current.version}")
    return "superseded", (f"superseded: same cutoff {draft.cutoff} but inputs listed at {our_listing} are "
                          f"not newer than those of serving version {current.version} (listed {their_listing})")


def stale_base(draft: DraftManifest, current: Pointer | None) -> str:
    """Why an incremental delta must not be published over ``current`` ("" = it may).

    An incremental version carries the segments of the version it was built on (``inputs.based_on``);
    published over any other version it would drop that version's newest segment. It is refused like
    a failed validation (not final): the retry builds on what serves then (a commit requirement, as in
    Iceberg's table commits, with the retry one level above the single attempt).
    """
    base = draft.inputs.get("based_on")
    if not draft.segments or current is None or current.version == base:
        return ""
    if base is None and draft.inputs.get("build") != BuildKind.INCREMENTAL:
        return ""  # a window rebuild rests on the window alone
    built_on = f"delta version {base}" if base else "no delta (the full index alone)"
    return (f"validation failed: base changed: built on {built_on}, but {current.version} serves "
            f"now (published meanwhile by run {current.run_id}); the next attempt builds on it")


def rebase_after_compaction(store: ObjectStore, draft: DraftManifest, current: Pointer | None) -> DraftManifest:
    """``draft`` moved onto ``current`` when ``current`` is a compaction of the version the draft was
    built on (a background compaction published while the micro-batch was building): the same segments
    stored differently, so the new segment is appended to them instead of failing on a changed base
    (:func:`freshidx.delta.compaction.rebase_after_compaction` decides, conservatively). Otherwise ``draft``.

    Done before the manifest is written (create-once): a compaction that lands between this read and
    the compare-and-swap is still refused as a changed base, and the next attempt builds on it.
    """
    if current is None or not draft.segments or draft.inputs.get("build") == COMPACTION \
            or not stale_base(draft, current):
        return draft
    from freshidx.delta import compaction
    from freshidx.delta.segments import Segment, segments_of

    try:
        serving = read_manifest(store, draft.index, current.version)
    except NotFound:
        return draft
    serving_segments = segments_of(serving)
    if (serving.get("inputs") or {}).get("build") != COMPACTION or serving_segments is None:
        return draft
    cutoff = draft.inputs.get("full_cutoff")
    rebased = compaction.rebase_after_compaction(
        [Segment.from_dict(s) for s in draft.segments], draft.version, serving_segments,
        parse_iso(cutoff) if cutoff else None)
    if rebased is None:
        return draft
    return dataclasses.replace(
        draft, segments=[s.to_dict() for s in rebased], doc_count=sum(s.doc_count for s in rebased),
        covered_count=sum(s.covered_count for s in rebased),
        inputs={**draft.inputs, "based_on": current.version, "rebased_from": draft.inputs.get("based_on"),
                "segments_kept": len(rebased) - 1},
        stats={**draft.stats, "segments": len(rebased)},
    )


def _inputs_text(inputs: dict[str, Any]) -> str:
    return f"{inputs.get('files', '?')} files in {inputs.get('partitions', '?')} partitions"


def _applied(store: ObjectStore, draft: DraftManifest, current: Pointer, seq: int | None) -> bool:
    """Did our own swap land? ``CURRENT`` holds our version, or moved on past the generation ``seq``
    our swap wrote (the next publisher writes the history entry of the pointer it replaces)."""
    if current.version == draft.version:
        return True
    if seq is None or current.seq <= seq:
        return False
    try:
        entry, _ = store.get_json(layout.history_key(draft.index, seq))
    except NotFound:
        return False
    return bool(entry.get("version") == draft.version)


def next_pointer(draft: DraftManifest, current: Pointer | None) -> Pointer:
    """The pointer that publishes ``draft`` over ``current``."""
    return Pointer(
        index=draft.index, version=draft.version, seq=(current.seq + 1) if current else 1,
        position=draft.position, manifest=layout.manifest_key(draft.index, draft.version),
        doc_count=draft.doc_count, published_at=iso(utcnow()), run_id=draft.run_id,
        source_partition=draft.source_partition, window_start=draft.window_start,
        window_end=draft.window_end, cutoff=draft.cutoff,
        previous_version=current.version if current else None,
    )


def publish(
    store: ObjectStore,
    draft: DraftManifest,
    *,
    allow_empty: bool = False,
    max_drop_fraction: float | None = None,
    before_swap: Callable[[Pointer | None], None] | None = None,
    only_if_absent: bool = False,
) -> PublishResult:
    """Validate, write the manifest create-once, then CAS ``CURRENT`` if ``draft`` is newer.

    ``only_if_absent``: publish only the first version (create-once of ``CURRENT``); used by the
    catch-up consumer so that an hour is processed exactly once even if a stuck run it gave up on
    comes back to life. Anything already published wins and this draft is refused as superseded.

    ``before_swap`` is called after each pointer read, right before the conditional write; tests
    use it to force two real publishers to interleave at the worst moment.
    """
    t0 = time.monotonic()
    current, _ = read_pointer(store, draft.index)
    draft = rebase_after_compaction(store, draft, current)
    problems = validate_draft(store, draft, allow_empty=allow_empty, max_drop_fraction=max_drop_fraction,
                              current=current)
    if problems:
        reason = "validation failed: " + "; ".join(problems)
        record_refusal(store, draft, "invalid", reason, current)
        return PublishResult("invalid", draft.version, reason, current, 0, time.monotonic() - t0, draft)

    store.create_json(layout.manifest_key(draft.index, draft.version), draft.to_dict())
    crash_point("before_cas")

    unknown_seq: int | None = None  # generation of our last swap whose outcome we did not see
    for attempt in range(1, CAS_MAX_ATTEMPTS + 1):
        current, etag = read_pointer(store, draft.index)
        if current is not None and _applied(store, draft, current, unknown_seq):
            # Our own earlier swap landed (its response was lost), or a retried step re-publishes a
            # version already serving: the publication succeeded.
            if current.version == draft.version:
                ensure_history(store, current)
            reason = "published" if current.version == draft.version else \
                f"published (then replaced by version {current.version})"
            return PublishResult("published", draft.version, reason, current, attempt, time.monotonic() - t0,
                                 draft)
        if current is not None:
            ensure_history(store, current)
        if current is not None and only_if_absent:
            reason = f"superseded: already published as version {current.version} (run {current.run_id})"
            record_refusal(store, draft, "superseded", reason, current)
            return PublishResult("superseded", draft.version, reason, current, attempt,
                                 time.monotonic() - t0, draft)
        stale = stale_base(draft, current)
        if stale:
            record_refusal(store, draft, "invalid", stale, current)
            return PublishResult("invalid", draft.version, stale, current, attempt, time.monotonic() - t0,
                                 draft)
        verdict, why = compare_to_serving(store, draft, current)
        if verdict != "newer":
            record_refusal(store, draft, verdict, why, current)
            return PublishResult(verdict, draft.version, why, current, attempt, time.monotonic() - t0, draft)
        pointer = next_pointer(draft, current)
        if before_swap is not None:
            before_swap(current)
        try:
            store.swap_json(layout.pointer_key(draft.index), pointer.to_dict(), etag)
        except WriteOutcomeUnknown:
            unknown_seq = pointer.seq  # no answer at all: re-read at once, it may have landed
            continue
        except PreconditionFailed:
            # Lost the race, or our own applied write retried by the client after a lost response:
            # the re-read at the top of the loop tells which. Back off a little first.
            unknown_seq = pointer.seq
            time.sleep(min(0.5, 0.02 * 2**attempt) * random.random())
            continue
        crash_point("after_cas")
        ensure_history(store, pointer)
        # Say why when it is not obvious: the same cutoff published again (late inputs).
        said = f"published: {why}" if current is not None and draft.position == current.position else "published"
        if draft.inputs.get("rebased_from") and current is not None:
            said += f" (rebased from {draft.inputs['rebased_from']} onto its compaction {current.version})"
        return PublishResult("published", draft.version, said, pointer, attempt, time.monotonic() - t0, draft)
    raise PublishError(f"{draft.index}: gave up after {CAS_MAX_ATTEMPTS} compare-and-swap attempts")
