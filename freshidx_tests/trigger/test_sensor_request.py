"""The delta sensor answers each tick at once: no in-tick polling (continuous mode is the latency path).

The real sensor on a real instance: a tick with nothing new skips without waiting; a tick with a new
partition requests one run of ``delta_index_job`` for it, tagged with when the sensor noticed it. The
removed watch settings still load, with a warning that names them.
"""

from __future__ import annotations

import datetime as dt
import warnings

import dagster as dg

from freshidx.defs.shared.assets import TAG_NOTICED
from freshidx.publish.commit import Pointer, iso, parse_iso, utcnow
from freshidx.settings import Settings
from freshidx.store import ObjectStore, StoreConfig, layout
from freshidx.store.partitions import PartitionId
from freshidx_tests.support.harness import Harness
from freshidx_tests.trigger.test_latest_only_planner import at


def _point_at(store: ObjectStore, p: PartitionId) -> None:
    """A published delta whose watermark is ``p`` (what the planner reads; no index behind it)."""
    store.put_json(layout.pointer_key("delta"), Pointer(
        index="delta", version=f"v{p.compact}", seq=1, position=iso(p.at), manifest="m", doc_count=1,
        published_at=iso(utcnow()), source_partition=p.path).to_dict())


def test_the_sensor_answers_at_once_and_tags_when_it_noticed(local_store_config: StoreConfig) -> None:
    with dg.instance_for_test() as instance:
        h = Harness(local_store_config, instance)
        try:
            h.write(0)
            _point_at(h.store, at(0))
            skipped = h.tick()
            assert not skipped.run_requests and "no partition newer than" in (skipped.skip_message or "")
            h.write(5)
            start = utcnow()
            (request,) = h.tick().run_requests
            end = utcnow()
            assert request.tags["freshidx/source_partition"] == at(5).path
            assert "freshidx/launch" not in request.tags  # no lane past the run queue
            noticed = parse_iso(request.tags[TAG_NOTICED])
            assert start - dt.timedelta(milliseconds=1) <= noticed <= end
        finally:
            h.close()


def test_the_removed_watch_settings_load_with_a_warning() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Settings.from_env({"FRESHIDX_SENSOR_WAIT_SECONDS": "4", "FRESHIDX_SENSOR_POLL_SECONDS": "0.5"})
    text = " ".join(str(w.message) for w in caught)
    assert "FRESHIDX_SENSOR_WAIT_SECONDS" in text and "FRESHIDX_SENSOR_POLL_SECONDS" in text
    assert "ignored" in text
