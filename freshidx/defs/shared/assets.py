"""What the index assets share: the raw upstream source, tags, launchpad values, "nothing new", run info.

The index assets themselves are their pipelines' (``delta_index``: :mod:`freshidx.defs.delta.assets`,
``full_index``: :mod:`freshidx.defs.full.assets`). Two rules every index asset follows, so the UI tells
the truth:

* Launchpad values are validated before anything is built (:func:`resolve_partition`): a partition
  that does not parse, is in the future or is not visible in the store fails the run once, without
  step retries, with the reason as the failure's headline; nothing is built and no pointer moves.
* A run that publishes nothing records no materialization: the asset compares its draft with what is
  serving (the one rule, :func:`freshidx.publish.commit.compare_to_serving`) *before* yielding its optional
  output (:func:`output_if_newer`). Not newer → no output (so no materialization, the IO manager is never
  called), an ``AssetObservation`` "nothing new: …" on the asset, the run tag ``freshidx/outcome`` and the
  refusal recorded in the store, and the run stays green (it did what was asked: nothing to do).
"""
# No `from __future__ import annotations` here: Dagster inspects these annotations at definition time.

import datetime as dt
from collections.abc import Iterator

import dagster as dg

from freshidx.defs.shared.io_manager import TAG_OUTCOME as TAG_OUTCOME  # re-exported: the assets set it
from freshidx.defs.shared.io_manager import (  # TAG_SKIPPED re-exported: the sensors set it
    TAG_SKIPPED,
    outcome_metadata,
    outcome_tags,
)
from freshidx.delta.after_build import refusal_unless_newer
from freshidx.publish.commit import DraftManifest, iso, utcnow
from freshidx.settings import Settings
from freshidx.store import ObjectStore, layout
from freshidx.store.partitions import PartitionError, PartitionId
from freshidx.trigger import ledger
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

PARTITION_HELP = (
    "Accepted: " + PARTITION_FORMS_TEXT + ". The partition must already be visible in the store "
    "(at least one data file) and not in the future; anything else fails the run before it builds."
)


# What every published index asset shares: the publishing IO manager and where it sits in the UI.
INDEX_ASSET: dict = {
    "io_manager_key": "index_io_manager",
    "group_name": "indexes",
    "kinds": {"spark", "tantivy"},
    "owners": OWNERS,
    "deps": ["raw_ad_updates"],
}


def code_version() -> str:
    """The installed freshidx version ("unknown" when the package metadata is missing)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("freshidx")
    except PackageNotFoundError:
        return "unknown"


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


def output_if_newer(context: dg.AssetExecutionContext, st: ObjectStore, draft: DraftManifest
                    ) -> Iterator[dg.Output[DraftManifest]]:
    """Yield the draft for the publishing IO manager only if it is newer than what is serving.

    The IO manager compares again inside its compare-and-swap loop (a publisher may win meanwhile);
    this early compare (:func:`~freshidx.delta.after_build.refusal_unless_newer`, the first step after the
    build) only decides whether the run has anything to materialize at all.
    """
    result = refusal_unless_newer(st, draft, context.run.run_id)
    if result is None:
        yield dg.Output(draft)
        return
    skipped = context.run.tags.get(TAG_SKIPPED)
    report_nothing_new(context, draft.index, result.reason, outcome_tags(draft, result),
                       outcome_metadata(st, draft, result, skipped=skipped, manifest_written=False))


def report_nothing_new(context: dg.AssetExecutionContext, index: str, why: str, tags: dict[str, str],
                       meta: dict) -> None:
    """An ``AssetObservation`` "nothing new: …" on the asset and the outcome's run tags (no materialization)."""
    headline = f"nothing new: {index} not published: {why}"
    context.instance.add_run_tags(context.run.run_id, tags)
    # An observation, not a materialization: the asset page keeps the serving version as the
    # latest materialization and shows this event in the asset's timeline.
    context.log_event(dg.AssetObservation(asset_key=context.asset_key, description=headline, metadata=meta))
    context.log.warning(headline)


def run_info_trigger(context: dg.AssetExecutionContext) -> str:
    """What launched the run: its trigger tag, else a backfill, the schedule or a manual launch."""
    tags = context.run.tags
    return tags.get(TAG_TRIGGER, "backfill" if "dagster/backfill" in tags else
                    "schedule" if "dagster/schedule_name" in tags else "manual")


def run_info(context: dg.AssetExecutionContext, settings: Settings) -> dict:
    """The draft's run record: which run built it, why it exists, with which code and settings."""
    tags = context.run.tags
    return {
        "run_id": context.run.run_id,
        "trigger": run_info_trigger(context),
        "run_key": tags.get("dagster/run_key"),
        "attempt": tags.get(TAG_ATTEMPT),
        "sensor": tags.get("dagster/sensor_name"),
        "schedule": tags.get("dagster/schedule_name"),
        "code_version": code_version(),
        "settings": {"window_minutes": settings.window_minutes, "delta_shards": settings.delta_shards,
                     "full_shards": settings.full_shards, "source": settings.source},
    }

