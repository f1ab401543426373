"""The ``freshidx_raw`` Python data source: raw JSON lines read on executors, local dir and moto S3."""

from __future__ import annotations

from typing import Any

import pyarrow.fs as pafs
import pytest
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import to_arrow_schema

from freshidx.spark import raw_source
from freshidx.spark.raw_source import (
    ARROW_SCHEMA,
    RAW_LINES_SCHEMA,
    group_files,
    read_object_lines,
    read_raw_lines,
)
from freshidx.spark.session import register_sources
from freshidx.store import ObjectStore, StoreConfig

P1 = "year=2026/month=11/day=21/hour=14/minute=05"
P2 = "year=2026/month=11/day=21/hour=14/minute=10"


def _rows(df):  # type: ignore[no-untyped-def]
    return sorted(
        (r["partition"], r["file"], r["line"], r["raw"], r["bad_encoding"]) for r in df.collect()
    )


def test_reads_store_objects_on_executors(
    spark: SparkSession, store_config: StoreConfig, store: ObjectStore
) -> None:
    k1 = f"raw/ads/{P1}/part-0.jsonl"
    k2 = f"raw/ads/{P2}/part-0.jsonl"
    k3 = f"raw/ads/{P2}/part-1.jsonl"
    gone = f"raw/ads/{P2}/part-deleted.jsonl"  # listed by the driver, deleted before the read
    store.put(k1, b'{"a": 1}\n\n   \n{"a": 2}\r\n\t\n{"a": "\xc3\xa9"}')  # no final newline
    store.put(k2, b'{"a": 3}\n{"a": "\xff\xfe bad"}\n\n')
    store.put(k3, b"")
    df = read_raw_lines(spark, store_config, [(k1, P1), (k2, P2), (gone, P2), (k3, P2)])
    assert df.schema == RAW_LINES_SCHEMA
    assert _rows(df) == sorted(
        [
            (P1, k1, 1, '{"a": 1}', False),
            (P1, k1, 4, '{"a": 2}', False),
            (P1, k1, 6, '{"a": "é"}', False),
            (P2, k2, 1, '{"a": 3}', False),
            (P2, k2, 2, '{"a": "\ufffd\ufffd bad"}', True),
        ]
    )


def test_grouped_partitions_read_the_same_rows(
    spark: SparkSession, local_store_config: StoreConfig
) -> None:
    from freshidx.store import open_store

    store = open_store(local_store_config)
    files = []
    for i in range(5):
        key = f"raw/ads/{P1}/part-{i}.jsonl"
        store.put(key, f'{{"i": {i}}}\n{{"j": {i}}}\n'.encode())
        files.append((key, P1))
    df = read_raw_lines(spark, local_store_config, files, max_partitions=2)
    assert df.rdd.getNumPartitions() == 2
    assert _rows(df) == sorted(
        (P1, k, n, f'{{"{c}": {i}}}', False)
        for i, (k, _) in enumerate(files)
        for n, c in ((1, "i"), (2, "j"))
    )


def test_empty_file_list_launches_no_read(spark: SparkSession, local_store_config: StoreConfig) -> None:
    def plan(df):  # type: ignore[no-untyped-def]
        return df._jdf.queryExecution().optimizedPlan().toString()

    nonempty = read_raw_lines(spark, local_store_config, [("raw/x/never-read.jsonl", P1)])
    assert raw_source.SOURCE_NAME in plan(nonempty)
    df = read_raw_lines(spark, local_store_config, [])
    assert df.schema == RAW_LINES_SCHEMA
    assert raw_source.SOURCE_NAME not in plan(df)
    assert df.count() == 0


def test_register_sources_is_idempotent(spark: SparkSession) -> None:
    register_sources(spark)
    register_sources(spark)
    with pytest.raises(Exception, match="files"):
        spark.read.format(raw_source.SOURCE_NAME).load().collect()


def test_arrow_batches_match_spark_schema_exactly(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    assert to_arrow_schema(RAW_LINES_SCHEMA, timezone="UTC") == ARROW_SCHEMA
    path = tmp_path / "f.jsonl"
    lines = [f'{{"n": {i}}}' for i in range(1, 11)]
    path.write_bytes(("\n".join(lines) + "\n").encode())
    monkeypatch.setattr(raw_source, "READ_CHUNK_BYTES", 7)  # lines straddle chunk boundaries
    batches = list(read_object_lines(pafs.LocalFileSystem(), str(path), "k", P1, batch_rows=4))
    assert [b.num_rows for b in batches] == [4, 4, 2]
    assert all(b.schema == ARROW_SCHEMA for b in batches)
    got = [r for b in batches for r in b.to_pylist()]
    assert [(r["line"], r["raw"]) for r in got] == list(enumerate(lines, start=1))
    assert {(r["partition"], r["file"], r["bad_encoding"]) for r in got} == {(P1, "k", False)}


def test_missing_object_is_skipped(tmp_path) -> None:  # type: ignore[no-untyped-def]
    got = list(read_object_lines(pafs.LocalFileSystem(), str(tmp_path / "nope"), "nope", P1))
    assert got == []


def test_bom_is_dropped_on_first_line_only(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\n\xef\xbb\xbf{"a": 2}\n')
    rows = [r for b in read_object_lines(pafs.LocalFileSystem(), str(path), "k", P1) for r in b.to_pylist()]
    assert [r["raw"] for r in rows] == ['{"a": 1}', '\ufeff{"a": 2}']


@pytest.mark.parametrize(
    ("n", "max_parts", "sizes"),
    [(0, 3, []), (5, 0, [1, 1, 1, 1, 1]), (5, 2, [3, 2]), (3, 10, [1, 1, 1]), (7, 3, [3, 2, 2])],
)
def test_group_files(n: int, max_parts: int, sizes: list[int]) -> None:
    files = [(f"k{i}", "p") for i in range(n)]
    groups = group_files(files, max_parts)
    assert [len(g) for g in groups] == sizes
    assert [f for g in groups for f in g] == files


# --------------------------------------------------------------------------- the input contract


def _object_rows(path: Any, key: str = "k") -> list[dict[str, Any]]:
    return [r for b in read_object_lines(pafs.LocalFileSystem(), str(path), key, P1) for r in b.to_pylist()]


def test_non_utf8_line_keeps_its_exact_bytes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = b'{"title": "caf\xe9 \xff"}'
    path = tmp_path / "f.jsonl"
    path.write_bytes(b'{"a": 1}\r\n' + bad + b"\r\n")
    rows = _object_rows(path)
    assert [(r["bad_encoding"], r["original"]) for r in rows] == [(False, None), (True, bad)]
    assert "\ufffd" in rows[1]["raw"] and rows[1]["object_error"] is None


def test_encoding_is_told_from_the_content_not_the_name(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import gzip

    body = b'{"a": 1}\n{"a": 2}\n'
    (tmp_path / "plain.jsonl.gz").write_bytes(body)  # a plain file with a .gz name
    (tmp_path / "zipped.jsonl").write_bytes(gzip.compress(body))  # gzip without the name
    (tmp_path / "two-members.jsonl.gz").write_bytes(gzip.compress(body) + gzip.compress(b'{"a": 3}\n'))
    for name, n in (("plain.jsonl.gz", 2), ("zipped.jsonl", 2), ("two-members.jsonl.gz", 3)):
        rows = _object_rows(tmp_path / name)
        assert [r["raw"] for r in rows] == [f'{{"a": {i}}}' for i in range(1, n + 1)], name
        assert {r["object_error"] for r in rows} == {None}


def test_unreadable_and_foreign_objects_are_one_row_each(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    whole = gzip.compress(b"".join(b'{"a": %d}\n' % i for i in range(5000)))
    (tmp_path / "truncated.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "corrupt.jsonl.gz").write_bytes(whole[:20] + b"\x00" * 200 + whole[220:])
    pq.write_table(pa.table({"ad_id": ["a"]}), tmp_path / "dropped.parquet")
    (tmp_path / "zipped-parquet.gz").write_bytes(gzip.compress((tmp_path / "dropped.parquet").read_bytes()))
    expected = {
        "truncated.jsonl.gz": raw_source.UNREADABLE_OBJECT,
        "corrupt.jsonl.gz": raw_source.UNREADABLE_OBJECT,
        "dropped.parquet": raw_source.UNSUPPORTED_FORMAT,
        "zipped-parquet.gz": raw_source.UNSUPPORTED_FORMAT,
    }
    for name, reason in expected.items():
        rows = _object_rows(tmp_path / name, key=f"raw/ads/{name}")
        assert len(rows) == 1, f"{name}: nothing of an unreadable object is read, it is one row"
        (row,) = rows
        assert (row["line"], row["raw"], row["file"]) == (0, None, f"raw/ads/{name}")
        assert row["object_error"].startswith(reason + ": ") and raw_source.CONTRACT in row["object_error"]
