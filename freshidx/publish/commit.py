"""Publication: stage → validate → manifest (create-once) → compare-and-swap of ``CURRENT``.

Modelled on Quickwit's split lifecycle (staged → published) and Iceberg's optimistic commit:
the pointer is the only mutable object; it carries the version *and* the source position it
covers (pointer = watermark, docs/architecture.md), so progress and publication cannot diverge. The CAS
loop re-reads after losing a race and refuses, with a durable record, any publish whose position
is not newer than what readers already see.

What must hold to publish is decided apart from the effects, by requirement objects and one pure
check (:mod:`freshidx.publish.requirements`); :func:`publish` only reads the pointer, checks, swaps,
retries, and writes the refusal of a failed check. What "newer" means lives in ONE place,
:func:`freshidx.publish.requirements.newer_than_serving` (:func:`compare_to_serving` reads what it needs):
a later position (delta: source partition; full: cutoff), or, for the full index only, the same cutoff
rebuilt from different inputs listed later than the serving version's (late partitions older than the
cutoff). The same cutoff and the same inputs digest is ``unchanged``: nothing new, refused.

Publication knows no pipeline: a pipeline that can move its draft onto a version published meanwhile
hands :func:`publish` a ``rebase`` (the delta: onto a compaction of its base, :mod:`freshidx.delta.compaction_run`).

Ambiguous commits (Iceberg's "commit state unknown"): a 412 or a timeout on our own conditional
write does not prove that somebody else won, because the write may have been applied and only its
response lost (the client's retry then gets 412). ``publish`` re-reads ``CURRENT`` (and, if the
pointer already moved on, the history entry our swap would have created) before deciding; the
create-once objects compare content instead (:meth:`ObjectStore.create_or_same`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import random
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from freshidx.publish.requirements import COMPACTION as COMPACTION
from freshidx.publish.requirements import REQUIRED_SHARD_FILES as REQUIRED_SHARD_FILES
from freshidx.publish.requirements import (
    Comparison,
    Serving,
    Verdict,
    base_requirement,
    check,
    gate_requirements,
    needs_serving_manifest,
    newer_than_serving,
    staged_keys,
    swap_requirements,
)
from freshidx.publish.requirements import Outcome as Outcome
from freshidx.store import NotFound, ObjectStore, PreconditionFailed, WriteOutcomeUnknown, layout
from freshidx.store.records import Manifest, Pointer, Refusal
from freshidx.store.records.base import iso as iso
from freshidx.store.records.base import utcnow as utcnow

# Outcome is what publish() answers; the ledger decision of each: freshidx.trigger.lifecycle.PUBLISH_DECISION.
CAS_MAX_ATTEMPTS = 8


def parse_iso(s: str) -> dt.datetime:
    return dt.datetime.fromisoformat(s.replace("Z", "+00:00"))


def new_version(position: dt.datetime) -> str:
    """Unique, sortable, path-safe version id: ``<position>-<created>-<random>``."""
    return f"{position.strftime('%Y%m%dT%H%M')}-{utcnow().strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


#: What a build staged (the asset body makes it from task commit messages, never by listing): the
#: manifest record, written create-once before the pointer moves.
DraftManifest = Manifest


@dataclass(frozen=True)
class PublishResult:
    outcome: Outcome
    version: str
    reason: str
    pointer: Pointer | None  # the pointer readers see after this call
    cas_attempts: int = 0
    seconds: float = 0.0
    #: The draft :func:`publish` validated and wrote: the caller's, or what its ``rebase`` made of it (a
    #: micro-batch onto a compaction: other segments, doc and covered counts). None: not from publish().
    draft: DraftManifest | None = None


class PublishError(RuntimeError):
    """Publication could not complete (e.g. CAS contention beyond the retry budget)."""


def read_pointer(store: ObjectStore, index: str) -> tuple[Pointer | None, str | None]:
    """``index``'s ``CURRENT`` (any format) and its ETag; ``(None, None)``: nothing published."""
    return Pointer.current(store, index)


def read_manifest(store: ObjectStore, index: str, version: str) -> Manifest:
    """The manifest of ``version`` (any format, upgraded; raises NotFound)."""
    return Manifest.of(store, index, version)


def staged_sizes(store: ObjectStore, draft: DraftManifest) -> dict[str, int | None]:
    """The size of every file the draft's build wrote (None: missing), for the validation gate.

    One listing of the version's shards instead of a request per file: a micro-batch's shard has about
    ten files, and each request on the gate's path is one more chance of a slow or failed answer before the
    swap (listings are strongly consistent, as reads after writes are). A file the listing does not show
    is asked for by itself, so a listing can only save requests, never call a written file missing."""
    keys = staged_keys(draft)
    listed: dict[str, int] = {}
    for directory in sorted({d for k in keys if (d := _shard_dir(k))}):
        listed.update((o.key, o.size) for o in store.iter_objects(directory))
    sizes: dict[str, int | None] = {}
    for key in keys:
        if key in listed:
            sizes[key] = listed[key]
            continue
        try:
            sizes[key] = store.head(key).size
        except NotFound:
            sizes[key] = None
    return sizes


def _shard_dir(key: str) -> str | None:
    """The directory a staged file's listing starts at: its version's shards (``…/shards/``), else its own
    (None at the store's root: never list a whole store)."""
    head, sep, _ = key.partition("/shards/")
    if sep:
        return head + sep
    return key.rsplit("/", 1)[0] + "/" if "/" in key else None


def crash_point(name: str) -> None:
    # Fault injection for crash-safety tests: the process really dies here (no cleanup, no
    # exception handlers), exactly like a kill -9 at this step.
    if os.environ.get("FRESHIDX_CRASH_AT") == name:
        os._exit(86)


def record_refusal(store: ObjectStore, draft: DraftManifest, outcome: str, reason: str,
                   current: Pointer | None) -> None:
    refusal = Refusal(
        index=draft.index, version=draft.version, position=draft.position,
        source_partition=draft.source_partition, cutoff=draft.cutoff, run_id=draft.run_id,
        outcome=outcome, reason=reason, at=iso(utcnow()),
        current_version=current.version if current else None,
        current_position=current.position if current else None,
    )
    with contextlib.suppress(PreconditionFailed):  # already recorded (retried step)
        refusal.write(store)


def ensure_history(store: ObjectStore, pointer: Pointer) -> None:
    """Write the create-once history entry of a pointer if a crash left it out."""
    with contextlib.suppress(PreconditionFailed):
        pointer.create(store, layout.history_key(pointer.index, pointer.seq))


def serving_manifest(store: ObjectStore, draft: DraftManifest, current: Pointer | None
                     ) -> Mapping[str, Any] | None:
    """The serving version's manifest when the publication rule compares inputs (``{}``: it is gone)."""
    if current is None or not needs_serving_manifest(draft, current):
        return None
    try:
        return read_manifest(store, current.index, current.version)
    except NotFound:
        return {}


def compare_to_serving(store: ObjectStore, draft: DraftManifest, current: Pointer | None
                       ) -> tuple[Comparison, str]:
    """THE publication rule (:func:`freshidx.publish.requirements.newer_than_serving`): is ``draft``
    newer than what readers see (the pointer ``current``)?"""
    return newer_than_serving(draft, current, serving_manifest(store, draft, current))


def stale_base(draft: DraftManifest, current: Pointer | None) -> str:
    """Why a segmented delta must not be published over ``current`` ("" = it may): the base it was built
    on changed (:class:`freshidx.publish.requirements.RequireBase`)."""
    base = base_requirement(draft)
    return "" if base is None else base.validate(Serving(current), draft).reason


def _applied(store: ObjectStore, draft: DraftManifest, current: Pointer, seq: int | None) -> bool:
    """Did our own swap land? ``CURRENT`` holds our version, or moved on past the generation ``seq``
    our swap wrote (the next publisher writes the history entry of the pointer it replaces)."""
    if current.version == draft.version:
        return True
    if seq is None or current.seq <= seq:
        return False
    try:
        entry = Pointer.history(store, draft.index, seq)
    except NotFound:
        return False
    return entry.version == draft.version


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


#: Moves a draft onto the serving version ``current`` when the pipeline that built it knows how (a delta
#: micro-batch onto a compaction of its base: :func:`freshidx.delta.compaction_run.rebase_onto_compaction`); None: no.
Rebase = Callable[[ObjectStore, Pointer, DraftManifest], DraftManifest | None]


def publish(
    store: ObjectStore,
    draft: DraftManifest,
    *,
    allow_empty: bool = False,
    max_drop_fraction: float | None = None,
    before_swap: Callable[[Pointer | None], None] | None = None,
    only_if_absent: bool = False,
    rebase: Rebase | None = None,
) -> PublishResult:
    """Validate, write the manifest create-once, then CAS ``CURRENT`` while the requirements hold
    (:mod:`freshidx.publish.requirements`: the gate once, the others at every pointer read).

    ``only_if_absent``: publish only the first version (create-once of ``CURRENT``); used by the
    catch-up consumer so that an hour is processed exactly once even if a stuck run it gave up on
    comes back to life. Anything already published wins and this draft is refused as superseded.

    ``rebase``: see :func:`_gate`. ``before_swap`` is called after each pointer read, right before the
    conditional write; tests use it to force two real publishers to interleave at the worst moment.
    """
    t0 = time.monotonic()
    draft, current, gate = _gate(store, draft, allow_empty=allow_empty, max_drop_fraction=max_drop_fraction,
                                 rebase=rebase)
    if not gate.ok:
        return _refused(store, draft, gate, current, 0, t0)
    draft.write(store)
    crash_point("before_cas")
    requirements = swap_requirements(draft, only_if_absent=only_if_absent)
    unknown_seq: int | None = None  # generation of our last swap whose outcome we did not see
    for attempt in range(1, CAS_MAX_ATTEMPTS + 1):
        current, etag = read_pointer(store, draft.index)
        if current is not None and _applied(store, draft, current, unknown_seq):
            return _landed(store, draft, current, attempt, t0)
        if current is not None:
            ensure_history(store, current)
        verdict = check(requirements, Serving(current, serving_manifest(store, draft, current)), draft)
        if not verdict.ok:
            return _refused(store, draft, verdict, current, attempt, t0)
        pointer = next_pointer(draft, current)
        if before_swap is not None:
            before_swap(current)
        try:
            pointer.swap(store, layout.pointer_key(draft.index), etag)
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
        return PublishResult("published", draft.version, _published_reason(draft, current, verdict), pointer,
                             attempt, time.monotonic() - t0, draft)
    raise PublishError(f"{draft.index}: gave up after {CAS_MAX_ATTEMPTS} compare-and-swap attempts")


def _gate(store: ObjectStore, draft: DraftManifest, *, allow_empty: bool, max_drop_fraction: float | None,
          rebase: Rebase | None) -> tuple[DraftManifest, Pointer | None, Verdict]:
    """The first pointer read, the draft its pipeline's ``rebase`` moves onto the version serving then (before
    the create-once manifest: what it returns is validated and published; a base that changes after this
    read is refused like any other, not final), and the validation gate's verdict."""
    current, _ = read_pointer(store, draft.index)
    if rebase is not None and current is not None:
        draft = rebase(store, current, draft) or draft
    requirements = gate_requirements(draft, staged_sizes(store, draft), allow_empty=allow_empty,
                                     max_drop_fraction=max_drop_fraction)
    return draft, current, check(requirements, Serving(current), draft)


def _refused(store: ObjectStore, draft: DraftManifest, verdict: Verdict, current: Pointer | None,
             attempts: int, t0: float) -> PublishResult:
    """The one place a failed check is written down (the refusal record), then answered."""
    assert verdict.outcome is not None
    record_refusal(store, draft, verdict.outcome, verdict.reason, current)
    return PublishResult(verdict.outcome, draft.version, verdict.reason, current, attempts, time.monotonic() - t0,
                         draft)


def _landed(store: ObjectStore, draft: DraftManifest, current: Pointer, attempt: int, t0: float) -> PublishResult:
    """Our own earlier swap landed (its response was lost), or a retried step re-publishes a version
    already serving: the publication succeeded."""
    if current.version == draft.version:
        ensure_history(store, current)
    reason = "published" if current.version == draft.version else \
        f"published (then replaced by version {current.version})"
    return PublishResult("published", draft.version, reason, current, attempt, time.monotonic() - t0, draft)


def _published_reason(draft: DraftManifest, current: Pointer | None, verdict: Verdict) -> str:
    # Say why when it is not obvious: the same cutoff published again (late inputs), a compaction.
    said = f"published: {verdict.reason}" if current is not None and draft.position == current.position \
        else "published"
    if draft.inputs.get("rebased_from") and current is not None:
        said += f" (rebased from {draft.inputs['rebased_from']} onto its compaction {current.version})"
    return said
