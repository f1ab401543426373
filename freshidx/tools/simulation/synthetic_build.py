"""The synthetic side of a build: raw partitions, staged shards and the draft a micro-batch hands to publication.

No Spark: a shard is two tiny files (the ones the validation gate requires) written through the store, and
the draft is what ``freshidx.delta.delta_build`` makes of a build, over what the real planning reads decided (the
serving full version, the serving delta's segments, :func:`freshidx.delta.segments.plan`, the window's files).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from freshidx.delta import segments, serving_state, window_files
from freshidx.publish.commit import DraftManifest, iso, new_version, utcnow
from freshidx.settings import Settings
from freshidx.spark.index_format import FORMAT
from freshidx.spark.shards import ShardCommit
from freshidx.spark.task_files import ShardFile
from freshidx.store import ObjectStore, layout
from freshidx.store.partitions import PartitionId
from freshidx.store.records import Segment

SHARD_FILES = {"index/meta.json": b'{"segments":[]}', "covered.parquet": b"PAR1"}


def write_partition(store: ObjectStore, source: str, p: PartitionId) -> None:
    """What the upstream writes: one small data file in the partition."""
    store.put(layout.raw_partition_prefix(source, p) + "part-00000.json", b'{"ad_id": 1}\n')


def stage_shard(store: ObjectStore, index: str, version: str, shard: int, *, docs: int, covered: int,
                commit: bool = False) -> Any:
    """Stage one shard of ``version`` (what a Spark task uploads) and return its commit message."""
    files = []
    for name, data in SHARD_FILES.items():
        key = layout.shard_prefix(index, version, shard, 0) + name
        store.put(key, data)
        files.append(ShardFile(key=key, bytes=len(data), sha256="-", rows=1))
    done = ShardCommit(shard=shard, attempt=0, doc_count=docs, covered_count=covered, files=tuple(files))
    return done if commit else done.to_dict()


def run_record(settings: Settings, run_id: str, trigger: str, run_key: str | None = None) -> dict[str, Any]:
    return {"run_id": run_id, "trigger": trigger, "run_key": run_key, "code_version": "sim",
            "settings": {"window_minutes": settings.window_minutes, "source": settings.source},
            "force": False, "max_drop_fraction": settings.delta_max_drop_fraction}


def micro_batch(store: ObjectStore, settings: Settings, p: PartitionId, run_id: str, trigger: str,
                run_key: str | None = None) -> DraftManifest:
    """Stage one delta version for ``p`` over what serves now, as ``freshidx.delta.delta_build.build_delta`` does."""
    full, _ = serving_state.full_base(store)
    delta_pointer, previous = serving_state.delta_segments(store, "simulated micro-batch")
    mb = segments.plan(p, settings.window, full, previous, has_previous_delta=delta_pointer is not None,
                       max_segments=settings.delta_max_segments, force_rebuild=False)
    listed_at = utcnow()
    files, _ = window_files.files_in_window(store, settings.source, mb.window_start, p, threads=1)
    to_read = segments.files_to_read(files, full, mb.kept) if mb.kind is segments.BuildKind.INCREMENTAL and \
        full is not None else files
    version = new_version(p.at)
    shard = stage_shard(store, "delta", version, 0, docs=2, covered=2)
    new = Segment(version=version, position=iso(p.at), kind=str(mb.kind), shards=[shard], doc_count=2,
                  covered_count=2, files=[o.key for objs in to_read.values() for o in objs], listed_at=iso(listed_at),
                  full_version=full.version if full is not None else None)
    kept = [*mb.kept, new]
    serving = delta_pointer.version if delta_pointer is not None else None
    return DraftManifest(
        index="delta", version=version, position=iso(p.at), run_id=run_id, shards=[shard],
        doc_count=sum(s.doc_count for s in kept), num_shards=1, source_partition=p.path,
        window_start=iso(mb.window_start), window_end=iso(p.at), covered_count=sum(s.covered_count for s in kept),
        segments=[s.to_dict() for s in kept],
        inputs={"source": settings.source, "build": str(mb.kind), "rebuild_reason": mb.reason or None,
                "based_on": serving if mb.kind is segments.BuildKind.INCREMENTAL else None,
                "partitions": [pid.path for pid in to_read], "files": [], "format": FORMAT,
                "full_version": full.version if full else None, "full_cutoff": iso(full.cutoff) if full else None,
                "segments_kept": len(mb.kept), "segments_dropped": mb.dropped},
        run=run_record(settings, run_id, trigger, run_key),
    )


def full_version(store: ObjectStore, settings: Settings, cutoff: dt.datetime, run_id: str) -> DraftManifest:
    """Stage a full version with ``cutoff`` (the simulation's starting state rests on one)."""
    version = new_version(cutoff)
    shard = stage_shard(store, "full", version, 0, docs=10, covered=10)
    return DraftManifest(
        index="full", version=version, position=iso(cutoff), run_id=run_id, shards=[shard], doc_count=10,
        num_shards=1, cutoff=iso(cutoff),
        inputs={"source": settings.source, "build": "raw", "format": FORMAT, "listed_at": iso(utcnow()),
                "files_sha256": version, "files": 0, "partitions": 0},
        run=run_record(settings, run_id, "schedule"),
    )
