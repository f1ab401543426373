"""State read from mapped local copies (freshidx.delta.executor.state_files, key_index_file): a key index built
once per machine and mapped by every worker, answering as the decoded one; a worker keeps nothing of the
window; superseded files are forgotten; a lookup over values that outweigh the cache rebuilds none of those
it found; a warm-up has a copy read into the page cache."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from freshidx.delta.executor import file_cache, key_index_file, state_lookup
from freshidx.delta.executor.decoded_cache import DecodedCache
from freshidx.delta.executor.key_index import KeyIndex, query_keys
from freshidx.delta.executor.state_files import MappedState, ParquetState, StateFile
from freshidx.delta.executor.state_lookup import select_rows
from freshidx.delta.executor.warm_state import warm_files
from freshidx.spark.shards import DOCS_ARROW_SCHEMA, DOCS_FILE, conform


def _docs(path: Path, ads: int, products: int) -> Path:
    n = ads
    table = pa.table({
        "ad_id": [f"ad-{i}" for i in range(n)], "campaign_id": ["c"] * n,
        "product_id": [f"p{i % products}" if i % 11 else None for i in range(n)],
        "title": [f"title {i}" for i in range(n)], "keywords": [["k", str(i)] for i in range(n)], "bid": [1.0] * n,
        "status": ["active"] * n, "updated_at": pa.array([0] * n, pa.timestamp("us", "UTC")), "version": [1] * n,
    })
    pq.write_table(pa.Table.from_batches([conform(b, DOCS_ARROW_SCHEMA) for b in table.to_batches()]), path,
                   row_group_size=64)
    return path


def _mapped(parquet: Path) -> Path:
    copy = parquet.with_suffix(".arrow")
    file_cache.write_mapped(parquet, copy)
    return copy


def test_a_saved_key_index_loads_mapped_and_answers_as_built(tmp_path: Path) -> None:
    parquet = _docs(tmp_path / DOCS_FILE, 500, 37)
    built = KeyIndex.build(pq.read_table(parquet, columns=["ad_id", "product_id"]), [64] * 7 + [52])
    assert built is not None
    path = tmp_path / "index.keys"
    key_index_file.save(built, path)
    loaded = key_index_file.load(path)
    assert loaded.mapped and not built.mapped
    assert list(loaded.row_group_sizes) == list(built.row_group_sizes)
    assert (loaded.ads_unique, loaded.products_unique) == (built.ads_unique, built.products_unique)
    ads = query_keys(pa.array(["ad-3", "ad-499", "ad-77", "nope"]))
    products = query_keys(pa.array(["p0", "p36", "p99"]))
    assert loaded.rows_of_ads(ads).tolist() == built.rows_of_ads(ads).tolist() == [3, 77, 499]
    assert loaded.rows_of_products(products).tolist() == built.rows_of_products(products).tolist()
    rows = np.array([0, 5, 11, 499])
    assert loaded.products_of_rows(rows).tolist() == built.products_of_rows(rows).tolist()
    assert loaded.ads_of_rows(rows).tolist() == built.ads_of_rows(rows).tolist()


def test_a_cut_short_key_file_is_refused(tmp_path: Path) -> None:
    built = KeyIndex.build(pa.table({"ad_id": [f"a{i}" for i in range(100)]}), [100])
    assert built is not None
    path = tmp_path / "index.keys"
    key_index_file.save(built, path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError):
        key_index_file.load(path)
    path.write_bytes(b"something else entirely")
    with pytest.raises(ValueError):
        key_index_file.load(path)


def test_the_first_lookup_writes_the_key_file_and_the_next_worker_maps_it(tmp_path: Path) -> None:
    parquet = _docs(tmp_path / DOCS_FILE, 400, 23)
    copy = _mapped(parquet)
    batch = pa.table({"ad_id": ["ad-5", "ad-390"], "product_id": ["p3", "p1"]})

    def lookup(cache: DecodedCache, mapped: bool) -> list[tuple]:
        opener = (lambda: MappedState(copy)) if mapped else (lambda: ParquetState(pq.ParquetFile(parquet)))
        got = pa.Table.from_batches(list(select_rows(batch, [StateFile("d", DOCS_FILE, opener)], cache)),
                                    DOCS_ARROW_SCHEMA)
        return sorted(tuple(r.values()) for r in got.to_pylist())

    first = DecodedCache(1 << 30)
    assert lookup(first, True) == lookup(DecodedCache(0), False)
    key_file = key_index_file.key_file(copy)
    assert key_file.exists()
    built_at = key_file.stat().st_mtime_ns
    second = DecodedCache(1 << 30)  # another worker: maps the file, builds nothing
    assert lookup(second, True) == lookup(DecodedCache(0), False)
    assert key_file.stat().st_mtime_ns >= built_at
    # What the workers keep of the window: the mapped index's nominal weight, no row group.
    assert first.nbytes == second.nbytes == state_lookup.MAPPED_WEIGHT


def test_state_no_longer_read_is_forgotten(tmp_path: Path) -> None:
    cache = DecodedCache(1 << 20)
    for name in ("old", "new"):
        cache.get((name, "key-index", 5), lambda: "index", lambda _: 10, lasting=True)
        cache.get((name, 0), lambda: "group", lambda _: 10)
    files = [StateFile("new", DOCS_FILE, lambda: pytest.fail("not opened"))]
    state_lookup.forget_other_state(cache, files)
    assert ("new", "key-index", 5) in cache and ("new", 0) in cache
    assert ("old", "key-index", 5) not in cache and ("old", 0) not in cache and cache.nbytes == 20


def test_values_found_by_a_call_are_not_loaded_again_when_a_new_one_outweighs_the_budget() -> None:
    """Key indexes over the budget, asked in the same order each micro-batch: a new one pushes out the oldest,
    which used to be loaded again, pushing out the next, and so on through every one."""
    cache = DecodedCache(30)
    loads: list[str] = []

    def ask(keys: list[str]) -> list[str]:
        def load(k: str) -> str:
            loads.append(k)
            return k
        return cache.get_many([(k, lambda k=k: load(k)) for k in keys], lambda _: 10, lasting=True)

    assert ask(["a", "b", "c"]) == ["a", "b", "c"]
    loads.clear()
    assert ask(["a", "b", "c", "d"]) == ["a", "b", "c", "d"]
    assert loads == ["d"]


def test_a_shard_writer_leaves_its_state_files_mapped_and_indexed_on_its_machine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new full version's files are warm where they were written: the first micro-batch over it maps them
    instead of downloading, decoding and indexing each (what it cost at ten million documents: ~30 s)."""
    from freshidx.delta.executor.state_files import open_state_files, read_keys, state_writer
    from freshidx.spark.index_shards import version_files, write_one_index_shard
    from freshidx.spark.shards import COVERED_FILE
    from freshidx.store import StoreConfig, open_store

    monkeypatch.setattr(file_cache, "cache_dir", lambda: tmp_path / "copies")
    config = StoreConfig(uri=f"file://{tmp_path / 'store'}")
    t0 = pa.scalar(0, pa.timestamp("us", "UTC")).as_py()
    rows = [{"ad_id": f"ad-{i}", "campaign_id": "c", "product_id": f"p{i % 7}", "title": f"widget {i}",
             "keywords": ["gizmo"], "bid": 1.0, "status": "active" if i % 5 else "paused", "updated_at": t0,
             "version": 1} for i in range(60)]
    batch = pa.RecordBatch.from_pylist(rows, schema=DOCS_ARROW_SCHEMA)
    commit = write_one_index_shard(config, "full", "v1", 0, 0, [batch], written=state_writer(1 << 30))
    assert "keep" in commit.seconds
    keys = [(k, kind, 0, False) for kind in (DOCS_FILE, COVERED_FILE)
            for k in version_files({"shards": [commit.to_dict()]}, kind)]
    assert len(keys) == 2
    for key, _, _, _ in keys:  # the store's copies are gone: what opens is this machine's own
        open_store(config).delete(key)
    for f in open_state_files(config, keys, disk_bytes=1 << 30):
        reader = f.reader()
        assert reader.mapped and reader.key_file is not None and reader.key_file.exists()
        index = read_keys(reader)
        assert not isinstance(index, tuple) and index.mapped
        assert reader.num_rows == (48 if f.kind == DOCS_FILE else 60)
        f.close()
    # Off: nothing kept.
    assert state_writer(0) is None


def _resident(path: Path, offset: int = 0) -> bool:
    """Whether the page at ``offset`` of ``path`` is in the page cache (a read that must not wait on the disk)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.preadv(fd, [bytearray(4096)], offset, os.RWF_NOWAIT)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _evicted(path: Path) -> bool:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return not _resident(path)


@pytest.mark.skipif(not hasattr(os, "RWF_NOWAIT"), reason="needs Linux's non-blocking reads to see the page cache")
def test_a_warm_up_has_a_mapped_copy_read_into_the_page_cache_once_per_worker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = _mapped(_docs(tmp_path / DOCS_FILE, 3000, 50))
    state_lookup.load_key_index(StateFile("d", DOCS_FILE, lambda: MappedState(copy)), DecodedCache(1 << 30))
    key_file = key_index_file.key_file(copy)
    if not (_evicted(copy) and _evicted(key_file)):
        pytest.skip("this file system keeps the files in memory: nothing to read ahead")
    asked: list[Path] = []
    real = file_cache.read_ahead
    monkeypatch.setattr(file_cache, "read_ahead", lambda path: (asked.append(path), real(path)))
    cache = DecodedCache(1 << 30)
    files = [StateFile("d", DOCS_FILE, lambda: MappedState(copy))]
    assert warm_files(files, cache) == (1, True)  # the key index read; nothing decoded for the rows
    assert asked == [copy, key_file]
    deadline = time.monotonic() + 120  # the kernel reads in the background: generous on a loaded box
    while not (_resident(copy, copy.stat().st_size - 1) and _resident(key_file)):
        assert time.monotonic() < deadline, "the copy was never read into the page cache"
        time.sleep(0.05)
    assert warm_files(files, cache) == (0, True) and asked == [copy, key_file]  # once per worker and file
    state_lookup.forget_other_state(cache, [])
    assert not state_lookup.is_read_ahead(files[0], cache)  # forgotten with the file's other entries


def test_a_warm_up_past_its_budget_reads_ahead_one_copy_and_leaves_the_rest_for_the_next(tmp_path: Path) -> None:
    copies = [_mapped(_docs(tmp_path / f"{i}-{DOCS_FILE}", 200, 7)) for i in range(3)]
    files = [StateFile(f"d{i}", DOCS_FILE, lambda c=c: MappedState(c)) for i, c in enumerate(copies)]
    cache = DecodedCache(1 << 30)
    for f in files:  # key indexes warm: only the read-aheads are left
        state_lookup.load_key_index(f, cache)
    advised = [warm_files(files, cache, deadline=time.monotonic()) for _ in files]
    assert advised == [(0, False), (0, False), (0, True)]  # one copy a call, the budget being spent
    assert all(state_lookup.is_read_ahead(f, cache) for f in files)
    assert warm_files(files, cache, deadline=time.monotonic()) == (0, True)
