"""``ads_hourly`` (closed, validated, deduplicated hourly buckets) and its catch-up sensor.

The asset is hourly-partitioned, so UI backfills of a range work as Dagster users expect (at most
``hourly_max_hours_per_run`` hours per run, lower priority than live runs via dagster.yaml). The
sensor observes (the store, :class:`DagsterRunIndex`), plans (:func:`freshidx.catchup.planner.plan_tick`, reads
only) and applies the plan (:func:`freshidx.catchup.planner.apply`); this module only adapts both to Dagster.
"""
# No `from __future__ import annotations` here: Dagster inspects these annotations at definition time.

import contextlib
import datetime as dt
import hashlib
import json
from typing import TYPE_CHECKING, Any

import dagster as dg
from dagster import DagsterRunStatus, RunsFilter

from freshidx.catchup import planner
from freshidx.catchup.readiness import check_ready, list_hour
from freshidx.defs.catchup.io_manager import HourBucket
from freshidx.defs.runs.run_status import IN_FLIGHT
from freshidx.defs.shared.assets import OWNERS, TAG_PIPELINE, TAG_TRIGGER, code_version, hourly_partitions
from freshidx.defs.shared.lanes import POOL_HEAVY, PRIORITY_CATCHUP, priority_tag
from freshidx.defs.shared.resources import FreshidxSettings, ObjectStoreResource, SparkResource
from freshidx.publish.commit import crash_point, utcnow
from freshidx.settings import Settings
from freshidx.store import ObjectStore
from freshidx.trigger import run_health
from freshidx.trigger.lifecycle import Decision, Mark, TriggerId
from freshidx.trigger.listing import newest_partition

if TYPE_CHECKING:
    from freshidx.catchup.hourly_build import HourInput

ADS_HOURLY_KEY = dg.AssetKey(planner.ASSET)
ADS_HOURLY_JOB = "ads_hourly_job"


def make_ads_hourly(settings: Settings) -> dg.AssetsDefinition:
    # A multi_asset of one output: @asset's backfill_policy parameter is beta, multi_asset's is stable,
    # and the policy (UI backfills of at most hourly_max_hours_per_run hours per run) is the same.
    @dg.multi_asset(
        name=planner.ASSET,
        outs={planner.ASSET: dg.AssetOut(
            description=(
                "Every closed hour of raw_ad_updates, validated (invalid records quarantined with a reason and "
                "counted), deduplicated to one row per ad and version, written as an immutable Parquet bucket "
                "and published per hour by the stage → manifest → compare-and-swap protocol. Each hour is "
                "processed exactly once by the catch-up sensor; late data produces a correction version; UI "
                "backfills rebuild hours without ever moving a pointer to fewer inputs."
            ),
            io_manager_key="bucket_io_manager",
            group_name="buckets",
            kinds={"spark", "parquet"},
            owners=OWNERS,
            tags={"freshidx/lane": "catchup"},
        )},
        partitions_def=hourly_partitions(settings),
        backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=settings.hourly_max_hours_per_run),
        # A Spark Connect restart under the build (drained, or a dead JVM) fails it with an ordinary
        # exception; retrying here keeps it from costing one of the catch-up's per-hour attempts.
        retry_policy=dg.RetryPolicy(max_retries=2, delay=30),
        deps=["raw_ad_updates"],
        pool=POOL_HEAVY,  # one heavy build at a time beside the delta (freshidx.defs.shared.lanes)
    )
    def ads_hourly(
        context: dg.AssetExecutionContext,
        store: ObjectStoreResource,
        spark: SparkResource,
        freshidx: FreshidxSettings,
    ) -> list:
        cfg = freshidx.settings(store.uri, store.endpoint_url)
        st = store.open()
        tags = context.run.tags
        claims: dict[str, str] = json.loads(tags.get(planner.TAG_CLAIMS) or "{}")
        kind = tags.get(planner.TAG_KIND) or ("backfill" if "dagster/backfill" in tags else "manual")
        out, todo = _ready_hours(context, st, cfg, claims, kind)
        if todo:
            out += _build_hours(context, store, spark, cfg, todo, claims, kind)
        out.sort(key=lambda hb: hb.hour_id)
        return out

    return ads_hourly


def _ready_hours(context: dg.AssetExecutionContext, st: ObjectStore, cfg: Settings, claims: dict[str, str],
                 kind: str) -> tuple[list[HourBucket], list["HourInput"]]:
    """The run's hours, each linked to its claim: the ready ones to build, and a bucket without a draft
    (its reason) for each hour not ready yet."""
    from freshidx.catchup.hourly_build import HourInput

    policy = cfg.readiness_for(cfg.source)
    newest, _ = newest_partition(st, cfg.source)
    tags = context.run.tags
    out: list[HourBucket] = []
    todo: list[HourInput] = []  # ready hours; id and claim follow from .hour
    for key in context.partition_keys:
        hour = planner.hour_from_dagster_key(key)
        hid = planner.layout.hour_id(hour)
        claim = claims.get(hid)
        if claim:
            tid = TriggerId.from_suffix(hid, claim).then(Mark.RUN)
            planner.record(st, planner.ASSET, hour, tid, Decision.STARTED, "run started for the claim",
                           run_id=context.run.run_id, run_key=tags.get("dagster/run_key"))
        listed_at = utcnow()
        listing = list_hour(st, cfg.source, hour)
        ready = check_ready(st, listing, policy, now=listed_at, quiet_seconds=cfg.quiet_seconds,
                            close_grace_seconds=cfg.close_grace_seconds,
                            newer_data_visible=newest is not None and newest.at >= hour + planner.HOUR)
        if not ready.ready:
            # Publishing a partial hour would close it for good; a backfill must wait like the sensor.
            context.log.warning(f"{hid} not ready ({policy}): {ready.reason}")
            out.append(HourBucket(hid, kind, claim, None, [f"not ready ({policy}): {ready.reason}"]))
            continue
        todo.append(HourInput(hour=hour, files=listing.files, listed_at=listed_at,
                              expected_rows=ready.expected_rows))
    return out, todo


def _build_hours(context: dg.AssetExecutionContext, store: ObjectStoreResource, spark: SparkResource,
                 cfg: Settings, todo: list["HourInput"], claims: dict[str, str], kind: str) -> list[HourBucket]:
    """The ready hours' buckets, built in one Spark pass (drafts for the bucket IO manager to publish)."""
    from freshidx.catchup.hourly_build import build_buckets

    tags = context.run.tags
    run_info = {"run_id": context.run.run_id, "trigger": kind, "run_key": tags.get("dagster/run_key"),
                "backfill": tags.get("dagster/backfill"), "code_version": code_version(),
                "readiness": cfg.readiness_for(cfg.source), "claims": claims}
    crash_point("bucket_build")  # tests: the run dies mid-hour like a kill -9 (claim taken, run STARTED)
    hids = [planner.layout.hour_id(i.hour) for i in todo]
    context.log.info(f"building {planner.ASSET} {', '.join(hids)} in one Spark pass: "
                     f"{sum(len(i.files) for i in todo)} file(s), {kind}")
    # A failure drops the session, so a step retry reconnects.
    with spark.session(keep_as=planner.ASSET) as session:
        built = build_buckets(session, store.store_config(), asset=planner.ASSET, source=cfg.source,
                              hours=todo, run_id=context.run.run_id,
                              parts=cfg.hourly_parts, run_info=run_info, kind=kind,
                              max_future_skew_seconds=cfg.max_future_skew_seconds,
                              quarantine_once=True)  # a bad record is quarantined by its first reader
    return [HourBucket(hid, kind, claims.get(hid), b.draft, [f"manifest rows: {m}" for m in b.row_mismatches])
            for hid, b in zip(hids, built, strict=True)]


class DagsterRunIndex:
    """:class:`freshidx.catchup.planner.CatchupRunIndex` answered from the Dagster instance (bounded queries),
    and the :class:`freshidx.catchup.planner.Canceller` that :func:`freshidx.catchup.planner.apply` cancels
    stuck runs with."""

    def __init__(self, instance: dg.DagsterInstance) -> None:
        self.instance = instance
        self._in_flight: list | None = None

    def by_run_key(self, run_key: str) -> planner.CatchupRun | None:
        records = self.instance.get_run_records(RunsFilter(tags={"dagster/run_key": run_key}), limit=1)
        if not records:
            return None
        rec = records[0]
        status = rec.dagster_run.status
        view = (planner.IN_FLIGHT if status in IN_FLIGHT else planner.SUCCESS if status == DagsterRunStatus.SUCCESS
                else planner.CANCELED if status == DagsterRunStatus.CANCELED else planner.FAILURE)
        return planner.CatchupRun(rec.dagster_run.run_id, view, rec.create_timestamp.timestamp(), rec.start_time,
                                  interrupted=run_health.is_interrupted(rec.dagster_run.tags))

    def _runs(self) -> list:
        if self._in_flight is None:
            self._in_flight = [r for r in self.instance.get_runs(RunsFilter(statuses=IN_FLIGHT), limit=200)
                               if ADS_HOURLY_KEY in (r.asset_selection or ())]
        return self._in_flight

    def busy_hours(self) -> dict[str, str]:
        busy: dict[str, str] = {}
        for r in self._runs():
            for hour in _run_hours(r.tags):
                busy[planner.layout.hour_id(hour)] = r.run_id
        return busy

    def catchup_in_flight(self) -> int:
        return sum(1 for r in self._runs() if r.tags.get(planner.TAG_KIND))

    def cancel(self, run_id: str, reason: str) -> None:
        run = self.instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return
        with contextlib.suppress(Exception):  # the process may be gone; the run record is fixed below
            self.instance.run_coordinator.cancel_run(run_id)
        run = self.instance.get_run_by_id(run_id)
        # A dead process never acknowledges; a record left CANCELING would keep its hours busy forever.
        if run is not None and not run.is_finished:
            self.instance.report_run_canceled(run, message=f"freshidx catch-up: {reason}")


def _run_hours(tags: dict) -> list[dt.datetime]:
    if tags.get("dagster/partition"):
        return [planner.hour_from_dagster_key(tags["dagster/partition"])]
    start, end = tags.get("dagster/asset_partition_range_start"), tags.get("dagster/asset_partition_range_end")
    if start and end:
        h, last = planner.hour_from_dagster_key(start), planner.hour_from_dagster_key(end)
        out = []
        while h <= last and len(out) < 24 * 366:
            out.append(h)
            h += planner.HOUR
        return out
    return []


def run_request(req: planner.CatchupRequest) -> dg.RunRequest:
    keys = [planner.dagster_key(h) for h in req.hours]
    tags = {
        TAG_PIPELINE: planner.ASSET, TAG_TRIGGER: "sensor", planner.TAG_KIND: req.kind,
        planner.TAG_CLAIMS: json.dumps({planner.layout.hour_id(c.hour): c.suffix for c in req.claims},
                                       sort_keys=True),
    }
    if len(keys) == 1:
        return dg.RunRequest(run_key=req.run_key, partition_key=keys[0], tags=tags, asset_selection=[ADS_HOURLY_KEY])
    tags.update({"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]})
    return dg.RunRequest(run_key=req.run_key, tags=tags, asset_selection=[ADS_HOURLY_KEY])


# What define_asset_job returns is not exported by dagster under a public name: hence Any.
def make_ads_hourly_job(ads_hourly: dg.AssetsDefinition) -> Any:
    """The catch-up's job: its runs come before compaction and UI backfills in the queue
    (freshidx.defs.shared.lanes)."""
    return dg.define_asset_job(
        ADS_HOURLY_JOB, selection=[ads_hourly],  # partitioned like ads_hourly (Dagster infers it)
        tags={TAG_PIPELINE: planner.ASSET, **priority_tag(PRIORITY_CATCHUP)},
        description="Builds ads_hourly buckets (what ads_hourly_sensor launches for the catch-up).")


def make_hourly_sensor(settings: Settings, job: Any) -> dg.SensorDefinition:
    @dg.sensor(
        name="ads_hourly_sensor",
        job=job,
        minimum_interval_seconds=max(1, settings.hourly_sensor_interval_seconds - 1),
        default_status=dg.DefaultSensorStatus.RUNNING if settings.catchup_autostart
        else dg.DefaultSensorStatus.STOPPED,
        description="Catch-up trigger of ads_hourly: every closed hour exactly once, oldest first, at most "
        f"{settings.hourly_max_hours_per_run} hours per run; stuck or failed runs retried, then parked; late "
        "data produces corrections.",
    )
    def ads_hourly_sensor(
        context: dg.SensorEvaluationContext, store: ObjectStoreResource, freshidx: FreshidxSettings
    ) -> dg.SensorResult:
        cfg = freshidx.settings(store.uri, store.endpoint_url)
        st, runs = store.open(), DagsterRunIndex(context.instance)
        plan = planner.plan_tick(st, cfg, runs, utcnow())
        applied = planner.apply(st, plan, runs)
        partitions_def = hourly_partitions(cfg)

        def observation(hid: str, metadata: dict) -> dg.AssetObservation:
            key = planner.dagster_key(planner.parse_hour_id(hid))
            try:
                valid = partitions_def.has_partition_key(key)
            except Exception:  # a key outside the definition's range must not fail the tick
                valid = False
            return dg.AssetObservation(asset_key="raw_ad_updates", partition=key if valid else None,
                                       metadata={"hour": hid, **metadata})

        events = [observation(hid, {"catchup": decision, "reason": reason})
                  for hid, decision, reason in applied.actions]
        for hid, decision, reason in applied.actions:
            context.log.info(f"{hid}: {decision}: {reason}")
        cursor = json.loads(context.cursor) if context.cursor else {}
        digest = hashlib.sha1(json.dumps(plan.waiting, sort_keys=True).encode()).hexdigest()
        if plan.waiting and cursor.get("waiting") != digest:  # show changed reasons once, not every tick
            events += [observation(hid, {"catchup": "waiting", "reason": reason})
                       for hid, reason in list(plan.waiting.items())[:24]]
        cursor["waiting"] = digest
        cursor["frontier"] = plan.frontier
        requests = [run_request(r) for r in applied.requests]
        return dg.SensorResult(run_requests=requests, asset_events=events, cursor=json.dumps(cursor),
                               skip_reason=None if requests else applied.skip_reason or "nothing to do")

    return ads_hourly_sensor
