"""Build one delta version for trigger partition P: window (P − window, P] → staged shards → draft.

Driver work here is listing, planning and collecting task commit messages; reading, validating,
quarantining and writing shards all happen on Spark executors.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import SparkSession

from freshidx import listing, transform
from freshidx.partitions import PartitionId
from freshidx.publish import DraftManifest, iso, new_version
from freshidx.settings import Settings
from freshidx.spark.raw_source import read_raw_lines
from freshidx.spark.shards import write_quarantine, write_shards
from freshidx.store import ObjectStore, StoreConfig

log = logging.getLogger(__name__)
INDEX = "delta"


@dataclass(frozen=True)
class DeltaPlan:
    partition: PartitionId
    watermark: PartitionId | None  # partitions after this one are new to this run (quarantine)
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
    timings: dict[str, float] = {}
    t_all = time.monotonic()

    def stage(name: str, t0: float) -> None:
        timings[name] = round(time.monotonic() - t0, 3)
        if on_stage:
            on_stage(name, timings[name])

    p = plan.partition
    window_start = p.at - settings.window
    t0 = time.monotonic()
    files, ignored = listing.files_in_window(store, settings.source, window_start, p)
    stage("list_seconds", t0)
    file_list = [(o.key, pid.path) for pid, objs in files.items() for o in objs]
    log.info("delta %s: %d partitions, %d files in window", p.path, len(files), len(file_list))

    t0 = time.monotonic()
    lines = read_raw_lines(spark, store_config, file_list)
    parsed = transform.parse_records(lines).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        valid, invalid = transform.split_valid(parsed)
        reasons = {r["reason"]: int(r["count"]) for r in transform.reason_counts(invalid).collect()}
        quarantined = write_quarantine(
            invalid, store_config, settings.source, plan.run_id,
            plan.watermark.path if plan.watermark else None,
        )
        latest = transform.latest_per_ad(valid)
        version = new_version(p.at)
        commits = write_shards(latest, store_config, INDEX, version, settings.delta_shards)
    finally:
        parsed.unpersist()
    stage("build_seconds", t0)

    shards = [c.to_dict() for c in commits]
    doc_count = sum(c.doc_count for c in commits)
    timings["total_build_seconds"] = round(time.monotonic() - t_all, 3)
    return DraftManifest(
        index=INDEX,
        version=version,
        position=iso(p.at),
        run_id=plan.run_id,
        shards=shards,
        doc_count=doc_count,
        num_shards=settings.delta_shards,
        source_partition=p.path,
        window_start=iso(window_start),
        window_end=iso(p.at),
        covered_count=sum(c.covered_count for c in commits),
        inputs={
            "source": settings.source,
            "partitions": [pid.path for pid in files],
            "files": [{"key": o.key, "etag": o.etag, "size": o.size} for objs in files.values() for o in objs],
            "ignored": [{"key": i.key, "reason": i.reason} for i in ignored],
        },
        invalid={
            "count": sum(reasons.values()),
            "reasons": reasons,
            "quarantine": [
                {"partition": q.partition, "key": q.key, "records": q.records, "reasons": q.reasons}
                for q in quarantined
            ],
        },
        stats=timings,
        run=plan.run_info,
    )
