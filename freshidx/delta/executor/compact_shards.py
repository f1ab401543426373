"""Executor-side merge of consecutive delta segments into one (:mod:`freshidx.delta.compaction_plan`).

The run's ``docs.parquet`` (active ads of the touched products, whole records) and ``covered.parquet``
(kill-list: the ads whose document a segment replaced, paused/deleted ones as ``ad_id, status, version,
updated_at``) are read on the executors, each row tagged
with its segment's order in the run; per ad the row of the newest segment wins (what a reader does
with the kill-lists), and the result goes through the same shard writer as every index build
(:func:`freshidx.spark.index_shards.write_index_shards`: whole products per shard, product features
computed in the task, index + docs + covered uploaded, commit messages back). The driver sees only
the file list and the commits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from freshidx.delta.segments import Segment
from freshidx.spark.index_shards import DOCS_DDL, INDEX_COLUMNS, StateWritten, state_file_rows, write_index_shards
from freshidx.spark.raw_source import store_from_json, store_to_json
from freshidx.spark.shards import COVERED_FILE, DOCS_ARROW_SCHEMA, DOCS_FILE, ShardCommit
from freshidx.store import StoreConfig

ORDER = "_segment_order"
_ORDER_FIELD = pa.field(ORDER, pa.int32())
_TAGGED_SCHEMA = pa.schema([*DOCS_ARROW_SCHEMA, _ORDER_FIELD])
#: One Python task per file costs ~0.5 s of worker start-up under Connect (SPARK-54055): a few tasks.
MAX_READ_TASKS = 2


def _tagged(batch: pa.RecordBatch, order: int) -> pa.RecordBatch:
    """``batch`` (docs schema) plus its segment's order in the run."""
    return pa.RecordBatch.from_arrays([*batch.columns, pa.array([order] * batch.num_rows, pa.int32())],
                                      schema=_TAGGED_SCHEMA)


def _read_task(store_json: str) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        config = store_from_json(store_json)
        fs = config.arrow_fs()
        for batch in batches:
            for key, kind, order in zip(batch.column("key").to_pylist(), batch.column("kind").to_pylist(),
                                        batch.column("ord").to_pylist(), strict=True):
                for b in state_file_rows(fs, config, key, kind):
                    yield _tagged(b, int(order))

    return run


def merge_inputs(run: Sequence[Segment]) -> list[tuple[str, str, int]]:
    """``(key, file name, order)`` of every ``docs.parquet`` and ``covered.parquet`` of ``run``; ``order``
    is the segment's place in the run (a higher order wins for an ad, as a newer kill-list would)."""
    out: list[tuple[str, str, int]] = []
    for order, seg in enumerate(run):
        for sh in seg.shards:
            for f in sh["files"]:
                name = str(f["key"]).rsplit("/", 1)[-1]
                if name in (DOCS_FILE, COVERED_FILE):
                    out.append((str(f["key"]), name, order))
    return sorted(out, key=lambda t: (t[2], t[0]))


def merged_rows(spark: SparkSession, store_config: StoreConfig, inputs: list[tuple[str, str, int]]) -> DataFrame:
    """One row per ad of the run (:func:`merge_inputs`): the newest segment's row."""
    if not inputs:
        return spark.createDataFrame([], DOCS_DDL)
    files = spark.createDataFrame(inputs, "key string, kind string, ord int").repartition(
        min(len(inputs), MAX_READ_TASKS))
    rows = files.mapInArrow(_read_task(store_to_json(store_config)), f"{DOCS_DDL}, {ORDER} int")
    newest = Window.partitionBy("ad_id").orderBy(F.col(ORDER).desc())
    return (rows.withColumn("_rank", F.row_number().over(newest))
            .filter(F.col("_rank") == 1).select(*INDEX_COLUMNS))


def write_merged_segment(spark: SparkSession, store_config: StoreConfig, inputs: list[tuple[str, str, int]], *,
                         index: str, version: str, num_shards: int,
                         written: StateWritten | None = None) -> list[ShardCommit]:
    """Build and stage the merged segment under ``version``'s prefix; the commits, one per shard."""
    return write_index_shards(merged_rows(spark, store_config, inputs), store_config, index, version, num_shards,
                              written=written)
