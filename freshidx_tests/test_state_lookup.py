"""The micro-batch's state lookup (freshidx.spark.state_lookup.select_rows), pure Arrow: which rows of
the published state a batch needs, read from row groups that hold them only."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from freshidx.spark.shards import COVERED_ARROW_SCHEMA, COVERED_FILE, DOCS_ARROW_SCHEMA, DOCS_FILE, conform
from freshidx.spark.state_lookup import select_rows


def _docs(path: Path, rows: list[tuple[str, str]], row_group: int) -> pq.ParquetFile:
    table = pa.table({
        "ad_id": [a for a, _ in rows], "campaign_id": ["c"] * len(rows), "product_id": [p for _, p in rows],
        "title": ["t"] * len(rows), "keywords": [["k"]] * len(rows), "bid": [1.0] * len(rows),
        "status": ["active"] * len(rows), "updated_at": pa.array([0] * len(rows), pa.timestamp("us", "UTC")),
        "version": [1] * len(rows),
    })
    pq.write_table(pa.Table.from_batches([conform(b, DOCS_ARROW_SCHEMA) for b in table.to_batches()]),
                   path, row_group_size=row_group)
    return pq.ParquetFile(path)


def _covered(path: Path, rows: list[tuple[str, str]]) -> pq.ParquetFile:
    names = COVERED_ARROW_SCHEMA.names
    cols = {"ad_id": [a for a, _ in rows], "status": [s for _, s in rows], "version": [2] * len(rows),
            "updated_at": pa.array([0] * len(rows), pa.timestamp("us", "UTC"))}
    table = pa.table({n: cols[n] for n in names if n in cols})
    pq.write_table(table, path)
    return pq.ParquetFile(path)


def test_selects_batch_ads_their_old_products_and_every_ad_of_touched_products(tmp_path: Path) -> None:
    # Products p0..p9, 4 ads each, sorted by product, 8 rows per row group (5 groups).
    rows = [(f"a{p}{i}", f"p{p}") for p in range(10) for i in range(4)]
    docs = _docs(tmp_path / DOCS_FILE, rows, row_group=8)
    covered = _covered(tmp_path / COVERED_FILE, [("a11", "deleted"), ("a90", "active"), ("z", "paused")])
    # The batch: a10 changes (p1 touched), a30 moved to p7 (its old product p3 and p7 touched),
    # z (paused before, in no product now) comes back.
    keys = pa.table({"ad_id": ["a10", "a30", "z"], "product_id": ["p1", "p7", "p2"]})
    out = pa.Table.from_batches(list(select_rows(keys, [(docs, DOCS_FILE), (covered, COVERED_FILE)])))
    got = sorted(zip(out.column("ad_id").to_pylist(), out.column("status").to_pylist(), strict=True))
    touched = {"p1", "p2", "p3", "p7"}
    want = sorted([(a, "active") for a, p in rows if p in touched] + [("a11", "deleted"), ("z", "paused")])
    assert got == want
    assert out.schema.names == DOCS_ARROW_SCHEMA.names


def test_reads_only_row_groups_that_hold_a_needed_row(tmp_path: Path) -> None:
    rows = [(f"a{p}{i}", f"p{p}") for p in range(10) for i in range(4)]
    docs = _docs(tmp_path / DOCS_FILE, rows, row_group=8)
    read: list[int] = []
    original = docs.read_row_group

    def spy(i: int, *args: object, **kwargs: object) -> pa.Table:
        read.append(i)
        return original(i, *args, **kwargs)

    docs.read_row_group = spy  # type: ignore[method-assign]
    keys = pa.table({"ad_id": ["a00"], "product_id": ["p0"]})
    out = pa.Table.from_batches(list(select_rows(keys, [(docs, DOCS_FILE)])))
    assert sorted(out.column("ad_id").to_pylist()) == ["a00", "a01", "a02", "a03"]
    assert read == [0]  # p0 lives in the first row group only
