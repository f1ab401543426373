"""A full version built from state (docs/architecture.md#full-index-from-state) is the full version built from every raw
partition: the same documents with the same product features, the same kill-list, each product in the
same shard; and what search answers stays right across state builds in a row.

Arrivals as in the equivalence test (updates, deletes, pauses, products moving, versions out of order,
re-deliveries, late partitions behind the watermark), a full index first built from raw, micro-batches,
then full builds from state; the reference is a raw build of the same store at the same cutoff, staged
but never published.
"""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow.parquet as pq

from freshidx.full.full_build import build_full
from freshidx.full.full_plan import FullBuildKind
from freshidx.publish.commit import DraftManifest, parse_iso, read_manifest, read_pointer
from freshidx.serve import status
from freshidx.serve.searcher import Searcher
from freshidx.spark.shards import COVERED_FILE, DOCS_FILE, ShardCommit
from freshidx.store import ObjectStore, StoreConfig
from freshidx.store.partitions import PartitionId
from freshidx_tests.delta.test_incremental_equivalence import (
    WORDS,
    _batch,
    _micro_batch,
    _write,
    expected,
    first_full,
    served,
)
from freshidx_tests.spark.test_index_reuse import index_segments
from freshidx_tests.spark.test_index_shards import docs_with_features, download_shard, open_index
from freshidx_tests.support.harness import Harness, at

FULL = dg.RunRequest(asset_selection=[dg.AssetKey("full_index")])
FROM_RAW = dg.RunRequest(asset_selection=[dg.AssetKey("full_index")],
                         run_config={"ops": {"full_index": {"config": {"from_raw": True}}}})


def version_view(store: ObjectStore, shards: list[dict[str, Any]], tmp: Path) -> dict[str, Any]:
    """Everything a full version serves and knows, shard by shard: indexed documents with their product
    features, the docs.parquet rows, the kill-list rows, and which shard holds each product."""
    docs: dict[str, tuple[Any, ...]] = {}
    rows: set[tuple[Any, ...]] = set()
    covered: set[tuple[Any, ...]] = set()
    shard_of: dict[str, int] = {}
    for d in shards:
        c = ShardCommit.from_dict(d)
        index = open_index(str(download_shard(store, c, tmp / f"s{c.shard}-{c.attempt}-{len(docs)}")))
        for doc, na, b in docs_with_features(index.searcher()):
            docs[doc["ad_id"][0]] = (c.shard, doc["title"][0], doc["product_id"][0], doc["bid"][0],
                                     doc["version"][0], na, b)
        for f in c.files:
            name = f.key.rsplit("/", 1)[-1]
            if name not in (DOCS_FILE, COVERED_FILE):
                continue
            table = pq.read_table(io.BytesIO(store.get(f.key).data)).to_pylist()
            for r in table:
                if name == DOCS_FILE:
                    rows.add((r["ad_id"], r["version"], r["product_id"], r["title"], tuple(r["keywords"] or ()),
                              r["bid"], r["status"]))
                    shard_of.setdefault(r["product_id"], c.shard)
                    assert shard_of[r["product_id"]] == c.shard, f"product {r['product_id']} in two shards"
                else:
                    covered.add((r["ad_id"], r["version"], r["status"]))
    return {"docs": docs, "rows": rows, "covered": covered, "shard_of": shard_of}


def _serving_full(h: Harness) -> dict[str, Any]:
    pointer, _ = read_pointer(h.store, "full")
    assert pointer is not None
    return read_manifest(h.store, "full", pointer.version)


def _raw_reference(h: Harness, spark: Any, cutoff: str) -> DraftManifest:
    """A raw build of the same store at the same cutoff: staged, never published."""
    return build_full(spark, h.store, StoreConfig(uri=h.settings.store), h.settings,
                      cutoff=PartitionId(parse_iso(cutoff)), run_id="reference", run_info={}, force_raw=True)


def _check_answers(h: Harness, s: Searcher, sent: list[dict[str, Any]]) -> None:
    got = served(s)
    want = {w: expected(sent, w) for w in WORDS}
    assert {w: got[w] for w in WORDS} == want


def test_full_from_state_equals_full_from_raw(tmp_path: Path, spark: Any) -> None:
    cfg = StoreConfig(uri=(tmp_path / "store").as_uri())
    rng = random.Random(7)
    sent: list[dict[str, Any]] = []
    with dg.instance_for_test() as instance:
        # Every shard extends its base's index (freshidx.spark.index_reuse) however much of it changes (here
        # nearly all of it: six products); the reference is indexed whole.
        h = Harness(cfg, instance, window_minutes=120, full_max_age_seconds=10**9, full_shards=3,
                    full_reuse_deleted_share=1.0)
        try:
            minute = first_full(h, rng, sent, 30)
            first = _serving_full(h)
            assert first["inputs"]["build"] == FullBuildKind.RAW and first["inputs"]["raw_reason"] == "no_full"
            s = Searcher(h.store, tmp_path / "cache")
            for round_ in range(2):
                for step in range(4):
                    sent += (b := _batch(rng, minute, sent, 30))
                    _write(h, minute, b)
                    if step in (1, 2):  # late: behind the watermark, and before the full cutoff
                        late = minute - 5 * rng.randint(1, 4)
                        sent += (b := _batch(rng, late, sent, 30))
                        _write(h, late, b, name=f"late-{round_}-{step}.jsonl")
                    minute += 5
                    _micro_batch(h)
                    _check_answers(h, s, sent)
                delta, _ = read_pointer(h.store, "delta")
                assert delta is not None
                result = h.run(FULL)
                assert result.success
                (mat,) = result.asset_materializations_for_node("full_index")
                built = _serving_full(h)
                inputs = built["inputs"]
                # From state, at the delta's position, over every segment newer than the previous cutoff.
                assert inputs["build"] == FullBuildKind.STATE, inputs
                assert mat.metadata["build"].value == "state" and mat.metadata["segments_used"].value >= 4
                assert built["cutoff"] == delta.position and inputs["state_chain"] == round_ + 1
                assert inputs["base_full_version"] == (first["version"] if round_ == 0 else inputs["state_bases"][0])
                reference = _raw_reference(h, spark, built["cutoff"])
                assert reference.inputs["build"] == FullBuildKind.RAW
                assert reference.inputs["files_sha256"] == inputs["files_sha256"]  # the same raw files
                got = version_view(h.store, built["shards"], tmp_path / f"got{round_}")
                want = version_view(h.store, reference.shards, tmp_path / f"want{round_}")
                assert got["docs"] == want["docs"]
                assert got["rows"] == want["rows"] and got["covered"] == want["covered"]
                assert got["shard_of"] == want["shard_of"]
                assert built["doc_count"] == reference.doc_count and len(got["docs"]) == reference.doc_count
                _check_answers(h, s, sent)
                shown = status.render(status.collect(h.store, "ad_updates"))
                assert (f"built from state: full {inputs['base_full_version']} + {len(inputs['segments_used'])} "
                        f"delta segments ({round_ + 1} state builds in a row)") in shown, shown
            # Asked for (launchpad `from_raw`): every partition read again; the chain starts over after it.
            for _ in range(2):
                sent += (b := _batch(rng, minute, sent, 30))
                _write(h, minute, b)
                minute += 5
                _micro_batch(h)
                assert h.run(FROM_RAW if _ == 0 else FULL).success
                inputs = _serving_full(h)["inputs"]
                if _ == 0:
                    assert (inputs["build"], inputs["raw_reason"], inputs["state_chain"]) == ("raw", "forced", 0)
                    assert "built from every raw partition (forced)" in status.render(
                        status.collect(h.store, "ad_updates"))
                else:
                    assert (inputs["build"], inputs["state_chain"]) == ("state", 1), inputs
                _check_answers(h, s, sent)
        finally:
            h.close()


def _ad(i: int, minutes: int, bid: float, title: str = "amber birch") -> dict[str, Any]:
    return {"ad_id": f"ad-{i}", "campaign_id": "cmp", "product_id": f"p-{i % 40}", "title": title,
            "keywords": ["k"], "bid": bid, "status": "active",
            "updated_at": at(minutes).at.strftime("%Y-%m-%dT%H:%M:%S.000Z"), "version": minutes + 1}


def test_a_full_from_state_indexes_again_only_what_changed(tmp_path: Path, spark: Any) -> None:
    """120 ads in 40 products; then one ad renamed (its product's features stay) and one ad's bid raised above
    its product's best (its product's three ads change): the full build from state keeps every segment of the
    serving shards' indexes and indexes four documents, and serves what a raw build serves."""
    cfg = StoreConfig(uri=(tmp_path / "store").as_uri())
    with dg.instance_for_test() as instance:
        h = Harness(cfg, instance, window_minutes=120, full_max_age_seconds=10**9, full_shards=2)
        try:
            _write(h, 0, [_ad(i, 0, bid=1.0 + i / 100) for i in range(120)])
            assert h.run(FULL).success
            base = _serving_full(h)
            _write(h, 5, [_ad(1, 5, bid=1.01, title="cobalt dune"), _ad(2, 5, bid=50.0)])
            _micro_batch(h)
            assert h.run(FULL).success
            built = _serving_full(h)
            assert built["inputs"]["build"] == FullBuildKind.STATE
            before = [index_segments(h.store, s) for s in base["shards"]]
            after = [index_segments(h.store, s) for s in built["shards"]]
            assert all(set(b) <= set(a) for b, a in zip(before, after, strict=True))
            assert sum(n for b, a in zip(before, after, strict=True) for seg, n in a.items() if seg not in b) == 4
            reference = _raw_reference(h, spark, built["cutoff"])
            got = version_view(h.store, built["shards"], tmp_path / "got")
            assert got["docs"] == version_view(h.store, reference.shards, tmp_path / "want")["docs"]
            assert got["docs"]["ad-1"][1] == "cobalt dune" and got["docs"]["ad-42"][-1] == 50.0
        finally:
            h.close()
