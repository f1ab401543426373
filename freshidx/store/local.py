"""A directory as an object store.

Atomicity: every write goes to a temp file in ``<root>/.freshidx-tmp`` (same filesystem) and is
then renamed into place, so readers see the old or the new object, never a partial one.
Create-once uses ``os.link`` (fails if the target exists); compare-and-swap holds an exclusive
``flock`` on a per-key lock file while it compares the content hash and renames.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

from freshidx.store.errors import classify
from freshidx.store.object_store import (
    ListPage,
    NotFound,
    ObjectInfo,
    ObjectStore,
    PreconditionFailed,
    StoredObject,
    StoreStats,
    check_key,
)

_RESERVED = ".freshidx-"


def _etag(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


class LocalStore(ObjectStore):
    """``create=True``: the root (and its parents) is created if missing, as a writer wants.
    ``create=False``: the root must be an existing directory (else :class:`StoreAccessError`) and opening
    creates nothing in it; the temp and lock dirs appear only with the first write."""

    def __init__(self, root: str | os.PathLike[str], uri: str | None = None, *, create: bool = True) -> None:
        self.root = Path(root).resolve()
        self.uri = uri or self.root.as_uri()
        self.stats = StoreStats()
        self._tmp = self.root / f"{_RESERVED}tmp"
        self._locks = self.root / f"{_RESERVED}locks"
        self._work_dirs_made = create
        if create:
            for d in (self.root, self._tmp, self._locks):
                d.mkdir(parents=True, exist_ok=True)
        else:
            try:
                with os.scandir(self.root):
                    pass  # an existing directory we may read
            except OSError as exc:
                error = classify(exc, uri=self.uri)
                if error is None:
                    raise
                raise error from exc

    def _work_dirs(self) -> None:
        """The temp and lock dirs, made by the first write of a store opened with ``create=False``."""
        if not self._work_dirs_made:
            for d in (self._tmp, self._locks):
                d.mkdir(exist_ok=True)
            self._work_dirs_made = True

    # ---- paths ----
    def path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _write_tmp(self, data: bytes) -> Path:
        self._work_dirs()
        tmp = self._tmp / uuid.uuid4().hex
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return tmp

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        self._work_dirs()
        lock = self._locks / hashlib.sha1(key.encode()).hexdigest()
        with open(lock, "a+b") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    # ---- contract ----
    def get(self, key: str) -> StoredObject:
        data = self.get_data(key)
        return StoredObject(key, data, _etag(data))

    def get_data(self, key: str) -> bytes:
        self.stats.bump("get_calls")
        p = self.path(key)
        try:
            return p.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise NotFound(key) from exc

    def head(self, key: str) -> ObjectInfo:
        self.stats.bump("get_calls")
        p = self.path(key)
        try:
            st = p.stat()
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise NotFound(key) from exc
        if not p.is_file():
            raise NotFound(key)
        return ObjectInfo(key, st.st_size, f"{st.st_size:x}-{st.st_mtime_ns:x}",
                          dt.datetime.fromtimestamp(st.st_mtime, tz=dt.UTC))

    def put(self, key: str, data: bytes) -> str:
        self.stats.bump("put_calls")
        p = self.path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._write_tmp(data)
        with self._locked(key):
            os.replace(tmp, p)
        return _etag(data)

    def create(self, key: str, data: bytes) -> str:
        self.stats.bump("put_calls")
        p = self.path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._write_tmp(data)
        try:
            os.link(tmp, p)  # atomic, fails if p exists: create-once with full content visible
        except FileExistsError as exc:
            raise PreconditionFailed(f"{key} already exists") from exc
        finally:
            tmp.unlink(missing_ok=True)
        return _etag(data)

    def swap(self, key: str, data: bytes, expected_etag: str | None) -> str:
        self.stats.bump("put_calls")
        p = self.path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._write_tmp(data)
        try:
            with self._locked(key):
                try:
                    current: str | None = _etag(p.read_bytes())
                except FileNotFoundError:
                    current = None
                if current != expected_etag:
                    raise PreconditionFailed(
                        f"{key}: expected etag {expected_etag!r}, found {current!r}"
                    )
                os.replace(tmp, p)
        finally:
            tmp.unlink(missing_ok=True)
        return _etag(data)

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(key).unlink()

    def _list_page(
        self, prefix: str, *, delimiter: str | None, start_after: str | None, max_keys: int,
        continuation: str | None,
    ) -> tuple[ListPage, str | None]:
        # The continuation token is the last key returned: listing resumes strictly after it.
        after = max(filter(None, [start_after, continuation]), default=None)
        if delimiter not in (None, "/"):
            raise ValueError("only '/' is supported as delimiter")
        objects: list[ObjectInfo] = []
        prefixes: list[str] = []
        if delimiter == "/":
            self.stats.bump("list_calls")
            dir_key, _, name_prefix = prefix.rpartition("/")
            base = self.root / dir_key if dir_key else self.root
            for entry in sorted(self._scandir(base), key=lambda e: e.name):
                if not entry.name.startswith(name_prefix) or entry.name.startswith(_RESERVED):
                    continue
                key = f"{dir_key}/{entry.name}" if dir_key else entry.name
                if entry.is_dir():
                    if after is not None and key + "/" <= after and not after.startswith(key + "/"):
                        continue
                    prefixes.append(key + "/")
                elif after is None or key > after:
                    objects.append(self._info(key, entry))
            return ListPage(objects, prefixes), None
        # Recursive listing in key order, pruning subtrees that lie entirely at or before `after`.
        # One page counts as one LIST call, like S3.
        self.stats.bump("list_calls")
        for key, entry in self._walk(prefix, after):
            objects.append(self._info(key, entry))
            if len(objects) >= max_keys:
                return ListPage(objects, []), key
        return ListPage(objects, []), None

    # ---- internals ----
    def _scandir(self, path: Path) -> list[os.DirEntry[str]]:
        try:
            with os.scandir(path) as it:
                return list(it)
        except (FileNotFoundError, NotADirectoryError):
            return []

    def _walk(self, prefix: str, after: str | None) -> Iterator[tuple[str, os.DirEntry[str]]]:
        dir_key, _, name_prefix = prefix.rpartition("/")
        base = self.root / dir_key if dir_key else self.root
        yield from self._walk_dir(base, dir_key, name_prefix, after)

    def _walk_dir(
        self, path: Path, dir_key: str, name_prefix: str, after: str | None
    ) -> Iterator[tuple[str, os.DirEntry[str]]]:
        # Sorting entries by "name/" for dirs and "name" for files yields S3's lexicographic key order.
        entries = [
            e for e in self._scandir(path)
            if e.name.startswith(name_prefix) and not e.name.startswith(_RESERVED)
        ]
        entries.sort(key=lambda e: e.name + "/" if e.is_dir() else e.name)
        for e in entries:
            key = f"{dir_key}/{e.name}" if dir_key else e.name
            if e.is_dir():
                sub = key + "/"
                if after is not None and sub <= after and not after.startswith(sub):
                    continue  # every key below `sub` sorts before `after`
                yield from self._walk_dir(Path(e.path), key, "", after)
            elif after is None or key > after:
                yield key, e

    @staticmethod
    def _info(key: str, entry: os.DirEntry[str]) -> ObjectInfo:
        st = entry.stat()
        # The listing ETag of a local file is size+mtime (cheap); get() returns the content hash.
        return ObjectInfo(
            key=key,
            size=st.st_size,
            etag=f"{st.st_size:x}-{st.st_mtime_ns:x}",
            last_modified=dt.datetime.fromtimestamp(st.st_mtime, tz=dt.UTC),
        )
