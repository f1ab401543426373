"""The ledger explains every visible partition, whatever triggered the run
(docs/architecture.md#nothing-visible-is-lost).

End to end on a real Dagster instance (SQLite, in process), real sensor ticks and real local Spark,
for each delta overlap policy (``serialize``, ``skip``, ``queue``): bursts of partitions land while a
run is queued, a UI/CLI materialize builds a chosen partition, another one builds "the newest" while
the sensor keeps ticking, a late partition arrives behind the watermark inside the window, another
one older than every window (read by the full index only). At the end ``freshidx ledger --json``
must explain 100% of the partitions visible in the store (a final decision, parked, or a listed
gap), and every partition a version was published for must say ``published``.

Queued runs are run records in the instance (``NOT_STARTED``, as the daemon creates them from a sensor
request or a launchpad click, without the planned events) that the test executes later (``_execute``),
so the sensor sees them in flight exactly as it would under the daemon; no sleeps: nothing here waits
on a clock.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import dagster as dg
import pytest

from freshidx.catchup import planner as catchup
from freshidx.cli import main as cli
from freshidx.definitions import build_definitions
from freshidx.publish.commit import read_pointer
from freshidx.store import ObjectStore, StoreConfig, layout
from freshidx.store.partitions import PartitionError, PartitionId
from freshidx.trigger import ledger
from freshidx_tests.catchup.test_catchup import drain, hour, write_hours
from freshidx_tests.conftest import make_s3_config
from freshidx_tests.support.harness import Harness, at

DELTA = dg.AssetKey("delta_index")


def _visible(store: ObjectStore, source: str = "ad_updates") -> set[PartitionId]:
    """Every partition with a data file, straight from the store (not from any freshidx listing)."""
    root = layout.raw_root(source)
    out: set[PartitionId] = set()
    for obj in store.iter_objects(root):
        part, _, name = obj.key[len(root):].rpartition("/")
        if name.startswith((".", "_")):
            continue
        try:
            out.add(PartitionId.parse(part))
        except PartitionError:
            continue
    return out


def _ledger_rows(store_uri: str, capsys: Any) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert cli(["ledger", "--pipeline", "delta", "--json", "--store", store_uri]) == 0
    return list(json.loads(capsys.readouterr().out))


def _enqueue(h: Harness, run_config: dict[str, Any], tags: dict[str, str]) -> str:
    """A run record as the daemon creates it for a request or a launchpad click: in flight, not started."""
    job = h.defs.resolve_implicit_global_asset_job_def()
    # A bare record (no planned events): _execute replaces it by the run itself under the same id.
    run = h.instance.add_run(dg.DagsterRun(job_name=job.name, run_id=str(uuid.uuid4()), run_config=run_config,
                                           tags=tags, status=dg.DagsterRunStatus.NOT_STARTED,
                                           asset_selection=frozenset({DELTA})))
    return run.run_id


def _execute(h: Harness, run_id: str) -> None:
    """Run a record :func:`_enqueue` created, as the daemon would start it. Dagster's public API has no
    call that executes an existing record in process, so the record is replaced by an in-process run
    under the same id, config and tags (nothing ticks in between)."""
    job = h.defs.resolve_implicit_global_asset_job_def()
    run = h.instance.get_run_by_id(run_id)
    assert run is not None and run.status == dg.DagsterRunStatus.NOT_STARTED, run
    h.instance.delete_run(run_id)
    result = job.execute_in_process(run_config=run.run_config, instance=h.instance, run_id=run_id, tags=run.tags,
                                    asset_selection=[DELTA], raise_on_error=False)
    assert result.success, [e.message for e in result.all_events if e.is_failure]


def _enqueue_request(h: Harness, request: dg.RunRequest) -> str:
    return _enqueue(h, request.run_config, {**request.tags, "dagster/run_key": str(request.run_key)})


def _requested(data: Any) -> list[str]:
    return [r.tags["freshidx/source_partition"] for r in data.run_requests or []]


def _manual(minutes: int | None) -> dict[str, Any]:
    config = {"source_partition": at(minutes).path} if minutes is not None else {}
    return {"ops": {"delta_index": {"config": config}}}


@pytest.fixture
def policy_harness(request: pytest.FixtureRequest, local_store_config: StoreConfig) -> Iterator[Harness]:
    """``(policy, store)``: a harness with that overlap policy on the local store or on moto S3."""
    policy, kind = request.param
    cfg = make_s3_config(request.getfixturevalue("moto_endpoint")) if kind == "s3" else local_store_config
    with dg.instance_for_test() as instance:
        h = Harness(cfg, instance, delta_overlap=policy)
        try:
            yield h
        finally:
            h.close()


# Every policy once: the most involved one (queue) on moto S3, the other two on the local store.
@pytest.mark.parametrize("policy_harness", [("serialize", "local"), ("skip", "local"), ("queue", "s3")],
                         indirect=True, ids=lambda p: "-".join(p))
def test_ledger_explains_every_visible_partition(policy_harness: Harness, spark: Any, capsys: Any) -> None:
    h = policy_harness
    policy = h.settings.delta_overlap
    for m in (0, 5, 10):  # a burst: one run, for the newest
        h.write(m)
    first = h.tick()
    assert _requested(first) == [at(10).path]
    r1 = _enqueue_request(h, first.run_requests[0])

    for m in (15, 20, 25):  # a second burst while that run is queued
        h.write(m)
    second = h.tick()
    r2 = None
    if policy == "queue":
        assert _requested(second) == [at(25).path]
        r2 = _enqueue_request(h, second.run_requests[0])
        # The queued run's own partition is not decided by the sensor: its run publishes it.
        assert ledger.decision(h.store, "delta", at(10)) is None
    else:
        assert not second.run_requests
    _execute(h, r1)
    published = ledger.decision(h.store, "delta", at(10))
    assert published is not None and published["decision"] == "published"
    assert published["extra"]["seconds"]["publish"] >= 0  # where the run's time went, publication included
    if r2 is not None:
        _execute(h, r2)
    third = h.tick()
    if policy == "serialize":
        assert _requested(third) == [at(25).path]
        assert h.run(third.run_requests[0]).success
    else:
        assert not third.run_requests

    # A UI/CLI materialize of a chosen partition jumps over 30: the publication records why.
    for m in (30, 35, 40):
        h.write(m)
    assert h.run(dg.RunRequest(run_config=_manual(35), asset_selection=[DELTA])).success
    jumped = ledger.decision(h.store, "delta", at(30))
    assert jumped is not None and jumped["decision"] == "folded" and at(35).path in jumped["reason"]
    fourth = h.tick()
    assert _requested(fourth) == [at(40).path]
    assert h.run(fourth.run_requests[0]).success

    # A materialize of "the newest" is queued; partitions land; the sensor keeps ticking.
    manual = _enqueue(h, _manual(None), {})
    for m in (45, 50):
        h.write(m)
    fifth = h.tick()
    if policy == "queue":
        assert _requested(fifth) == [at(50).path]
        r5 = _enqueue_request(h, fifth.run_requests[0])
    else:
        # Nobody knows yet which partition the manual run will build: nothing is decided meanwhile.
        assert not fifth.run_requests and ledger.decision(h.store, "delta", at(50)) is None
    _execute(h, manual)  # it builds the newest visible partition, 50
    assert ledger.decision(h.store, "delta", at(50))["decision"] == "published"  # type: ignore[index]
    if policy == "queue":
        _execute(h, r5)  # not newer than what serves: refused before building, and recorded
        assert any(k.startswith("refused-") for k in ledger.partition_entries(h.store, "delta", at(50)))

    # Late data: a partition behind the watermark inside the next window, and one older than any window.
    h.write(42)
    h.write(-250)  # before the window of 55 (which starts at -245), after the first listing's gap (-300)
    h.write(55)
    sixth = h.tick()
    assert _requested(sixth) == [at(55).path]
    assert h.run(sixth.run_requests[0]).success
    late = ledger.decision(h.store, "delta", at(42))
    assert late is not None and late["extra"].get("late") and at(55).path in late["reason"]
    assert ledger.decision(h.store, "delta", at(-250)) is None  # no delta window reads it ...
    assert h.run(dg.RunRequest(asset_selection=[dg.AssetKey("full_index")])).success
    old = ledger.decision(h.store, "delta", at(-250))
    assert old is not None and "full index" in old["reason"]  # ... the full index did, and says so

    # 100% of the visible partitions are explained by `freshidx ledger`.
    visible = _visible(h.store)
    assert len(visible) == 14
    rows = _ledger_rows(h.settings.store, capsys)
    missing = ledger.unexplained(ledger.Explained.from_rows(rows), visible)
    assert not missing, (f"{len(missing)} of {len(visible)} visible partitions unexplained (policy {policy}): "
                         + ", ".join(p.path for p in missing))
    # ... and truthfully: every partition a version was published for says published.
    published = {PartitionId.parse(e["source_partition"]) for e in _history(h.store, "delta")}
    said = {(r.get("partition"), r["decision"]) for r in rows}
    assert all((p.path, "published") in said for p in published), sorted(p.path for p in published)
    pointer, _ = read_pointer(h.store, "delta")
    assert pointer is not None and pointer.source_partition == at(55).path


def _history(store: ObjectStore, index: str) -> list[dict[str, Any]]:
    return [store.get_json(o.key)[0] for o in store.iter_objects(layout.index_root(index) + "history/")]


@pytest.fixture
def catchup_harness(request: pytest.FixtureRequest, local_store_config: StoreConfig) -> Iterator[Harness]:
    """A catch-up harness on the local store or on moto S3."""
    cfg = make_s3_config(request.getfixturevalue("moto_endpoint")) if request.param == "s3" else local_store_config
    with dg.instance_for_test() as instance:
        h = Harness(cfg, instance, hourly_late_checks_per_tick=24, hourly_max_hours_per_run=4)
        try:
            yield h
        finally:
            h.close()


@pytest.mark.parametrize("catchup_harness", ["s3"], indirect=True)
def test_late_hour_behind_the_catchup_start_is_processed_or_out_of_range(catchup_harness: Harness,
                                                                         spark: Any) -> None:
    """Late data for a closed hour inside the lookback: before the consumer's first hour it is processed;
    before FRESHIDX_PARTITIONS_START (not an ads_hourly partition) it is recorded as out of range."""
    h = catchup_harness
    # The harness fixes partitions_start; this test needs it at the day the data starts.
    h.settings = h.settings.model_copy(update={"partitions_start": "2026-11-20"})
    h.defs = build_definitions(h.settings)
    write_hours(h, range(3, 5))
    assert drain(h) == [[layout.hour_id(hour(3)), layout.hour_id(hour(4))]]
    write_hours(h, range(1, 2))  # after the partitions start, before the consumer's first hour
    write_hours(h, range(-1, 0))  # 2026-11-19T23: before FRESHIDX_PARTITIONS_START
    assert drain(h) == [[layout.hour_id(hour(1))]]
    assert catchup.processed(h.store, catchup.ASSET, hour(1))
    assert catchup.hour_entries(h.store, catchup.ASSET, hour(1))[""]["decision"] == "processed"
    entries = catchup.hour_entries(h.store, catchup.ASSET, hour(-1))
    assert entries["out_of_range"]["decision"] == "out_of_range"
    assert "FRESHIDX_PARTITIONS_START" in entries["out_of_range"]["reason"]
    assert not catchup.processed(h.store, catchup.ASSET, hour(-1))
    assert drain(h) == []  # recorded once, nothing requested again
    assert list(catchup.hour_entries(h.store, catchup.ASSET, hour(-1))) == ["out_of_range"]
