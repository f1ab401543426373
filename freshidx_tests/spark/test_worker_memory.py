"""A Python worker's freed heap goes back to the kernel after a shard task."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import psutil
import pyarrow as pa
import pytest

from freshidx.spark import shards, worker_memory
from freshidx.spark.shards import ShardCommit
from freshidx.store import StoreConfig

MIB = 1024 * 1024
#: Blocks below the C library's first mmap threshold (128 KiB), so they come from the heap it keeps.
BLOCK = 100 * 1024
BLOCKS = 3000

needs_trim = pytest.mark.skipif(worker_memory._malloc_trim() is None, reason="the C library has no malloc_trim")


def _rss() -> int:
    return int(psutil.Process().memory_info().rss)


@needs_trim
def test_a_trim_hands_the_freed_heap_back_and_keeps_what_is_in_use() -> None:
    pool = pa.system_memory_pool()
    blocks = []
    for _ in range(BLOCKS):
        block = pa.allocate_buffer(BLOCK, memory_pool=pool)
        np.frombuffer(block, dtype=np.uint8)[:] = 7  # touched: resident
        blocks.append(block)
    kept = blocks[-1]  # the heap's top stays in use, so a free alone gives nothing back
    del blocks
    freed = _rss()
    thread = worker_memory.trim_soon()
    assert thread is not None
    thread.join(120)
    assert not thread.is_alive()
    after = _rss()
    assert freed - after >= (BLOCKS * BLOCK) // 2, (freed // MIB, after // MIB)
    assert bytes(np.frombuffer(kept, dtype=np.uint8)[:4]) == b"\x07" * 4


@needs_trim
def test_a_trim_under_way_serves_a_second_request() -> None:
    with worker_memory._TRIMMING:
        assert worker_memory.trim_now() is False
    assert worker_memory.trim_now() is True


def test_the_shard_task_trims_after_handing_over_its_result(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(shards, "task_ids", lambda: (0, 0))
    monkeypatch.setattr(shards, "use_task_cores", lambda: 1)
    monkeypatch.setattr(shards, "trim_soon", lambda: calls.append("trim"))

    def write(config: object, shard: int, attempt: int, batches: Iterator[pa.RecordBatch]) -> ShardCommit:
        calls.append("write")
        return ShardCommit(shard, attempt, 0, 0, ())

    config = StoreConfig("file:///nonexistent-freshidx-store")
    run = shards._shard_task(shards.store_to_json(config), 1, write)(iter([]))
    first = next(run)
    assert first.num_rows == 1
    assert calls == ["write"]  # the result is out before the trim
    assert list(run) == []
    assert calls == ["write", "trim"]

