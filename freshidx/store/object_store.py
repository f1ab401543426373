"""The object-store contract: small JSON objects, create-once, compare-and-swap, bounded listing.

Two implementations: :mod:`freshidx.store.local` (a directory; lock + atomic rename) and
:mod:`freshidx.store.s3` (S3 conditional writes ``If-None-Match: *`` / ``If-Match: <etag>``).
Keys are ``/``-separated paths relative to the store root; they are validated so that a key can
never leave the root.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


class StoreError(Exception):
    """Base class for object-store errors."""


class NotFound(StoreError):
    """The key does not exist."""


class PreconditionFailed(StoreError):
    """A conditional write lost: the object exists (create-once) or changed (compare-and-swap)."""


class WriteOutcomeUnknown(StoreError):
    """A write whose response never arrived (timeout, dropped connection): it may or may not be applied.

    Iceberg's "commit state unknown": the caller must re-read before deciding it won or lost.
    """


class ConditionalWritesUnsupported(StoreError):
    """The store accepts ``If-None-Match`` / ``If-Match`` but does not enforce them (probe failed)."""


class InvalidKey(StoreError, ValueError):
    """A key that could escape the store root or is otherwise unusable."""


def check_key(key: str) -> str:
    if not key or key.startswith("/") or "\\" in key or "\x00" in key:
        raise InvalidKey(f"invalid object key {key!r}")
    parts = key.split("/")
    for i, part in enumerate(parts):
        if part in ("", ".", "..") and not (part == "" and i == len(parts) - 1):
            raise InvalidKey(f"invalid object key {key!r}: empty, '.' or '..' segment")
        if part.startswith(".freshidx-"):
            raise InvalidKey(f"invalid object key {key!r}: reserved name")
    return key


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    etag: str
    last_modified: dt.datetime


@dataclass(frozen=True)
class StoredObject:
    key: str
    data: bytes
    etag: str

    def json(self) -> Any:
        return json.loads(self.data)


@dataclass(frozen=True)
class ListPage:
    """One listing call: objects directly matched and, with a delimiter, the common prefixes."""

    objects: list[ObjectInfo]
    prefixes: list[str]


@dataclass
class StoreStats:
    """Call counters, so tests and benchmarks can prove listing cost is bounded.

    ``listed_entries``: keys and common prefixes the LIST calls returned (what a listing costs beyond its
    calls: one call may return up to 1,000 of them)."""

    list_calls: int = 0
    get_calls: int = 0
    put_calls: int = 0
    listed_entries: int = 0
    quick_retries: int = 0  # reads the quick first try did not answer, asked again (an S3 store)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def bump(self, name: str, by: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + by)

    def reset(self) -> None:
        with self._lock:
            self.list_calls = self.get_calls = self.put_calls = self.listed_entries = self.quick_retries = 0


class ObjectStore(ABC):
    """Operations the driver needs: listings, manifests, pointers. Bulk data goes through Spark."""

    uri: str
    stats: StoreStats

    @abstractmethod
    def get(self, key: str) -> StoredObject:
        """Read a whole object with its ETag. Raises NotFound."""

    def get_data(self, key: str) -> bytes:
        """Read a whole object's bytes without its ETag (a store that computes ETags from the bytes skips
        that: a reader's download verifies its own sha256). Raises NotFound."""
        return self.get(key).data

    @abstractmethod
    def head(self, key: str) -> ObjectInfo:
        """Size and ETag without reading the body. Raises NotFound."""

    @abstractmethod
    def put(self, key: str, data: bytes) -> str:
        """Unconditional write (atomic for readers). Returns the new ETag."""

    @abstractmethod
    def create(self, key: str, data: bytes) -> str:
        """Create-once: raises PreconditionFailed if the key exists. Returns the ETag."""

    @abstractmethod
    def swap(self, key: str, data: bytes, expected_etag: str | None) -> str:
        """Compare-and-swap. ``expected_etag=None`` means the key must not exist yet.

        Raises PreconditionFailed when the current object does not match. Returns the new ETag.
        """

    @abstractmethod
    def delete(self, key: str) -> None:
        """Delete a key; deleting a missing key is not an error."""

    def list_page(
        self, prefix: str, *, delimiter: str | None = None, start_after: str | None = None,
        max_keys: int = 1000, continuation: str | None = None,
    ) -> tuple[ListPage, str | None]:
        """One LIST call. Returns the page and a continuation token (None when done)."""
        page, token = self._list_page(prefix, delimiter=delimiter, start_after=start_after, max_keys=max_keys,
                                      continuation=continuation)
        self.stats.bump("listed_entries", len(page.objects) + len(page.prefixes))
        return page, token

    @abstractmethod
    def _list_page(
        self, prefix: str, *, delimiter: str | None, start_after: str | None, max_keys: int,
        continuation: str | None,
    ) -> tuple[ListPage, str | None]:
        """The store's LIST call behind :meth:`list_page` (which counts what it returns)."""

    # ---- derived helpers (shared by every implementation) ----

    def list(
        self, prefix: str, *, delimiter: str | None = None, start_after: str | None = None,
        limit: int | None = None,
    ) -> ListPage:
        """All pages of a listing (optionally stopping after ``limit`` objects)."""
        objects: list[ObjectInfo] = []
        prefixes: list[str] = []
        token: str | None = None
        while True:
            page, token = self.list_page(
                prefix, delimiter=delimiter, start_after=start_after, continuation=token
            )
            objects.extend(page.objects)
            prefixes.extend(page.prefixes)
            if token is None or (limit is not None and len(objects) >= limit):
                break
        return ListPage(objects[:limit] if limit is not None else objects, prefixes)

    def iter_objects(self, prefix: str, *, start_after: str | None = None) -> Iterator[ObjectInfo]:
        token: str | None = None
        while True:
            page, token = self.list_page(prefix, start_after=start_after, continuation=token)
            yield from page.objects
            if token is None:
                return

    def check_conditional_writes(self) -> None:
        """Raise :class:`ConditionalWritesUnsupported` if create-once / CAS are not enforced.

        Called when a store is opened for writing; a store that trusts its primitives (a directory:
        ``os.link`` + ``flock``) has nothing to check.
        """
        return None

    def create_or_same(self, key: str, data: bytes) -> str:
        """Create-once that survives a lost response; returns the ETag.

        A 412 can be our own earlier attempt, applied by the server before its response was lost
        (the client retried), and a timeout leaves the outcome unknown. Either way, read the object
        back: identical bytes mean our create succeeded. Other bytes raise PreconditionFailed.
        """
        for _ in range(3):
            try:
                return self.create(key, data)
            except (PreconditionFailed, WriteOutcomeUnknown) as exc:
                try:
                    found = self.get(key)
                except NotFound:
                    if isinstance(exc, PreconditionFailed):
                        raise
                    continue  # never landed: safe to try again
                if found.data == data:
                    return found.etag
                raise PreconditionFailed(f"{key} already exists with other content") from exc
        raise WriteOutcomeUnknown(f"{key}: create-once outcome still unknown after 3 attempts")

    def exists(self, key: str) -> bool:
        try:
            self.get_data(key)
        except NotFound:
            return False
        return True

    def get_json(self, key: str) -> tuple[Any, str]:
        obj = self.get(key)
        return obj.json(), obj.etag

    def put_json(self, key: str, value: Any) -> str:
        return self.put(key, dump_json(value))

    def create_json(self, key: str, value: Any) -> str:
        """Create-once of a JSON object; our own earlier write of the same bytes counts as success."""
        return self.create_or_same(key, dump_json(value))

    def swap_json(self, key: str, value: Any, expected_etag: str | None) -> str:
        return self.swap(key, dump_json(value), expected_etag)


def dump_json(value: Any) -> bytes:
    return (json.dumps(value, sort_keys=True, indent=1, default=_encode) + "\n").encode()


def _encode(value: Any) -> Any:
    # A store record (freshidx.store.records) is written in its serialized form, whoever hands it over.
    to_json = getattr(value, "to_json", None)
    return to_json() if callable(to_json) else str(value)
