"""What must hold for a draft to be published over what serves: requirement objects and one pure check.

Modelled on Iceberg's table requirements (``AssertCreate``, ``AssertRefSnapshotId``, … each validated
against the metadata the commit read): :func:`freshidx.publish.commit.publish` re-reads the pointer,
checks its requirements against it (:func:`check`) and swaps only if all hold. Nothing here reads or writes the
store: what a requirement needs beyond the pointer (the staged files' sizes, the serving manifest) is read
by the caller and handed in (:class:`RequireValid`, :class:`Serving`).

Two groups (docs/architecture.md, "Publication"):

* the validation gate, once, before the manifest is written (create-once): :class:`RequireDropWithin`,
  :class:`RequireValid`; their problems are reported together ("validation failed: a; b");
* at every pointer read, right before the compare-and-swap: :class:`RequireNothingServing` (create-once of
  ``CURRENT``), :class:`RequireBase`, :class:`RequireNewerThanServing` (THE publication rule).

The first failing requirement decides. Its refusal is *final* when no later attempt can publish this
position (``superseded``, ``unchanged``); an ``invalid`` one is not: the run fails and the work is retried.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    from freshidx.store.records import Manifest as DraftManifest
    from freshidx.store.records import Pointer

#: What :func:`freshidx.publish.commit.publish` answers.
Outcome = Literal["published", "superseded", "unchanged", "invalid"]
#: What a failed requirement answers.
Refusal = Literal["superseded", "unchanged", "invalid"]
#: The publication rule's answer (:func:`newer_than_serving`).
Comparison = Literal["newer", "superseded", "unchanged"]

#: ``inputs.build`` of a version that re-stores the serving version's segments (a background compaction).
COMPACTION = "compaction"
#: ``inputs.build`` of a version that adds one segment to the version it was built on (``inputs.based_on``).
INCREMENTAL = "incremental"
REQUIRED_SHARD_FILES = ("covered.parquet", "index/meta.json")
GATE_PREFIX = "validation failed: "


@dataclass(frozen=True)
class Serving:
    """What the requirements are checked against: the pointer read, and the serving version's manifest
    when the publication rule needs it (:func:`needs_serving_manifest`; ``{}``: it is gone)."""

    pointer: Pointer | None
    manifest: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Finding:
    """One requirement against what serves: ``outcome`` None = it holds (``reason`` may still say why)."""

    reason: str = ""
    outcome: Refusal | None = None


HOLDS = Finding()


@dataclass(frozen=True)
class RequireDropWithin:
    """The document count fell by at most ``fraction`` versus the serving version (a collapsed build is
    refused; forcing a publication drops this requirement)."""

    fraction: float
    gate: ClassVar[bool] = True

    def validate(self, serving: Serving, draft: DraftManifest) -> Finding:
        current = serving.pointer
        if current is None or current.doc_count <= 0:
            return HOLDS
        floor = current.doc_count * (1.0 - self.fraction)
        if draft.doc_count >= floor:
            return HOLDS
        return Finding(f"document count collapsed: {draft.doc_count} < {floor:.0f} ({self.fraction:.0%} below "
                       f"the serving {current.doc_count}); force to publish anyway", "invalid")


@dataclass(frozen=True)
class RequireValid:
    """The draft is whole: index files in every shard (when it names a format), shards 0..n-1 once each,
    documents (unless ``allow_empty``), counts that add up, and every staged file there with its size.

    ``staged``: the size of each file the draft's shards list, ``None`` when it is missing (read by the caller).
    """

    staged: Mapping[str, int | None]
    allow_empty: bool = False
    gate: ClassVar[bool] = True

    def validate(self, serving: Serving, draft: DraftManifest) -> Finding:
        problems = _shape_problems(draft, self.allow_empty)
        for s in draft.shards:
            for f in s["files"]:
                size = self.staged.get(f["key"])
                if size is None:
                    problems.append(f"staged file missing: {f['key']}")
                elif size != int(f["bytes"]):
                    problems.append(f"staged file size mismatch: {f['key']} {size} != {f['bytes']}")
        return Finding("; ".join(problems), "invalid") if problems else HOLDS


@dataclass(frozen=True)
class RequireNothingServing:
    """Create-once of ``CURRENT`` (Iceberg's ``AssertCreate``): the catch-up processes an hour exactly once,
    even if a stuck run it gave up on comes back to life; anything already published wins."""

    gate: ClassVar[bool] = False

    def validate(self, serving: Serving, draft: DraftManifest) -> Finding:
        current = serving.pointer
        if current is None:
            return HOLDS
        return Finding(f"superseded: already published as version {current.version} (run {current.run_id})",
                       "superseded")


@dataclass(frozen=True)
class RequireBase:
    """Published over exactly version ``base`` (``None``: over nothing), or onto an empty index
    (Iceberg's ``AssertRefSnapshotId``).

    An incremental version carries the segments of the version it was built on; published over any other
    it would drop that version's newest segment. Not final: the retry builds on what serves then.
    """

    base: str | None
    gate: ClassVar[bool] = False

    def validate(self, serving: Serving, draft: DraftManifest) -> Finding:
        current = serving.pointer
        if current is None or current.version == self.base:
            return HOLDS
        built_on = f"delta version {self.base}" if self.base else "no delta (the full index alone)"
        return Finding(f"{GATE_PREFIX}base changed: built on {built_on}, but {current.version} serves now "
                       f"(published meanwhile by run {current.run_id}); the next attempt builds on it", "invalid")


@dataclass(frozen=True)
class RequireNewerThanServing:
    """THE publication rule (:func:`newer_than_serving`): the draft is newer than what readers see."""

    gate: ClassVar[bool] = False

    def validate(self, serving: Serving, draft: DraftManifest) -> Finding:
        comparison, why = newer_than_serving(draft, serving.pointer, serving.manifest)
        return Finding(why) if comparison == "newer" else Finding(why, comparison)


Requirement = RequireDropWithin | RequireValid | RequireNothingServing | RequireBase | RequireNewerThanServing


@dataclass(frozen=True)
class Verdict:
    """What :func:`check` found: the first failing requirement and why, or (``outcome`` None) that all hold,
    with the publication rule's reason (why the draft is newer)."""

    outcome: Refusal | None
    reason: str
    requirement: Requirement | None = None

    @property
    def ok(self) -> bool:
        return self.outcome is None

    @property
    def final(self) -> bool:
        """No later attempt can publish this position (an ``invalid`` refusal is retried instead)."""
        return self.outcome in ("superseded", "unchanged")


def check(requirements: Sequence[Requirement], serving: Serving, draft: DraftManifest) -> Verdict:
    """Evaluate ``requirements`` in order; the first failing one decides. A failing gate requirement is
    reported with every other failing gate requirement's problems, as one validation failure."""
    why = ""
    for req in requirements:
        found = req.validate(serving, draft)
        if found.outcome is None:
            why = found.reason or why
            continue
        if not req.gate:
            return Verdict(found.outcome, found.reason, req)
        problems = [f.reason for f in (r.validate(serving, draft) for r in requirements if r.gate) if f.outcome]
        return Verdict(found.outcome, GATE_PREFIX + "; ".join(problems), req)
    return Verdict(None, why)


def gate_requirements(draft: DraftManifest, staged: Mapping[str, int | None], *, allow_empty: bool = False,
                      max_drop_fraction: float | None = None) -> list[Requirement]:
    """The validation gate (checked once, against the pointer read before the manifest is written)."""
    drop: list[Requirement] = [] if max_drop_fraction is None else [RequireDropWithin(max_drop_fraction)]
    return [*drop, RequireValid(staged, allow_empty)]


def swap_requirements(draft: DraftManifest, *, only_if_absent: bool = False) -> list[Requirement]:
    """What must hold at each pointer read right before the compare-and-swap, in this order."""
    base = base_requirement(draft)
    return [*([RequireNothingServing()] if only_if_absent else []), *([base] if base else []),
            RequireNewerThanServing()]


def base_requirement(draft: DraftManifest) -> RequireBase | None:
    """The base a segmented draft must be published over: the version it was built on (``inputs.based_on``),
    or nothing for an incremental build over the full index alone. A window rebuild rests on the window alone."""
    base = draft.inputs.get("based_on")
    if not draft.segments or (base is None and draft.inputs.get("build") != INCREMENTAL):
        return None
    return RequireBase(base)


def staged_keys(draft: DraftManifest) -> list[str]:
    """The files :class:`RequireValid` needs the sizes of (the ones this draft's build wrote)."""
    return [f["key"] for s in draft.shards for f in s["files"]]


def _shape_problems(draft: DraftManifest, allow_empty: bool) -> list[str]:
    problems: list[str] = []
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
    return problems


# --------------------------------------------------------------------------- the publication rule


def _is_compaction_of(draft: DraftManifest, current: Pointer) -> bool:
    # A compaction rewrites how the serving version stores its segments, not what it covers: newer than
    # exactly the version it compacted (RequireBase refuses any other).
    return (draft.inputs.get("build") == COMPACTION and draft.inputs.get("based_on") == current.version
            and draft.position == current.position)


def needs_serving_manifest(draft: DraftManifest, current: Pointer | None) -> bool:
    """Whether :func:`newer_than_serving` compares inputs (a full rebuild of the serving cutoff)."""
    return (current is not None and not _is_compaction_of(draft, current) and draft.position == current.position
            and draft.cutoff is not None and current.cutoff is not None)


def newer_than_serving(draft: DraftManifest, current: Pointer | None, serving_manifest: Mapping[str, Any] | None
                       ) -> tuple[Comparison, str]:
    """Is ``draft`` newer than what readers see? (``serving_manifest``: see :func:`needs_serving_manifest`.)

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
    if _is_compaction_of(draft, current):
        return "newer", f"compaction of serving version {current.version} (position {current.position})"
    if draft.position > current.position:
        return "newer", f"position {draft.position} is newer than published {current.position}"
    not_newer = (f"superseded: position {draft.position} is not newer than published "
                 f"{current.position} (version {current.version})")
    if not needs_serving_manifest(draft, current):
        return "superseded", not_newer
    serving = serving_manifest or {}
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


def _inputs_text(inputs: Mapping[str, Any]) -> str:
    return f"{inputs.get('files', '?')} files in {inputs.get('partitions', '?')} partitions"
