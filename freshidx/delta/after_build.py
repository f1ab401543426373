"""After an index build: a staged draft becomes a decision and an outcome, without Dagster.

One path for every trigger (docs/architecture.md#publication): the early "not newer" refusal
(:func:`refusal_unless_newer`, recorded in the store and the ledger, no publication attempt), else the
gate → manifest → compare-and-swap of ``CURRENT`` (:func:`publish_index_draft`, a micro-batch whose base a
compaction replaced is moved onto it), then the ledger entries and what the publication settles
(:mod:`freshidx.trigger.settlement`). :func:`after_build` runs them in order and returns an
:class:`AfterBuild`; the index IO manager (asset runs) and the continuous loop (micro-batches) only turn it
into Dagster events, metadata and tags. Here, not in ``trigger``, because the index publication uses the
delta's compaction rebase and its micro-batch steps (``full`` sits above ``delta`` and publishes through it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from freshidx.delta.compaction_run import rebase_onto_compaction
from freshidx.delta.executor.one_pass import STEPS as MICRO_BATCH_STEPS
from freshidx.publish.commit import (
    DraftManifest,
    PublishResult,
    compare_to_serving,
    publish,
    read_pointer,
    record_refusal,
)
from freshidx.store import ObjectStore
from freshidx.trigger.settlement import published_draft, record_publication


@dataclass(frozen=True)
class AfterBuild:
    """What became of one staged draft."""

    draft: DraftManifest  # as built
    result: PublishResult
    #: The draft reached the gate (it was newer than what served when compared before publishing).
    attempted: bool

    @property
    def published(self) -> DraftManifest:
        """The draft the outcome describes: a rebased micro-batch serves other segments and counts."""
        return published_draft(self.draft, self.result)

    @property
    def manifest_written(self) -> bool:
        """The gate passed and the manifest was written: the attempt reached the compare-and-swap
        (published, or another publisher won meanwhile)."""
        return self.attempted and self.result.outcome != "invalid"


def after_build(store: ObjectStore, draft: DraftManifest, run_id: str, *, compared: bool = False,
                before_publish: Callable[[], None] | None = None) -> AfterBuild:
    """Refuse ``draft`` if it is not newer than what serves, else publish it; record and settle either way.
    ``compared``: the caller already refused what was not newer (an asset body yields only a newer draft,
    so a run that publishes nothing records no materialization). ``before_publish`` runs right before the
    publication attempt (crash-safety tests stop the process there)."""
    if not compared:
        refused = refusal_unless_newer(store, draft, run_id)
        if refused is not None:
            return AfterBuild(draft, refused, attempted=False)
    if before_publish is not None:
        before_publish()
    return AfterBuild(draft, publish_index_draft(store, draft, run_id), attempted=True)


def refusal_unless_newer(store: ObjectStore, draft: DraftManifest, run_id: str) -> PublishResult | None:
    """The one rule before any publication attempt (:func:`~freshidx.publish.commit.compare_to_serving`):
    None when ``draft`` is newer than what is serving (publish it); otherwise the refusal, recorded in
    the store and the ledger, with no publication attempt. The compare-and-swap compares again (a
    publisher may win meanwhile); this early compare decides whether there is anything to publish."""
    current, _ = read_pointer(store, draft.index)
    verdict, why = compare_to_serving(store, draft, current)
    if verdict == "newer":
        return None
    result = PublishResult(verdict, draft.version, why, current)
    record_refusal(store, draft, verdict, why, current)
    record_outcome(store, draft, result, run_id)
    return result


def publish_index_draft(store: ObjectStore, draft: DraftManifest, run_id: str) -> PublishResult:
    """The gate → manifest → compare-and-swap of ``CURRENT``, under the draft's run record (``force`` turns
    the drop guard off, never monotonicity), then the ledger (:func:`record_outcome`)."""
    result = publish(store, draft, allow_empty=False, rebase=rebase_onto_compaction,
                     max_drop_fraction=None if draft.forced else draft.max_drop_fraction)
    record_outcome(store, draft, result, run_id)
    return result


def record_outcome(store: ObjectStore, draft: DraftManifest, result: PublishResult, run_id: str) -> None:
    """The ledger entries of one publication attempt and what it settles
    (:func:`freshidx.trigger.settlement.record_publication`), with the micro-batch's step seconds."""
    record_publication(store, draft, result, run_id, seconds=step_seconds(published_draft(draft, result), result))


def step_seconds(obj: DraftManifest, result: PublishResult) -> dict[str, float]:
    """Where a micro-batch's time went, for its ledger entry: the build's steps its manifest has (``parse``,
    ``state``, ``merge``, ``index``, ``upload``) and ``publish`` (known only once the pointer moved)."""
    steps = {k: float(obj.stats[f"{k}_seconds"]) for k in MICRO_BATCH_STEPS if f"{k}_seconds" in obj.stats}
    return {**steps, "publish": round(result.seconds, 3)}
