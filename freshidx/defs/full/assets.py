"""``full_index``, ``full_index_job`` and ``full_index_schedule``: the full rebuild as a Dagster asset.

It follows the two rules of every index asset (:mod:`freshidx.defs.shared.assets`): launchpad values are
validated before anything is built, and a run that publishes nothing records no materialization.
"""
# No `from __future__ import annotations` here: Dagster inspects these annotations at definition time.

from collections.abc import Iterator

import dagster as dg
from pydantic import Field

from freshidx.defs.shared.assets import (
    INDEX_ASSET,
    PARTITION_HELP,
    TAG_PIPELINE,
    TAG_TRIGGER,
    output_if_newer,
    resolve_partition,
    run_info,
)
from freshidx.defs.shared.lanes import POOL_HEAVY, PRIORITY_FULL, priority_tag
from freshidx.defs.shared.publishing_io_manager import PublishPolicy
from freshidx.defs.shared.resources import FreshidxSettings, ObjectStoreResource, SparkResource
from freshidx.publish.commit import DraftManifest
from freshidx.settings import Settings


class FullIndexConfig(dg.Config):
    cutoff_partition: str | None = Field(
        default=None,
        description=(
            "Cutoff C: the full index holds every raw partition up to and including C. Leave empty "
            "(null) for the newest visible partition, which is what the schedule does. " + PARTITION_HELP
            + " Example: cutoff_partition: year=2026/month=11/day=24/hour=02/minute=13"
        ),
    )
    force: bool = Field(
        default=False,
        description=(
            "Publish even if the document count collapsed versus the serving version (the gate's "
            "max-drop guard). Never overrides monotonicity: an older cutoff is still refused. "
            "Example: force: true"
        ),
    )
    from_raw: bool = Field(
        default=False,
        description=(
            "Read every raw partition up to the cutoff again instead of laying the delta's segments over "
            "the serving full version (what every FRESHIDX_FULL_RAW_EVERY-th build does anyway). "
            "Example: from_raw: true"
        ),
    )


@dg.asset(
    name="full_index",
    description=(
        "Full index up to a cutoff (latest version per ad): the serving full version with the delta's "
        "segments laid over it, one Spark task per product bucket, or, when they do not hold every raw "
        "file up to the cutoff (and every FRESHIDX_FULL_RAW_EVERY-th build), every raw partition read "
        "again. The safety net that makes latest-only delta skipping acceptable. Published by "
        "compare-and-swap of indexes/full/CURRENT with the cutoff in the pointer; an older cutoff never "
        "replaces a newer one."
    ),
    **INDEX_ASSET,
    tags={"freshidx/lane": "full"},
    pool=POOL_HEAVY,  # one heavy build at a time beside the delta (freshidx.defs.shared.lanes)
    retry_policy=dg.RetryPolicy(max_retries=2, delay=30),
    output_required=False,  # see delta_index
)
def full_index(
    context: dg.AssetExecutionContext,
    config: FullIndexConfig,
    store: ObjectStoreResource,
    spark: SparkResource,
    freshidx: FreshidxSettings,
) -> Iterator[dg.Output[DraftManifest]]:
    from freshidx.full.full_build import INDEX as FULL_INDEX
    from freshidx.full.full_build import build_full

    settings = freshidx.settings(store.uri, store.endpoint_url)
    st = store.open()
    cutoff = resolve_partition(st, settings, config.cutoff_partition, "cutoff_partition", store.uri)
    context.log.info(f"building full index up to {cutoff.path}")
    policy = PublishPolicy(max_drop_fraction=settings.full_max_drop_fraction, force=config.force)
    info = {**run_info(context, settings), **policy.run_record()}
    # No pre-build shortcut here: the same cutoff can be newer (late partitions), which only the
    # built draft's inputs can tell.
    with spark.session(keep_as=FULL_INDEX) as session:
        draft = build_full(session, st, store.store_config(), settings, cutoff=cutoff, run_id=context.run.run_id,
                           run_info=info, force_raw=config.from_raw,
                           cutoff_configured=bool((config.cutoff_partition or "").strip()))
    yield from output_if_newer(context, st, draft)


#: What the schedule and the SLA remediation launch (and the UI can): its tags give the runs their pipeline
#: and their place in the queue.
full_index_job = dg.define_asset_job(
    "full_index_job", selection=[full_index], tags={TAG_PIPELINE: "full", **priority_tag(PRIORITY_FULL)},
    description="Builds and publishes full_index (what full_index_schedule and the SLA remediation launch).")


def full_index_schedule(settings: Settings) -> dg.ScheduleDefinition:
    return dg.ScheduleDefinition(
        name="full_index_schedule",
        job=full_index_job,
        cron_schedule=f"7 */{settings.full_every_hours} * * *",
        execution_timezone="UTC",
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=f"Full rebuild every {settings.full_every_hours} h (minute 7, off the hour's burst).",
        tags={TAG_TRIGGER: "schedule"},
    )
