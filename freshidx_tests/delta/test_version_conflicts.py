"""(ad_id, version) conflicts and quarantine-once, on Spark; end to end on moto S3.

Two records with the same ``ad_id`` and ``version`` but different content are reported with every
copy (quarantine reason ``version_conflict``, raw line kept, counted in the manifest's
``invalid.conflicts`` and the materialization's ``version_conflicts``) and resolved by the documented,
order-independent rule (greatest ``updated_at``, then status paused > deleted > active, then the other
fields), the same in the delta, the full index and ``ads_hourly``. Identical duplicates are not
conflicts. Every bad record is quarantined once, by whichever build reads it first: late partitions
behind the delta watermark and history no delta window covered included.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from pyspark.sql import SparkSession

from freshidx.cli.quarantine import entries
from freshidx.publish.commit import read_manifest, read_pointer
from freshidx.serve.searcher import Searcher
from freshidx.spark import transform
from freshidx.store import StoreConfig, layout
from freshidx_tests.catchup.test_catchup import bucket_rows
from freshidx_tests.support.harness import Harness, at

SOURCE = "ad_updates"


def rec(ad: str, minutes: int, title: str, *, version: int = 1, seconds: int = 0, status: str = "active",
        bid: float = 1.0, spelled: bool = False) -> str:
    """One raw line; ``spelled`` writes the same record with other key order, spacing and zone notation."""
    t = at(minutes).at + dt.timedelta(seconds=seconds)
    body = {"ad_id": ad, "campaign_id": "c", "product_id": f"p-{ad}", "title": title, "keywords": ["k"],
            "bid": bid, "status": status, "updated_at": t.strftime("%Y-%m-%dT%H:%M:%S.000Z"), "version": version}
    if spelled:
        body["updated_at"] = t.strftime("%Y-%m-%dT%H:%M:%S+00:00")
        return json.dumps(dict(reversed(list(body.items()))), indent=None, separators=(" ,", ":  "))
    return json.dumps(body)


# --------------------------------------------------------------------------- the transform


def _lines(spark: SparkSession, rows: list[tuple[int, str, int, str]]) -> Any:
    parts = [(at(m).path, f"raw/{SOURCE}/{at(m).path}/{f}", n, raw) for m, f, n, raw in rows]
    return spark.createDataFrame(parts, "partition string, file string, line long, raw string")


def test_conflicts_report_every_copy_and_the_winner_is_order_independent(spark: SparkSession) -> None:
    rows = [
        (0, "a.jsonl", 1, rec("ad-1", 0, "first content")),
        (5, "b.jsonl", 1, rec("ad-1", 5, "second content", seconds=1)),  # later updated_at: wins
        (0, "a.jsonl", 2, rec("ad-2", 0, "same")),
        (5, "b.jsonl", 2, rec("ad-2", 0, "same", spelled=True)),  # identical content, other spelling
        (0, "a.jsonl", 3, rec("ad-3", 0, "tie", status="active")),
        (0, "a.jsonl", 4, rec("ad-3", 0, "tie", status="paused")),  # same time: paused beats active
        (5, "b.jsonl", 3, rec("ad-3", 0, "tie", status="deleted")),
        (0, "a.jsonl", 5, rec("ad-4", 0, "v1")),
        (0, "a.jsonl", 6, rec("ad-4", 0, "v2", version=2)),  # another version: no conflict
        (0, "a.jsonl", 7, "{not json"),
    ]
    winners: list[dict[str, Any]] = []
    for shuffle in range(3):  # the same copies in other orders and partitionings: the same answer
        order = list(rows)
        random.Random(shuffle).shuffle(order)
        parsed = transform.parse_records(_lines(spark, order).repartition(shuffle + 1))
        got = transform.version_conflicts(parsed).collect()
        by_key = Counter((r["ad_id"], r["version"]) for r in got)
        assert by_key == {("ad-1", 1): 2, ("ad-3", 1): 3}, by_key
        assert {r["reason"] for r in got} == {transform.REASON_VERSION_CONFLICT}
        raws = {r["raw"]: r for r in got}
        assert set(raws) == {rows[i][3] for i in (0, 1, 4, 5, 6)}  # every copy, verbatim
        won = sorted(r["raw"] for r in got if "this copy won" in r["detail"])
        assert won == sorted([rows[1][3], rows[5][3]])  # ad-1: later updated_at; ad-3: paused
        assert all("2 different contents" in raws[rows[i][3]]["detail"] for i in (0, 1))
        assert all("3 different contents" in raws[rows[i][3]]["detail"] for i in (4, 5, 6))
        assert all(transform.CONFLICT_RULE in r["detail"] for r in got)
        valid, _ = transform.split_valid(parsed)
        latest = {r["ad_id"]: r.asDict() for r in transform.latest_per_ad(valid).collect()}
        # The kept copy is the one reported as the winner.
        assert (latest["ad-1"]["title"], latest["ad-3"]["status"]) == ("second content", "paused")
        winners.append(latest)
    assert winners[0] == winners[1] == winners[2]


def test_the_cheap_pre_check_says_maybe_exactly_when_there_are_conflicts(spark: SparkSession) -> None:
    # The pre-check lets a build skip the conflict report; it must never say "none" for a real one.
    same = [(0, "a.jsonl", 1, rec("ad-2", 0, "same")), (5, "b.jsonl", 1, rec("ad-2", 0, "same", spelled=True)),
            (0, "a.jsonl", 2, rec("ad-4", 0, "v1")), (0, "a.jsonl", 3, rec("ad-4", 0, "v2", version=2)),
            (0, "a.jsonl", 4, "{not json")]
    assert not transform.may_have_version_conflicts(transform.parse_records(_lines(spark, same)))
    for i, differing in enumerate([rec("ad-2", 0, "same", seconds=1), rec("ad-2", 0, "same", status="paused"),
                                   rec("ad-2", 0, "other"), rec("ad-2", 0, "same", bid=2.5)]):
        parsed = transform.parse_records(_lines(spark, [*same, (5, "c.jsonl", 9, differing)]).repartition(i + 1))
        assert transform.may_have_version_conflicts(parsed), differing
        assert transform.version_conflicts(parsed).count() == 3  # and the exact report finds every copy
    # Spark's hash skips nulls, inside arrays too: missing vs empty keywords, null elements in other places.
    base = json.loads(rec("ad-5", 0, "kw"))
    for a, b in [(None, []), (["k", None], [None, "k"]), ([None], [])]:
        pair = [json.dumps({**base, "keywords": kw}) for kw in (a, b)]
        parsed = transform.parse_records(_lines(spark, [(0, "a.jsonl", 1, pair[0]), (5, "b.jsonl", 1, pair[1])]))
        assert transform.may_have_version_conflicts(parsed), pair
        assert transform.version_conflicts(parsed).count() == 2, pair


# --------------------------------------------------------------------------- delta, full, ads_hourly


def _put(h: Harness, minutes: int, name: str, lines: list[str]) -> str:
    key = layout.raw_partition_prefix(SOURCE, at(minutes)) + name
    h.store.put(key, "".join(line + "\n" for line in lines).encode())
    return key


def _quarantined(h: Harness) -> list[dict[str, Any]]:
    return [e for _, e in entries(h.store, SOURCE)]


def _invalid(h: Harness, index: str) -> dict[str, Any]:
    pointer, _ = read_pointer(h.store, index)
    assert pointer is not None
    return dict(read_manifest(h.store, index, pointer.version)["invalid"])


def test_conflicts_and_quarantine_once_across_delta_full_and_hourly(
    tmp_path: Path, spark: Any, s3_store_config: StoreConfig
) -> None:
    store_config = s3_store_config  # moto S3 (the store contract holds both stores to the same semantics)
    with dg.instance_for_test() as instance:
        h = Harness(store_config, instance)
        try:
            a = rec("ad-c", 0, "alpha conflict")
            b = rec("ad-c", 5, "beta conflict", seconds=30)  # the winner: greatest updated_at
            k0 = _put(h, 0, "part-0.jsonl", [rec("ad-ok", 0, "anchor one"), a, "{broken"])
            k5 = _put(h, 5, "part-0.jsonl", [b, rec("ad-ok", 0, "anchor one", spelled=True)])
            first = h.run(h.tick().run_requests[0])
            assert first.success
            inv = _invalid(h, "delta")
            assert inv["conflicts"]["ads"] == 1 and inv["conflicts"]["records"] == 2
            assert inv["conflicts"]["reported"] == {at(0).path: 1, at(5).path: 1}
            assert inv["reasons"] == {"malformed_json": 1}  # conflicts are valid records, counted apart
            mat = first.asset_materializations_for_node("delta_index")[0]
            assert mat.metadata["version_conflicts"].value == 1
            q = _quarantined(h)
            conflicts = sorted((e["file"], e["line"], "won" in e["detail"]) for e in q
                               if e["reason"] == "version_conflict")
            assert conflicts == [(k0, 2, False), (k5, 1, True)]
            assert {e["raw"] for e in q if e["reason"] == "version_conflict"} == {a, b}  # both copies, verbatim
            s = Searcher(h.store, tmp_path / "cache")
            s.refresh()
            assert [(x.ad_id, x.title) for x in s.search("conflict", k=10)] == [("ad-c", "beta conflict")]

            # Late data: a partition behind the watermark (inside the next window) with a third content
            # and a bad line, and history older than any window with another bad line.
            k2 = _put(h, 2, "late.jsonl", [rec("ad-c", 2, "gamma conflict", seconds=1), "{late broken"])
            old = _put(h, -400, "old.jsonl", [rec("ad-old", -400, "anchor old"), "{old broken"])
            _put(h, 10, "part-0.jsonl", [rec("ad-new", 10, "anchor new")])
            assert h.run(h.tick().run_requests[0]).success
            inv = _invalid(h, "delta")
            assert inv["conflicts"]["ads"] == 1 and inv["conflicts"]["records"] == 3
            assert inv["conflicts"]["reported"] == {at(2).path: 1}  # only the new copy; the others are there
            late = [e for e in _quarantined(h) if e["file"] == k2]
            assert sorted(e["reason"] for e in late) == ["malformed_json", "version_conflict"]  # the late partition

            full = h.run(dg.RunRequest(asset_selection=[dg.AssetKey("full_index")]))
            assert full.success
            inv = _invalid(h, "full")
            assert inv["count"] == 3 and inv["conflicts"]["ads"] == 1 and inv["conflicts"]["reported"] == {}
            # The full index quarantined only what no delta read: the history before every window.
            assert [(q["partition"], q["records"]) for q in inv["quarantine"]] == [(at(-400).path, 1)]
            assert [e["raw"] for e in _quarantined(h) if e["file"] == old] == ["{old broken"]

            hourly = h.run(dg.RunRequest(asset_selection=[dg.AssetKey("ads_hourly")],
                                         partition_key=at(0).dagster_hour_key))
            assert hourly.success
            bucket = layout.bucket_name("ads_hourly", at(0).hour_start)
            hinv = dict(read_manifest(h.store, bucket, read_pointer(h.store, bucket)[0].version)["invalid"])
            assert hinv["conflicts"]["ads"] == 1 and hinv["conflicts"]["records"] == 3
            assert hinv["quarantine"] == [] and hinv["conflicts"]["reported"] == {}  # all read before
            rows = [r for r in bucket_rows(h.store, store_config, layout.hour_id(at(0).hour_start))
                    if r["ad_id"] == "ad-c"]
            assert [(r["version"], r["title"]) for r in rows] == [(1, "beta conflict")]  # the same winner

            # Every bad record and every conflicting copy is in the quarantine exactly once.
            seen = Counter((e["file"], e["line"]) for e in _quarantined(h))
            assert set(seen.values()) == {1}, seen
            assert len(seen) == 3 + 3  # three broken lines, three copies of ad-c version 1
        finally:
            h.close()


@pytest.mark.parametrize("once", [True, False])
def test_hourly_build_quarantine_once_is_opt_in(spark: SparkSession, local_store_config: StoreConfig,
                                                once: bool) -> None:
    """``build_buckets`` writes every invalid record unless asked to skip files already quarantined."""
    from freshidx.catchup.hourly_build import HourInput, build_buckets
    from freshidx.store import open_store

    store = open_store(local_store_config)
    key = layout.raw_partition_prefix(SOURCE, at(0)) + "part-0.jsonl"
    store.put(key, (rec("ad-1", 0, "x") + "\n{broken\n").encode())
    hour = HourInput(hour=at(0).hour_start, files=[store.head(key)], listed_at=dt.datetime.now(dt.UTC))
    kw: dict[str, Any] = {"asset": "ads_hourly", "source": SOURCE, "hours": [hour], "quarantine_once": once}
    (first,) = build_buckets(spark, local_store_config, run_id="run-1", **kw)
    (second,) = build_buckets(spark, local_store_config, run_id="run-2", **kw)
    assert first.draft.invalid["count"] == second.draft.invalid["count"] == 1
    assert [q["records"] for q in first.draft.invalid["quarantine"]] == [1]
    assert [q["records"] for q in second.draft.invalid["quarantine"]] == ([] if once else [1])
