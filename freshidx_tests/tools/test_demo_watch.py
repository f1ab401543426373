"""The demo's publication line says how long after its files arrived a partition was published, besides
the lag from the partition's own time (which also counts the upstream writer)."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import dagster as dg
import pytest

from freshidx.publish.commit import Pointer
from freshidx.store import StoreConfig, layout, open_store
from freshidx.store.partitions import PartitionId
from freshidx.tools.demo import Printer, Watcher


def test_arrival_to_published_counts_from_the_partitions_last_file(tmp_path: Path) -> None:
    store = open_store(StoreConfig(uri=(tmp_path / "store").as_uri()))
    partition = PartitionId(dt.datetime(2026, 11, 28, 5, 16, tzinfo=dt.UTC))
    prefix = f"{layout.raw_root('ads')}{partition.path}/"
    arrived = dt.datetime(2026, 11, 28, 5, 16, 55, tzinfo=dt.UTC)
    for name, at in (("a.jsonl", arrived - dt.timedelta(seconds=20)), ("b.jsonl", arrived)):
        store.put(prefix + name, b"{}\n")
        os.utime(tmp_path / "store" / prefix / name, (at.timestamp(), at.timestamp()))
    with dg.DagsterInstance.ephemeral() as instance:
        watch = Watcher(store, "ads", instance, Printer(as_json=True))
        published = arrived + dt.timedelta(seconds=3.5)
        assert watch._arrival_to_published(partition.path, published) == 3.5  # from the last file, not the first
        assert watch._arrival_to_published(None, published) is None  # a full index has no source partition
        other = PartitionId(dt.datetime(2026, 11, 28, 5, 17, tzinfo=dt.UTC))
        assert watch._arrival_to_published(other.path, published) is None  # nothing there (removed by retention)


def test_a_publication_line_gives_the_arrival_time_once_per_partition(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    store = open_store(StoreConfig(uri=(tmp_path / "store").as_uri()))
    partition = PartitionId(dt.datetime(2026, 11, 28, 5, 16, tzinfo=dt.UTC))
    key = f"{layout.raw_root('ads')}{partition.path}/a.jsonl"
    store.put(key, b"{}\n")
    arrived = dt.datetime(2026, 11, 28, 5, 16, 55, tzinfo=dt.UTC)
    os.utime(tmp_path / "store" / key, (arrived.timestamp(), arrived.timestamp()))

    def publish(seq: int, published: dt.datetime) -> None:
        store.put_json(layout.pointer_key("delta"), Pointer(
            "delta", f"v{seq}", seq, partition.at.isoformat(), "m", 10, published.isoformat(),
            source_partition=partition.path).to_dict())

    with dg.DagsterInstance.ephemeral() as instance:
        watch = Watcher(store, "ads", instance, Printer(as_json=True))
        publish(1, arrived + dt.timedelta(seconds=2))
        watch._publications()
        publish(2, arrived + dt.timedelta(minutes=3))  # a compaction: the same partition, published again
        watch._publications()
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(e["seq"], e["arrival_to_published_seconds"]) for e in events if e["event"] == "published"] == [
        (1, 2.0), (2, None)]
