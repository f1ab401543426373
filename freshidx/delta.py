"""Build one delta version for trigger partition P: window (P − window, P] → staged shards → draft."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession

from freshidx import listing
from freshidx.build import FORMAT, build_version
from freshidx.partitions import PartitionId
from freshidx.publish import DraftManifest, iso, new_version, read_manifest, read_pointer
from freshidx.settings import Settings
from freshidx.store import ObjectStore, StoreConfig

log = logging.getLogger(__name__)
INDEX = "delta"
READ_TASKS = 4


@dataclass(frozen=True)
class DeltaPlan:
    partition: PartitionId
    watermark: PartitionId | None  # the serving delta's partition when the run started
    run_id: str
    run_info: dict[str, Any]


def build_delta(
    spark: SparkSession,
    store: ObjectStore,
    store_config: StoreConfig,
    settings: Settings,
    plan: DeltaPlan,
    *,
    on_stage: Callable[[str, float], None] | None = None,
) -> DraftManifest:
    p = plan.partition
    window_start = p.at - settings.window
    t0 = time.monotonic()
    files, ignored = listing.files_in_window(store, settings.source, window_start, p)
    list_seconds = round(time.monotonic() - t0, 3)
    file_list = [(o.key, pid.path) for pid, objs in files.items() for o in objs]
    log.info("delta %s: %d partitions, %d files in window", p.path, len(files), len(file_list))
    if on_stage:
        on_stage("list_seconds", list_seconds)

    version = new_version(p.at)
    full_pointer, _ = read_pointer(store, "full")
    full_manifest = read_manifest(store, "full", full_pointer.version) if full_pointer else None
    result = build_version(
        spark, store_config, index=INDEX, version=version, files=file_list,
        num_shards=settings.delta_shards, source=settings.source, run_id=plan.run_id,
        # Every file of the window not quarantined yet, late partitions behind the watermark included
        # (files an earlier build quarantined have a done marker: freshidx.spark.quarantine_once).
        quarantine_after=None,
        full_manifest=full_manifest,
        # A few files per task: one Python task per 5-minute file costs more in task start-up than
        # in reading (60 files in a 5 h window).
        max_read_tasks=READ_TASKS,
        max_future_skew_seconds=settings.max_future_skew_seconds,
    )
    if on_stage:
        on_stage("build_seconds", result.seconds)
    return DraftManifest(
        index=INDEX,
        version=version,
        position=iso(p.at),
        run_id=plan.run_id,
        shards=[c.to_dict() for c in result.commits],
        doc_count=result.doc_count,
        num_shards=settings.delta_shards,
        source_partition=p.path,
        window_start=iso(window_start),
        window_end=iso(p.at),
        covered_count=result.covered_count,
        inputs={
            "source": settings.source,
            "partitions": [pid.path for pid in files],
            "files": [{"key": o.key, "etag": o.etag, "size": o.size} for objs in files.values() for o in objs],
            "ignored": [{"key": i.key, "reason": i.reason} for i in ignored],
            "full_version": full_pointer.version if full_pointer else None,
            "format": FORMAT,
            "kill_list": "covered.parquet of every shard (every ad id this delta covers)",
        },
        invalid=result.invalid_summary(),
        stats={"list_seconds": list_seconds, "build_seconds": result.seconds,
               "total_build_seconds": round(list_seconds + result.seconds, 3)},
        run=plan.run_info,
    )
