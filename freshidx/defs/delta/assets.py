"""``delta_index`` and ``delta_index_job``: the delta micro-batch as a Dagster asset.

It follows the two rules of every index asset (:mod:`freshidx.defs.shared.assets`): launchpad values are
validated before anything is built, and a run that publishes nothing records no materialization. A
partition not newer than the serving delta is refused before any Spark build.
"""
# No `from __future__ import annotations` here: Dagster inspects these annotations at definition time.

from collections.abc import Iterator

import dagster as dg
from pydantic import Field

from freshidx.defs.shared.assets import (
    INDEX_ASSET,
    PARTITION_HELP,
    TAG_ATTEMPT,
    TAG_OUTCOME,
    TAG_PARTITION,
    TAG_PIPELINE,
    TAG_TRIGGER,
    output_if_newer,
    report_nothing_new,
    resolve_partition,
    run_info,
    run_info_trigger,
)
from freshidx.defs.shared.lanes import POOL_DELTA, PRIORITY_DELTA, priority_tag
from freshidx.defs.shared.publishing_io_manager import PublishPolicy
from freshidx.defs.shared.resources import FreshidxSettings, ObjectStoreResource, SparkResource
from freshidx.delta.delta_build import DeltaPlan, build_delta
from freshidx.publish.commit import DraftManifest, compare_to_serving, iso, read_pointer
from freshidx.store import ObjectStore
from freshidx.store.partitions import PartitionId
from freshidx.trigger import ledger
from freshidx.trigger.latest_only import PIPELINE as DELTA_PIPELINE
from freshidx.trigger.lifecycle import Mark, TriggerId, decision_for


class DeltaIndexConfig(dg.Config):
    source_partition: str | None = Field(
        default=None,
        description=(
            "Trigger partition P: the delta covers (P - window, P]. Leave empty (null) for the newest "
            "visible partition, which is what the sensor does. " + PARTITION_HELP
            + " Example: source_partition: 20261124T0213"
        ),
    )
    force: bool = Field(
        default=False,
        description=(
            "Publish even if the document count collapsed versus the serving version (the gate's "
            "max-drop guard). Never overrides monotonicity: a partition not newer than the serving "
            "one is still refused. Example: force: true"
        ),
    )
    rebuild: bool = Field(
        default=False,
        description=(
            "Rebuild the delta from the whole window (P - window, P] as one segment instead of appending "
            "a segment of what is new since the serving delta (use it after repairing raw data in place). "
            "Example: rebuild: true"
        ),
    )


@dg.asset(
    name="delta_index",
    description=(
        "Delta index: every change after the full index's cutoff, up to trigger partition P (at most the "
        "window). Each run appends one segment: the products its new partitions touched, with a kill-list "
        "that hides their older copies (a window rebuild when there is nothing to append to). Built on "
        "Spark executors, staged under a fresh version and published by compare-and-swap of "
        "indexes/delta/CURRENT (the pointer is also the watermark). A publish that is not newer than what "
        "is serving is refused and recorded."
    ),
    **INDEX_ASSET,
    tags={"freshidx/lane": "delta"},
    pool=POOL_DELTA,  # one delta build at a time, however it is launched (freshidx.defs.shared.lanes)
    # Transient failures (e.g. the Connect server restarting) are retried inside the run; config
    # refusals and the validation gate raise a non-retriable Failure.
    retry_policy=dg.RetryPolicy(max_retries=2, delay=10),
    # Not yielded when there is nothing new to publish: no materialization is recorded then.
    output_required=False,
)
def delta_index(
    context: dg.AssetExecutionContext,
    config: DeltaIndexConfig,
    store: ObjectStoreResource,
    spark: SparkResource,
    freshidx: FreshidxSettings,
) -> Iterator[dg.Output[DraftManifest]]:
    settings = freshidx.settings(store.uri, store.endpoint_url)
    st = store.open()
    pointer, _ = read_pointer(st, "delta")
    # The sensor's value comes from the listing: a visible partition that upstream labelled ahead of our
    # clock (skew, or a test writing minutes faster than real time) is data, not a typo. Values typed
    # in the launchpad are also checked against the clock.
    from_listing = context.run.tags.get(TAG_TRIGGER) == "sensor"
    partition = resolve_partition(st, settings, config.source_partition, "source_partition", store.uri,
                                  allow_future=from_listing)
    watermark = PartitionId.parse(pointer.source_partition) if pointer and pointer.source_partition else None
    policy = PublishPolicy(max_drop_fraction=settings.delta_max_drop_fraction, force=config.force)
    info = {**run_info(context, settings), **policy.run_record()}
    _link_accepted_trigger(context, st, partition)
    if watermark is not None and partition <= watermark:
        # Whatever it would contain, a delta for P is not newer than the serving one: say so without
        # paying for a Spark build (UI "Materialize" with nothing new lands here).
        _nothing_new_before_build(context, st, partition)
        return
    context.log.info(f"building delta for {partition.path} (watermark {watermark.path if watermark else None})")
    with spark.session(keep_as=DELTA_PIPELINE) as session:
        draft = build_delta(
            session, st, store.store_config(), settings,
            DeltaPlan(partition=partition, watermark=watermark, run_id=context.run.run_id, run_info=info,
                      force_rebuild=config.rebuild),
            on_stage=lambda name, s: context.log.info(f"{name}: {s:.2f}s"),
        )
    yield from output_if_newer(context, st, draft)


def _link_accepted_trigger(context: dg.AssetExecutionContext, st: ObjectStore, partition: PartitionId) -> None:
    """Link the accepted trigger (P.aN, written by the sensor) to the run that executes it."""
    attempt = context.run.tags.get(TAG_ATTEMPT)
    if attempt and context.run.tags.get(TAG_PARTITION) == partition.path:
        ledger.start_attempt(st, "delta", partition, int(attempt), run_id=context.run.run_id,
                             run_key=context.run.tags.get("dagster/run_key"))


def _nothing_new_before_build(context: dg.AssetExecutionContext, st: ObjectStore, partition: PartitionId) -> None:
    """The delta for ``partition`` is not newer than the serving one: decided by the one rule on a
    draft that was never built (position is all :func:`compare_to_serving` reads for the delta)."""
    current, _ = read_pointer(st, "delta")
    probe = DraftManifest(index="delta", version="not-built", position=iso(partition.at), run_id=context.run.run_id,
                          shards=[], doc_count=0, num_shards=0, source_partition=partition.path)
    verdict, why = compare_to_serving(st, probe, current)
    if verdict == "newer":  # pragma: no cover - the caller checked partition <= watermark
        raise dg.Failure(description=f"internal: {partition.path} is newer than the pointer", allow_retries=False)
    ledger.record_partition(st, "delta", partition, decision_for(verdict), f"{why} (not built)",
                            tid=TriggerId(partition.compact).by_run(Mark.REFUSED, context.run.run_id),
                            run_id=context.run.run_id, extra={"outcome": verdict})
    tags = {TAG_OUTCOME: verdict, "freshidx/source_partition": partition.path}
    meta = {"outcome": verdict, "reason": why, "source_partition": partition.path,
            "serving_version": current.version if current else "none",
            "trigger": run_info_trigger(context)}
    report_nothing_new(context, "delta", f"{why} (not built)", tags, meta)


#: What the delta sensor (and the UI) launches: its tags give the runs their pipeline and their place in the queue.
delta_index_job = dg.define_asset_job(
    "delta_index_job", selection=[delta_index], tags={TAG_PIPELINE: DELTA_PIPELINE, **priority_tag(PRIORITY_DELTA)},
    description="Builds and publishes delta_index (what delta_index_sensor launches).")
