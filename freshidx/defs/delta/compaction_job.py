"""``delta_compaction``: background merge of small delta segments (docs/architecture.md), and its sensor.

Never on the freshness path: the micro-batches do not wait for it and it never blocks them (no
``freshidx/pipeline: delta`` tag, so the delta sensor's overlap rule ignores it). It takes the heavy
pool (one heavy Spark build at a time beside the delta, :mod:`freshidx.defs.shared.lanes`), like the full
index and the ads_hourly catch-up: it competes with them for the same two cores, not with the
delta. A micro-batch that publishes while a compaction builds wins; the compaction then republishes
its merged segment over the newer version (:mod:`freshidx.delta.compaction_run`), and a micro-batch that
loses to a compaction appends its segment to the compacted version (its publication's ``rebase``,
:func:`freshidx.delta.compaction_run.rebase_onto_compaction`).
"""
# No `from __future__ import annotations` here: Dagster inspects these annotations at definition time.

from collections.abc import Iterator

import dagster as dg

from freshidx.defs.runs.run_status import in_flight_runs
from freshidx.defs.shared.assets import OWNERS, TAG_OUTCOME, TAG_PIPELINE, TAG_TRIGGER, code_version
from freshidx.defs.shared.lanes import POOL_HEAVY, PRIORITY_COMPACTION, priority_tag
from freshidx.defs.shared.resources import FreshidxSettings, ObjectStoreResource, SparkResource
from freshidx.delta.compaction_run import PIPELINE, compact_delta, needs_compaction
from freshidx.settings import Settings

COMPACTION_KEY = dg.AssetKey("delta_compaction")
JOB_NAME = "delta_compaction_job"
RUN_TAGS = {TAG_PIPELINE: PIPELINE, **priority_tag(PRIORITY_COMPACTION)}
#: Compaction is not urgent: the limit it keeps is far below the one that forces a window rebuild.
SENSOR_INTERVAL_SECONDS = 30


@dg.asset(
    name="delta_compaction",
    description=(
        "Background compaction of the delta index: when the serving delta version holds more than "
        "delta_compact_segments segments newer than the full cutoff, a run of consecutive small segments "
        "is merged into one (each ad's row from the newest segment of the run; kill-lists united), built on "
        "Spark executors and published by compare-and-swap of indexes/delta/CURRENT as a compaction of the "
        "serving version. Search answers do not change. Off the freshness path; the outcome (merged "
        "segments, published / gave up and why) is recorded in ledger/delta_compaction/."
    ),
    group_name="indexes",
    kinds={"spark", "tantivy"},
    owners=OWNERS,
    deps=["delta_index"],
    tags={"freshidx/lane": "compaction"},
    pool=POOL_HEAVY,
    # Like the index assets: a run that publishes nothing records no materialization (an observation
    # says why), and it stays green (a compaction that gave up is recorded, not a failure).
    output_required=False,
)
def delta_compaction(
    context: dg.AssetExecutionContext, store: ObjectStoreResource, spark: SparkResource, freshidx: FreshidxSettings,
) -> Iterator[dg.MaterializeResult]:
    settings = freshidx.settings(store.uri, store.endpoint_url)
    st = store.open()
    needed, why, serving = needs_compaction(st, settings.delta_compact_segments)
    if not needed:  # checked before starting a Spark session: a manual run with nothing to do is cheap
        _not_published(context, {"outcome": "nothing_to_do", "reason": why, "based_on": serving or ""})
        return
    tags = context.run.tags
    run_info = {"run_id": context.run.run_id, "trigger": tags.get(TAG_TRIGGER, "manual"),
                "run_key": tags.get("dagster/run_key"), "code_version": code_version()}
    with spark.session(keep_as=PIPELINE) as session:
        result = compact_delta(session, st, store.store_config(), settings, run_id=context.run.run_id,
                               run_info=run_info)
    context.log.info(f"compaction {result.outcome}: {result.reason}")
    metadata = {
        "outcome": result.outcome,
        "reason": result.reason,
        "based_on": result.based_on or "",
        "version": result.version or "",
        "merged_segments": dg.MetadataValue.int(len(result.merged)),
        "segments_before": dg.MetadataValue.int(result.segments_before),
        "segments_after": dg.MetadataValue.int(result.segments_after),
        "run_docs": dg.MetadataValue.int(result.run_docs),
        "merged_docs": dg.MetadataValue.int(result.merged_docs),
        "attempts": dg.MetadataValue.int(result.attempts),
        "build_seconds": dg.MetadataValue.float(result.build_seconds),
        "publish_seconds": dg.MetadataValue.float(result.publish_seconds),
        **spark.spark_metadata(),
    }
    if result.outcome != "published":
        _not_published(context, metadata)
        return
    context.instance.add_run_tags(context.run.run_id, {TAG_OUTCOME: result.outcome})
    yield dg.MaterializeResult(metadata=metadata)


def _not_published(context: dg.AssetExecutionContext, metadata: dict) -> None:
    context.log.info(f"delta_compaction: {metadata['outcome']}: {metadata['reason']}")
    context.instance.add_run_tags(context.run.run_id, {TAG_OUTCOME: str(metadata["outcome"])})
    context.log_event(dg.AssetObservation(asset_key=COMPACTION_KEY, metadata=metadata))


delta_compaction_job = dg.define_asset_job(JOB_NAME, selection=[COMPACTION_KEY], tags=RUN_TAGS)


def make_compaction_sensor(settings: Settings) -> dg.SensorDefinition:
    @dg.sensor(
        name="delta_compaction_sensor",
        job=delta_compaction_job,
        minimum_interval_seconds=SENSOR_INTERVAL_SECONDS,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Requests delta_compaction when the serving delta version holds more than "
        f"{settings.delta_compact_segments} segments newer than the full cutoff (one pointer and one manifest "
        "read per tick); at most one compaction run at a time, one per serving version.",
    )
    def delta_compaction_sensor(
        context: dg.SensorEvaluationContext, store: ObjectStoreResource, freshidx: FreshidxSettings
    ) -> dg.SensorResult | dg.SkipReason:
        cfg = freshidx.settings(store.uri, store.endpoint_url)
        needed, why, serving = needs_compaction(store.open(), cfg.delta_compact_segments)
        if not needed or serving is None:
            return dg.SkipReason(why)
        if in_flight_runs(context.instance, 1, tags={TAG_PIPELINE: PIPELINE}):
            return dg.SkipReason(f"{why}; a compaction run is in flight")
        return dg.SensorResult(run_requests=[dg.RunRequest(
            run_key=f"compact:{serving}", tags={TAG_TRIGGER: "sensor"})])

    return delta_compaction_sensor
