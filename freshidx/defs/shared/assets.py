"""Software-defined assets: the raw upstream source and the index assets.

Two rules every index asset follows, so the UI tells the truth:

* Launchpad values are validated before anything is built (:func:`resolve_partition`): a partition
  that does not parse, is in the future or is not visible in the store fails the run once, without
  step retries, with the reason as the failure's headline; nothing is built and no pointer moves.
* A run that publishes nothing records no materialization: the asset compares its draft with what is
  serving (the one rule, :func:`freshidx.publish.commit.compare_to_serving`) *before* yielding its optional
  output. Not newer → no output (so no materialization, the IO manager is never called), an
  ``AssetObservation`` "nothing new: …" on the asset, the run tag ``freshidx/outcome`` and the
  refusal recorded in the store, and the run stays green (it did what was asked: nothing to do).
"""
# No `from __future__ import annotations` here: Dagster inspects these annotations at definition time.

import datetime as dt
from collections.abc import Iterator

import dagster as dg
from pydantic import Field

from freshidx.defs.runs.lanes import POOL_DELTA, POOL_HEAVY, PRIORITY_DELTA, PRIORITY_FULL, priority_tag
from freshidx.defs.shared.io_manager import (  # TAG_SKIPPED re-exported: the sensors set it
    TAG_OUTCOME,
    TAG_SKIPPED,
    outcome_metadata,
    outcome_tags,
    refusal_unless_newer,
)
from freshidx.defs.shared.publishing_io_manager import PublishPolicy
from freshidx.defs.shared.resources import FreshidxSettings, ObjectStoreResource, SparkResource
from freshidx.delta.build import DeltaPlan, build_delta
from freshidx.publish.commit import (
    DraftManifest,
    compare_to_serving,
    iso,
    read_pointer,
    utcnow,
)
from freshidx.settings import Settings
from freshidx.store import ObjectStore, layout
from freshidx.store.partitions import PartitionError, PartitionId
from freshidx.trigger import ledger
from freshidx.trigger.latest_only import PIPELINE as DELTA_PIPELINE
from freshidx.trigger.lifecycle import Decision, Mark, TriggerId, decision_for
from freshidx.trigger.listing import newest_partition

OWNERS = ["team:freshidx"]
TAG_PIPELINE = "freshidx/pipeline"
TAG_PARTITION = "freshidx/source_partition"
TAG_ATTEMPT = "freshidx/attempt"
TAG_TRIGGER = "freshidx/trigger"
#: When the delta sensor saw the partition it requests a run for (UTC, ISO): arrival → noticed is the trigger's share.
TAG_NOTICED = "freshidx/noticed_at"


def hourly_partitions(settings: Settings) -> dg.HourlyPartitionsDefinition:
    return dg.HourlyPartitionsDefinition(start_date=settings.partitions_start_at, timezone="UTC")


def store_kind(uri: str) -> str:
    """The asset kind of the configured object store (the UI shows it as the asset's storage)."""
    return "s3" if uri.startswith("s3://") else "file"


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
        kinds={store_kind(settings.store), "json"},
        owners=OWNERS,
        metadata={"layout": f"raw/{settings.source}/year=YYYY/month=MM/day=DD/hour=HH/minute=mm/"},
    )


#: The forms a launchpad partition value may take (shown in config descriptions and refusals).
PARTITION_FORMS_TEXT = (
    "a minute partition as 20261124T0213 or year=2026/month=11/day=24/hour=02/minute=13, or an hour "
    "as 2026-11-24-02:00 (the hourly key the Dagster UI shows), 20261124T02 or "
    "year=2026/month=11/day=24/hour=02, meaning the newest visible partition of that hour (UTC)"
)

_PARTITION_HELP = (
    "Accepted: " + PARTITION_FORMS_TEXT + ". The partition must already be visible in the store "
    "(at least one data file) and not in the future; anything else fails the run before it builds."
)


class DeltaIndexConfig(dg.Config):
    source_partition: str | None = Field(
        default=None,
        description=(
            "Trigger partition P: the delta covers (P - window, P]. Leave empty (null) for the newest "
            "visible partition, which is what the sensor does. " + _PARTITION_HELP
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
        "Delta index: every change after the full index's cutoff, up to trigger partition P (at most the "
        "window). Each run appends one segment: the products its new partitions touched, with a kill-list "
        "that hides their older copies (a window rebuild when there is nothing to append to). Built on "
        "Spark executors, staged under a fresh version and published by compare-and-swap of "
        "indexes/delta/CURRENT (the pointer is also the watermark). A publish that is not newer than what "
        "is serving is refused and recorded."
    ),
    **INDEX_ASSET,
    tags={"freshidx/lane": "delta"},
    pool=POOL_DELTA,  # one delta build at a time, however it is launched (freshidx.defs.runs.lanes)
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
    run_info = {**_run_info(context, settings), **policy.run_record()}
    attempt = context.run.tags.get(TAG_ATTEMPT)
    if attempt and context.run.tags.get(TAG_PARTITION) == partition.path:
        # Link the accepted trigger (P.aN, written by the sensor) to the run that executes it.
        ledger.record_partition(
            st, "delta", partition, Decision.STARTED, "run started for accepted trigger",
            tid=TriggerId(partition.compact).claim(int(attempt)).then(Mark.RUN), run_id=context.run_id,
            run_key=context.run.tags.get("dagster/run_key"), attempt=int(attempt))
    if watermark is not None and partition <= watermark:
        # Whatever it would contain, a delta for P is not newer than the serving one: say so without
        # paying for a Spark build (UI "Materialize" with nothing new lands here).
        _nothing_new_before_build(context, st, partition)
        return
    context.log.info(f"building delta for {partition.path} (watermark {watermark.path if watermark else None})")
    with spark.session(keep_as=DELTA_PIPELINE) as session:
        draft = build_delta(
            session, st, store.store_config(), settings,
            DeltaPlan(partition=partition, watermark=watermark, run_id=context.run_id, run_info=run_info,
                      force_rebuild=config.rebuild),
            on_stage=lambda name, s: context.log.info(f"{name}: {s:.2f}s"),
        )
    yield from _output_if_newer(context, st, draft)


def code_version() -> str:
    """The installed freshidx version ("unknown" when the package metadata is missing)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("freshidx")
    except PackageNotFoundError:
        return "unknown"


class FullIndexConfig(dg.Config):
    cutoff_partition: str | None = Field(
        default=None,
        description=(
            "Cutoff C: the full index holds every raw partition up to and including C. Leave empty "
            "(null) for the newest visible partition, which is what the schedule does. " + _PARTITION_HELP
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
    pool=POOL_HEAVY,  # one heavy build at a time beside the delta (freshidx.defs.runs.lanes)
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
    from freshidx.full.build import INDEX as FULL_INDEX
    from freshidx.full.build import build_full

    settings = freshidx.settings(store.uri, store.endpoint_url)
    st = store.open()
    cutoff = resolve_partition(st, settings, config.cutoff_partition, "cutoff_partition", store.uri)
    context.log.info(f"building full index up to {cutoff.path}")
    policy = PublishPolicy(max_drop_fraction=settings.full_max_drop_fraction, force=config.force)
    run_info = {**_run_info(context, settings), **policy.run_record()}
    # No pre-build shortcut here: the same cutoff can be newer (late partitions), which only the
    # built draft's inputs can tell.
    with spark.session(keep_as=FULL_INDEX) as session:
        draft = build_full(session, st, store.store_config(), settings, cutoff=cutoff, run_id=context.run_id,
                           run_info=run_info, force_raw=config.from_raw,
                           cutoff_configured=bool((config.cutoff_partition or "").strip()))
    yield from _output_if_newer(context, st, draft)


# ------------------------------------------------------------------------------ launchpad values


def config_refused(field: str, value: str, why: str) -> dg.Failure:
    """A refused launchpad value: the run fails once (``allow_retries=False`` bypasses the asset's
    RetryPolicy, dagster ``op_execution_error_boundary``) with this as the step failure's headline."""
    return dg.Failure(
        description=f"config {field}={value!r} refused: {why}. Nothing was built; the pointer did not move.",
        metadata={"field": field, "value": value, "accepted_forms": PARTITION_FORMS_TEXT},
        allow_retries=False,
    )


def resolve_partition(
    st: ObjectStore, settings: Settings, configured: str | None, field: str, uri: str,
    *, now: dt.datetime | None = None, allow_future: bool = False,
) -> PartitionId:
    """The partition a run builds for: the configured one, validated, or the newest visible one.

    A configured value must parse (:data:`PARTITION_FORMS_TEXT`; an hour means the newest visible
    partition of that hour), must not be in the future and must be visible (at least one data
    file), else :func:`config_refused`. A partition that does not exist yet would otherwise be
    published as the pointer/watermark and hide every real partition before it.
    """
    now = now or utcnow()
    if configured is None or not configured.strip():
        found, _ = newest_partition(st, settings.source)
        if found is None:
            # Retrying in seconds would not make upstream write: fail once, clearly.
            raise dg.Failure(description=f"no raw partitions under {uri}/raw/{settings.source}/ yet; nothing to build",
                             allow_retries=False)
        return found
    value = configured.strip()
    try:
        selected = ledger.parse_partition(value)
    except PartitionError:
        raise config_refused(field, value, "not a partition; expected " + PARTITION_FORMS_TEXT) from None
    if selected.at > now and not allow_future:
        raise config_refused(field, value, f"{selected.path} is in the future (now {iso(now)}); "
                                           "a partition that does not exist yet would freeze the delta")
    if selected.hour:
        found = _newest_in_hour(st, settings.source, selected.at, now)
        if found is None:
            raise config_refused(field, value, f"no visible partition in hour {selected.path} under "
                                               f"{uri}/raw/{settings.source}/{_newest_hint(st, settings.source)}")
        return found
    minute = selected.minute()
    if not _has_data(st, layout.raw_partition_prefix(settings.source, minute)):
        raise config_refused(field, value, f"partition {minute.path} is not visible in {uri}/raw/{settings.source}/ "
                                           f"(no data file){_newest_hint(st, settings.source)}")
    return minute


def _is_data(key: str) -> bool:
    return not key.rpartition("/")[2].startswith((".", "_"))  # hidden files and markers are not data


def _has_data(st: ObjectStore, prefix: str) -> bool:
    return any(_is_data(o.key) for o in st.list(prefix, delimiter="/").objects)


def _newest_in_hour(st: ObjectStore, source: str, hour: dt.datetime, now: dt.datetime) -> PartitionId | None:
    """The newest partition of one hour holding a data file, not after ``now`` (one hour's listing)."""
    root = layout.raw_root(source)
    newest: PartitionId | None = None
    for obj in st.iter_objects(layout.raw_hour_prefix(source, PartitionId(hour).hour_path)):
        part_path, _, _ = obj.key[len(root):].rpartition("/")
        try:
            pid = PartitionId.parse(part_path)
        except PartitionError:
            continue  # not ours to interpret (the listing reports these elsewhere)
        if _is_data(obj.key) and pid.at <= now and (newest is None or pid > newest):
            newest = pid
    return newest


def _newest_hint(st: ObjectStore, source: str) -> str:
    found, _ = newest_partition(st, source)
    return f"; the newest visible partition is {found.path}" if found else "; no partition is visible yet"


# ------------------------------------------------------------------------------ nothing new


def _output_if_newer(context: dg.AssetExecutionContext, st: ObjectStore, draft: DraftManifest
                     ) -> Iterator[dg.Output[DraftManifest]]:
    """Yield the draft for the publishing IO manager only if it is newer than what is serving.

    The IO manager compares again inside its compare-and-swap loop (a publisher may win meanwhile);
    this early compare (:func:`~freshidx.defs.shared.io_manager.refusal_unless_newer`) only decides whether the
    run has anything to materialize at all.
    """
    result = refusal_unless_newer(st, draft, context.run_id)
    if result is None:
        yield dg.Output(draft)
        return
    skipped = context.run.tags.get(TAG_SKIPPED)
    _report_nothing_new(context, draft.index, result.reason, outcome_tags(draft, result),
                        outcome_metadata(st, draft, result, skipped=skipped, manifest_written=False))


def _nothing_new_before_build(context: dg.AssetExecutionContext, st: ObjectStore, partition: PartitionId) -> None:
    """The delta for ``partition`` is not newer than the serving one: decided by the one rule on a
    draft that was never built (position is all :func:`compare_to_serving` reads for the delta)."""
    current, _ = read_pointer(st, "delta")
    probe = DraftManifest(index="delta", version="not-built", position=iso(partition.at), run_id=context.run_id,
                          shards=[], doc_count=0, num_shards=0, source_partition=partition.path)
    verdict, why = compare_to_serving(st, probe, current)
    if verdict == "newer":  # pragma: no cover - the caller checked partition <= watermark
        raise dg.Failure(description=f"internal: {partition.path} is newer than the pointer", allow_retries=False)
    ledger.record_partition(st, "delta", partition, decision_for(verdict), f"{why} (not built)",
                            tid=TriggerId(partition.compact).by_run(Mark.REFUSED, context.run_id),
                            run_id=context.run_id, extra={"outcome": verdict})
    tags = {TAG_OUTCOME: verdict, "freshidx/source_partition": partition.path}
    meta = {"outcome": verdict, "reason": why, "source_partition": partition.path,
            "serving_version": current.version if current else "none",
            "trigger": _run_info_trigger(context)}
    _report_nothing_new(context, "delta", f"{why} (not built)", tags, meta)


def _report_nothing_new(context: dg.AssetExecutionContext, index: str, why: str, tags: dict[str, str],
                        meta: dict) -> None:
    headline = f"nothing new: {index} not published: {why}"
    context.instance.add_run_tags(context.run_id, tags)
    # An observation, not a materialization: the asset page keeps the serving version as the
    # latest materialization and shows this event in the asset's timeline.
    context.log_event(dg.AssetObservation(asset_key=context.asset_key, description=headline, metadata=meta))
    context.log.warning(headline)


def _run_info_trigger(context: dg.AssetExecutionContext) -> str:
    tags = context.run.tags
    return tags.get(TAG_TRIGGER, "backfill" if "dagster/backfill" in tags else
                    "schedule" if "dagster/schedule_name" in tags else "manual")


def _run_info(context: dg.AssetExecutionContext, settings: Settings) -> dict:
    tags = context.run.tags
    return {
        "run_id": context.run_id,
        "trigger": _run_info_trigger(context),
        "run_key": tags.get("dagster/run_key"),
        "attempt": tags.get(TAG_ATTEMPT),
        "sensor": tags.get("dagster/sensor_name"),
        "schedule": tags.get("dagster/schedule_name"),
        "code_version": code_version(),
        "settings": {"window_minutes": settings.window_minutes, "delta_shards": settings.delta_shards,
                     "full_shards": settings.full_shards, "source": settings.source},
    }


#: The jobs the sensors, the schedule and the SLA remediation launch (and the UI can): their tags give the
#: runs their pipeline and their place in the queue.
delta_index_job = dg.define_asset_job(
    "delta_index_job", selection=[delta_index], tags={TAG_PIPELINE: DELTA_PIPELINE, **priority_tag(PRIORITY_DELTA)},
    description="Builds and publishes delta_index (what delta_index_sensor launches).")
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
