"""Build one full version up to a cutoff: the latest version per ad → staged shards.

Either from state (the serving full version with the delta's segments laid over it, one task per
product bucket: :mod:`freshidx.full.executor`) or from every raw partition up to the cutoff;
:mod:`freshidx.full.full_plan` decides, and the manifest records which and why. The raw build is the safety
net that makes latest-only skipping acceptable: anything the state could miss is in it. Both
list all history once per build (one paginated pass, 1,000 keys per call), never per tick: the state
build checks that every raw file is held by the full version or a segment.

Late partitions (older than the serving cutoff) reach the full index on the next build even when
no newer partition exists: the build keeps the cutoff, its inputs digest differs, and
:func:`freshidx.publish.commit.compare_to_serving` accepts it; an identical digest is refused as unchanged.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable
from typing import Any

from pyspark.sql import SparkSession

from freshidx.delta import serving_state
from freshidx.delta.executor.state_files import state_writer
from freshidx.full.executor import bucket_shards
from freshidx.full.full_plan import FullBuildKind, FullPlan, ServingFull, plan_full
from freshidx.publish.commit import DraftManifest, iso, new_version, parse_iso, utcnow
from freshidx.settings import Settings
from freshidx.spark.index_build import FORMAT, BuildResult, build_version
from freshidx.store import ObjectInfo, ObjectStore, StoreConfig, layout
from freshidx.store.partitions import PartitionError, PartitionId
from freshidx.store.records import Manifest
from freshidx.trigger.listing import Ignored

log = logging.getLogger(__name__)
INDEX = "full"


def files_up_to(store: ObjectStore, source: str, cutoff: PartitionId
                ) -> tuple[dict[PartitionId, list[ObjectInfo]], list[Ignored]]:
    files: dict[PartitionId, list[ObjectInfo]] = {}
    ignored: list[Ignored] = []
    root = layout.raw_root(source)
    for obj in store.iter_objects(root):
        part_path, _, name = obj.key[len(root):].rpartition("/")
        try:
            pid = PartitionId.parse(part_path)
        except PartitionError as exc:
            ignored.append(Ignored(obj.key, str(exc)))
            continue
        if pid > cutoff:
            break  # keys are in chronological order
        if not name.startswith((".", "_")):
            files.setdefault(pid, []).append(obj)
    return files, ignored


def inputs_digest(groups: Iterable[list[ObjectInfo]]) -> str:
    """sha256 over ``key\tetag\tsize`` lines of every input object, in listing order."""
    h = hashlib.sha256()
    for objs in groups:
        for o in objs:
            h.update(f"{o.key}\t{o.etag}\t{o.size}\n".encode())
    return h.hexdigest()


def build_full(
    spark: SparkSession,
    store: ObjectStore,
    store_config: StoreConfig,
    settings: Settings,
    *,
    cutoff: PartitionId,
    run_id: str,
    run_info: dict[str, Any],
    cutoff_configured: bool = True,
    force_raw: bool = False,
) -> DraftManifest:
    """Stage a full version up to ``cutoff``: from the serving full version and the delta's segments when
    they hold every raw file up to it, else from every raw partition (:mod:`freshidx.full.full_plan`).

    ``cutoff_configured`` False (the newest visible partition, not asked for): a state build may stop at
    the delta's position instead. ``force_raw``: read every raw partition whatever the state.
    """
    t0 = time.monotonic()
    # Taken before listing: every object visible at this instant is in the listing, which is what
    # lets a same-cutoff rebuild count as newer than the serving one (publish.compare_to_serving).
    listed_at = iso(utcnow())
    files, ignored = files_up_to(store, settings.source, cutoff)
    plan, full, full_manifest = _plan(store, settings, cutoff, files, cutoff_configured=cutoff_configured,
                                      force_raw=force_raw)
    cutoff = plan.cutoff
    files = {pid: objs for pid, objs in files.items() if pid <= cutoff}
    list_seconds = round(time.monotonic() - t0, 3)
    file_list = [(o.key, pid.path) for pid, objs in files.items() for o in objs]
    log.info("full up to %s (%s%s): %d partitions, %d files", cutoff.path, plan.kind,
             f": {plan.reason}" if plan.reason else "", len(files), len(file_list))
    version = new_version(cutoff.at)
    result = _build(spark, store_config, settings, plan, full_manifest, version=version, file_list=file_list,
                    run_id=run_id)
    return DraftManifest(
        index=INDEX,
        version=version,
        position=iso(cutoff.at),
        run_id=run_id,
        shards=[c.to_dict() for c in result.commits],
        doc_count=result.doc_count,
        num_shards=settings.full_shards,
        cutoff=iso(cutoff.at),
        source_partition=None,
        covered_count=result.covered_count,
        inputs={**_inputs(settings.source, cutoff, files, listed_at, ignored), **plan.inputs(full)},
        invalid=result.invalid_summary(),
        stats={"list_seconds": list_seconds, "build_seconds": result.seconds,
               "total_build_seconds": round(list_seconds + result.seconds, 3),
               **{f"{k}_seconds": v for k, v in result.stages.items()}},
        run=run_info,
    )


def _plan(store: ObjectStore, settings: Settings, cutoff: PartitionId, files: dict[PartitionId, list[ObjectInfo]],
          *, cutoff_configured: bool, force_raw: bool) -> tuple[FullPlan, ServingFull | None, Manifest | None]:
    """What the serving state offers (the full version, the delta's segments) and the plan made of it
    (:func:`freshidx.full.full_plan.plan_full`), with the serving full version and its manifest."""
    base, full_manifest = serving_state.full_base(store)
    full = ServingFull.from_manifest(base, full_manifest) if base is not None and full_manifest is not None else None
    delta, segs = serving_state.delta_segments(store, "full: raw build")
    delta_position = parse_iso(delta.position) if delta is not None else None
    if delta is None:
        segs = []  # no delta yet: nothing to lay over the full version (not an unreadable one)
    plan = plan_full(cutoff, cutoff_configured, full, delta_position, segs, files,
                     num_shards=settings.full_shards, index_format=FORMAT, raw_every=settings.full_raw_every,
                     force_raw=force_raw)
    return plan, full, full_manifest


def _build(spark: SparkSession, store_config: StoreConfig, settings: Settings, plan: FullPlan,
           full_manifest: Manifest | None, *, version: str, file_list: list[tuple[str, str]], run_id: str,
           ) -> BuildResult:
    """The Spark part: the serving full version with the segments laid over it per product bucket, or
    every raw file up to the cutoff read again."""
    # Its state files stay on this machine, mapped and indexed: the first micro-batch over the new version
    # finds them warm (docs/architecture.md#state-as-built).
    written = state_writer(settings.delta_state_disk_bytes)
    if plan.kind is FullBuildKind.STATE:
        assert full_manifest is not None
        t1 = time.monotonic()
        commits = bucket_shards(spark, store_config, full_manifest.shards, plan.segments, index=INDEX,
                                version=version, written=written,
                                reuse_deleted_share=settings.full_reuse_deleted_share)
        return BuildResult(commits, {}, seconds=round(time.monotonic() - t1, 3))
    return build_version(
        spark, store_config, index=INDEX, version=version, files=file_list,
        num_shards=settings.full_shards, source=settings.source, run_id=run_id,
        # Whatever no earlier build quarantined (late partitions, history before the first delta);
        # files already quarantined are skipped (freshidx.spark.quarantine_once).
        quarantine_after=None,
        max_read_tasks=max(4, settings.full_shards * 4),
        max_future_skew_seconds=settings.max_future_skew_seconds,
        written=written,
    )


def _inputs(source: str, cutoff: PartitionId, files: dict[PartitionId, list[ObjectInfo]], listed_at: str,
            ignored: list[Ignored]) -> dict[str, Any]:
    """The manifest's ``inputs`` about what was read (the plan adds how it was built)."""
    return {
        "source": source,
        "cutoff_partition": cutoff.path,
        "format": FORMAT,
        "partitions": len(files),
        "files": sum(len(objs) for objs in files.values()),
        "first_partition": next(iter(files)).path if files else None,
        # Every input object with its ETag would make the manifest O(history); a digest over
        # (key, etag, size) in listing order still says exactly which object versions were read.
        "files_sha256": inputs_digest(objs for objs in files.values()),
        "listed_at": listed_at,
        "ignored": [{"key": i.key, "reason": i.reason} for i in ignored[:100]],
    }
