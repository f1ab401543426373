"""A shard build that extends the same shard's index of the version it replaces, instead of indexing every
row again (docs/architecture.md#full-index-from-state).

A full version built from state keeps the serving full version's product buckets, and most of a bucket's
documents are the ones that version already serves: the same record with the same product features.
Indexing them again is most of such a build's time. So the bucket's task starts from a copy of that
shard's index (downloaded and checked against its manifest) and

* deletes the documents of the bucket's ads whose document changed (by ``ad_id``: a newer row that makes
  another document; the segments re-emit every ad of a product they touched, most of them unchanged) and
  of every product whose features changed (by ``product_id``),
* indexes those ads that are active now, the bucket's new ads and every active ad of those products, with
  the new features.

The result serves what a fresh build serves: each active ad's record with its product's features, once. The
task checks that the index holds as many live documents as ``docs.parquet`` has rows, and builds the
shard fresh when it does not. Deleted documents stay in their segments until tantivy merges them away and
still count in their terms' document frequencies (as in any Lucene-style index), so scores differ slightly
from a fresh build's, and each search that matches them pays for them: a shard whose deleted share would pass
``max_deleted_share`` (the ``full_reuse_deleted_share`` setting) is built fresh.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from freshidx.record_rules import ProductFeatures, equal_or_null, is_in
from freshidx.spark.index_format import DOCUMENT_COLUMNS, INDEX_DIR, META_FILE, IndexBuilder, live_doc_count
from freshidx.spark.task_files import ShardFile, download_file
from freshidx.store import StoreConfig

log = logging.getLogger(__name__)


@dataclass
class IndexBase:
    """The index a bucket's shard is built over, and what the task learns of it from the rows it reads.

    ``files``: that shard's index files (the serving full version's, under ``.../index/``). The task feeds
    :meth:`add_old` every batch of that shard's active rows, with the mask of those whose ad has a newer
    row; ``new_ids`` are the ads whose newer row is in this bucket."""

    files: list[ShardFile]
    new_ids: pa.Array
    max_deleted_share: float
    old_features: ProductFeatures = dataclasses.field(default_factory=ProductFeatures)
    changed_here: list[pa.Table] = dataclasses.field(default_factory=list)

    def add_old(self, active: pa.RecordBatch, changed: pa.Array) -> None:
        """One batch of the base's active rows, ``changed``: which of them have a newer row."""
        self.old_features.add(active)
        self.changed_here.append(_documents(active.filter(changed)))


@dataclass(frozen=True)
class ReusePlan:
    """What extending the base means: the documents to delete (by ad and by product) and the rows to index."""

    delete_ads: list[str]
    delete_products: list[str]
    rows: pa.Table


def reuse_pays(max_doc: int, deleted: int, deleting: int, adding: int, max_deleted_share: float) -> bool:
    """Whether to extend an index of ``max_doc`` documents (``deleted`` of them already deleted) by
    deleting ``deleting`` and adding ``adding``, rather than build it fresh."""
    if max_doc <= 0 or max_deleted_share <= 0:
        return False
    return (deleted + deleting) <= max_deleted_share * (max_doc + adding)


def changed_products(old: pa.Table, new: pa.Table) -> pa.Array:
    """The products (``ProductFeatures.table()`` of the base's rows and of the new rows) whose features,
    as a document holds them (``attach``: no bid is 0.0), differ, or that only one side has."""
    def served(t: pa.Table) -> pa.Table:
        return pa.table({"product_id": t.column("product_id"), "n": t.column("n"),
                         "best": pc.fill_null(t.column("best"), 0.0)})
    joined = served(old).join(served(new), "product_id", join_type="full outer",
                              left_suffix="_old", right_suffix="_new", use_threads=False)
    same = pc.and_(pc.equal(joined.column("n_old"), joined.column("n_new")),
                   pc.equal(joined.column("best_old"), joined.column("best_new"))).fill_null(False)
    return joined.column("product_id").filter(pc.invert(same)).combine_chunks()


def _documents(rows: pa.Table | pa.RecordBatch) -> pa.Table:
    """``rows``' :data:`DOCUMENT_COLUMNS`, ``keywords`` joined as a document holds them."""
    table = rows if isinstance(rows, pa.Table) else pa.Table.from_batches([rows])
    keywords = pc.binary_join(table.column("keywords"), " ")
    return pa.table([keywords if c == "keywords" else table.column(c) for c in DOCUMENT_COLUMNS],
                    names=list(DOCUMENT_COLUMNS))


def same_documents(old: pa.Table, new: pa.Table) -> pa.Array:
    """The ads (of :func:`_documents` tables ``old`` and ``new``, one row per ad each) whose rows make the same
    document on both sides: a segment's state rows re-emit every ad of a product it touched, changed or not."""
    joined = old.join(new, "ad_id", join_type="inner", left_suffix="_old", right_suffix="_new", use_threads=False)
    same = pa.array(np.ones(joined.num_rows, bool))
    for c in DOCUMENT_COLUMNS[1:]:
        same = pc.and_(same, equal_or_null(joined.column(f"{c}_old"), joined.column(f"{c}_new")))
    return joined.column("ad_id").filter(same).combine_chunks()


def plan_reuse(base: IndexBase, spilled: pa.Table, features: ProductFeatures) -> tuple[ReusePlan, int]:
    """The plan over ``base`` for ``spilled`` (every active row of the new shard) and ``features`` (theirs),
    and how many of the base's documents it deletes."""
    old = base.old_features.table()
    products = changed_products(old, features.table())
    old_n = pc.sum(old.column("n").filter(is_in(old.column("product_id"), products))).as_py() or 0
    newer = _documents(spilled.filter(is_in(spilled.column("ad_id"), base.new_ids)))
    gone = pa.concat_tables(base.changed_here) if base.changed_here else newer.slice(0, 0)
    same = same_documents(gone, newer)
    gone = gone.filter(pc.invert(is_in(gone.column("ad_id"), same)))
    elsewhere = pc.sum(pc.invert(is_in(gone.column("product_id"), products))).as_py() or 0
    ids = spilled.column("ad_id")
    reindex = pc.or_(pc.and_(is_in(ids, base.new_ids), pc.invert(is_in(ids, same))),
                     is_in(spilled.column("product_id"), products))
    plan = ReusePlan(delete_ads=gone.column("ad_id").to_pylist(), delete_products=products.drop_null().to_pylist(),
                     rows=spilled.filter(reindex))
    return plan, int(old_n) + int(elsewhere)


def fetch_base(fs: Any, config: StoreConfig, base: IndexBase, index_dir: str, wanted: Callable[[str], bool]) -> None:
    """Download the base's index files whose names are ``wanted`` into ``index_dir``, checked."""
    os.makedirs(index_dir, exist_ok=True)
    for f in base.files:
        name = f.key.rsplit(INDEX_DIR, 1)[-1]
        if wanted(name):
            download_file(fs, config, f, os.path.join(index_dir, name))


def base_counts(index_dir: str) -> tuple[int, int]:
    """``(max_doc, deleted)`` of the index whose ``meta.json`` is in ``index_dir``."""
    with open(os.path.join(index_dir, META_FILE), encoding="utf-8") as f:
        segments = json.load(f).get("segments", [])
    max_doc = sum(int(s["max_doc"]) for s in segments)
    deleted = sum(int((s.get("deletes") or {}).get("num_deleted_docs", 0)) for s in segments)
    return max_doc, deleted


def extend_base(fs: Any, config: StoreConfig, base: IndexBase, index_dir: str, spilled: pa.Table,
                features: ProductFeatures) -> int | None:
    """Build the shard in ``index_dir`` over ``base``: the live document count, or None when a fresh build
    is due instead (too many deletes, or a base that does not add up; ``index_dir`` is then left to the
    caller to empty)."""
    if base.max_deleted_share <= 0 or not base.files:
        return None
    fetch_base(fs, config, base, index_dir, lambda name: name == META_FILE)
    max_doc, deleted = base_counts(index_dir)
    plan, deleting = plan_reuse(base, spilled, features)
    if not reuse_pays(max_doc, deleted, deleting, plan.rows.num_rows, base.max_deleted_share):
        log.info("shard of %d documents (%d deleted): deleting %d, adding %d: indexed whole", max_doc, deleted,
                 deleting, plan.rows.num_rows)
        return None
    fetch_base(fs, config, base, index_dir, lambda name: name != META_FILE)  # the rest: meta.json is there
    builder = IndexBuilder(index_dir)  # opens the copy: tantivy reuses an index it finds in the directory
    builder.delete_terms("ad_id", plan.delete_ads)
    builder.delete_terms("product_id", plan.delete_products)
    for batch in features.attach(plan.rows).to_batches():
        builder.add_batch(batch)
    builder.finish()
    live = live_doc_count(index_dir)
    if live != spilled.num_rows:
        log.warning("the shard extended over %s serves %d documents, not its %d active ads: building it fresh",
                    base.files[0].key.rsplit(INDEX_DIR, 1)[0] if base.files else "its base", live, spilled.num_rows)
        return None
    log.info("shard extended: %d documents of %d kept (%d deleted before), %d indexed", max_doc - deleted - deleting,
             max_doc, deleted, plan.rows.num_rows)
    return live
