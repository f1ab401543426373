"""Immutable state files copied to the executor's local disk, shared by its Python workers
(docs/architecture.md#state-as-built).

A Python worker keeps what it decoded (:mod:`freshidx.delta.executor.decoded_cache`), but a new worker
starts empty: after a killed task (a killed run's micro-batch takes its workers with it), after Spark
stopped an idle one, on a standby's takeover. Reading the state again through the object store costs
one round trip per column chunk and row group, each one a chance of a slow or failed answer. A state
file never changes once written (every key carries its index version and task attempt), so the first
worker on a machine that needs it downloads it whole, once, and every later worker opens the local
copy: a new worker decodes from disk. Bounded by bytes (the least recently opened copies go first);
a copy appears only complete (written aside, checked, then renamed into place).
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
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

#: A partial download this old was abandoned (its worker died); any download takes far less.
ABANDONED_SECONDS = 3600
#: The directory under the executor's temporary directory (``TMPDIR``) that holds the copies.
DIR_NAME = "freshidx-state-files"


def cache_dir() -> Path:
    """Where this machine keeps its copies (resolved where the task runs, not on the driver)."""
    return Path(tempfile.gettempdir()) / f"{DIR_NAME}-{os.getuid()}"


def open_parquet(fs: Any, path: str, name: str, disk_bytes: int) -> pq.ParquetFile:
    """The immutable file ``path`` of ``fs`` (named ``name``), through its local copy when ``disk_bytes`` allows
    one; from the store when not, or should the copy fail (a full disk costs the store reads, nothing else)."""
    if disk_bytes > 0:
        try:
            return pq.ParquetFile(str(local_copy(name, lambda: fs.open_input_stream(path), disk_bytes)))
        except (OSError, pa.ArrowException):
            pass
    return pq.ParquetFile(fs.open_input_file(path))


def local_copy(name: str, open_remote: Callable[[], BinaryIO], max_bytes: int, root: Path | None = None) -> Path:
    """The local copy of the immutable file ``name`` (its store path), downloaded with ``open_remote()``
    when missing; the copies beyond ``max_bytes`` are then deleted, least recently opened first."""
    root = root or cache_dir()
    path = root / hashlib.sha256(name.encode()).hexdigest()
    try:
        os.utime(path)  # opened now: the last to go
        return path
    except FileNotFoundError:
        pass
    root.mkdir(parents=True, exist_ok=True)
    part = root / f".{path.name}.{uuid.uuid4().hex}.part"  # two workers may fetch the same file: both complete
    try:
        with open_remote() as src, open(part, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        pq.ParquetFile(part).close()  # a cut-off download has no footer: never renamed into place
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)
    evict(root, max_bytes, keep=path)
    return path


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
