"""What a micro-batch needs to know from the published state, and nothing more (DESIGN §9).

An incremental micro-batch (``transform.segment_rows``) needs, of everything the serving full version
and the kept segments know, only the rows of

* the batch's ads (their highest known version, and the product an ad that moved leaves), and
* every ad that has a row in a product the batch touches (the product is re-indexed whole, seed 000).

Reading every state row into Spark and joining there costs the window on every micro-batch (measured:
the state step doubled from 100k to 400k documents). Here one Python task receives the batch's
``(ad_id, product_id)`` keys as its input (they stay on the executors) and reads the state files in
two passes: the key columns of every file first, to find those rows, then whole records of the row
groups that hold them only. The key pass is the only part that still scans the state, at a few
bytes per row; everything downstream of it is the size of the change.

The selection is a superset of what ``segment_rows`` uses (it also keeps the rows of the products of
a batch ad's inactive or older rows), so ``segment_rows`` over it answers exactly as over the whole
state: it computes the exact touched set itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from freshidx.records import ACTIVE
from freshidx.spark.index_shards import DOCS_DDL, version_files, widen
from freshidx.spark.raw_source import store_from_json, store_to_json
from freshidx.spark.shards import COVERED_FILE, DOCS_ARROW_SCHEMA, DOCS_FILE, conform
from freshidx.store import StoreConfig

KEY_COLUMNS = ("ad_id", "product_id")


def state_for_batch(spark: SparkSession, store_config: StoreConfig, manifest: dict[str, Any],
                    batch: DataFrame) -> DataFrame:
    """The state rows (``DOCS_DDL`` columns, several per ad allowed) that ``transform.segment_rows``
    needs for ``batch`` (one row per ad; only its ``ad_id``/``product_id`` are used), read in one task
    on the executors. ``manifest``: ``{"shards": [...]}`` of the full version and the kept segments."""
    files = [(k, DOCS_FILE) for k in version_files(manifest, DOCS_FILE)]
    files += [(k, COVERED_FILE) for k in version_files(manifest, COVERED_FILE)]
    keys = batch.select(*KEY_COLUMNS).coalesce(1)
    return keys.mapInArrow(_lookup_task(store_to_json(store_config), files), DOCS_DDL)


def _lookup_task(store_json: str, files: list[tuple[str, str]]
                 ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        keys = pa.Table.from_batches(list(batches), schema=pa.schema(
            [pa.field("ad_id", pa.string()), pa.field("product_id", pa.string())]))
        if keys.num_rows == 0 or not files:
            return
        config = store_from_json(store_json)
        fs = config.arrow_fs()
        opened = [(pq.ParquetFile(fs.open_input_file(config.arrow_path(k))), kind) for k, kind in files]
        try:
            yield from select_rows(keys, opened)
        finally:
            for f, _ in opened:
                f.close()

    return run


def select_rows(keys: pa.Table, files: list[tuple[pq.ParquetFile, str]]) -> Iterator[pa.RecordBatch]:
    """The two passes over opened state files (pure Arrow; tested without Spark)."""
    batch_ads = pc.unique(keys.column("ad_id").combine_chunks())
    products = pc.unique(keys.column("product_id").combine_chunks().drop_null())
    # Pass 1: key columns only. A covered file (kill-list) has no product.
    key_tables = [f.read(columns=[c for c in KEY_COLUMNS if c in f.schema_arrow.names]) for f, _ in files]
    prior = [t.filter(pc.is_in(t.column("ad_id"), value_set=batch_ads)) for t in key_tables]
    products = pc.unique(pa.concat_arrays([products, *(
        t.column("product_id").combine_chunks().drop_null() for t in prior if "product_id" in t.column_names)]))
    in_products = [t.filter(pc.is_in(t.column("product_id"), value_set=products)).column("ad_id").combine_chunks()
                   for t in key_tables if "product_id" in t.column_names]
    candidates = pc.unique(pa.concat_arrays([batch_ads, *in_products]))
    # Pass 2: whole records of the row groups holding a candidate's row, then just those rows.
    for (f, kind), t in zip(files, key_tables, strict=True):
        hit = pc.is_in(t.column("ad_id"), value_set=candidates)
        if not pc.any(hit).as_py():
            continue
        groups, start = [], 0
        for g in range(f.metadata.num_row_groups):
            n = f.metadata.row_group(g).num_rows
            if pc.any(hit.slice(start, n)).as_py():
                groups.append((g, start, n))
            start += n
        for g, start, n in groups:
            rows = f.read_row_group(g).filter(hit.slice(start, n))
            if kind != DOCS_FILE:  # the kill-list's active ads are whole records in docs.parquet
                rows = rows.filter(pc.not_equal(rows.column("status"), ACTIVE))
            for b in rows.to_batches():
                yield conform(b, DOCS_ARROW_SCHEMA) if kind == DOCS_FILE else widen(b, DOCS_ARROW_SCHEMA)
