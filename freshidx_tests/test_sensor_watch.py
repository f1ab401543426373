"""A delta sensor tick watches for work (:func:`freshidx.latest_only.wait_for_work`).

The daemon starts sensor ticks every 5 s, so a tick that answered at once left an arrival waiting
0-5 s. A tick with nothing to do now keeps looking (one LIST after the watermark per look, none while a
delta run is in flight) until a newer partition appears or ``sensor_wait_seconds`` pass. The clock
and the sleep are injected: the "time" passes only when the wait sleeps, and a sleep can make the
next event happen, so every scenario is deterministic. The sensor itself, with its real instance, is
at the end; every ``dagster dev`` test runs with the watch on (dagster.yaml: ``sensors.use_threads``).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Any

import dagster as dg
import pytest

from freshidx import layout, listing
from freshidx.defs.assets import TAG_NOTICED
from freshidx.latest_only import wait_for_work
from freshidx.partitions import PartitionId
from freshidx.publish import Pointer, iso, parse_iso, utcnow
from freshidx.settings import Settings
from freshidx.store import ObjectStore, StoreConfig, open_store
from freshidx_tests.harness import Harness
from freshidx_tests.test_latest_only_planner import FakeRuns, at


def _write(store: ObjectStore, p: PartitionId, name: str = "part-0.jsonl", source: str = "ad_updates") -> None:
    store.put(layout.raw_partition_prefix(source, p) + name, b'{"ad_id": "a1"}\n')


def _point_at(store: ObjectStore, p: PartitionId) -> None:
    """A published delta whose watermark is ``p`` (what the wait reads; no index behind it)."""
    store.put_json(layout.pointer_key("delta"), Pointer(
        index="delta", version=f"v{p.compact}", seq=1, position=iso(p.at), manifest="m", doc_count=1,
        published_at=iso(utcnow()), source_partition=p.path).to_dict())


class Clock:
    """Time that passes only when the wait sleeps; ``on_sleep[n]`` runs at the n-th sleep (1-based)."""

    def __init__(self, on_sleep: dict[int, Callable[[], None]] | None = None) -> None:
        self.now = 0.0
        self.sleeps = 0
        self.on_sleep = on_sleep or {}

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds
        if (action := self.on_sleep.get(self.sleeps)) is not None:
            action()


def _settings(cfg: StoreConfig, **overrides: Any) -> Settings:
    values: dict[str, Any] = {"sensor_wait_seconds": 4.0, "sensor_poll_seconds": 0.5, **overrides}
    return Settings.from_env({}, store=cfg.uri, partitions_start="2026-11-01", **values)


def _wait(store: ObjectStore, settings: Settings, runs: FakeRuns, clock: Clock) -> tuple[bool, int]:
    """(the answer, LIST calls it made)."""
    before = store.stats.list_calls
    found = wait_for_work(store, settings, runs, clock=clock, sleep=clock.sleep)
    return found, store.stats.list_calls - before


def test_nothing_new_waits_the_whole_time_one_list_per_look(local_store_config: StoreConfig) -> None:
    store = open_store(local_store_config)
    _write(store, at(0))
    _point_at(store, at(0))
    clock = Clock()
    found, lists = _wait(store, _settings(local_store_config), FakeRuns(), clock)
    assert not found
    assert clock.sleeps == 8 and clock.now == pytest.approx(4.0)  # looks at 0, 0.5, …, 4.0 s (the deadline)
    assert lists == 9


def test_a_partition_arriving_during_the_wait_ends_it_at_the_next_look(local_store_config: StoreConfig) -> None:
    store = open_store(local_store_config)
    _write(store, at(0))
    _point_at(store, at(0))
    clock = Clock({3: lambda: _write(store, at(1))})
    found, lists = _wait(store, _settings(local_store_config), FakeRuns(), clock)
    assert found and clock.sleeps == 3 and lists == 4


def test_work_already_there_or_no_delta_yet_answers_at_once(local_store_config: StoreConfig) -> None:
    store = open_store(local_store_config)
    settings = _settings(local_store_config)
    _write(store, at(0))
    clock = Clock()
    assert _wait(store, settings, FakeRuns(), clock) == (True, 0)  # no pointer: the full listing decides
    _point_at(store, at(0))
    _write(store, at(5))
    assert _wait(store, settings, FakeRuns(), clock) == (True, 1)
    assert clock.sleeps == 0


def test_no_wait_configured_touches_nothing(local_store_config: StoreConfig) -> None:
    store = open_store(local_store_config)
    clock = Clock()
    runs = FakeRuns()
    runs.launch("delta:x:a1", at(0).path)
    assert _wait(store, _settings(local_store_config, sensor_wait_seconds=0), runs, clock) == (True, 0)
    assert clock.sleeps == 0


def test_hidden_and_unparsable_keys_are_not_work(local_store_config: StoreConfig) -> None:
    store = open_store(local_store_config)
    _write(store, at(0))
    _point_at(store, at(0))
    _write(store, at(1), name="_temporary-part-0.jsonl")  # an upstream writer's temp file
    _write(store, at(1), name=".part-0.jsonl.crc")
    store.put(layout.raw_root("ad_updates") + "year=2026/month=11/day=20/hour=09/minute=7x/part-0.jsonl", b"{}\n")
    assert not listing.data_after(store, "ad_updates", at(0))
    found, _ = _wait(store, _settings(local_store_config), FakeRuns(), Clock())
    assert not found
    _write(store, at(2))
    assert listing.data_after(store, "ad_updates", at(0))
    assert not listing.data_after(store, "ad_updates", at(2))


def test_a_full_page_without_an_answer_says_yes(local_store_config: StoreConfig) -> None:
    store = open_store(local_store_config)
    _point_at(store, at(0))
    for i in range(3):
        _write(store, at(1), name=f"_tmp-{i}")
    assert listing.data_after(store, "ad_updates", at(0), max_keys=2)  # more keys than one page: list properly
    assert not listing.data_after(store, "ad_updates", at(0), max_keys=10)


def _run_in_flight(store: ObjectStore) -> FakeRuns:
    """Partitions 0 and 1 visible, the delta at 0, a run for 1 in flight."""
    _write(store, at(0))
    _write(store, at(1))
    _point_at(store, at(0))
    runs = FakeRuns()
    runs.launch("delta:p1:a1", at(1).path)
    return runs


def test_no_listing_while_a_run_is_in_flight_and_the_pointer_is_read_again_after_it(
    local_store_config: StoreConfig,
) -> None:
    store = open_store(local_store_config)
    runs = _run_in_flight(store)

    def run_publishes_and_ends() -> None:
        _point_at(store, at(1))  # the run's publication moves the watermark past the newest partition
        runs.end("delta:p1:a1", "SUCCESS")

    clock = Clock({3: run_publishes_and_ends, 5: lambda: _write(store, at(2))})
    found, lists = _wait(store, _settings(local_store_config), runs, clock)
    # Looks 1-3: a run in flight (no LIST); look 4: watermark at(1) re-read, nothing newer; look 6: at(2).
    assert found and clock.sleeps == 5 and lists == 3


def test_overlap_queue_does_not_wait_for_runs(local_store_config: StoreConfig) -> None:
    store = open_store(local_store_config)
    runs = _run_in_flight(store)
    assert _wait(store, _settings(local_store_config, delta_overlap="queue"), runs, Clock()) == (True, 1)


def test_overlap_skip_plans_at_once_while_a_run_is_in_flight(local_store_config: StoreConfig) -> None:
    # Policy skip records partitions that arrive during a run as skipped, so it must not wait for the run.
    store = open_store(local_store_config)
    runs = _run_in_flight(store)
    clock = Clock()
    assert _wait(store, _settings(local_store_config, delta_overlap="skip"), runs, clock) == (True, 0)
    assert clock.sleeps == 0


def test_the_setting_is_bounded_below_the_daemon_loop() -> None:
    with pytest.raises(ValueError, match="sensor_wait_seconds"):
        Settings.from_env({"FRESHIDX_SENSOR_WAIT_SECONDS": "5"})


def test_the_sensor_waits_then_requests_with_the_time_it_noticed(local_store_config: StoreConfig) -> None:
    """The real sensor on a real instance: a tick with nothing new skips after the wait (a lower bound:
    a busy machine only makes it longer); a tick with a new partition requests it at once, tagged with
    when it noticed it."""
    with dg.instance_for_test() as instance:
        h = Harness(local_store_config, instance, sensor_wait_seconds=0.3, sensor_poll_seconds=0.1)
        try:
            h.write(0)
            _point_at(h.store, at(0))
            started = time.monotonic()
            skipped = h.tick()
            assert time.monotonic() - started >= 0.3
            assert not skipped.run_requests and "no partition newer than" in (skipped.skip_message or "")
            h.write(5)
            start = utcnow()
            (request,) = h.tick().run_requests
            end = utcnow()
            assert request.tags["freshidx/source_partition"] == at(5).path
            noticed = parse_iso(request.tags[TAG_NOTICED])
            assert start - dt.timedelta(milliseconds=1) <= noticed <= end
        finally:
            h.close()
