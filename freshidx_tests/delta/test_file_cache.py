"""State files copied to the executor's local disk (freshidx.delta.executor.file_cache): downloaded once per
machine, a cut-off download never used, bounded by bytes, and the micro-batch's state files read through it
from a real S3-protocol server."""

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
from freshidx.delta.executor.state_lookup import open_state_files
from freshidx.store import StoreConfig, open_store


def _parquet(rows: int) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table({"ad_id": [f"a{i}" for i in range(rows)]}), sink)
    return sink.getvalue()


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
    assert pq.read_table(first).num_rows == 100


def test_a_cut_off_download_is_never_put_in_place(tmp_path: Path) -> None:
    data = _parquet(100)
    with pytest.raises(pa.ArrowException):
        file_cache.local_copy("s3|b/cut.parquet", _Remote(data[: len(data) // 2]), 1 << 20, tmp_path)
    assert list(tmp_path.iterdir()) == []  # neither a copy nor its partial download
    whole = _Remote(data)
    assert pq.read_table(file_cache.local_copy("s3|b/cut.parquet", whole, 1 << 20, tmp_path)).num_rows == 100
    assert whole.downloads == 1


def test_the_least_recently_opened_copies_go_first_beyond_the_budget(tmp_path: Path) -> None:
    data = _parquet(1000)
    budget = 2 * len(data)
    a = file_cache.local_copy("a", _Remote(data), budget, tmp_path)
    b = file_cache.local_copy("b", _Remote(data), budget, tmp_path)
    os.utime(b, (time.time() - 60, time.time() - 60))
    file_cache.local_copy("a", _Remote(data), budget, tmp_path)  # opened again: the most recent
    c = file_cache.local_copy("c", _Remote(data), budget, tmp_path)
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
    assert file_cache.open_parquet(fs, path, "x", 1 << 20).read().num_rows == 5


def test_state_files_from_s3_are_read_through_one_local_copy(s3_store_config: StoreConfig, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_cache, "cache_dir", lambda: tmp_path / "copies")
    key = f"state/{tmp_path.name}/docs.parquet"
    open_store(s3_store_config).put(key, _parquet(50))
    for _ in range(2):
        [f] = open_state_files(s3_store_config, [(key, "docs.parquet", 0, False)], disk_bytes=1 << 20)
        assert f.parquet().read().num_rows == 50
        f.close()
    copies = list((tmp_path / "copies").iterdir())
    assert len(copies) == 1
    # Off (0), or a local store, reads the store itself and copies nothing.
    [f] = open_state_files(s3_store_config, [(key, "docs.parquet", 0, False)], disk_bytes=0)
    assert f.parquet().read().num_rows == 50
    f.close()
    assert list((tmp_path / "copies").iterdir()) == copies
