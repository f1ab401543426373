"""Pure computations of the code under test, memoized while a simulation runs
(docs/architecture.md#deterministic-simulation).

Every schedule starts from the same state, and its code parses the same few partition paths, formats the
same times, builds the same ledger keys and reads the same records thousands of times. While
:func:`installed` is active (``seams.installed`` enters it) these functions and methods answer from a
per-process memo: the same values, computed once. Each is a function of hashable, immutable arguments whose
result is immutable or never changed by its readers; a value that does not parse raises every time, as
before. Records the memory store reads are shared by content (``memstore.read_record``) and a record is
written to it from its fields as they are (the bytes ``to_json``'s deep copy would give). test_simulation.py
checks that schedules go the same with and without these (:func:`suspended`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

from freshidx.store import ObjectStore
from freshidx.store.partitions import PartitionId
from freshidx.store.records import base
from freshidx.store.records.base import Record
from freshidx.store.records.index import Manifest
from freshidx.store.records.segment import Segment
from freshidx.tools.simulation import memstore
from freshidx.tools.simulation.memstore import MemStore

#: Module functions memoized: (module, name) -> memo size. Every freshidx module that bound the function
#: (``from m import f``) gets the memo.
PURE = {("freshidx.store.records.base", "iso"): 1 << 12, ("freshidx.publish.commit", "parse_iso"): 1 << 12,
        ("freshidx.trigger.ledger", "partition_key"): 1 << 12, ("freshidx.trigger.lifecycle", "parse_suffix"): 1 << 12,
        ("freshidx.store.partitions", "parse_segment"): 256}

_PARSE = PartitionId.__dict__["parse"].__func__
_PARTITION_NAMES = tuple(PartitionId.__dict__[name].fget for name in ("path", "compact", "hour_path"))
_SEGMENT_LIST = Manifest.__dict__["segment_list"]
_TO_STORE = {name: Record.__dict__[name] for name in ("create", "put", "swap")}
_TO_JSON = Record.__dict__["to_json"]


@functools.lru_cache(maxsize=1 << 12)
def _partition(path: str) -> PartitionId:
    parsed: PartitionId = _PARSE(PartitionId, path)
    return parsed


def _parse_partition(cls: type[PartitionId], path: str) -> PartitionId:
    return _partition(path) if cls is PartitionId else _PARSE(cls, path)  # type: ignore[no-any-return]


@functools.lru_cache(maxsize=1 << 12)
def _minute_names(at: Any) -> tuple[str, ...]:
    """``PartitionId.path``, ``.compact`` and ``.hour_path`` of the minute ``at`` (all they read of it)."""
    p = SimpleNamespace(at=at)
    return tuple(name(p) for name in _PARTITION_NAMES)


#: ``Manifest.segment_list()`` of the manifests the memory store shares, by identity (each held while listed,
#: so an id is not reused).
_SEGMENTS: dict[int, tuple[Manifest, tuple[Segment, ...] | None]] = {}


def _segment_list(self: Manifest) -> list[Segment] | None:
    """``segment_list`` once per shared manifest: a new list each call, of the same (frozen) segments."""
    hit = _SEGMENTS.get(id(self))
    if hit is None:
        if not memstore.shared(self):
            return _SEGMENT_LIST(self)  # type: ignore[no-any-return]
        if len(_SEGMENTS) >= 1 << 12:
            _SEGMENTS.clear()
        listed = _SEGMENT_LIST(self)
        hit = _SEGMENTS[id(self)] = (self, None if listed is None else tuple(listed))
    return None if hit[1] is None else list(hit[1])


def _read_record(cls: type[Record], store: ObjectStore, key: str) -> tuple[Record, str]:
    """``Record.read``: through the memory store's records by content when it is one (the same call, the
    same scheduling point), else as the product reads."""
    read = getattr(store, "get_record", None)
    if read is not None:
        return read(cls, key)  # type: ignore[no-any-return]
    data, etag = store.get_json(key)
    return cls.from_json(data), etag


def _writer(name: str) -> Callable[..., str]:
    """``Record.create``/``put``/``swap``: to the memory store the record's fields as they are (its encoder
    writes them as ``to_json``'s deep copy would be written: the same bytes), to any other store as before."""
    product, fields = _TO_STORE[name], base._field_names
    version = {base.VERSION_KEY: base.CURRENT_FORMAT}

    def write(self: Record, store: ObjectStore, key: str, *args: Any) -> str:
        cls = self.__class__
        if not isinstance(store, MemStore) or cls.to_json is not _TO_JSON:
            return product(self, store, key, *args)  # type: ignore[no-any-return]
        body = {n: getattr(self, n) for n in fields(cls)}
        return getattr(store, f"{name}_json")(key, {**body, **version}, *args)  # type: ignore[no-any-return]
    return write


@functools.lru_cache(maxsize=64)
def _settings_of(draft_settings: Callable[[Any], Any], window_minutes: int | None) -> Any:
    return draft_settings(SimpleNamespace(window_minutes=window_minutes))


def _draft_settings(product: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``settlement.draft_settings``: a function of the draft's window alone (settings only read: shared)."""
    def memo(obj: Any) -> Any:
        return _settings_of(product, obj.window_minutes)
    return memo


_MEMOS: dict[tuple[str, str], Any] = {}

#: What :func:`installed` replaced: (owner, attribute, the product's value, the memo).
Patch = tuple[Any, str, Any, Any]
_patched: list[Patch] = []
_depth = 0


def _patches() -> list[Patch]:
    ours = [m for name, m in sorted(sys.modules.items()) if name.startswith("freshidx.") and m is not None]
    out: list[Patch] = []
    for (module, name), size in PURE.items():
        pure = getattr(importlib.import_module(module), name)
        memo = _MEMOS.get((module, name))
        if memo is None or memo.__wrapped__ is not pure:
            memo = _MEMOS[(module, name)] = functools.lru_cache(maxsize=size)(pure)
        out += [(m, name, pure, memo) for m in ours if getattr(m, name, None) is pure]
    settlement = importlib.import_module("freshidx.trigger.settlement")
    out.append((settlement, "draft_settings", settlement.draft_settings, _draft_settings(settlement.draft_settings)))
    classes: list[tuple[type, str, Any]] = [
        (PartitionId, "parse", classmethod(_parse_partition)), (Record, "read", classmethod(_read_record)),
        (PartitionId, "path", property(lambda p: _minute_names(p.at)[0])),
        (PartitionId, "compact", property(lambda p: _minute_names(p.at)[1])),
        (PartitionId, "hour_path", property(lambda p: _minute_names(p.at)[2])),
        (Manifest, "segment_list", _segment_list), *[(Record, name, _writer(name)) for name in _TO_STORE]]
    # A class attribute is kept as its descriptor (getattr would give a bound classmethod).
    return out + [(cls, attr, cls.__dict__[attr], memo) for cls, attr, memo in classes]


def _apply(which: int) -> None:
    for patch in _patched:
        setattr(patch[0], patch[1], patch[which])


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """The memos in place of the product's functions (once: a nested ``installed`` changes nothing)."""
    global _depth
    if _depth == 0:
        _patched[:] = _patches()
        _apply(3)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            _apply(2)
            _patched.clear()


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """The product's own functions again, inside :func:`installed` (what the memos are checked against)."""
    _apply(2)
    try:
        yield
    finally:
        _apply(3)
