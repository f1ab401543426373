"""Object-store key layout (docs/architecture.md#object-store-layout).

Every key freshidx reads or writes is built here.
"""

from __future__ import annotations

import datetime as dt

from freshidx.store.partitions import PartitionId

INDEX_NAMES = ("delta", "full")


def raw_root(source: str) -> str:
    return f"raw/{source}/"


def raw_partition_prefix(source: str, partition: PartitionId) -> str:
    return f"raw/{source}/{partition.path}/"


def raw_hour_prefix(source: str, hour_path: str) -> str:
    return f"raw/{source}/{hour_path}/"


def index_root(index: str) -> str:
    """Root of a published dataset. ``delta``/``full`` live under ``indexes/``; a name with a ``/``
    (``buckets/ads_hourly/20261121T14``, see :func:`bucket_name`) is a root of its own, so hourly
    buckets share the exact publication protocol (versions, manifest, CURRENT, history, refused)."""
    return f"{index}/" if "/" in index else f"indexes/{index}/"


def pointer_key(index: str) -> str:
    return f"{index_root(index)}CURRENT"


def version_prefix(index: str, version: str) -> str:
    return f"{index_root(index)}versions/{version}/"


def manifest_key(index: str, version: str) -> str:
    return f"{version_prefix(index, version)}manifest.json"


def shard_prefix(index: str, version: str, shard: int, attempt: int) -> str:
    # The attempt is part of the key so a retried Spark task never overwrites a half-written upload.
    return f"{version_prefix(index, version)}shards/shard-{shard:05d}-a{attempt}/"


def history_key(index: str, seq: int) -> str:
    return f"{index_root(index)}history/{seq:012d}.json"


def refusal_key(index: str, version: str) -> str:
    return f"{index_root(index)}refused/{version}.json"


def hour_id(hour: dt.datetime) -> str:
    """Compact, sortable id of a UTC hour: ``20261121T14``."""
    return hour.astimezone(dt.UTC).strftime("%Y%m%dT%H")


def bucket_name(asset: str, hour: dt.datetime) -> str:
    """Publication name of one hourly bucket: ``buckets/<asset>/<YYYYMMDDTHH>``."""
    return f"buckets/{asset}/{hour_id(hour)}"


def bucket_part_key(asset: str, hour: dt.datetime, version: str, part: int, attempt: int) -> str:
    # Attempt in the key for the same reason as shard_prefix.
    return f"{version_prefix(bucket_name(asset, hour), version)}part-{part:05d}-a{attempt}.parquet"


def catchup_state_key(asset: str) -> str:
    """Small CAS'd object with the catch-up frontier (oldest hour not yet closed) and parked hours."""
    return f"catchup/{asset}/STATE"


def ledger_key(pipeline: str, date: str, trigger_id: str) -> str:
    return f"ledger/{pipeline}/{date}/{trigger_id}.json"


def runtime_record_key(name: str) -> str:
    """Where a local runtime (``spark-server``) records its host-local state dir for this store, so
    ``freshidx status --store`` finds the state that belongs to the store, not the one in the CWD."""
    return f"runtime/{name}.json"


def continuous_heartbeat_key(pipeline: str = "delta") -> str:
    """The heartbeat a continuous-mode run overwrites in place (run id, start, planned restart, last
    tick): what ``freshidx status`` shows about the live run. Not history."""
    return f"continuous/{pipeline}/heartbeat.json"


def quarantine_prefix(source: str, partition: PartitionId, run_id: str) -> str:
    return f"quarantine/{source}/{partition.path}/{run_id}/"
