"""Background compaction of delta segments (docs/architecture.md): pure decisions.

A micro-batch appends one small segment per run, so a delta version grows by one segment per
micro-batch until a full index takes the old ones over. Readers pay per segment (a tantivy searcher
per shard, a kill-list per segment), and :func:`freshidx.delta.segments.plan` rebuilds the window once a
version would exceed ``delta_max_segments``. Compaction keeps a version at or below
``delta_compact_segments`` (K) by merging a run of *consecutive* small segments s_i..s_j into one
segment M that replaces them in place (Lucene's merge of adjacent segments; Quickwit's merge of splits):

* M's rows: for every ad, its row in the newest s_k (i ≤ k ≤ j) that holds it. A segment holds the
  whole state of the products it touched (and indexes only the documents that changed,
  ``segment_merge.SegmentUpdate``), so M holds those products whole at their newest state; M indexes
  every active ad of them with its product's features and kills them all (a superset of the run's
  kill-lists: every ad it kills it serves again, as the newest s_k's state says). Readers therefore
  answer what they answered with s_i..s_j (segments after j hide M exactly as they hid s_i..s_j);
* M's files consumed = the union; position = s_j's (the newest partition it holds); ``listed_at`` =
  the earliest of the run (what :func:`freshidx.delta.segments.files_to_read` compares late files with:
  earlier means "read again", never "skip");
* every other segment is kept as it is, in order.

Only segments newer than the serving full cutoff are merged (the next micro-batch drops the others,
and merging one the full index covers with one it does not would keep the older state visible).

Two publishers may race on ``indexes/delta/CURRENT``: a compaction and a micro-batch, both based on
the version V serving when they started. Whoever loses the compare-and-swap re-reads and moves its
already-built work onto the new serving version instead of rebuilding (the retry one level above the
attempt, as in Iceberg's table commits): :func:`splice` puts M over a newer version that still holds
s_i..s_j in a row (:func:`splice_over`); :func:`rebase_after_compaction` puts a micro-batch's new segment
over a compaction of its base (:func:`rebased_draft`, which the delta hands to publication as its
``rebase``). Each only succeeds when no segment can be lost, which :func:`constituents` makes
checkable: every merged segment lists the original segments it holds.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from freshidx.delta.segments import Segment
from freshidx.publish.commit import COMPACTION, DraftManifest, parse_iso
from freshidx.store.records import Manifest
from freshidx.store.records.segment import MERGED_KEY, Constituent

__all__ = ["COMPACTION", "MERGED_KIND", "CompactionPlan", "merged_segment", "plan_compaction", "rebased_draft",
           "splice", "splice_over"]
#: ``kind`` of a merged segment (``inputs.build`` of the version a compaction publishes: COMPACTION).
MERGED_KIND = "compacted"


def _parse(s: str) -> dt.datetime:
    return dt.datetime.fromisoformat(s.replace("Z", "+00:00"))


def constituents(seg: Segment) -> list[Constituent]:
    """The original (micro-batch or rebuild) segments ``seg`` holds, oldest first: itself unless merged."""
    return seg.constituents()


def original_versions(segs: Sequence[Segment]) -> list[str]:
    """Versions of the original segments ``segs`` hold, in order (compaction does not change it)."""
    return [c.version for s in segs for c in constituents(s)]


@dataclass(frozen=True)
class CompactionPlan:
    """Merge ``run`` (the serving segments ``start..end``, inclusive) into one segment."""

    start: int
    end: int
    run: tuple[Segment, ...]
    segments_before: int  # segments of the serving version
    eligible: int  # of those, newer than the full cutoff (what the limit counts)

    @property
    def versions(self) -> list[str]:
        return [s.version for s in self.run]

    @property
    def segments_after(self) -> int:
        return self.segments_before - len(self.run) + 1

    @property
    def doc_count(self) -> int:
        return sum(s.doc_count for s in self.run)

    def describe(self) -> str:
        return (f"merge segments {self.start}..{self.end} ({len(self.run)} segments, {self.doc_count} docs, "
                f"positions {self.run[0].position} .. {self.run[-1].position}): "
                f"{self.segments_before} -> {self.segments_after} segments")


def first_eligible(segs: Sequence[Segment], full_cutoff: dt.datetime | None) -> int:
    """Index of the first segment newer than the full cutoff (positions increase along a version)."""
    if full_cutoff is None:
        return 0
    for n, s in enumerate(segs):
        if _parse(s.position) > full_cutoff:
            return n
    return len(segs)


def needs_compaction(segs: Sequence[Segment], max_segments: int, full_cutoff: dt.datetime | None) -> bool:
    """More than K segments newer than the full cutoff (the ones the next micro-batch keeps)."""
    return len(segs) - first_eligible(segs, full_cutoff) > max_segments


def plan_compaction(segs: Sequence[Segment], *, max_segments: int, full_cutoff: dt.datetime | None,
                    target: int | None = None) -> CompactionPlan | None:
    """Which consecutive run to merge, or ``None`` when the version holds at most ``max_segments``.

    Merging L segments removes L − 1, so the run is as long as needed to come down to ``target``
    (default K // 2, so that the next micro-batches append for a while before the next compaction
    instead of compacting after every one) and, of the runs of that length, the one with the fewest
    documents (the small segments: what a merge rewrites is what it costs; a window-rebuild segment is
    usually the biggest and stays alone); ties go to the oldest run.
    """
    if max_segments < 2:
        raise ValueError(f"max_segments must be >= 2, got {max_segments}")
    first = first_eligible(segs, full_cutoff)
    eligible = len(segs) - first
    if eligible <= max_segments:
        return None
    goal = max(1, min(target if target is not None else max_segments // 2, max_segments))
    length = eligible - goal + 1
    best: tuple[int, int] | None = None  # (docs, start)
    for start in range(first, len(segs) - length + 1):
        docs = sum(s.doc_count for s in segs[start:start + length])
        if best is None or docs < best[0]:
            best = (docs, start)
    assert best is not None
    start = best[1]
    end = start + length - 1
    return CompactionPlan(start, end, tuple(segs[start:end + 1]), len(segs), eligible)


def merged_segment(run: Sequence[Segment], *, version: str, shards: list[dict[str, Any]],
                   doc_count: int, covered_count: int, compacted_at: str) -> Segment:
    """The segment M that replaces ``run`` (module docstring: files, position, listed_at)."""
    files: list[str] = []
    seen: set[str] = set()
    for s in run:
        for k in s.files:
            if k not in seen:
                seen.add(k)
                files.append(k)
    return Segment(
        version=version, position=run[-1].position, kind=MERGED_KIND, shards=shards, doc_count=doc_count,
        covered_count=covered_count, files=files,
        listed_at=min(run, key=lambda s: _parse(s.listed_at)).listed_at,
        touched_products=sum(s.touched_products for s in run),  # an upper bound: runs overlap
        extra={MERGED_KEY: [c.to_dict() for s in run for c in constituents(s)], "compacted_at": compacted_at,
               "segments_merged": [s.version for s in run]},
        # M's row for an ad is one of the run's, so it rests on a full version only if all of them do.
        full_version=run[0].full_version if len({s.full_version for s in run}) == 1 else None,
    )


def splice(segs: Sequence[Segment], run_versions: Sequence[str], merged: Segment) -> list[Segment] | None:
    """``segs`` with the consecutive run ``run_versions`` replaced by ``merged``; ``None`` when ``segs``
    no longer holds that run in a row (a full index dropped part of it, a rebuild or another
    compaction replaced it): then the merge must not be published over ``segs``."""
    names = [s.version for s in segs]
    n = len(run_versions)
    if n == 0:
        return None
    for start in range(len(names) - n + 1):
        if names[start:start + n] == list(run_versions):
            return [*segs[:start], merged, *segs[start + n:]]
    return None


def covered_by_full(segs: Sequence[Segment], full_cutoff: dt.datetime | None) -> list[str]:
    """Merged segments holding an original segment the full index covers while newer ones are not
    covered (they would keep an older state visible): their versions."""
    if full_cutoff is None:
        return []
    out: list[str] = []
    for s in segs:
        positions = [_parse(str(c.position)) > full_cutoff for c in constituents(s)]
        if any(positions) and not all(positions):
            out.append(s.version)
    return out


def rebase_after_compaction(draft_segments: Sequence[Segment], own_version: str,
                            serving_segments: Sequence[Segment], full_cutoff: dt.datetime | None,
                            ) -> list[Segment] | None:
    """A micro-batch built on V lost its compare-and-swap to a compaction of V: its segments over the
    compacted version (the compaction's segments it keeps, then its own new segment), or ``None``
    when that could lose or resurrect something.

    ``draft_segments``: the micro-batch's segments (V's kept ones, then its own, ``own_version``);
    ``serving_segments``: the compacted version's. The rebase is exact when the serving version holds
    the very same original segments the micro-batch kept, after dropping those the full index covers
    (:func:`original_versions`): a compaction changes how they are stored, never what readers answer,
    so the new segment, computed from the same state, hides the same ads.
    """
    own = [s for s in draft_segments if s.version == own_version]
    kept = [s for s in draft_segments if s.version != own_version]
    if len(own) != 1 or draft_segments[-1].version != own_version:
        return None
    if covered_by_full(serving_segments, full_cutoff):
        return None
    first = first_eligible(serving_segments, full_cutoff)
    rebased = list(serving_segments[first:])
    if original_versions(rebased) != original_versions(kept):
        return None
    return [*rebased, own[0]]



@dataclass(frozen=True)
class Splice:
    """M over a serving version: the segments to publish, or (``segments`` None) why not."""

    segments: list[Segment] | None
    why: str = ""


def splice_over(serving_version: str, segs: Sequence[Segment], plan: CompactionPlan, merged: Segment,
                full_cutoff: dt.datetime | None) -> Splice:
    """What a compaction publishes over ``serving_version`` (its segments ``segs``): :func:`splice`, unless
    that no longer holds the run in a row or the full index now covers part of it (:func:`covered_by_full`)."""
    spliced = splice(segs, plan.versions, merged)
    if spliced is None:
        return Splice(None, f"serving version {serving_version} no longer holds segments {plan.versions} in a row "
                            f"(a rebuild, a full index or another compaction replaced them); M not published")
    if covered_by_full(spliced, full_cutoff):
        return Splice(None, "the full index now covers part of the merged run; M not published")
    return Splice(spliced)


def rebased_draft(draft: DraftManifest, serving_version: str, serving_manifest: Manifest
                  ) -> DraftManifest | None:
    """``draft`` (a micro-batch whose base changed) moved onto the serving version when that is a
    compaction of its base (:func:`rebase_after_compaction` decides, conservatively); None otherwise.
    The segments, counts and ``inputs.based_on`` change; ``inputs.rebased_from`` keeps the old base."""
    serving_segments = serving_manifest.segment_list()
    draft_segments = draft.segment_list()
    if not draft_segments or serving_manifest.build != COMPACTION or serving_segments is None:
        return None
    cutoff = draft.full_cutoff
    rebased = rebase_after_compaction(draft_segments, draft.version, serving_segments,
                                      parse_iso(cutoff) if cutoff else None)
    if rebased is None:
        return None
    return dataclasses.replace(
        draft, segments=[s.to_dict() for s in rebased], doc_count=sum(s.doc_count for s in rebased),
        covered_count=sum(s.covered_count for s in rebased),
        inputs={**draft.inputs, "based_on": serving_version, "rebased_from": draft.based_on,
                "segments_kept": len(rebased) - 1},
        stats={**draft.stats, "segments": len(rebased)},
    )
