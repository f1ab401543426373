"""The code location: every Dagster definition of freshidx, in one place.

Settings are read from ``FRESHIDX_*`` variables when the location loads, so a bad value fails the
load with a message naming the field (shown in the UI as a location error).
"""

from __future__ import annotations

import datetime as dt
import warnings

import dagster as dg

from freshidx.defs.assets import (
    delta_index,
    full_index,
    full_index_schedule,
    hourly_partitions,
    raw_ad_updates_spec,
)
from freshidx.defs.bucket_io_manager import BucketIOManager
from freshidx.defs.hourly import HEAVY, make_ads_hourly, make_hourly_sensor
from freshidx.defs.io_manager import IndexIOManager
from freshidx.defs.resources import build_resources
from freshidx.defs.run_health import make_run_health_sensor
from freshidx.defs.sensors import make_delta_sensor
from freshidx.defs.sla import make_sla_sensor, sla_checks
from freshidx.settings import Settings


def freshness_policies(settings: Settings) -> dict[str, dg.FreshnessPolicy]:
    """UI health badges. Dagster evaluates these on last-write time only; the data-aware SLA is the
    ``freshidx_sla_sensor`` checks."""
    return {
        "delta_index": dg.FreshnessPolicy.time_window(
            fail_window=dt.timedelta(seconds=max(60, settings.lag_fail_seconds)),
            warn_window=dt.timedelta(seconds=max(60, min(settings.lag_warn_seconds, settings.lag_fail_seconds - 1))),
        ),
        "full_index": dg.FreshnessPolicy.time_window(
            fail_window=dt.timedelta(seconds=max(120, settings.full_max_age_seconds)),
            warn_window=dt.timedelta(hours=settings.full_every_hours, minutes=30)
            if settings.full_every_hours * 3600 + 1800 < settings.full_max_age_seconds else None,
        ),
    }


def heavy_schedule(schedule: dg.ScheduleDefinition) -> dg.ScheduleDefinition:
    """The same schedule, its runs tagged heavy (one heavy build at a time, dagster.yaml)."""
    return dg.ScheduleDefinition(
        name=schedule.name, target=[full_index], cron_schedule=schedule.cron_schedule,
        execution_timezone=schedule.execution_timezone, default_status=schedule.default_status,
        description=schedule.description, tags={**schedule.tags, **HEAVY},
    )


def build_definitions(settings: Settings | None = None) -> dg.Definitions:
    settings = settings or Settings.from_env()
    resources = build_resources(settings)
    resources["index_io_manager"] = IndexIOManager(store=resources["store"])
    resources["bucket_io_manager"] = BucketIOManager(store=resources["store"])
    ads_hourly = make_ads_hourly(settings)
    defs = dg.Definitions(
        assets=[raw_ad_updates_spec(settings), delta_index, full_index, ads_hourly],
        asset_checks=sla_checks(),
        schedules=[heavy_schedule(full_index_schedule(settings))],
        sensors=[
            make_delta_sensor(settings.sensor_interval_seconds, hourly_partitions(settings)),
            make_sla_sensor(settings.sla_interval_seconds),
            make_hourly_sensor(settings, ads_hourly),
            make_run_health_sensor(),
        ],
        resources=resources,
        # Spark steps run inside the run worker: saves a process spawn (~1-2 s) per run and keeps
        # one SparkSession per run (measured in shared/notes/dagster-1.13-facts.md §9).
        executor=dg.in_process_executor,
    )
    policies = freshness_policies(settings)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # map_asset_specs is a preview API
        return defs.map_asset_specs(
            func=lambda spec: dg.apply_freshness_policy(spec, policies[spec.key.to_user_string()])
            if spec.key.to_user_string() in policies else spec
        )


defs = build_definitions()
