"""A title change, a delete, and a full rebuild, seen through `Searcher`, via the real Dagster assets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dagster as dg

from freshidx.publish.commit import read_pointer
from freshidx.serve.searcher import Hit, Searcher
from freshidx.store import StoreConfig, layout
from freshidx.tools.generate import GeneratorConfig, partition_base_version
from freshidx_tests.conftest import make_s3_config
from freshidx_tests.support.harness import Harness, at

GEN = GeneratorConfig(seed=11, ads=200, products=40, changes_per_partition=60, malformed_rate=0.0,
                      delete_rate=0.0, pause_rate=0.0, burst_probability=0.0)
NEW_TITLE = "zanzibar quokka lantern"


def change(h: Harness, minutes: int, hit: Hit, **fields: Any) -> None:
    """Upstream writes a partition with one record for the hit's ad (newer than anything before)."""
    p = at(minutes)
    rec = {"ad_id": hit.ad_id, "campaign_id": "cmp-e2e", "product_id": hit.product_id, "title": "x",
           "keywords": ["k"], "bid": 1.0, "status": "active",
           "updated_at": p.at.strftime("%Y-%m-%dT%H:%M:%S.000Z"), "version": partition_base_version(p) + 999}
    rec.update(fields)
    h.store.put(layout.raw_partition_prefix("ad_updates", p) + "part-00000.jsonl", (json.dumps(rec) + "\n").encode())


def hits(s: Searcher, q: str) -> list[tuple[str, str]]:
    s.refresh()
    return [(h.ad_id, h.index) for h in s.search(q, k=200)]


def scenario(cfg: StoreConfig, cache: Path) -> dict[str, Any]:
    with dg.instance_for_test() as instance:
        h = Harness(cfg, instance, full_max_age_seconds=10**9)
        try:
            for m in range(0, 30, 5):
                h.write(m, GEN)
            assert h.run(dg.RunRequest(asset_selection=[dg.AssetKey("full_index")])).success
            full, _ = read_pointer(h.store, "full")
            assert full is not None
            s = Searcher(h.store, cache)
            # Pick an ad the full index holds, and its current title.
            target = next(x for x in s.search("ads OR new OR sale OR pro OR max", k=50) if x.index == "full")
            victim = next(x for x in s.search("ads OR new OR sale OR pro OR max", k=50)
                          if x.index == "full" and x.ad_id != target.ad_id and x.product_id != target.product_id)
            old_title = target.title
            assert (target.ad_id, "full") in hits(s, old_title)

            change(h, 35, target, title=NEW_TITLE)
            change(h, 40, victim, status="deleted", title=victim.title)
            req = h.tick().run_requests[0]
            assert h.run(req).success
            after_delta = {
                "new": hits(s, NEW_TITLE),
                "old": hits(s, old_title),
                "victim": hits(s, victim.title),
            }
            assert (target.ad_id, "delta") in after_delta["new"]
            assert target.ad_id not in [a for a, _ in after_delta["old"]]  # stale full copy hidden
            assert victim.ad_id not in [a for a, _ in after_delta["victim"]]
            # ... although the full index still holds the deleted ad:
            assert read_pointer(h.store, "full")[0].version == full.version  # type: ignore[union-attr]

            assert h.run(dg.RunRequest(asset_selection=[dg.AssetKey("full_index")])).success
            after_full = {"new": hits(s, NEW_TITLE), "old": hits(s, old_title), "victim": hits(s, victim.title)}
            assert [a for a, _ in after_full["new"]].count(target.ad_id) == 1
            assert target.ad_id not in [a for a, _ in after_full["old"]]
            assert victim.ad_id not in [a for a, _ in after_full["victim"]]
            return {"delta": {k: sorted(a for a, _ in v) for k, v in after_delta.items()},
                    "full": {k: sorted(a for a, _ in v) for k, v in after_full.items()},
                    "target": target.ad_id, "victim": victim.ad_id}
        finally:
            h.close()


def test_title_change_delete_and_full_rebuild_local_and_s3(
    tmp_path: Path, moto_endpoint: str, spark: Any
) -> None:
    local = scenario(StoreConfig(uri=(tmp_path / "store").as_uri()), tmp_path / "cache-local")
    s3 = scenario(make_s3_config(moto_endpoint), tmp_path / "cache-s3")
    assert local == s3  # identical answers whether the store is a directory or S3
