"""Software-defined assets: the raw upstream source and the delta index."""
# No `from __future__ import annotations` here: Dagster inspects these annotations at definition time.


import dagster as dg

from freshidx import ledger
from freshidx.defs.resources import FreshidxSettings, ObjectStoreResource, SparkResource
from freshidx.delta import DeltaPlan, build_delta
from freshidx.listing import newest_partition
from freshidx.partitions import PartitionError, PartitionId
from freshidx.publish import DraftManifest, read_pointer
from freshidx.settings import Settings
from freshidx.store import ObjectStore

OWNERS = ["team:freshidx"]
TAG_PIPELINE = "freshidx/pipeline"
TAG_PARTITION = "freshidx/source_partition"
TAG_ATTEMPT = "freshidx/attempt"
TAG_TRIGGER = "freshidx/trigger"
TAG_SKIPPED = "freshidx/skipped_count"


def hourly_partitions(settings: Settings) -> dg.HourlyPartitionsDefinition:
    return dg.HourlyPartitionsDefinition(start_date=f"{settings.partitions_start}-00:00", timezone="UTC")


def raw_ad_updates_spec(settings: Settings) -> dg.AssetSpec:
    return dg.AssetSpec(
        "raw_ad_updates",
        description=(
            "Ad/catalog change batches dropped by upstream jobs every few minutes under "
            f"raw/{settings.source}/year=/month=/day=/hour=/minute=/. Not materialized by freshidx: "
            "the delta sensor observes it and records, per partition, whether it was processed or "
            "superseded and why."
        ),
        partitions_def=hourly_partitions(settings),
        group_name="raw",
        kinds={"s3", "json"},
        owners=OWNERS,
        metadata={"layout": f"raw/{settings.source}/year=YYYY/month=MM/day=DD/hour=HH/minute=mm/"},
    )


class DeltaIndexConfig(dg.Config):
    source_partition: str | None = None
    """Trigger partition path (``year=…/minute=mm``). Empty: the newest visible partition."""
    force: bool = False
    """Publish even if the document count collapsed versus the serving version."""


# What every published index asset shares: the publishing IO manager and where it sits in the UI.
INDEX_ASSET: dict = {
    "io_manager_key": "index_io_manager",
    "group_name": "indexes",
    "kinds": {"spark", "tantivy"},
    "owners": OWNERS,
    "deps": ["raw_ad_updates"],
}


@dg.asset(
    name="delta_index",
    description=(
        "Delta index over the sliding window (P − window, P] ending at trigger partition P: latest "
        "version per ad, deletes/pauses as kill-list entries. Built on Spark executors, staged under "
        "a fresh version and published by compare-and-swap of indexes/delta/CURRENT (the pointer is "
        "also the watermark). A publish that is not newer than what is serving is refused and recorded."
    ),
    **INDEX_ASSET,
    tags={"freshidx/lane": "delta"},
    # Transient failures (e.g. the Connect server restarting) are retried inside the run; the
    # validation gate raises a non-retriable Failure.
    retry_policy=dg.RetryPolicy(max_retries=2, delay=10),
)
def delta_index(
    context: dg.AssetExecutionContext,
    config: DeltaIndexConfig,
    store: ObjectStoreResource,
    spark: SparkResource,
    freshidx: FreshidxSettings,
) -> DraftManifest:
    settings = freshidx.settings(store.uri, store.endpoint_url)
    st = store.open()
    pointer, _ = read_pointer(st, "delta")
    partition = _resolve_partition(st, settings, config.source_partition, "source_partition", store.uri)
    watermark = PartitionId.parse(pointer.source_partition) if pointer and pointer.source_partition else None
    run_info = {**_run_info(context, settings), "force": config.force,
                "max_drop_fraction": settings.delta_max_drop_fraction}
    attempt = context.run.tags.get(TAG_ATTEMPT)
    if attempt and context.run.tags.get(TAG_PARTITION) == partition.path:
        # Link the accepted trigger (P.aN, written by the sensor) to the run that executes it.
        ledger.record(st, ledger.partition_key("delta", partition, f".a{attempt}.run"), ledger.Entry(
            "delta", f"{partition.compact}.a{attempt}.run", "started", "run started for accepted trigger",
            partition=partition.path, run_id=context.run_id, run_key=context.run.tags.get("dagster/run_key"),
            attempt=int(attempt)))
    context.log.info(f"building delta for {partition.path} (watermark {watermark.path if watermark else None})")
    with spark.session() as session:
        return build_delta(
            session, st, store.store_config(), settings,
            DeltaPlan(partition=partition, watermark=watermark, run_id=context.run_id, run_info=run_info),
            on_stage=lambda name, s: context.log.info(f"{name}: {s:.2f}s"),
        )


def _code_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("freshidx")
    except PackageNotFoundError:
        return "unknown"


class FullIndexConfig(dg.Config):
    cutoff_partition: str | None = None
    """Include raw partitions up to this path (``year=…/minute=mm``). Empty: the newest visible one."""
    force: bool = False
    """Publish even if the document count collapsed versus the serving version."""


@dg.asset(
    name="full_index",
    description=(
        "Full index rebuilt from every raw partition up to a cutoff (latest version per ad). The safety "
        "net that makes latest-only delta skipping acceptable. Published by compare-and-swap of "
        "indexes/full/CURRENT with the cutoff in the pointer; an older cutoff never replaces a newer one."
    ),
    **INDEX_ASSET,
    tags={"freshidx/lane": "full"},
    retry_policy=dg.RetryPolicy(max_retries=2, delay=30),
)
def full_index(
    context: dg.AssetExecutionContext,
    config: FullIndexConfig,
    store: ObjectStoreResource,
    spark: SparkResource,
    freshidx: FreshidxSettings,
) -> DraftManifest:
    from freshidx.full import build_full

    settings = freshidx.settings(store.uri, store.endpoint_url)
    st = store.open()
    cutoff = _resolve_partition(st, settings, config.cutoff_partition, "cutoff_partition", store.uri)
    context.log.info(f"building full index up to {cutoff.path}")
    run_info = {**_run_info(context, settings), "force": config.force,
                "max_drop_fraction": settings.full_max_drop_fraction}
    with spark.session() as session:
        return build_full(session, st, store.store_config(), settings, cutoff=cutoff, run_id=context.run_id,
                          run_info=run_info)


def _resolve_partition(
    st: ObjectStore, settings: Settings, configured: str | None, field: str, uri: str
) -> PartitionId:
    """The configured partition path (validated), or the newest visible partition when empty."""
    if configured:
        try:
            return PartitionId.parse(configured)
        except PartitionError as exc:
            raise dg.Failure(f"config {field}: {exc}") from exc
    found, _ = newest_partition(st, settings.source)
    if found is None:
        raise dg.Failure(f"no raw partitions under {uri}/raw/{settings.source}/ yet")
    return found


def _run_info(context: dg.AssetExecutionContext, settings: Settings) -> dict:
    tags = context.run.tags
    return {
        "run_id": context.run_id,
        "trigger": tags.get(TAG_TRIGGER, "backfill" if "dagster/backfill" in tags else
                            "schedule" if "dagster/schedule_name" in tags else "manual"),
        "run_key": tags.get("dagster/run_key"),
        "attempt": tags.get(TAG_ATTEMPT),
        "sensor": tags.get("dagster/sensor_name"),
        "schedule": tags.get("dagster/schedule_name"),
        "code_version": _code_version(),
        "settings": {"window_minutes": settings.window_minutes, "delta_shards": settings.delta_shards,
                     "full_shards": settings.full_shards, "source": settings.source},
    }


def full_index_schedule(settings: Settings) -> dg.ScheduleDefinition:
    return dg.ScheduleDefinition(
        name="full_index_schedule",
        target=[full_index],
        cron_schedule=f"7 */{settings.full_every_hours} * * *",
        execution_timezone="UTC",
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=f"Full rebuild every {settings.full_every_hours} h (minute 7, off the hour's burst).",
        tags={TAG_TRIGGER: "schedule", TAG_PIPELINE: "full"},
    )
