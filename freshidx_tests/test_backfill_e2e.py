"""Through ``dagster dev`` (webserver + daemon), as the UI does it: a backfill of 2 ``ads_hourly`` hours
launched with GraphQL ``launchPartitionBackfill`` while the delta sensor keeps publishing. The 2 hours
are rebuilt (new bucket versions, recorded in the ledger as backfill rebuilds) and the delta pointer
only ever moves forward.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from freshidx import catchup, layout
from freshidx.partitions import PartitionId
from freshidx.publish import read_pointer
from freshidx.store import ObjectStore, StoreConfig, open_store
from freshidx.tools.devserver import BACKFILL_TERMINAL_STATUSES, DagsterDev, prepare_home
from freshidx.tools.generate import GeneratorConfig, write_partition
from freshidx_tests.polling import poll_until
from freshidx_tests.test_daemon_e2e import (
    REPO,
    SLA_OFF,
    SLA_SENSOR,
    assert_stopped_before_start,
    env_for,
)

GEN = GeneratorConfig(seed=5, ads=300, products=50, changes_per_partition=25)
# Hours 0-1 carry the closed hours to rebuild; hour 2 is the previous hour, where the live batches land.
H0 = catchup.floor_hour(dt.datetime.now(dt.UTC)) - dt.timedelta(hours=3)
#: Hours 0-1 ended over an hour ago, so they are closed; the live hour 2 ended less than an hour ago
#: and stays open, so the catch-up sensor processes exactly the 2 hours under test (no empty hours,
#: no live hour and its late-data corrections queued in the one heavy slot before the backfill).
CLOSE_GRACE_S = 3600


def hour(i: int) -> dt.datetime:
    return H0 + dt.timedelta(hours=i)


def delta_history(store: ObjectStore) -> list[dict]:
    out = [store.get_json(o.key)[0] for o in store.list(layout.index_root("delta") + "history/").objects]
    return sorted(out, key=lambda p: p["seq"])


@pytest.fixture
def dev(tmp_path: Path, local_store_config: StoreConfig,
        shared_spark_connect: dict[str, str]) -> Iterator[tuple[DagsterDev, StoreConfig]]:
    home = prepare_home(tmp_path / "dagster_home", REPO / "dagster.yaml")
    # SLA sensor off: its full_index build is not under test here
    env = {**env_for(local_store_config, shared_spark_connect), **SLA_OFF, "FRESHIDX_CATCHUP_AUTOSTART": "true",
           "FRESHIDX_HOURLY_SENSOR_INTERVAL_SECONDS": "5", "FRESHIDX_CLOSE_GRACE_SECONDS": str(CLOSE_GRACE_S),
           # one hour per run: the backfill is 2 runs, long enough for live publications to land inside it
           "FRESHIDX_HOURLY_MAX_HOURS_PER_RUN": "1"}
    d = DagsterDev(home=home, module="freshidx.definitions", env=env, cwd=REPO)
    d.start()
    try:
        d.wait_ready(timeout=300)
        assert_stopped_before_start(d, SLA_SENSOR)
        yield d, local_store_config
    finally:
        d.stop()


@pytest.mark.daemon
@pytest.mark.timeout(2400)  # under cpu_load every local-Spark run takes minutes
def test_ui_backfill_rebuilds_hours_while_delta_only_moves_forward(
        cpu_load: list, dev: tuple[DagsterDev, StoreConfig]) -> None:
    # cpu_load first: the box is busy (CPU hogs, see conftest) from before dagster dev starts.
    d, cfg = dev
    store = open_store(cfg)
    for i in range(2):  # two closed hours (a range, as the UI selects it), two batches each
        for m in (10, 40):
            write_partition(store, GEN, PartitionId(hour(i) + dt.timedelta(minutes=m)))
    live = [PartitionId(hour(2) + dt.timedelta(minutes=m)) for m in range(0, 60, 3)]
    write_partition(store, GEN, live.pop(0))

    # The catch-up sensor processes the closed hours once; the delta sensor publishes the newest.
    names = [layout.bucket_name(catchup.ASSET, hour(i)) for i in range(2)]
    poll_until(lambda: all(read_pointer(store, n)[0] is not None for n in names), timeout=600, interval=1,
               what="catch-up sensor to process hours 0-1")
    first = {n: read_pointer(store, n)[0] for n in names}
    assert all(p is not None and p.seq == 1 for p in first.values())
    poll_until(lambda: read_pointer(store, "delta")[0] is not None, timeout=420, interval=1, what="first delta")

    # The UI's partition backfill of hours 0..1 (one range), while new batches keep arriving.
    keys = [catchup.dagster_key(hour(i)) for i in range(2)]
    launched_at = dt.datetime.now(dt.UTC)
    backfill_id = d.launch_partition_backfill("ads_hourly", range=(keys[0], keys[-1]), title="rebuild 2 hours")
    delta_before = read_pointer(store, "delta")[0].seq
    last_write = [time.monotonic()]

    def backfill_done() -> dict | None:
        # Meanwhile the upstream simulator drops a batch every ~6 s, so the delta sensor keeps publishing.
        if live and time.monotonic() - last_write[0] >= 4:
            write_partition(store, GEN, live.pop(0))
            last_write[0] = time.monotonic()
        st = d.backfill_status(backfill_id)
        return st if st["status"] in BACKFILL_TERMINAL_STATUSES else None

    status = poll_until(backfill_done, timeout=900, interval=1, what="the backfill to finish")
    done_at = dt.datetime.now(dt.UTC)
    assert status.get("status") == "COMPLETED_SUCCESS", status
    # The delta sensor kept publishing while the backfill ran: live runs are not held behind it.
    assert read_pointer(store, "delta")[0].seq > delta_before
    during = [h for h in delta_history(store)
              if launched_at <= dt.datetime.fromisoformat(h["published_at"]) <= done_at]
    assert during, f"no delta publication between {launched_at} and {done_at}"

    # Rebuilt: a second version of each hour, recorded as a backfill rebuild, in runs of <= N hours.
    for i, n in enumerate(names):
        ptr = read_pointer(store, n)[0]
        assert ptr.seq == 2 and ptr.version != first[n].version, n
        entries = catchup.hour_entries(store, catchup.ASSET, hour(i))
        rebuilt = [e for k, e in entries.items() if k.startswith("backfill-")]
        assert len(rebuilt) == 1 and rebuilt[0]["decision"] == "rebuilt", entries.keys()
        assert [k for k in entries if k[:1] == "a" and k[1:].isdigit()] == ["a1"], "processed once by catch-up"
    instance = dg.DagsterInstance.from_config(str(d.home))
    try:
        runs = instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
        assert len(runs) == 2 and all(r.tags.get(catchup.TAG_KIND) is None for r in runs)  # not catch-up claims
        assert all(r.status.value == "SUCCESS" for r in runs)
        # Lower priority than live work: the run queue dequeues the live delta runs first.
        live_runs = instance.get_runs(dg.RunsFilter(tags={"freshidx/pipeline": "delta"}))
        assert live_runs and all(int(r.tags.get("dagster/priority", 0)) > 0 for r in live_runs)
        assert all(int(r.tags.get("dagster/priority", 0)) < min(int(x.tags["dagster/priority"]) for x in live_runs)
                   for r in runs)
    finally:
        instance.dispose()

    # The delta pointer only ever moved forward: every publication's position is newer than the last.
    hist = delta_history(store)
    assert len(hist) >= 2
    positions = [h["position"] for h in hist]
    assert positions == sorted(positions) and len(set(positions)) == len(positions), positions
    assert [h["seq"] for h in hist] == list(range(1, len(hist) + 1))
