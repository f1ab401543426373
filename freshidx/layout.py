"""Object-store key layout (DESIGN §3). Every key freshidx reads or writes is built here."""

from __future__ import annotations

from freshidx.partitions import PartitionId

INDEX_NAMES = ("delta", "full")


def raw_root(source: str) -> str:
    return f"raw/{source}/"


def raw_partition_prefix(source: str, partition: PartitionId) -> str:
    return f"raw/{source}/{partition.path}/"


def raw_hour_prefix(source: str, hour_path: str) -> str:
    return f"raw/{source}/{hour_path}/"


def index_root(index: str) -> str:
    return f"indexes/{index}/"


def pointer_key(index: str) -> str:
    return f"indexes/{index}/CURRENT"


def version_prefix(index: str, version: str) -> str:
    return f"indexes/{index}/versions/{version}/"


def manifest_key(index: str, version: str) -> str:
    return f"indexes/{index}/versions/{version}/manifest.json"


def shard_prefix(index: str, version: str, shard: int, attempt: int) -> str:
    # The attempt is part of the key so a retried Spark task never overwrites a half-written upload.
    return f"indexes/{index}/versions/{version}/shards/shard-{shard:05d}-a{attempt}/"


def history_key(index: str, seq: int) -> str:
    return f"indexes/{index}/history/{seq:012d}.json"


def refusal_key(index: str, version: str) -> str:
    return f"indexes/{index}/refused/{version}.json"


def ledger_key(pipeline: str, date: str, trigger_id: str) -> str:
    return f"ledger/{pipeline}/{date}/{trigger_id}.json"


def quarantine_prefix(source: str, partition: PartitionId, run_id: str) -> str:
    return f"quarantine/{source}/{partition.path}/{run_id}/"
