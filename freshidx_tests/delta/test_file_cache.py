"""State files copied to the executor's local disk as mapped Arrow (freshidx.delta.executor.file_cache):
downloaded once per machine, the same rows and row groups as the stored file, a cut-off download never
used, bounded by bytes, and the micro-batch's state files read through it from a real S3-protocol server."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from freshidx.delta.executor import file_cache
from freshidx.delta.executor.state_files import MappedState, ParquetState, open_state, open_state_files
from freshidx.store import StoreConfig, open_store


def _parquet(rows: int, row_group: int | None = None) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table({"ad_id": [f"a{i}" for i in range(rows)], "n": list(range(rows))}), sink,
                   row_group_size=row_group)
    return sink.getvalue()


def _rows(path: Path) -> int:
    mapped = MappedState(path)
    try:
        return mapped.num_rows
    finally:
        mapped.close()


class _Remote:
    """A store file: counts its downloads."""

    def __init__(self, data: bytes) -> None:
        self.data, self.downloads = data, 0

    def __call__(self) -> BinaryIO:
        self.downloads += 1
        return io.BytesIO(self.data)


def test_a_file_is_downloaded_once_and_then_opened_from_disk(tmp_path: Path) -> None:
    remote = _Remote(_parquet(100))
    first = file_cache.local_copy("s3|b/f.parquet", remote, 1 << 20, tmp_path)
    second = file_cache.local_copy("s3|b/f.parquet", remote, 1 << 20, tmp_path)
    assert first == second and remote.downloads == 1
    assert _rows(first) == 100


def test_a_copy_numbers_rows_and_row_groups_as_the_stored_file(tmp_path: Path) -> None:
    stored = tmp_path / "stored.parquet"
    stored.write_bytes(_parquet(250, row_group=100))
    parquet, mapped = ParquetState(pq.ParquetFile(stored)), MappedState(
        file_cache.local_copy("s3|b/g.parquet", _Remote(stored.read_bytes()), 1 << 20, tmp_path / "copies"))
    assert mapped.mapped and not parquet.mapped
    assert mapped.row_group_sizes == parquet.row_group_sizes == [100, 100, 50]
    assert mapped.column_names == parquet.column_names
    for g in range(3):
        assert mapped.read_row_group(g).equals(parquet.read_row_group(g))
    assert mapped.read_columns(["n"]).equals(parquet.read_columns(["n"]))
    taken = mapped.read_row_group(2).take([0, 49])
    mapped.close()  # what was read stays valid
    assert taken.column("n").to_pylist() == [200, 249]


def test_a_cut_off_download_is_never_put_in_place(tmp_path: Path) -> None:
    data = _parquet(100)
    with pytest.raises(pa.ArrowException):
        file_cache.local_copy("s3|b/cut.parquet", _Remote(data[: len(data) // 2]), 1 << 20, tmp_path)
    assert list(tmp_path.iterdir()) == []  # neither a copy nor its partial download
    whole = _Remote(data)
    assert _rows(file_cache.local_copy("s3|b/cut.parquet", whole, 1 << 20, tmp_path)) == 100
    assert whole.downloads == 1


def test_the_least_recently_opened_copies_go_first_beyond_the_budget(tmp_path: Path) -> None:
    data = _parquet(1000)
    budget = 2 * file_cache.local_copy("sized", _Remote(data), 1 << 30, tmp_path / "sized").stat().st_size
    root = tmp_path / "copies"
    a = file_cache.local_copy("a", _Remote(data), budget, root)
    b = file_cache.local_copy("b", _Remote(data), budget, root)
    os.utime(b, (time.time() - 60, time.time() - 60))
    file_cache.local_copy("a", _Remote(data), budget, root)  # opened again: the most recent
    c = file_cache.local_copy("c", _Remote(data), budget, root)
    assert a.exists() and c.exists() and not b.exists()


def test_an_abandoned_partial_download_is_deleted_a_recent_one_is_not(tmp_path: Path) -> None:
    old, recent = tmp_path / ".x.1.part", tmp_path / ".y.2.part"
    old.write_bytes(b"partial")
    recent.write_bytes(b"partial")
    long_ago = time.time() - file_cache.ABANDONED_SECONDS - 1
    os.utime(old, (long_ago, long_ago))
    file_cache.local_copy("a", _Remote(_parquet(10)), 1 << 20, tmp_path)
    assert not old.exists() and recent.exists()


def test_an_unwritable_cache_falls_back_to_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")  # the cache's directory cannot be made under a file
    monkeypatch.setattr(file_cache, "cache_dir", lambda: blocked / "copies")
    local = StoreConfig(uri=f"file://{tmp_path / 'store'}")
    open_store(local).put("f.parquet", _parquet(5))
    fs, path = local.arrow_fs(), local.arrow_path("f.parquet")
    with pytest.raises(OSError):
        file_cache.local_copy("x", lambda: fs.open_input_stream(path), 1 << 20)
    reader = open_state(fs, path, "x", 1 << 20)
    assert not reader.mapped and reader.num_rows == 5


def test_state_files_from_s3_are_read_through_one_local_copy(s3_store_config: StoreConfig, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_cache, "cache_dir", lambda: tmp_path / "copies")
    key = f"state/{tmp_path.name}/docs.parquet"
    open_store(s3_store_config).put(key, _parquet(50))
    [f] = open_state_files(s3_store_config, [(key, "docs.parquet", 0, False)], disk_bytes=1 << 20)
    assert f.num_rows() == 50 and not (tmp_path / "copies").exists()  # counted from the footer, nothing copied
    for _ in range(2):
        [f] = open_state_files(s3_store_config, [(key, "docs.parquet", 0, False)], disk_bytes=1 << 20)
        assert f.reader().mapped and f.reader().read_columns(["ad_id"]).num_rows == 50
        f.close()
    copies = list((tmp_path / "copies").iterdir())
    assert len(copies) == 1
    # Off (0) reads the store itself and copies nothing.
    [f] = open_state_files(s3_store_config, [(key, "docs.parquet", 0, False)], disk_bytes=0)
    assert not f.reader().mapped and f.reader().num_rows == 50
    f.close()
    assert list((tmp_path / "copies").iterdir()) == copies


def test_a_local_store_is_mapped_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_cache, "cache_dir", lambda: tmp_path / "copies")
    local = StoreConfig(uri=f"file://{tmp_path / 'store'}")
    open_store(local).put("v/docs.parquet", _parquet(20))
    [f] = open_state_files(local, [("v/docs.parquet", "docs.parquet", 0, False)], disk_bytes=1 << 20)
    assert f.reader().mapped and f.reader().num_rows == 20
    f.close()
