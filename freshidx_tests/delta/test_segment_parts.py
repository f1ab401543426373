"""Which segment task owns which products (freshidx.delta.executor.segment_parts): a stable part per id, and the
labels that Spark's hash partitioning sends to partition p (so each task gets its own copy of the batch)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from freshidx.delta.executor.key_index import as_keys
from freshidx.delta.executor.segment_parts import (
    _murmur3_int,
    label_of_part,
    part_of,
    part_of_bytes,
    part_of_keys,
    spark_partition_of_int,
)


def test_an_id_has_one_part_whatever_the_array_and_process() -> None:
    ids = ["p-1", "p-22", "prodé-333", "x" * 40, ""]
    wide = as_keys(pa.array([*ids, "y" * 60]))
    narrow = as_keys(pa.array(ids))
    assert wide is not None and narrow is not None
    for parts in (2, 3, 7):
        # the padding of a wider array never moves an id; the per-id fallback agrees with the vectorized one
        assert part_of_keys(wide, parts)[:len(ids)].tolist() == part_of_keys(narrow, parts).tolist()
        assert part_of_keys(narrow, parts).tolist() == [part_of_bytes(i.encode(), parts) for i in ids]
    # fixed values: stable across processes and releases (a change would move products between shards)
    assert part_of(pa.array(["p-1", None, "p-22", "z" * 70]), 4).tolist() == [
        part_of_bytes(b"p-1", 4), -1, part_of_bytes(b"p-22", 4), part_of_bytes(b"z" * 70, 4)]
    assert [part_of_bytes(b"p-1", 1000), part_of_bytes(b"ad-000042", 1000)] == [757, 609]


def test_products_spread_over_the_parts() -> None:
    keys = as_keys(pa.array([f"product-{i}" for i in range(4000)]))
    assert keys is not None
    for parts in (2, 4):
        counts = np.bincount(part_of_keys(keys, parts), minlength=parts)
        assert counts.min() > 0.8 * len(keys) / parts, counts


def test_murmur3_matches_known_values() -> None:
    # Spark: SELECT hash(CAST(v AS INT)) (Murmur3, seed 42)
    assert [_murmur3_int(v) for v in (0, 1, -1)] == [933211791, -559580957, -1604776387]
    assert label_of_part(1) == (0,)
    for parts in (2, 3, 5):
        assert [spark_partition_of_int(v, parts) for v in label_of_part(parts)] == list(range(parts))


@pytest.mark.parametrize("parts", [2, 3, 4])
def test_spark_sends_each_label_to_its_part(spark: Any, parts: int) -> None:
    from pyspark.sql import functions as F

    labels = label_of_part(parts)
    frame = spark.createDataFrame([(label,) for label in labels], "label int").repartition(parts, "label")
    got = {r.label: r.pid for r in frame.select("label", F.spark_partition_id().alias("pid")).collect()}
    assert [got[label] for label in labels] == list(range(parts))
    assert [r.h for r in spark.createDataFrame([(0,), (1,), (-1,)], "v int").select(F.hash("v").alias("h"))
            .collect()] == [_murmur3_int(v) for v in (0, 1, -1)]
