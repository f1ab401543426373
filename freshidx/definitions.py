"""The code location: every Dagster definition of freshidx, in one place.

Settings are read from ``FRESHIDX_*`` variables when the location loads, so a bad value fails the
load with a message naming the field (shown in the UI as a location error).
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

import dagster as dg
from dagster_aws.s3 import S3Resource

from freshidx.defs.catchup.assets import make_ads_hourly, make_ads_hourly_job, make_hourly_sensor
from freshidx.defs.catchup.io_manager import BucketIOManager
from freshidx.defs.delta.assets import delta_index, delta_index_job
from freshidx.defs.delta.compaction_job import delta_compaction, delta_compaction_job, make_compaction_sensor
from freshidx.defs.delta.continuous_job import make_delta_continuous
from freshidx.defs.delta.sensor import make_delta_sensor
from freshidx.defs.delta.watchdog import make_continuous_watchdog
from freshidx.defs.full.assets import full_index, full_index_job, full_index_schedule
from freshidx.defs.runs.health import make_run_health_sensor
from freshidx.defs.shared.assets import hourly_partitions, raw_ad_updates_spec
from freshidx.defs.shared.io_manager import IndexIOManager
from freshidx.defs.shared.resources import FreshidxSettings, ObjectStoreResource, SparkResource
from freshidx.defs.sla.checks import make_sla_sensor, sla_checks
from freshidx.settings import Settings


def freshness_policies(settings: Settings) -> dict[str, dg.FreshnessPolicy]:
    """UI health badges. Dagster evaluates these on the time of the last materialization only; the
    data-aware SLA is the ``freshidx_sla_sensor`` checks. While upstream is quiet the SLA sensor records
    that the serving delta still covers the newest visible partition (a materialization with an unchanged
    data version, :mod:`freshidx.defs.sla.checks`), so ``delta_index`` goes red only when it falls behind data
    that exists, never merely because no data arrived."""
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


def with_freshness_policies(assets: list[dg.AssetsDefinition], settings: Settings) -> list[dg.AssetsDefinition]:
    """The assets with their freshness policies attached to their own definitions."""
    policies = freshness_policies(settings)

    def attach(spec: dg.AssetSpec) -> dg.AssetSpec:
        policy = policies.get(spec.key.to_user_string())
        return spec if policy is None else dg.apply_freshness_policy(spec, policy)

    return list(dg.map_asset_specs(attach, assets))


def _secret(name: str) -> Any:
    # EnvVar keeps the secret out of the UI's config view; only reference variables that exist,
    # since an unset EnvVar fails resource initialisation.
    return dg.EnvVar(name) if os.environ.get(name) else None


def build_resources(settings: Settings) -> dict[str, Any]:
    """Every resource, from the one :class:`Settings` the definitions are built from.

    The factories in :func:`build_definitions` read that same object, so sensors, schedules and runs
    start from one value (a run can still override the ``freshidx`` resource in the launchpad).
    """
    cfg = settings.store_config()
    s3 = S3Resource(
        endpoint_url=cfg.endpoint_url, region_name=cfg.region, aws_access_key_id=_secret("AWS_ACCESS_KEY_ID"),
        aws_secret_access_key=_secret("AWS_SECRET_ACCESS_KEY"), aws_session_token=_secret("AWS_SESSION_TOKEN"),
    )
    store = ObjectStoreResource(uri=settings.store, s3=s3, s3_first_try_seconds=settings.s3_first_try_seconds)
    return {
        "store": store,
        "spark": SparkResource(spark_config=dict(settings.spark_conf), remote=settings.spark_remote,
                               master=settings.spark_master, server_state_dir=settings.spark_server_state,
                               server_url=settings.spark_server_url,
                               keep_sessions=settings.spark_keep_sessions),
        "freshidx": FreshidxSettings.from_settings(settings),
        "index_io_manager": IndexIOManager(store=store),
        "bucket_io_manager": BucketIOManager(store=store),
    }


def build_definitions(settings: Settings | None = None) -> dg.Definitions:
    settings = settings or Settings.from_env()
    resources = build_resources(settings)
    ads_hourly = make_ads_hourly(settings)
    ads_hourly_job = make_ads_hourly_job(ads_hourly)
    return dg.Definitions(
        assets=[raw_ad_updates_spec(settings), *with_freshness_policies([delta_index, full_index], settings),
                ads_hourly, delta_compaction],
        jobs=[delta_index_job, full_index_job, ads_hourly_job, delta_compaction_job, make_delta_continuous(settings)],
        asset_checks=sla_checks(),
        schedules=[full_index_schedule(settings)],
        sensors=[
            make_delta_sensor(settings.sensor_interval_seconds, hourly_partitions(settings)),
            make_sla_sensor(settings.sla_interval_seconds, settings.sla_autostart),
            make_hourly_sensor(settings, ads_hourly_job),
            make_run_health_sensor(),
            make_compaction_sensor(settings),
            make_continuous_watchdog(settings),
        ],
        resources=resources,
        # Spark steps run inside the run worker: saves a process spawn per run and keeps one
        # SparkSession per run.
        executor=dg.in_process_executor,
    )


defs = build_definitions()
