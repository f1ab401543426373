"""The full index's publication rule: same cutoff + newer inputs publishes.

A late partition older than the serving cutoff used to reach the full index only once a newer
partition existed (the rebuild with the same cutoff was refused as superseded). Now the rule,
``publish.compare_to_serving``, accepts the same cutoff with a different inputs digest listed after
the serving version's, and refuses the same digest as ``unchanged``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import Any

import dagster as dg

from freshidx.publish.commit import DraftManifest, iso, publish, read_manifest, read_pointer
from freshidx.serve.searcher import Searcher
from freshidx.store import ObjectStore, layout
from freshidx.tools.generate import partition_base_version
from freshidx.trigger import ledger
from freshidx_tests.publish.test_publish import draft
from freshidx_tests.serve.test_search_e2e import GEN
from freshidx_tests.support.harness import Harness, at

FULL = [dg.AssetKey("full_index")]


def full_draft(store: ObjectStore, cutoff_minutes: int, digest: str, listed_at: dt.datetime,
               files: int = 10) -> DraftManifest:
    d = draft(store, cutoff_minutes)
    return dataclasses.replace(d, index="full", cutoff=d.position, source_partition=None,
                               window_start=None, window_end=None,
                               inputs={"files_sha256": digest, "listed_at": iso(listed_at),
                                       "files": files, "partitions": files})


def test_rule_same_cutoff_newer_inputs_publish_same_inputs_unchanged(tmp_path: Path) -> None:
    from freshidx.store.local import LocalStore

    store = LocalStore(tmp_path / "s")
    t = dt.datetime(2026, 11, 21, 15, 0, tzinfo=dt.UTC)
    first = full_draft(store, 30, "a" * 64, t)
    assert publish(store, first).outcome == "published"
    same = full_draft(store, 30, "a" * 64, t + dt.timedelta(minutes=5))
    r = publish(store, same)
    assert r.outcome == "unchanged" and r.reason.startswith("unchanged:"), r
    assert store.get_json(layout.refusal_key("full", same.version))[0]["outcome"] == "unchanged"
    late = full_draft(store, 30, "b" * 64, t + dt.timedelta(minutes=10), files=11)
    r = publish(store, late)
    assert r.outcome == "published" and "newer inputs: 11 files" in r.reason, r
    # A slow rebuild that listed before the serving one must not regress the late data it holds.
    slow = full_draft(store, 30, "c" * 64, t + dt.timedelta(minutes=7))
    r = publish(store, slow)
    assert r.outcome == "superseded" and "not newer" in r.reason, r
    older = full_draft(store, 25, "d" * 64, t + dt.timedelta(minutes=20))
    assert publish(store, older).outcome == "superseded"
    assert read_pointer(store, "full")[0].version == late.version  # type: ignore[union-attr]
    # The delta keeps its rule: the same source partition again is superseded.
    assert publish(store, draft(store, 30)).outcome == "published"
    assert publish(store, draft(store, 30)).outcome == "superseded"


def late_record(h: Harness, minutes: int, ad_id: str, title: str) -> None:
    """A partition written late: older than the full cutoff, with one new ad."""
    p = at(minutes)
    rec: dict[str, Any] = {
        "ad_id": ad_id, "campaign_id": "cmp-late", "product_id": "prd-late", "title": title,
        "keywords": ["late"], "bid": 1.0, "status": "active",
        "updated_at": p.at.strftime("%Y-%m-%dT%H:%M:%S.000Z"), "version": partition_base_version(p) + 999,
    }
    h.store.put(layout.raw_partition_prefix("ad_updates", p) + "part-00000.jsonl", (json.dumps(rec) + "\n").encode())


def test_late_partition_older_than_the_cutoff_reaches_the_full_index_on_the_next_rebuild(
    make_harness: Any, spark: Any, tmp_path: Path
) -> None:
    h: Harness = make_harness(full_max_age_seconds=10**9)
    for m in range(0, 30, 5):
        h.write(m, GEN)
    assert h.run(dg.RunRequest(asset_selection=FULL)).success
    first, _ = read_pointer(h.store, "full")
    assert first is not None and first.cutoff == iso(at(25).at)
    before = read_manifest(h.store, "full", first.version)["inputs"]

    late_record(h, 12, "ad-late-0001", "zanzibar latecomer lantern")  # 12 < cutoff 25, no newer partition
    result = h.run(dg.RunRequest(asset_selection=FULL))
    assert result.success
    second, _ = read_pointer(h.store, "full")
    assert second is not None and second.version != first.version and second.cutoff == first.cutoff
    after = read_manifest(h.store, "full", second.version)["inputs"]
    assert after["partitions"] == before["partitions"] + 1 and after["files_sha256"] != before["files_sha256"]
    assert second.doc_count == first.doc_count + 1
    hits = Searcher(h.store, tmp_path / "cache").search("zanzibar latecomer lantern", k=10)
    assert [(x.ad_id, x.index, x.version) for x in hits] == [("ad-late-0001", "full", second.version)]
    entry = h.store.get_json(layout.ledger_key(
        "full", at(25).at.strftime("%Y-%m-%d"), f"{at(25).at:%Y%m%dT%H%M}-{second.version}"))[0]
    assert entry["decision"] == ledger.PUBLISHED and "newer inputs" in entry["reason"]

    # Nothing new since: the rebuild is refused as unchanged, the pointer stays, the run says so.
    again = h.run(dg.RunRequest(asset_selection=FULL))
    assert again.success
    assert read_pointer(h.store, "full")[0].version == second.version  # type: ignore[union-attr]
    run = h.instance.get_run_by_id(again.run_id)
    assert run is not None and run.tags.get("freshidx/outcome") == "unchanged"
    version = run.tags["freshidx/version"]
    refusal = h.store.get_json(layout.refusal_key("full", version))[0]
    assert refusal["outcome"] == "unchanged" and refusal["current_version"] == second.version
