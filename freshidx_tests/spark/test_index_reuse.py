"""A shard built over the same shard's index of the version it replaces (freshidx.spark.index_reuse): it
serves what a fresh build serves, indexes again only what changed, and is built fresh when extending would
leave too many deleted documents or when the base does not add up. No Spark: the task code is called
directly, fed as the full-from-state bucket task feeds it (freshidx.full.executor)."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from freshidx.record_rules import ProductFeatures
from freshidx.spark.index_format import INDEX_DIR, META_FILE, IndexBuilder, index_files
from freshidx.spark.index_reuse import IndexBase, changed_products, reuse_pays
from freshidx.spark.index_shards import write_one_index_shard
from freshidx.spark.shards import DOCS_ARROW_SCHEMA, ShardCommit
from freshidx.spark.task_files import ShardFile, download_file
from freshidx.store import ObjectStore, StoreConfig, open_store
from freshidx_tests.spark.test_index_shards import COLUMNS, ad, docs_with_features, download_shard, open_index


def _table(ads: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist([{c: a[c] for c in COLUMNS} for a in ads], schema=DOCS_ARROW_SCHEMA)


def _served(config: StoreConfig, commit: ShardCommit, dest: Path) -> list[tuple[Any, ...]]:
    index = open_index(str(download_shard(open_store(config), commit, dest)))
    return sorted((d["ad_id"][0], d["product_id"][0], d["title"][0], d["bid"][0], d["version"][0], n, b)
                  for d, n, b in docs_with_features(index.searcher()))


def index_segments(store: ObjectStore, shard: dict[str, Any]) -> dict[str, int]:
    """``segment id -> max_doc`` of a shard's index (a ShardCommit dict), from its uploaded ``meta.json``."""
    key = next(str(f["key"]) for f in shard["files"] if str(f["key"]).endswith(INDEX_DIR + META_FILE))
    segments = json.loads(store.get(key).data)["segments"]
    return {str(m["segment_id"]).replace("-", ""): int(m["max_doc"]) for m in segments}


def _segments(config: StoreConfig, commit: ShardCommit) -> dict[str, int]:
    return index_segments(open_store(config), commit.to_dict())


def _rebuild(config: StoreConfig, old: list[dict[str, Any]], v1: ShardCommit, changed: list[dict[str, Any]],
             version: str, share: float, old_fed: list[dict[str, Any]] | None = None) -> ShardCommit:
    """The bucket task of a full build from state: the base's rows minus the changed ads, then the changed
    rows, over ``v1``'s index (``old_fed``: the base rows the task is told of, by default ``old``)."""
    gone = pa.array(sorted({a["ad_id"] for a in changed}), pa.string())
    base = IndexBase([f for f in v1.files if "/" + INDEX_DIR in f.key],
                     new_ids=pa.array([a["ad_id"] for a in changed], pa.string()), max_deleted_share=share)
    fed = _table([a for a in (old if old_fed is None else old_fed) if a["status"] == "active"])
    for b in fed.to_batches(max_chunksize=64):
        base.add_old(b, pc.is_in(b.column("ad_id"), value_set=gone).fill_null(False))
    kept = _table([a for a in old if a["ad_id"] not in set(gone.to_pylist())])
    rows = [*kept.to_batches(max_chunksize=64), *_table(changed).to_batches()]
    return write_one_index_shard(config, "full", version, 0, 0, rows, base=base)


def _catalog() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    old = [ad(i, product=i % 20, status="paused" if i % 17 == 0 else "active") for i in range(200)]
    changed = [
        ad(3, product=3, bid=99.0, version=2),                 # the best bid of product 3: its ads again
        ad(5, product=5, status="deleted", version=2),         # product 5 loses an ad
        ad(7, product=15, version=2),                          # moves: products 7 and 15 change
        ad(11, product=11, title="renamed widget", version=2),  # its own document only
        ad(13, product=13, status="paused", version=2),
        ad(250, product=2, bid=0.1, version=1),                # new in product 2: one more ad
        ad(9, product=9),                                      # re-emitted as it was: nothing to index
        ad(29, product=9, keywords=["kw29", "gizmo", "x"]),    # same product, another document
    ]
    return old, changed


@pytest.fixture()
def config(tmp_path: Path) -> StoreConfig:
    return StoreConfig(uri=(tmp_path / "store").as_uri())


def test_an_extended_shard_serves_what_a_fresh_build_serves_and_indexes_only_the_change(
        config: StoreConfig, tmp_path: Path) -> None:
    old, changed = _catalog()
    v1 = write_one_index_shard(config, "full", "v1", 0, 0, _table(old).to_batches())
    extended = _rebuild(config, old, v1, changed, "v2", share=1.0)
    fresh = _rebuild(config, old, v1, changed, "v2f", share=0.0)
    assert _served(config, extended, tmp_path / "e") == _served(config, fresh, tmp_path / "f")
    assert extended.doc_count == fresh.doc_count == 200 - 12 + 1 - 2  # 12 paused; ad 5 deleted, 13 paused; +250
    # The extension keeps v1's segment and adds one of the documents that changed: the changed ads that are
    # active (3, 7, 11, 29, 250; not 9, whose row came again unchanged) and the other active ads of products 2, 3,
    # 5, 7, 13 and 15, whose features changed.
    before, after = _segments(config, v1), _segments(config, extended)
    assert set(before) < set(after)
    products = {"p-002", "p-003", "p-005", "p-007", "p-013", "p-015"}
    again = {a["ad_id"] for a in old if a["product_id"] in products and a["status"] == "active"}
    again = (again - {"ad-0005", "ad-0007", "ad-0013"}) | {"ad-0007", "ad-0011", "ad-0250", "ad-0029"}
    (new_segment,) = set(after) - set(before)
    assert after[new_segment] == len(again)
    assert set(_segments(config, fresh)).isdisjoint(before)  # share 0: indexed whole


def test_a_shard_whose_deleted_share_would_pass_the_setting_is_indexed_whole(config: StoreConfig,
                                                                              tmp_path: Path) -> None:
    old, changed = _catalog()
    v1 = write_one_index_shard(config, "full", "v1", 0, 0, _table(old).to_batches())
    assert not set(_segments(config, _rebuild(config, old, v1, changed, "v2", share=0.05))) & set(_segments(config, v1))
    v2 = _rebuild(config, old, v1, changed, "v3", share=0.5)
    assert set(_segments(config, v1)) < set(_segments(config, v2))


def test_a_base_that_does_not_add_up_is_indexed_whole(config: StoreConfig, tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    old, changed = _catalog()
    v1 = write_one_index_shard(config, "full", "v1", 0, 0, _table(old).to_batches())
    # The task is told of a base without ad 40 (and the new version has no row for it either): the copy of
    # v1's index would still serve it.
    without = [a for a in old if a["ad_id"] != "ad-0040"]
    with caplog.at_level(logging.WARNING, logger="freshidx.spark.index_reuse"):
        v2 = _rebuild(config, without, v1, changed, "v2", share=1.0, old_fed=without)
    assert "building it fresh" in caplog.text
    fresh = _rebuild(config, without, v1, changed, "v2f", share=0.0)
    assert _served(config, v2, tmp_path / "e") == _served(config, fresh, tmp_path / "f")
    assert "ad-0040" not in {row[0] for row in _served(config, v2, tmp_path / "g")}


def test_whether_extending_pays() -> None:
    assert reuse_pays(1000, 0, 250, 0, 0.25)
    assert not reuse_pays(1000, 0, 251, 0, 0.25)
    assert reuse_pays(1000, 100, 150, 0, 0.25)       # earlier builds' deletes count
    assert not reuse_pays(1000, 100, 151, 0, 0.25)
    assert reuse_pays(1000, 0, 275, 100, 0.25)       # the added documents grow the index
    assert not reuse_pays(0, 0, 0, 10, 1.0)          # nothing to extend
    assert not reuse_pays(1000, 0, 0, 0, 0.0)        # off


def test_changed_products_compares_features_as_documents_hold_them() -> None:
    def table(rows: list[tuple[str, int, float | None]]) -> pa.Table:
        f = ProductFeatures()
        t = f.table()
        return pa.Table.from_pylist([{"product_id": p, "n": n, "best": b} for p, n, b in rows], schema=t.schema)
    old = table([("same", 2, 3.0), ("count", 2, 3.0), ("best", 2, 3.0), ("nobid", 1, None), ("gone", 1, 1.0)])
    new = table([("same", 2, 3.0), ("count", 3, 3.0), ("best", 2, 4.0), ("nobid", 1, 0.0), ("born", 1, 1.0)])
    assert sorted(changed_products(old, new).to_pylist()) == ["best", "born", "count", "gone"]


def test_an_index_lists_only_the_deletes_its_meta_names(tmp_path: Path) -> None:
    path = str(tmp_path / "index")
    rows = _table([ad(i, product=i % 3) for i in range(10)])
    features = ProductFeatures()
    features.add(rows)
    for deleted in (None, "ad-0001", "ad-0002"):
        builder = IndexBuilder(path)
        if deleted is None:
            builder.add_batch(features.attach(rows))
        else:
            builder.delete_terms("ad_id", [deleted])
        builder.finish()
    meta = json.loads((tmp_path / "index" / "meta.json").read_text())
    (segment,) = meta["segments"]
    seg = segment["segment_id"].replace("-", "")
    (tmp_path / "index" / f"{seg}.1.del").write_bytes(b"")  # an earlier build's deletes, left behind
    dels = [n for n in index_files(path) if n.endswith(".del")]
    assert dels == [f"{seg}.{segment['deletes']['opstamp']}.del"]
    assert segment["deletes"]["num_deleted_docs"] == 2


def test_a_download_that_does_not_match_its_manifest_fails(config: StoreConfig, tmp_path: Path) -> None:
    store = open_store(config)
    store.put("x/file", b"abc")
    good = ShardFile(key="x/file", bytes=3, sha256=hashlib.sha256(b"abc").hexdigest(), rows=0)
    download_file(config.arrow_fs(), config, good, str(tmp_path / "ok"))
    assert (tmp_path / "ok").read_bytes() == b"abc"
    with pytest.raises(OSError, match="sha256"):
        download_file(config.arrow_fs(), config, ShardFile("x/file", 3, "0" * 64, 0), str(tmp_path / "bad"))
