"""Tiny code location loaded by ``dagster dev -f`` in ``test_devserver.py`` (not imported by tests).

* ``noop``: unpartitioned no-op asset.
* ``hourly``: hourly-partitioned no-op asset (fixed start, so a few days of partitions exist).
* ``drop_sensor``: RUNNING by default; requests a run of ``noop`` for every file that appears in the
  directory named by ``FRESHIDX_TEST_DROP_DIR``, with ``run_key`` = file name.
"""

# No `from __future__ import annotations` here: dagster validates the `context` annotation at
# definition time and rejects the string "dg.AssetExecutionContext".
import os
from pathlib import Path

import dagster as dg

DROP_DIR_ENV = "FRESHIDX_TEST_DROP_DIR"
HOURLY_START = "2026-11-15-00:00"

hourly_partitions = dg.HourlyPartitionsDefinition(start_date=HOURLY_START, timezone="UTC")


@dg.asset
def noop() -> None:
    return None


@dg.asset(partitions_def=hourly_partitions)
def hourly(context: dg.AssetExecutionContext) -> None:
    context.log.info(f"hourly partition {context.partition_key}")


@dg.sensor(
    target=[noop],
    minimum_interval_seconds=1,
    default_status=dg.DefaultSensorStatus.RUNNING,
)
def drop_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
    drop_dir = Path(os.environ[DROP_DIR_ENV])
    names = sorted(p.name for p in drop_dir.iterdir() if p.is_file()) if drop_dir.is_dir() else []
    if not names:
        return dg.SkipReason(f"no files in {drop_dir}")
    # run_key dedup makes re-requesting already-seen files a no-op.
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(run_key=name, asset_selection=[noop.key], tags={"freshidx/drop_file": name}) for name in names
        ]
    )


defs = dg.Definitions(
    assets=[noop, hourly],
    sensors=[drop_sensor],
    executor=dg.in_process_executor,
)
