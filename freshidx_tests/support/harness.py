"""In-process harness: a code location built from settings, a real instance, ticks and runs."""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

import dagster as dg

from freshidx.definitions import build_definitions
from freshidx.settings import Settings
from freshidx.store import ObjectStore, StoreConfig, open_store
from freshidx.store.partitions import PartitionId
from freshidx.tools.generate import GeneratorConfig, PartitionWritten, write_partition

T0 = dt.datetime(2026, 11, 20, 9, 0, tzinfo=dt.UTC)
GEN = GeneratorConfig(seed=7, ads=400, products=60, changes_per_partition=40, malformed_rate=0.05)


def at(minutes: int) -> PartitionId:
    return PartitionId(T0 + dt.timedelta(minutes=minutes))


class Harness:
    """A code location built from settings, a real instance, and helpers to tick and run."""

    def __init__(self, cfg: StoreConfig, instance: dg.DagsterInstance, **overrides: Any) -> None:
        env = {}
        if cfg.is_s3:
            env = {"FRESHIDX_S3_ENDPOINT_URL": cfg.endpoint_url or "", "AWS_ACCESS_KEY_ID": cfg.access_key_id or "",
                   "AWS_SECRET_ACCESS_KEY": cfg.secret_access_key or "", "AWS_REGION": "us-east-1"}
        self._env = env
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # resources reference secrets as EnvVar, resolved from the environment
        self._saved = saved
        self.settings = Settings.from_env({}, store=cfg.uri, s3_endpoint_url=cfg.endpoint_url,
                                          partitions_start="2026-11-01", delta_shards=2, **overrides)
        self.defs = build_definitions(self.settings)
        self.instance = instance
        self.store: ObjectStore = open_store(cfg)
        self.cursors: dict[str, str | None] = {}

    def close(self) -> None:
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def write(self, minutes: int, cfg: GeneratorConfig = GEN) -> PartitionWritten:
        return write_partition(self.store, cfg, at(minutes))

    def tick(self, sensor_name: str = "delta_index_sensor") -> Any:
        sensor = self.defs.resolve_sensor_def(sensor_name)
        with dg.build_sensor_context(instance_ref=self.instance.get_ref(), cursor=self.cursors.get(sensor_name),
                                     definitions=self.defs, resources=dict(self.defs.resources or {})) as ctx:
            data = sensor.evaluate_tick(ctx)
        self.cursors[sensor_name] = data.cursor
        # Persist runless events like the daemon does, so observations are visible in the instance.
        for ev in data.asset_events or []:
            if isinstance(ev, dg.AssetObservation | dg.AssetCheckEvaluation):
                self.instance.report_runless_asset_event(ev)
        return data

    def run(self, request: dg.RunRequest, *, raise_on_error: bool = True) -> dg.ExecuteInProcessResult:
        job = self.defs.resolve_implicit_global_asset_job_def()
        tags = {**request.tags, "dagster/run_key": request.run_key}
        return job.execute_in_process(
            run_config=request.run_config, instance=self.instance, tags=tags,
            asset_selection=list(request.asset_selection or [dg.AssetKey("delta_index")]),
            raise_on_error=raise_on_error, partition_key=request.partition_key,
        )


