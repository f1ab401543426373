"""An in-memory :class:`~freshidx.store.object_store.ObjectStore`: the whole contract, every call a scheduling point.

Create-once, compare-and-swap on the content ETag (an MD5, as S3's for a single-part upload), sorted keys,
``list_page`` with ``/`` delimiter, ``StartAfter`` and continuation tokens. Before each call it asks its
``hook`` (the scheduler) what happens to the call: nothing, a transient error (nothing applied), or a lost
response (applied, then the caller hears :class:`WriteOutcomeUnknown`, a 412 as a client retry of an applied
conditional write gets, or a connection error). A crash never returns from the hook.
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime as dt
import functools
import hashlib
import json
from collections.abc import Callable
from enum import Enum
from typing import Any, TypeVar

from freshidx.store.errors import Problem, StoreAccessError
from freshidx.store.object_store import (
    ListPage,
    NotFound,
    ObjectInfo,
    ObjectStore,
    PreconditionFailed,
    StoredObject,
    StoreStats,
    WriteOutcomeUnknown,
    _encode,
    check_key,
)
from freshidx.store.records.base import Record

R = TypeVar("R", bound=Record)


class Fault(Enum):
    NONE = "ok"
    TRANSIENT = "transient"  # the call fails, nothing applied
    LOST_UNKNOWN = "lost"  # applied; no response at all
    LOST_RETRIED = "lost-412"  # applied; the client's retry of a conditional write got 412


#: (op, key, is_write) -> what happens to this call; may never return (the actor is killed there).
Hook = Callable[[str, str, bool], Fault]
#: Told of every applied delete: (key, the object's last-modified time).
DeleteWatch = Callable[[str, dt.datetime], None]


def _etag(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


#: The store contract's key check, once per key per process (a schedule uses the same few hundred keys).
_checked = functools.lru_cache(maxsize=1 << 16)(check_key)
#: JSON bodies parsed once per process by content: every schedule starts from the same records and reads each
#: one again and again. The value is shared: the only reader, ``Record.from_json``, validates it into a new
#: record (test_simulation.py checks that a schedule's trace is the same with and without this cache).
_parsed = functools.lru_cache(maxsize=1 << 12)(json.loads)


@functools.lru_cache(maxsize=1 << 12)
def read_record(cls: type[Record], data: bytes) -> Record:
    """A record read once per process by kind and content (``Record.read`` while memos.py is installed, and the
    checker): validating the same body again made a new, equal record; the records are shared the way the
    parsed bodies are (nothing changes a record it read; test_simulation.py compares schedules without)."""
    record = cls.from_json(_parsed(data))
    if len(_SHARED) >= 1 << 13:
        _SHARED.clear()
    _SHARED[id(record)] = record
    return record


#: The records :func:`read_record` handed out, by identity (held, so an id is not reused while listed).
_SHARED: dict[int, Record] = {}


def shared(record: Record) -> bool:
    """Whether ``record`` is one the store shares (read-only by contract: a value derived from it may be kept)."""
    return _SHARED.get(id(record)) is record


NO_FAULT = Fault.NONE  # a module global: read at every store call


class _Stats(StoreStats):
    """The call counters without their lock: one actor runs at a time."""

    def bump(self, name: str, by: int = 1) -> None:
        setattr(self, name, getattr(self, name) + by)


#: An object: its bytes, ETag, last-modified time and the listing's ObjectInfo of it (built once per write).
Entry = tuple[bytes, str, dt.datetime, ObjectInfo]


class MemStore(ObjectStore):
    """Objects in a dict, keys in a sorted list; ``clock`` dates each write (the simulated clock)."""

    def __init__(self, clock: Callable[[], dt.datetime], *, page_size: int = 1000, uri: str = "sim://store") -> None:
        self.uri = uri
        self.stats: StoreStats = _Stats()
        self.objects: dict[str, Entry] = {}
        self.keys: list[str] = []
        self.clock = clock
        self.page_size = page_size  # the most a LIST answers, whatever max_keys asks (S3 may answer fewer)
        self.hook: Hook | None = None
        self.on_delete: DeleteWatch | None = None
        self.mutations = 0
        #: The keys of deletes and overwrites, in order: the only changes that can take a file from a version
        #: (invariants.py reads what is new since it last looked).
        self.removed: list[str] = []
        #: False: parse every JSON body read (the reference the parse cache is checked against).
        self.parse_cache = True

    # ---- the scheduling point: each call of the contract asks ``hook`` first (inline: the hottest path)
    def _transient(self, op: str, key: str) -> StoreAccessError:
        return StoreAccessError(Problem.UNREACHABLE, self.uri, detail=f"{op} {key}: connection reset (simulated)")

    def _lost(self, fault: Fault, op: str, key: str, conditional: bool) -> None:
        if fault is Fault.LOST_RETRIED and conditional:
            raise PreconditionFailed(f"{key}: 412 (simulated retry of an applied {op})")
        if conditional:
            raise WriteOutcomeUnknown(f"{key}: no response to a conditional write (simulated)")
        raise self._transient(op, key)

    # ---- JSON without indentation: the C encoder (the bytes differ from a real store's, never their meaning)
    def put_json(self, key: str, value: Any) -> str:
        return self.put(key, _dump(value))

    def create_json(self, key: str, value: Any) -> str:
        return self.create_or_same(key, _dump(value))

    def swap_json(self, key: str, value: Any, expected_etag: str | None) -> str:
        return self.swap(key, _dump(value), expected_etag)

    def get_json(self, key: str) -> tuple[Any, str]:
        obj = self.get(key)
        return (_parsed(obj.data) if self.parse_cache else json.loads(obj.data)), obj.etag

    def get_record(self, cls: type[R], key: str) -> tuple[R, str]:
        """``cls.read(self, key)``: the same call, the record shared by content (unless ``parse_cache`` is off)."""
        obj = self.get(key)
        if self.parse_cache:
            return read_record(cls, obj.data), obj.etag  # type: ignore[return-value]
        return cls.from_json(json.loads(obj.data)), obj.etag

    # ---- raw state (no scheduling point: the invariant checker and setup read through these)
    def raw(self, key: str) -> bytes | None:
        found = self.objects.get(key)
        return None if found is None else found[0]

    def under(self, prefix: str, limit: int | None = None) -> list[str]:
        """The keys that start with ``prefix``, in order (at most ``limit``)."""
        keys, out = self.keys, []
        i = bisect.bisect_left(keys, prefix)
        while i < len(keys) and keys[i].startswith(prefix) and len(out) != limit:
            out.append(keys[i])
            i += 1
        return out

    def _set(self, key: str, data: bytes) -> str:
        etag = _etag(data)
        if key in self.objects:
            self.removed.append(key)
        else:
            bisect.insort(self.keys, key)
        modified = self.clock()
        self.objects[key] = (data, etag, modified, ObjectInfo(key, len(data), etag, modified))
        self.mutations += 1
        return etag

    # ---- contract
    def get(self, key: str) -> StoredObject:
        checked = _checked(key)
        fault = NO_FAULT if (hook := self.hook) is None else hook("get", checked, False)
        self.stats.get_calls += 1
        if fault is Fault.TRANSIENT:
            raise self._transient("get", key)
        found = self.objects.get(key)
        if found is None:
            raise NotFound(key)
        return StoredObject(key, found[0], found[1])

    def head(self, key: str) -> ObjectInfo:
        checked = _checked(key)
        fault = NO_FAULT if (hook := self.hook) is None else hook("head", checked, False)
        self.stats.get_calls += 1
        if fault is Fault.TRANSIENT:
            raise self._transient("head", key)
        found = self.objects.get(key)
        if found is None:
            raise NotFound(key)
        return found[3]

    def put(self, key: str, data: bytes) -> str:
        checked = _checked(key)
        fault = NO_FAULT if (hook := self.hook) is None else hook("put", checked, True)
        self.stats.put_calls += 1
        if fault is Fault.TRANSIENT:
            raise self._transient("put", key)
        etag = self._set(key, data)
        if fault is not Fault.NONE:
            self._lost(fault, "put", key, conditional=False)
        return etag

    def create(self, key: str, data: bytes) -> str:
        return self._conditional("create", key, data, None, create=True)

    def swap(self, key: str, data: bytes, expected_etag: str | None) -> str:
        return self._conditional("swap", key, data, expected_etag, create=False)

    def _conditional(self, op: str, key: str, data: bytes, expected: str | None, *, create: bool) -> str:
        checked = _checked(key)
        fault = NO_FAULT if (hook := self.hook) is None else hook(op, checked, True)
        self.stats.put_calls += 1
        if fault is Fault.TRANSIENT:
            raise self._transient(op, key)
        found = self.objects.get(key)
        if create or expected is None:
            if found is not None:
                raise PreconditionFailed(f"{key} already exists")
        elif found is None or found[1] != expected:
            raise PreconditionFailed(f"{key}: expected etag {expected!r}, found {found[1] if found else None!r}")
        etag = self._set(key, data)
        if fault is not Fault.NONE:
            self._lost(fault, op, key, conditional=True)
        return etag

    def delete(self, key: str) -> None:
        checked = _checked(key)
        fault = NO_FAULT if (hook := self.hook) is None else hook("delete", checked, True)
        if fault is Fault.TRANSIENT:
            raise self._transient("delete", key)
        found = self.objects.pop(key, None)
        if found is not None:
            del self.keys[bisect.bisect_left(self.keys, key)]
            self.mutations += 1
            self.removed.append(key)
            if self.on_delete is not None:
                self.on_delete(key, found[2])
        if fault is not Fault.NONE:
            self._lost(fault, "delete", key, conditional=False)

    def list_page(
        self, prefix: str, *, delimiter: str | None = None, start_after: str | None = None,
        max_keys: int = 1000, continuation: str | None = None,
    ) -> tuple[ListPage, str | None]:
        """:meth:`ObjectStore.list_page`, counted directly."""
        page, token = self._list_page(prefix, delimiter=delimiter, start_after=start_after, max_keys=max_keys,
                                      continuation=continuation)
        self.stats.listed_entries += len(page.objects) + len(page.prefixes)
        return page, token

    def _list_page(
        self, prefix: str, *, delimiter: str | None, start_after: str | None, max_keys: int,
        continuation: str | None,
    ) -> tuple[ListPage, str | None]:
        if delimiter not in (None, "/"):
            raise ValueError("only '/' is supported as delimiter")
        fault = NO_FAULT if (hook := self.hook) is None else hook("list", prefix or "/", False)
        self.stats.list_calls += 1
        if fault is Fault.TRANSIENT:
            raise self._transient("list", prefix)
        return self._page(prefix, delimiter, continuation or start_after, min(max_keys, self.page_size),
                          skip_under=continuation is not None)

    def _page(self, prefix: str, delimiter: str | None, after: str | None, limit: int, *, skip_under: bool
              ) -> tuple[ListPage, str | None]:
        # The token is the last key or common prefix answered: resume strictly after it (and after
        # every key under it, for a prefix), as S3 does.
        keys, entries = self.keys, self.objects
        i = bisect.bisect_right(keys, after) if after is not None and after > prefix else \
            bisect.bisect_left(keys, prefix)
        if delimiter is None and limit > 0 and not (skip_under and after is not None and after.endswith("/")):
            # No grouping: the keys under the prefix are one run of the sorted keys, answered as a slice.
            end = bisect.bisect_left(keys, prefix + "\U0010ffff", i)
            taken = keys[i:min(end, i + limit)]
            page = ListPage([entries[key][3] for key in taken], [])
            return page, (taken[-1] if end - i > limit else None)
        objects: list[ObjectInfo] = []
        prefixes: list[str] = []
        last: str | None = None
        while i < len(keys):
            key = keys[i]
            if not key.startswith(prefix):
                break
            if skip_under and after is not None and after.endswith("/") and key.startswith(after):
                i += 1
                continue
            if len(objects) + len(prefixes) >= limit:
                return ListPage(objects, prefixes), last
            cut = key.find("/", len(prefix)) if delimiter else -1
            if cut >= 0:
                common = key[:cut + 1]
                prefixes.append(common)
                last = common
                i = bisect.bisect_left(keys, common + "\U0010ffff", i)
                continue
            objects.append(entries[key][3])
            last = key
            i += 1
        return ListPage(objects, prefixes), None


def _dump(value: Any) -> bytes:
    return _ENCODER.encode(value).encode()


def _dataclass_or_encode(value: Any) -> Any:
    """A record's field values go to the encoder as they are (memos.py): a nested dataclass as
    ``dataclasses.asdict`` makes it, as ``Record.to_json`` would have; anything else as every store encodes it."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return _encode(value)


#: ``json.dumps(value, sort_keys=True, separators=(",", ":"), default=...)``, its encoder built once.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=_dataclass_or_encode)
