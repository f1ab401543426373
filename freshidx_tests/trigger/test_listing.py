"""Listing the newest partitions costs a bounded number of LIST calls and listed entries, whatever the
history."""

from __future__ import annotations

import datetime as dt
from concurrent.futures import ThreadPoolExecutor

import pytest

from freshidx.delta.window_files import files_in_window
from freshidx.store import ObjectStore, StoreConfig, layout, open_store
from freshidx.store.partitions import PartitionId
from freshidx.trigger.listing import newest_partition, partitions_after

T0 = dt.datetime(2026, 10, 1, tzinfo=dt.UTC)
SRC = "ad_updates"


def pid(minutes: int) -> PartitionId:
    return PartitionId(T0 + dt.timedelta(minutes=minutes))


def write(store: ObjectStore, parts: list[PartitionId], name: str = "part-00000.jsonl") -> None:
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda p: store.put(layout.raw_partition_prefix(SRC, p) + name, b"{}\n"), parts))


#: Old partitions (every 5 min, ~3.5 days): a listing that is not bounded by the new data returns at
#: least this many entries, ~10x the bound the tests assert (:data:`MAX_ENTRIES`).
HISTORY = 1000
#: The descent to the newest partition (the prefixes of a year, its months, a month's days, a day's hours,
#: an hour's minutes) and what follows the watermark: 26-29 entries here, 93 for a restart (which lists six
#: hours of partitions).
MAX_ENTRIES = 150


@pytest.fixture(scope="module")
def big_history(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """:data:`HISTORY` old partitions in a local store and in S3, built once."""
    from freshidx_tests.conftest import make_s3_config

    old = [pid(5 * i) for i in range(HISTORY)]
    local = StoreConfig(uri=(tmp_path_factory.mktemp("hist") / "store").as_uri())
    s3 = make_s3_config(request.getfixturevalue("moto_endpoint"))
    for cfg in (local, s3):
        write(open_store(cfg), old)
    return {"local": local, "s3": s3, "old": old}


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_listing_after_watermark_is_bounded_by_new_data(big_history, kind: str) -> None:  # type: ignore[no-untyped-def]
    store = open_store(big_history[kind])
    watermark = big_history["old"][-1]
    new = [PartitionId(watermark.at + dt.timedelta(minutes=5 * i)) for i in (1, 2, 3)]
    write(store, new)
    store.stats.reset()
    found = partitions_after(store, SRC, watermark, max_scan_hours=6)
    assert found.partitions == new
    assert found.newest == new[-1]
    # Descent to the newest partition (~6 calls) + one StartAfter page, and none of the old partitions'
    # keys: listing them would return HISTORY entries.
    assert store.stats.list_calls <= 8, store.stats.list_calls
    assert store.stats.listed_entries <= MAX_ENTRIES, store.stats.listed_entries
    assert found.list_calls == store.stats.list_calls

    # No new data: still bounded, and nothing returned.
    store.stats.reset()
    assert partitions_after(store, SRC, new[-1], max_scan_hours=6).partitions == []
    assert store.stats.list_calls <= 8
    assert store.stats.listed_entries <= MAX_ENTRIES, store.stats.listed_entries


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_restart_without_watermark_jumps_to_latest(big_history, kind: str) -> None:  # type: ignore[no-untyped-def]
    store = open_store(big_history[kind])
    store.stats.reset()
    found = partitions_after(store, SRC, None, max_scan_hours=6)
    assert store.stats.list_calls <= 8, store.stats.list_calls
    assert store.stats.listed_entries <= MAX_ENTRIES, store.stats.listed_entries
    # Only the last 6 hours are listed (the sensor supersedes all but the newest); older = one gap.
    assert found.unlisted_before is not None and found.partitions[0] >= found.unlisted_before
    # Every 5-minute partition from the floor to the newest, none missing (how many depends on
    # which partitions other tests of this module added after the 5,000 old ones).
    steps = [(b.at - a.at).total_seconds() for a, b in zip(found.partitions, found.partitions[1:], strict=False)]
    assert set(steps) == {300.0}
    assert (found.partitions[0].at - found.unlisted_before.at).total_seconds() < 300
    assert 12 * 5 <= len(found.partitions) <= 12 * 6
    newest, _ = newest_partition(store, SRC)
    assert found.newest == newest and newest >= big_history["old"][-1]


def test_watermark_far_behind_lists_only_recent_hours(store: ObjectStore) -> None:
    parts = [pid(5 * i) for i in range(12 * 30)]  # 30 hours
    write(store, parts)
    store.stats.reset()
    found = partitions_after(store, SRC, parts[0], max_scan_hours=6)
    assert found.unlisted_before is not None
    assert found.partitions[0] >= found.unlisted_before
    assert found.partitions[-1] == parts[-1]
    assert found.partitions == [p for p in parts if p >= found.unlisted_before]
    assert len(found.partitions) == 12 * 6  # six hours of 5-minute partitions


def test_malformed_partition_names_are_ignored_and_reported(store: ObjectStore, store_config: StoreConfig) -> None:
    good = [pid(0), pid(5)]
    write(store, good)
    bad = [
        "raw/ad_updates/year=2026/month=13/day=01/hour=00/minute=00/part.jsonl",
        "raw/ad_updates/year=2026/month=10/day=01/hour=00/minute=7/part.jsonl",
        "raw/ad_updates/year=2026/month=10/day=01/hour=00/minute=10x/part.jsonl",
        "raw/ad_updates/year=2026/month=10/day=01/hour=00/minute=30/extra/part.jsonl",
        "raw/ad_updates/year=9999x/part.jsonl",
        "raw/ad_updates/year=2026/month=10/day=01/hour=00/secret=1/part.jsonl",
    ]
    for k in bad:
        store.put(k, b"{}\n")
    newest, ignored = newest_partition(store, SRC)
    assert newest == good[-1]
    assert {i.key for i in ignored} >= {"raw/ad_updates/year=9999x/"}
    found = partitions_after(store, SRC, good[0], max_scan_hours=6)
    assert found.partitions == [good[1]]
    reported = {i.key for i in found.ignored}
    assert "raw/ad_updates/year=2026/month=10/day=01/hour=00/minute=10x/part.jsonl" in reported
    assert "raw/ad_updates/year=2026/month=10/day=01/hour=00/minute=30/extra/part.jsonl" in reported
    assert all(i.reason for i in found.ignored)


def test_traversal_like_upstream_keys_never_become_partitions(s3_store_config: StoreConfig) -> None:
    """S3 allows keys with '..'; upstream writing one must not turn into a path of ours."""
    store = open_store(s3_store_config)
    write(store, [pid(0)])
    client = s3_store_config.boto3_client()
    evil = f"{s3_store_config.prefix}/raw/ad_updates/year=2026/month=10/day=01/hour=00/minute=05/../../../../../x"
    client.put_object(Bucket=s3_store_config.bucket, Key=evil, Body=b"{}")
    found = partitions_after(store, SRC, PartitionId(T0 - dt.timedelta(minutes=5)), max_scan_hours=6)
    assert found.partitions == [pid(0)]
    assert any(".." in i.key for i in found.ignored)


def test_hidden_and_marker_files_are_not_data(store: ObjectStore) -> None:
    p = pid(0)
    store.put(layout.raw_partition_prefix(SRC, p) + "_SUCCESS", b"")
    store.put(layout.raw_partition_prefix(SRC, p) + ".part.tmp", b"")
    files, _ = files_in_window(store, SRC, p.at - dt.timedelta(hours=1), p)
    assert files == {}
    write(store, [p])
    files, _ = files_in_window(store, SRC, p.at - dt.timedelta(hours=1), p)
    assert [o.key.rsplit("/", 1)[1] for o in files[p]] == ["part-00000.jsonl"]


def test_files_in_window_is_left_open_right_closed(store: ObjectStore) -> None:
    parts = [pid(5 * i) for i in range(0, 30)]
    write(store, parts)
    end = parts[20]
    files, _ = files_in_window(store, SRC, parts[8].at, end)
    assert list(files) == parts[9:21]
    # the hours listed at once or one by one: the same files
    assert files_in_window(store, SRC, parts[0].at, end, threads=1) == files_in_window(store, SRC, parts[0].at, end)
