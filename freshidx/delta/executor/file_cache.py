"""Immutable state files kept on the executor's local disk as uncompressed Arrow IPC, shared by its Python
workers through memory maps (docs/architecture.md#state-as-built).

A micro-batch takes its state rows from every row group of the full version's state files (the rows it needs
are spread over all of them). Decoding those row groups from Parquet on every micro-batch cost the window;
keeping them decoded in each worker cost a worker's memory the size of the window. A state file never changes
once written (every key carries its index version and task attempt), so the first worker on a machine that
needs it downloads it once and writes it out decoded, uncompressed, one record batch per Parquet row group:
every worker then maps it, and a lookup is a ``take`` from the page cache
(:class:`freshidx.delta.executor.state_files.MappedState`). A new worker (after a killed task, a takeover)
starts warm. Bounded by bytes (the least recently opened copies go first); a copy appears only complete
(written aside, checked, then renamed into place).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

#: A partial download this old was abandoned (its worker died); any download takes far less.
ABANDONED_SECONDS = 3600
#: The directory under the executor's temporary directory (``TMPDIR``) that holds the copies.
DIR_NAME = "freshidx-state-files"
#: The copies' file name suffix (copies of another form, left by an older freshidx, age out by the budget).
SUFFIX = ".arrow"
#: What one read-ahead request asks of the kernel (one request for a whole file is cut short at the device's
#: read-ahead size).
READ_AHEAD_CHUNK = 8 << 20


def cache_dir() -> Path:
    """Where this machine keeps its copies (resolved where the task runs, not on the driver)."""
    return Path(tempfile.gettempdir()) / f"{DIR_NAME}-{os.getuid()}"


def copy_path(name: str, root: Path | None = None) -> Path:
    """Where the copy of the immutable file ``name`` (its store path) lives."""
    return (root or cache_dir()) / f"{hashlib.sha256(name.encode()).hexdigest()}{SUFFIX}"


def existing_copy(name: str, root: Path | None = None) -> Path | None:
    path = copy_path(name, root)
    return path if path.exists() else None


def _opened(path: Path) -> bool:
    """Mark the copy ``path`` as opened now (the last to go), if it exists."""
    try:
        os.utime(path)
        return True
    except FileNotFoundError:
        return False


def local_copy(name: str, open_remote: Callable[[], BinaryIO], max_bytes: int, root: Path | None = None) -> Path:
    """The local mapped copy of the immutable Parquet file ``name``, downloaded with ``open_remote()`` and
    written out as Arrow when missing (:func:`adopt`)."""
    root = root or cache_dir()
    path = copy_path(name, root)
    if _opened(path):
        return path
    root.mkdir(parents=True, exist_ok=True)
    download = root / f".{path.name}.{uuid.uuid4().hex}.parquet.part"  # two workers may fetch it: both complete
    try:
        with open_remote() as src, open(download, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        return adopt(name, download, max_bytes, root)  # a cut-off download has no footer: it fails there
    finally:
        download.unlink(missing_ok=True)


def adopt(name: str, parquet: Path, max_bytes: int, root: Path | None = None) -> Path:
    """The local mapped copy of ``name`` made from ``parquet``, a local file with its contents (a download, or
    the file a task just wrote), unless there is one; the copies beyond ``max_bytes`` are then deleted, least
    recently opened first."""
    root = root or cache_dir()
    path = copy_path(name, root)
    if _opened(path):
        return path
    root.mkdir(parents=True, exist_ok=True)
    written = root / f".{path.name}.{uuid.uuid4().hex}.part"
    try:
        write_mapped(parquet, written)
        os.replace(written, path)
    finally:
        written.unlink(missing_ok=True)
    evict(root, max_bytes, keep=path)
    return path


def write_mapped(parquet: Path, out: Path) -> None:
    """``parquet`` as uncompressed Arrow IPC at ``out``, one record batch per row group (so rows and row groups
    are numbered alike), checked by reading its footer back."""
    source = pq.ParquetFile(parquet)
    try:
        groups = source.metadata.num_row_groups
        with pa.OSFile(str(out), "wb") as sink, pa.ipc.new_file(sink, source.schema_arrow) as writer:
            for g in range(groups):
                # One batch: a Parquet row group may come back in several chunks.
                writer.write_batch(source.read_row_group(g, use_threads=False).combine_chunks().to_batches()[0]
                                   if source.metadata.row_group(g).num_rows else
                                   pa.RecordBatch.from_pylist([], source.schema_arrow))
    finally:
        source.close()
    with pa.memory_map(str(out)) as mapped:
        if pa.ipc.open_file(mapped).num_record_batches != groups:
            raise pa.ArrowInvalid(f"{out}: written short")


def read_ahead(path: Path) -> None:
    """Ask the kernel to bring ``path`` into the page cache; it reads in the background and this returns at
    once. A copy written a while ago may have been pushed out by other reads, and a lookup's takes, spread over
    the whole file, would then each wait on a random read from the disk. Best effort: nothing where the
    platform has no such advice, nothing for a copy evicted meanwhile."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        size = os.fstat(fd).st_size
        for offset in range(0, size, READ_AHEAD_CHUNK):
            advise(fd, offset, READ_AHEAD_CHUNK, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


def evict(root: Path, max_bytes: int, keep: Path) -> None:
    """Delete the least recently opened copies until those left weigh at most ``max_bytes`` (``keep``
    stays: a task is about to open it). Another worker may delete the same copy first: skipped."""
    copies: list[tuple[float, int, Path]] = []
    now = time.time()
    for entry in os.scandir(root):
        try:
            st = entry.stat()
        except FileNotFoundError:
            continue
        if not entry.name.startswith("."):
            copies.append((st.st_mtime, st.st_size, Path(entry.path)))
        elif now - st.st_mtime > ABANDONED_SECONDS:  # a download whose worker was killed
            Path(entry.path).unlink(missing_ok=True)
    total = sum(size for _, size, _ in copies)
    for _, size, path in sorted(copies):
        if total <= max_bytes:
            break
        if path != keep:
            path.unlink(missing_ok=True)  # an open copy stays readable to whoever has it open
            total -= size
