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
    assert "MapInArrow" in plan(nonempty)
    df = read_raw_lines(spark, local_store_config, [])
    assert df.schema == RAW_LINES_SCHEMA
    assert "MapInArrow" not in plan(df)
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


def _store_rows(config: StoreConfig, key: str) -> list[dict[str, Any]]:
    """The rows an executor reads for ``key``, through the store's own filesystem (local dir or S3)."""
    return [r for b in read_object_lines(config.arrow_fs(), config.arrow_path(key), key, P1) for r in b.to_pylist()]


def test_non_utf8_line_keeps_its_exact_bytes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = b'{"title": "caf\xe9 \xff"}'
    path = tmp_path / "f.jsonl"
    path.write_bytes(b'{"a": 1}\r\n' + bad + b"\r\n")
    rows = _object_rows(path)
    assert [(r["bad_encoding"], r["original"]) for r in rows] == [(False, None), (True, bad)]
    assert "\ufffd" in rows[1]["raw"] and rows[1]["object_error"] is None


def test_encoding_is_told_from_the_content_not_the_name(store_config: StoreConfig, store: ObjectStore) -> None:
    import gzip

    body = b'{"a": 1}\n{"a": 2}\n'
    objects = {
        "plain.jsonl.gz": body,  # a plain file with a .gz name
        "zipped.jsonl": gzip.compress(body),  # gzip without the name
        "two-members.jsonl.gz": gzip.compress(body) + gzip.compress(b'{"a": 3}\n'),
    }
    for name, data in objects.items():
        store.put(f"raw/ads/{P1}/{name}", data)
    for name, n in (("plain.jsonl.gz", 2), ("zipped.jsonl", 2), ("two-members.jsonl.gz", 3)):
        rows = _store_rows(store_config, f"raw/ads/{P1}/{name}")
        assert [r["raw"] for r in rows] == [f'{{"a": {i}}}' for i in range(1, n + 1)], name
        assert {r["object_error"] for r in rows} == {None}


def _unreadable_objects(tmp_path: Any) -> dict[str, tuple[bytes, str]]:
    """name → (bytes, expected object-level reason): what upstream must not write, one of each kind."""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    whole = gzip.compress(b"".join(b'{"a": %d}\n' % i for i in range(5000)))
    pq.write_table(pa.table({"ad_id": ["a"]}), tmp_path / "dropped.parquet")
    parquet = (tmp_path / "dropped.parquet").read_bytes()
    zstd = pa.compress(b'{"a": 1}\n', codec="zstd", asbytes=True)
    assert zstd[:4] == b"\x28\xb5\x2f\xfd"  # a real zstd frame (its magic), not a hand-made prefix
    return {
        "truncated.jsonl.gz": (whole[: len(whole) // 2], raw_source.UNREADABLE_OBJECT),
        "corrupt.jsonl.gz": (whole[:20] + b"\x00" * 200 + whole[220:], raw_source.UNREADABLE_OBJECT),
        "dropped.parquet": (parquet, raw_source.UNSUPPORTED_FORMAT),
        "zipped-parquet.gz": (gzip.compress(parquet), raw_source.UNSUPPORTED_FORMAT),
        "compressed.jsonl.zst": (zstd, raw_source.UNSUPPORTED_FORMAT),
    }


def test_unreadable_and_foreign_objects_are_one_row_each(
    tmp_path: Any, spark: SparkSession, store_config: StoreConfig, store: ObjectStore
) -> None:
    """On the local store and on moto S3: each object that is not readable JSON lines is ONE row (line 0,
    no text, the reason and the contract), read by the executor-side reader and by Spark alike."""
    expected = _unreadable_objects(tmp_path)
    for name, (data, _) in expected.items():
        store.put(f"raw/ads/{P1}/{name}", data)
    for name, (_, reason) in expected.items():
        key = f"raw/ads/{P1}/{name}"
        rows = _store_rows(store_config, key)
        assert len(rows) == 1, f"{name}: nothing of an unreadable object is read, it is one row"
        (row,) = rows
        assert (row["line"], row["raw"], row["file"]) == (0, None, key)
        assert row["object_error"].startswith(reason + ": ") and raw_source.CONTRACT in row["object_error"]
    # The same through Spark tasks (one task per object), next to a good object that must still be read.
    good = f"raw/ads/{P1}/good.jsonl"
    store.put(good, b'{"a": 1}\n')
    files = [(f"raw/ads/{P1}/{name}", P1) for name in expected] + [(good, P1)]
    got = {(r["file"], r["line"]): r for r in read_raw_lines(spark, store_config, files).collect()}
    assert set(got) == {(k, 0) for k, _ in files[:-1]} | {(good, 1)}
    for name, (_, reason) in expected.items():
        assert got[(f"raw/ads/{P1}/{name}", 0)]["object_error"].startswith(reason + ": "), name
    assert got[(good, 1)]["raw"] == '{"a": 1}' and got[(good, 1)]["object_error"] is None
