"""Executor-side tantivy shard builds: one Spark task = one shard = one tantivy index
(docs/architecture.md#index-format-and-serving).

The job runs on :func:`freshidx.spark.shards.write_sharded` (its docstring says why):
exactly ``num_shards`` commits, rows hash-partitioned by ``xxhash64(product_id)`` so a product is
never split, the Spark partition id of a task is its shard number, the attempt number is part of
every key, and the driver collects only the small commit messages. Each task

1. builds a tantivy index of the shard's *active* ads in a local temp dir
   (:class:`freshidx.spark.index_format.IndexBuilder`: 128 MB heap, one thread, commit, wait for merges),
   with the product-level features computed from the shard's own rows
   (:class:`freshidx.record_rules.ProductFeatures`: a product never spans shards, so no Spark window is needed).
   The features are known only after the last row, so the active rows are spilled to a local
   Arrow IPC file on the way and indexed from it (memory-mapped: a task's memory does not grow with
   its shard);
2. writes ``covered.parquet`` (``ad_id, status, version, updated_at`` of *every* ad of the shard: the shard's part
   of the kill-list; in ``ad_id`` order in a delta index, see :data:`KILL_LIST_INDEXES`) and ``docs.parquet``
   (the active ads' typed records, read back by the next delta build to re-emit all ads of a touched
   product, see ``freshidx.delta.product_expansion``);
3. uploads the index files (never ``.tantivy-*.lock``) under ``shard_prefix(...) + "index/"`` and the
   two Parquet files under ``shard_prefix(...)``, hashing each on the way (sha256), and returns a
   :class:`~freshidx.spark.shards.ShardCommit` listing every uploaded file.

Layout of one shard attempt::

    indexes/<index>/versions/<version>/shards/shard-NNNNN-aK/index/meta.json
                                                           index/.managed.json
                                                           index/<segment>.{idx,pos,term,store,fast,fieldnorm}
                                                           docs.parquet
                                                           covered.parquet
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from freshidx.raw_record import ACTIVE
from freshidx.record_rules import ProductFeatures
from freshidx.spark import index_reuse
from freshidx.spark.index_format import INDEX_DIR, IndexBuilder, index_files
from freshidx.spark.index_reuse import IndexBase
from freshidx.spark.raw_source import store_from_json, store_to_json
from freshidx.spark.shards import (
    COVERED_ARROW_SCHEMA,
    COVERED_FILE,
    DOCS_ARROW_SCHEMA,
    DOCS_FILE,
    BufferedParquet,
    ShardCommit,
    ShardFile,
    ShardWriter,
    check_name,
    conform,
    upload_file,
    write_sharded,
)
from freshidx.store import StoreConfig, layout

#: Told of a state file a shard task wrote: (the store, its key, its local path), after its upload.
StateWritten = Callable[[StoreConfig, str, str], None]

log = logging.getLogger(__name__)

#: Columns a shard build reads from each row: the typed record (features are computed in the task).
INDEX_COLUMNS: tuple[str, ...] = tuple(DOCS_ARROW_SCHEMA.names)
SPILL_FILE = "active.arrow"
#: Indexes whose ``covered.parquet`` readers take in as a kill-list (:mod:`freshidx.serve.kill_list`): written
#: in ``ad_id`` order, so that each reader checks the order instead of sorting it again on its swap's path.
#: A delta shard holds what its batch touched; a full shard's covered file is never a kill-list. A shard of more
#: than ``task_files.SORTED_ROWS_MAX`` ids (a large window rebuild's) is written as its rows came: its readers sort.
KILL_LIST_INDEXES = frozenset({"delta"})
#: An optional boolean column of a shard build's rows: when present, only flagged rows go to the kill-list
#: (``covered.parquet``) and, when active, into the index; every active row still goes to ``docs.parquet``
#: (the state) and into its product's features (``segment_merge.SegmentUpdate``).
REPLACE_COLUMN = "_freshidx_replace"
DOCS_DDL = (
    "ad_id string, campaign_id string, product_id string, title string, keywords array<string>, "
    "bid double, status string, updated_at timestamp, version long"
)
assert tuple(c.split()[0] for c in DOCS_DDL.split(", ")) == tuple(DOCS_ARROW_SCHEMA.names)


def write_one_index_shard(
    config: StoreConfig, index: str, version: str, shard: int, attempt: int,
    batches: Iterable[pa.RecordBatch], *, with_docs: bool = True, written: StateWritten | None = None,
    base: IndexBase | None = None,
) -> ShardCommit:
    """Build and upload one shard attempt (runs on an executor; callable directly, e.g. in tests).

    ``batches`` carry the typed record columns (:data:`INDEX_COLUMNS`; extra columns, e.g. stale
    feature columns, are ignored) of *every* ad of each product they mention: the product features
    are computed here. With a :data:`REPLACE_COLUMN`, only the flagged rows are killed and indexed.
    Returns a commit whose files are the index files (sorted by name), then
    ``docs.parquet`` (unless ``with_docs=False``), then ``covered.parquet``. ``written`` is told of each of
    those two once uploaded (the store, its key and its local path), while the local file still exists.
    With a ``base``, the shard's index extends that earlier index of the same shard where that pays
    (:mod:`freshidx.spark.index_reuse`); the files and what they serve are those of a fresh build.
    """
    fs = config.arrow_fs()
    prefix = layout.shard_prefix(index, version, shard, attempt)
    t0 = time.monotonic()
    # A file tantivy (re)creates in the index directory while it is being deleted made the cleanup fail
    # the task after the shard was uploaded (seen once in the suite: "Directory not empty: 'index'"):
    # a leftover temp file must not fail (and retry) a build that is done.
    with tempfile.TemporaryDirectory(prefix="freshidx-ishard-", ignore_cleanup_errors=True) as tmp:
        index_dir = os.path.join(tmp, "index")
        features = ProductFeatures()
        spill_path = os.path.join(tmp, SPILL_FILE)
        covered = BufferedParquet(os.path.join(tmp, COVERED_FILE), COVERED_ARROW_SCHEMA,
                                  sort_by="ad_id" if index in KILL_LIST_INDEXES else None)
        docs = BufferedParquet(os.path.join(tmp, DOCS_FILE), DOCS_ARROW_SCHEMA) if with_docs else None
        try:
            _take_rows(batches, spill_path, features, covered, docs)
            t1 = time.monotonic()  # the rows are in (their producer's time included)
            doc_count = _index_spilled(fs, config, spill_path, features, index_dir, base)
        finally:
            covered.close()
            if docs is not None:
                docs.close()
        t2 = time.monotonic()
        files: list[ShardFile] = [
            upload_file(fs, config, os.path.join(index_dir, name), prefix + INDEX_DIR + name, 0)
            for name in index_files(index_dir)
        ]
        if docs is not None:
            files.append(upload_file(fs, config, docs.path, prefix + DOCS_FILE, docs.rows))
        files.append(upload_file(fs, config, covered.path, prefix + COVERED_FILE, covered.rows))
        t3 = time.monotonic()
        if written is not None:
            for state in ([docs] if docs is not None else []) + [covered]:
                written(config, prefix + os.path.basename(state.path), state.path)
    seconds = {"rows": t1 - t0, "index": t2 - t1, "upload": t3 - t2}
    if written is not None:
        seconds["keep"] = time.monotonic() - t3
    return ShardCommit(shard=shard, attempt=attempt, doc_count=doc_count, covered_count=covered.rows,
                       files=tuple(files), seconds={k: round(v, 3) for k, v in seconds.items()})


def _take_rows(batches: Iterable[pa.RecordBatch], spill_path: str, features: ProductFeatures,
               covered: BufferedParquet, docs: BufferedParquet | None) -> None:
    """Step 1: every row to the kill-list (flagged rows only, with a :data:`REPLACE_COLUMN`), the active
    ones to ``docs`` and their products' features, and the active rows to index to the spill file."""
    with pa.OSFile(spill_path, "wb") as sink, pa.ipc.new_file(sink, DOCS_ARROW_SCHEMA) as spill:
        for raw_batch in batches:
            if raw_batch.num_rows == 0:
                continue
            batch = conform(raw_batch, DOCS_ARROW_SCHEMA)
            active = batch.filter(pc.equal(batch.column("status"), ACTIVE))
            if docs is not None:
                docs.write(active)
            features.add(active)
            if REPLACE_COLUMN in raw_batch.schema.names:
                replace = raw_batch.column(REPLACE_COLUMN).fill_null(True)
                batch = batch.filter(replace)
                active = batch.filter(pc.equal(batch.column("status"), ACTIVE))
            covered.write(conform(batch, COVERED_ARROW_SCHEMA))
            spill.write_batch(active)


def _index_spilled(fs: Any, config: StoreConfig, spill_path: str, features: ProductFeatures, index_dir: str,
                   base: IndexBase | None) -> int:
    """Index the spilled rows with their products' features (known only now) in ``index_dir``, over ``base``
    where that pays; returns the doc count."""
    with pa.memory_map(spill_path) as source:
        spilled = pa.ipc.open_file(source).read_all()  # zero-copy over the map
        if base is not None:
            live = index_reuse.extend_base(fs, config, base, index_dir, spilled, features)
            if live is not None:
                return live
            shutil.rmtree(index_dir, ignore_errors=True)
        builder = IndexBuilder(index_dir)
        for batch in features.attach(spilled).to_batches():
            builder.add_batch(batch)
    return builder.finish()


def shard_rows(latest: DataFrame, num_shards: int) -> DataFrame:
    """The index columns of ``latest`` split into ``num_shards`` partitions by ``xxhash64(product_id)``:
    partition i is shard i (see :func:`write_index_shards`)."""
    return latest.select(*INDEX_COLUMNS).repartition(num_shards, F.xxhash64("product_id"))


def write_index_shards(
    latest: DataFrame, store_config: StoreConfig, index: str, version: str, num_shards: int,
    *, with_docs: bool = True, sort: bool = False, written: StateWritten | None = None,
) -> list[ShardCommit]:
    """Build ``num_shards`` tantivy shards of ``latest`` (one row per ad) in Spark tasks; return commits.

    ``latest`` has the typed record columns (``transform.index_rows``) of every ad of each product
    it mentions: the whole latest state for a full build; a delta build expands to whole products
    first (``freshidx.delta.product_expansion.expand_to_products``). The product features are computed in each
    task from its shard's rows (:class:`freshidx.record_rules.ProductFeatures`).

    Rows are hash-partitioned by ``xxhash64(product_id)`` (one product's ads land in exactly one
    shard; why the hash and not the bare column: see ``shards.write_sharded``). With ``sort`` each shard
    is sorted by ``(product_id, ad_id)`` so a build is reproducible document for document; off by
    default because it costs a JVM sort per shard and search results do not depend on it (BM25
    scores do not depend on document order, and :class:`freshidx.serve.searcher.Searcher` breaks ties by
    ``ad_id``).
    A shard with no rows still gets an (empty) index and a commit. Returns commits sorted by shard.
    ``written``: :func:`write_one_index_shard`'s (run in the tasks: it must pickle).
    """
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    check_name("index", index)
    check_name("version", version)
    rows = shard_rows(latest, num_shards)
    if sort:
        rows = rows.sortWithinPartitions("product_id", "ad_id")
    return write_sharded(rows, store_config, num_shards, _index_writer(index, version, with_docs, written),
                         what="write_index_shards")


def _index_writer(index: str, version: str, with_docs: bool, written: StateWritten | None) -> ShardWriter:
    def write(config: StoreConfig, shard: int, attempt: int, batches: Iterable[pa.RecordBatch]) -> ShardCommit:
        return write_one_index_shard(config, index, version, shard, attempt, batches, with_docs=with_docs,
                                     written=written)

    return write


# --------------------------------------------------------------------------- reading a version back


def version_files(manifest: dict[str, Any], name: str) -> list[str]:
    """Keys of the per-shard file ``name`` (``docs.parquet``/``covered.parquet``) listed in ``manifest``."""
    return sorted(
        f["key"] for s in manifest["shards"] for f in s["files"] if str(f["key"]).rsplit("/", 1)[-1] == name
    )


def read_version_docs(spark: SparkSession, store_config: StoreConfig, manifest: dict[str, Any]) -> DataFrame:
    """The ``docs.parquet`` rows of a published version (its active ads), read on the executors.

    The file list comes from the manifest, never from a listing. Works for versions written by
    :func:`write_index_shards`. Columns: ``transform.TYPED_FIELDS``.
    """
    return read_state_files(spark, store_config, [(k, DOCS_FILE) for k in version_files(manifest, DOCS_FILE)])


def read_state_files(spark: SparkSession, store_config: StoreConfig, keys: list[tuple[str, str]],
                        max_tasks: int | None = None) -> DataFrame:
    """``(key, file name)`` pairs of a version read on the executors (:func:`_read_state_task`), in at most
    ``max_tasks`` tasks (default one per file)."""
    if not keys:
        return spark.createDataFrame([], DOCS_DDL)
    files = spark.createDataFrame(keys, "key string, kind string").repartition(min(len(keys), max_tasks or len(keys)))
    return files.mapInArrow(_read_state_task(store_to_json(store_config)), DOCS_DDL)


def _read_state_task(store_json: str) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        config = store_from_json(store_json)
        fs = config.arrow_fs()
        for batch in batches:
            for key, kind in zip(batch.column("key").to_pylist(), batch.column("kind").to_pylist(), strict=True):
                yield from state_file_rows(fs, config, key, kind)

    return run


def state_file_rows(fs: Any, config: StoreConfig, key: str, kind: str,
                    batch_size: int = 65536) -> Iterator[pa.RecordBatch]:
    """One state file's records in ``DOCS_ARROW_SCHEMA``, streamed: a ``docs.parquet`` whole (its active
    ads), a ``covered.parquet``'s paused/deleted rows only (the active ones are in ``docs.parquet``),
    their missing columns null."""
    with fs.open_input_file(config.arrow_path(key)) as f:
        for b in pq.ParquetFile(f).iter_batches(batch_size=batch_size):
            if kind == DOCS_FILE:
                yield conform(b, DOCS_ARROW_SCHEMA)
                continue
            inactive = b.filter(pc.not_equal(b.column("status"), ACTIVE))
            if inactive.num_rows:
                yield widen(inactive, DOCS_ARROW_SCHEMA)


def widen(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` in ``schema``: its own columns cast, the missing ones null (older covered files)."""
    names = set(batch.schema.names)
    arrays = [batch.column(f.name).cast(f.type) if f.name in names else pa.nulls(batch.num_rows, f.type)
              for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
