"""A store written before records carried a format version still reads, serves and takes new publications.

``data/store_v0/`` was written by commit d48d521 (the release before typed records), with that commit's code
run from a separate checkout (``git worktree add /tmp/fixture-src d48d521``, ``PYTHONPATH`` on it): a
``Harness`` on a local store (``full_max_age_seconds=10**9``, ``hourly_lookahead_hours=3``), generator
``GeneratorConfig(seed=5, ads=80, products=60, changes_per_partition=12, malformed_rate=0.1,
burst_probability=0.0)`` at minutes -400, -60, -30, 0, 5 and 10 after ``harness.T0``; ``full_index`` twice
(the second refused as unchanged); partitions 15 and 20, one sensor tick and its run (15 folded into 20);
a manual ``delta_index`` of partition 10 (refused before building); partition 25, tick and run; one
``ads_hourly_sensor`` tick and its run (hours 02-04); then the continuous heartbeat
(``freshidx.trigger.continuous_rules.heartbeat``) and the Spark server's runtime record
(``freshidx.serve.status.record_spark_server_state``). :data:`EXPECTED_HITS` is what ``Searcher`` answered
on that store. Every record kind is in it; the Dagster instance and the lock files are not.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from freshidx import cli
from freshidx.catchup.state import parse_hour_id
from freshidx.serve.searcher import Searcher
from freshidx.store import ObjectStore, StoreConfig, layout, open_store
from freshidx.store.records import (
    CURRENT_FORMAT,
    VERSION_KEY,
    CatchupState,
    Heartbeat,
    LedgerEntry,
    Manifest,
    Pointer,
    QuarantineDone,
    QuarantineLine,
    Record,
    RecordError,
    Refusal,
    RuntimeRecord,
    Segment,
)
from freshidx.tools.generate import GeneratorConfig
from freshidx_tests.support.harness import Harness

FIXTURE = Path(__file__).parents[1] / "data" / "store_v0"
#: The generator and settings the fixture was written with (the module docstring).
GEN = GeneratorConfig(seed=5, ads=80, products=60, changes_per_partition=12, malformed_rate=0.1,
                      burst_probability=0.0)
SETTINGS: dict[str, Any] = {"full_max_age_seconds": 10**9, "hourly_lookahead_hours": 3}
K = 8
#: ``[ad_id, index]`` of the top ``K`` hits, as ``Searcher`` answered on the fixture when it was made.
EXPECTED_HITS = {
    "slim OR mini OR smart OR granite": [
        ["ad-000009", "full"], ["ad-000007", "delta"], ["ad-000061", "delta"], ["ad-000006", "delta"],
        ["ad-000074", "delta"], ["ad-000036", "delta"], ["ad-000047", "delta"], ["ad-000042", "full"]],
    "treadmill": [
        ["ad-000063", "delta"], ["ad-000061", "delta"], ["ad-000067", "delta"], ["ad-000052", "full"],
        ["ad-000021", "delta"]],
}
ALL_KINDS = {Pointer, Manifest, Segment, Refusal, LedgerEntry, CatchupState, Heartbeat, RuntimeRecord,
             QuarantineLine, QuarantineDone}


def copy_fixture(to: Path) -> StoreConfig:
    shutil.copytree(FIXTURE, to)
    return StoreConfig(uri=to.as_uri())


def model_of(key: str) -> type[Record] | None:
    """The record model of a key the store layout gives it (None: data, not a record)."""
    if key.endswith("/CURRENT") or "/history/" in key:
        return Pointer
    if key.endswith("/manifest.json"):
        return Manifest
    if "/refused/" in key:
        return Refusal
    if key.startswith("ledger/"):
        return LedgerEntry
    if key.startswith("catchup/") and key.endswith("/STATE"):
        return CatchupState
    if key == layout.continuous_heartbeat_key("delta"):
        return Heartbeat
    if key.startswith("runtime/"):
        return RuntimeRecord
    if key.startswith("quarantine/") and key.endswith(".jsonl"):
        return QuarantineLine
    if key.startswith("quarantine/") and key.endswith(".done"):
        return QuarantineDone
    return None


def read_all(store: ObjectStore) -> list[tuple[str, Record]]:
    """Every record in the store, read through its model (a delta manifest's segments too)."""
    out: list[tuple[str, Record]] = []
    for obj in store.iter_objects(""):
        model = model_of(obj.key)
        if model is None:
            continue
        if model is QuarantineLine:
            lines = store.get(obj.key).data.decode("utf-8").splitlines()
            out += [(obj.key, QuarantineLine.from_json(json.loads(line))) for line in lines if line]
            continue
        record = model.read(store, obj.key)[0]
        out.append((obj.key, record))
        if isinstance(record, Manifest):
            out += [(obj.key, seg) for seg in record.segment_list() or ()]
    return out


def top_hits(searcher: Searcher, query: str) -> list[list[str]]:
    return [[h.ad_id, h.index] for h in searcher.search(query, k=K)]


# ------------------------------------------------------------------------------------ the v0 store


def test_every_record_kind_reads_through_its_model_as_format_0(tmp_path: Path) -> None:
    store = open_store(copy_fixture(tmp_path / "store"))
    records = read_all(store)
    assert {type(r) for _, r in records} == ALL_KINDS
    assert all(r.format_version == 0 for _, r in records), [k for k, r in records if r.format_version != 0]
    # What the fixture was made to hold: both indexes, a bucket, folded and refused decisions, a refusal.
    delta, _ = Pointer.current(store, "delta")
    assert delta is not None and delta.seq == 2 and Pointer.history(store, "delta", 1).seq == 1
    manifest = Manifest.of(store, "delta", delta.version)
    assert manifest.build == "incremental" and len(manifest.segment_list() or ()) == 2
    assert Manifest.of(store, "full", Pointer.current(store, "full")[0].version).index_format  # type: ignore[union-attr]
    assert Pointer.current(store, layout.bucket_name("ads_hourly", parse_hour_id("20261120T03")))[0] is not None
    decisions = {r.decision for _, r in records if isinstance(r, LedgerEntry)}
    assert {"folded", "refused", "published", "not_listed"} <= decisions
    assert any(isinstance(r, Refusal) and r.outcome == "unchanged" for _, r in records)
    state, etag = CatchupState.load(store, "ads_hourly")
    assert etag is not None and state.frontier == "20261120T02" and state.format_version == 0


def test_searcher_serves_the_v0_store_with_the_same_answer(tmp_path: Path) -> None:
    searcher = Searcher(open_store(copy_fixture(tmp_path / "store")), tmp_path / "cache")
    assert {q: top_hits(searcher, q) for q in EXPECTED_HITS} == EXPECTED_HITS


def test_cli_ledger_reads_the_v0_ledger(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = copy_fixture(tmp_path / "store")
    on_disk = sorted(p for p in (tmp_path / "store" / "ledger").rglob("*.json"))
    assert cli.main(["ledger", "--store", cfg.uri, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    started = [p for p in on_disk if p.name.endswith(".run.json")]  # folded into their attempt's row
    assert len(rows) == len(on_disk) - len(started)
    assert {r["pipeline"] for r in rows} == {"delta", "full", "ads_hourly"}
    assert {r[VERSION_KEY] for r in rows} == {0}
    folded = [r for r in rows if r["decision"] == "folded"]
    assert folded and all(r["extra"]["folded_into"] for r in folded)
    assert any(r["decision"] == "refused" and r["trigger_id"].startswith("20261120T0910.refused-") for r in rows)
    assert cli.main(["ledger", "--store", cfg.uri, "--partition", "20261120T0915"]) == 0
    assert "folded" in capsys.readouterr().out


def test_a_delta_micro_batch_publishes_format_1_over_the_v0_store(
        local_store_config: StoreConfig, make_harness: Any, tmp_path: Path) -> None:
    copy_fixture(Path(local_store_config.uri.removeprefix("file://")))
    h: Harness = make_harness(**SETTINGS)
    before, _ = Pointer.current(h.store, "delta")
    assert before is not None and before.format_version == 0
    h.write(30, GEN)
    reqs = h.tick().run_requests
    assert len(reqs) == 1
    assert h.run(reqs[0]).success
    after, _ = Pointer.current(h.store, "delta")
    assert after is not None and after.seq == before.seq + 1 and after.previous_version == before.version
    raw_pointer = h.store.get_json(layout.pointer_key("delta"))[0]
    assert after.format_version == raw_pointer[VERSION_KEY] == CURRENT_FORMAT == 1
    manifest = Manifest.of(h.store, "delta", after.version)
    assert manifest.format_version == 1 and manifest.based_on == before.version
    kept = Manifest.of(h.store, "delta", before.version).segment_list() or []
    assert [s.version for s in manifest.segment_list() or []][:len(kept)] == [s.version for s in kept]
    assert Pointer.history(h.store, "delta", after.seq).format_version == 1
    assert Pointer.history(h.store, "delta", before.seq).format_version == 0  # create-once: never rewritten
    entry = LedgerEntry.read(h.store, layout.ledger_key("delta", "2026-11-20", "20261120T0930"))[0]
    assert entry.decision == "published" and entry.format_version == 1
    searcher = Searcher(h.store, tmp_path / "cache")
    hits = searcher.search(" OR ".join(q for q in EXPECTED_HITS), k=50)
    assert {h.version for h in hits if h.index == "delta"} == {after.version}


# ------------------------------------------------------------------------------------ round trips


def fixture_dict(key: str) -> dict[str, Any]:
    return dict(json.loads((FIXTURE / key).read_text()))


def first(pattern: str) -> str:
    return sorted(p.relative_to(FIXTURE).as_posix() for p in FIXTURE.glob(pattern))[0]


def v0_samples() -> list[tuple[type[Record], dict[str, Any]]]:
    """One stored format-0 body of each kind, from the fixture."""
    pointer = fixture_dict("indexes/delta/CURRENT")
    manifest = fixture_dict(pointer["manifest"])  # segment-built: its segments are sampled too
    quarantined = (FIXTURE / first("quarantine/**/*.jsonl")).read_text().splitlines()[0]
    return [
        (Pointer, pointer), (Pointer, fixture_dict("indexes/full/history/000000000001.json")),
        (Manifest, manifest), (Segment, manifest["segments"][0]),
        (Refusal, fixture_dict(first("indexes/full/refused/*.json"))),
        (LedgerEntry, fixture_dict("ledger/delta/2026-11-20/20261120T0915.json")),
        (LedgerEntry, fixture_dict("ledger/delta/2026-11-20/20261120T0400.gap.json")),
        (CatchupState, fixture_dict("catchup/ads_hourly/STATE")),
        (Heartbeat, fixture_dict(layout.continuous_heartbeat_key("delta"))),
        (RuntimeRecord, fixture_dict("runtime/spark-server.json")),
        (QuarantineLine, json.loads(quarantined)), (QuarantineDone, fixture_dict(first("quarantine/**/*.done"))),
    ]


@pytest.mark.parametrize(("model", "body"), v0_samples(), ids=lambda x: getattr(x, "KIND", ""))
def test_a_v0_body_upgrades_and_the_latest_round_trips(model: type[Record], body: dict[str, Any]) -> None:
    assert VERSION_KEY not in body
    record = model.from_json(body)
    assert record.format_version == 0
    latest = record.to_json()
    assert latest[VERSION_KEY] == CURRENT_FORMAT
    # Format 1 only tags the body: every stored key and value survives the upgrade.
    assert {k: latest[k] for k in body} == body
    again = model.from_json(json.loads(json.dumps(latest)))
    assert again == record and again.format_version == CURRENT_FORMAT and again.to_json() == latest


@pytest.mark.parametrize(("model", "older"), [
    (Pointer, {"index": "delta", "version": "v", "seq": 1, "position": "p", "manifest": "m", "doc_count": 1,
               "published_at": "t"}),
    (Segment, {"version": "v", "position": "p", "kind": "incremental", "shards": [], "doc_count": 0,
               "covered_count": 0, "files": [], "listed_at": "t"}),
    (Heartbeat, {"run_id": "r", "started_at": "2026-11-20T09:00:00Z", "last_tick": "2026-11-20T09:01:00Z"}),
    (Manifest, {"index": "delta", "version": "v", "position": "p", "run_id": None, "shards": [], "doc_count": 0,
                "num_shards": 0}),
    (LedgerEntry, {"pipeline": "delta", "trigger_id": "t", "decision": "folded", "reason": "r"}),
    (CatchupState, {}),
    (RuntimeRecord, {"state_dir": "/x", "hostname": "h"}),
], ids=lambda x: getattr(x, "KIND", ""))
def test_fields_older_writers_omitted_read_as_their_defaults(model: type[Record], older: dict[str, Any]) -> None:
    record = model.from_json(older)
    assert record.format_version == 0
    assert model.from_json(record.to_json()) == record


def test_unknown_keys_are_dropped_and_newer_or_malformed_records_refused() -> None:
    body = fixture_dict("indexes/delta/CURRENT")
    assert Pointer.from_json({**body, "written_by_a_newer_release": 1}) == Pointer.from_json(body)
    with pytest.raises(RecordError, match="newer"):
        Pointer.from_json({**body, VERSION_KEY: CURRENT_FORMAT + 1})
    with pytest.raises(RecordError):
        Pointer.from_json({k: v for k, v in body.items() if k != "seq"})
    with pytest.raises(RecordError):
        Pointer.from_json(["not", "an", "object"])


def test_a_record_written_through_the_store_is_its_latest_serialized_form(tmp_path: Path) -> None:
    store = open_store(StoreConfig(uri=(tmp_path / "store").as_uri()))
    hb = Heartbeat.from_json(fixture_dict(layout.continuous_heartbeat_key("delta")))
    hb.write(store, "delta")
    stored = store.get_json(layout.continuous_heartbeat_key("delta"))[0]
    assert stored == hb.to_json() and stored[VERSION_KEY] == CURRENT_FORMAT
    store.put_json("elsewhere.json", hb)  # handed to the store's JSON writer as the record itself
    assert store.get_json("elsewhere.json")[0] == stored
    state = CatchupState(frontier="20261120T05", parked=["20261120T04", "20261120T03", "20261120T04"])
    assert state.save(store, "ads_hourly", None)
    loaded, etag = CatchupState.load(store, "ads_hourly")
    assert loaded.parked == ["20261120T03", "20261120T04"] and loaded.format_version == CURRENT_FORMAT
    assert not state.save(store, "ads_hourly", None)  # CAS: it exists now
    assert CatchupState(frontier="x").save(store, "ads_hourly", etag)


def test_a_quarantine_line_keeps_only_what_it_says() -> None:
    line = QuarantineLine("raw/k.jsonl", 3, "{", "malformed_json")
    assert json.loads(line.jsonl()) == {"file": "raw/k.jsonl", "line": 3, "raw": "{", "reason": "malformed_json",
                                        VERSION_KEY: CURRENT_FORMAT}
    conflict = QuarantineLine("raw/k.jsonl", 4, "{}", "version_conflict", ad_id="ad-1", version=7)
    assert QuarantineLine.from_json(json.loads(conflict.jsonl())) == conflict


def test_the_fixture_is_small() -> None:
    files = [p for p in FIXTURE.rglob("*") if p.is_file()]
    assert len(files) < 300 and sum(p.stat().st_size for p in files) < 1_000_000
