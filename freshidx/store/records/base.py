"""What every store record shares: a format version, a reader that upgrades, one writer.

Modelled on Quickwit's versioned split metadata (``VersionedSplitMetadata``): one model per record
kind, a serialized form tagged with its version, a reader that reads every older format it knows and
a writer that writes the current one only. The tag is ``format_version``; a record written before the
tag existed has none and reads as format 0 (docs/architecture.md#object-store-layout).

A model is a pydantic dataclass (declared with ``eq=False``: :class:`Record` defines equality) mixing in
:class:`Record`: still a dataclass (positional and keyword construction, ``dataclasses.replace``) and
validated by pydantic, both when built and when read.
``format_version`` on an instance is the format it was read in (the current one for a record built
in memory); it is not part of the record's identity (``compare=False``).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, Self

from pydantic import ConfigDict, TypeAdapter, ValidationError

from freshidx.store import NotFound, ObjectStore

#: The format every writer writes. 0: what freshidx wrote before records carried a version.
CURRENT_FORMAT = 1
VERSION_KEY = "format_version"
#: Unknown keys are dropped when read (a newer writer's additions do not fail an older reader).
CONFIG = ConfigDict(extra="ignore")

Upgrade = Callable[[dict[str, Any]], dict[str, Any]]


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def iso(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def version_field() -> Any:
    """The ``format_version`` field every model declares last."""
    return dataclasses.field(default=CURRENT_FORMAT, compare=False, kw_only=True)


class RecordError(ValueError):
    """A stored object that is not a readable record of its kind (malformed, or a newer format)."""


def _unchanged(body: dict[str, Any]) -> dict[str, Any]:
    # Format 1 only added the version tag: a format-0 body is a format-1 body.
    return body


@functools.cache
def _adapter(cls: type) -> TypeAdapter[Any]:
    return TypeAdapter(cls)


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


_ATOMS = frozenset({str, int, float, bool, type(None)})


def _plain(value: Any) -> Any:
    """What ``dataclasses.asdict`` makes of a field value (a deep copy, a nested dataclass as a dict), with
    the JSON types records hold taken directly: the generic path made writing a record slow."""
    cls = value.__class__
    if cls in _ATOMS:
        return value
    if cls is dict:
        return {k if k.__class__ in _ATOMS else _plain(k): v if v.__class__ in _ATOMS else _plain(v)
                for k, v in value.items()}
    if cls is list:
        return [v if v.__class__ in _ATOMS else _plain(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple, as asdict rebuilds it
        return cls(*[_plain(v) for v in value])
    if isinstance(value, (list, tuple)):
        return cls(_plain(v) for v in value)
    if isinstance(value, dict):
        return cls((_plain(k), _plain(v)) for k, v in value.items())
    return copy.deepcopy(value)


class FieldView(Mapping[str, Any]):
    """Reading a dataclass by field name (``record["doc_count"]``, ``get``, ``in``, ``dict(record)``): the
    read-only view of the dicts these records used to be, for tests and display code that index them
    so. Product code reads attributes."""

    def __getitem__(self, key: str) -> Any:
        if key in self._names():
            return getattr(self, key)
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        return _field_names(cls)


class Record(FieldView):
    """Mixin of every store record model (a pydantic dataclass).

    ``UPGRADES[n]`` turns a body of format ``n`` into one of format ``n + 1``; :meth:`from_json` runs
    them in order up to :data:`CURRENT_FORMAT`.
    """

    KIND: ClassVar[str] = "record"
    UPGRADES: ClassVar[Mapping[int, Upgrade]] = {0: _unchanged}

    @classmethod
    def from_json(cls, data: Any) -> Self:
        """The record in ``data`` (a parsed JSON object of any known format), upgraded to the current model."""
        if isinstance(data, cls):
            return data
        if data.__class__ is dict and data.get(VERSION_KEY).__class__ is int and data[VERSION_KEY] == CURRENT_FORMAT:
            return cls._validated(data)  # what every current writer writes: nothing to upgrade
        if not isinstance(data, Mapping):
            raise RecordError(f"{cls.KIND}: expected a JSON object, got {type(data).__name__}")
        body = dict(data)
        read = body.pop(VERSION_KEY, 0)
        if not isinstance(read, int) or isinstance(read, bool) or read < 0:
            raise RecordError(f"{cls.KIND}: bad {VERSION_KEY} {read!r}")
        if read > CURRENT_FORMAT:
            raise RecordError(f"{cls.KIND}: {VERSION_KEY} {read} is newer than this freshidx reads "
                              f"({CURRENT_FORMAT}); upgrade freshidx")
        for version in range(read, CURRENT_FORMAT):
            body = cls.UPGRADES[version](body)
        return cls._validated({**body, VERSION_KEY: read})

    @classmethod
    def _validated(cls, body: dict[str, Any]) -> Self:
        try:
            record: Self = _adapter(cls).validate_python(body)
        except ValidationError as exc:
            raise RecordError(f"{cls.KIND}: {exc}") from exc
        return record

    # ---------------------------------------------------------------- identity

    def __eq__(self, other: object) -> bool:
        """Equal records of a kind have equal fields (whatever format each was read in); a record equals
        a plain mapping that is its serialized form."""
        if other.__class__ is self.__class__:
            return self._identity() == other._identity()  # type: ignore[attr-defined]
        if isinstance(other, Mapping) and not isinstance(other, Record):
            return self.to_json() == dict(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._identity())

    def _identity(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self) if f.compare)  # type: ignore[arg-type]

    # ---------------------------------------------------------------- serialized form

    def to_json(self) -> dict[str, Any]:
        """The serialized form, always of the current format: what every writer stores."""
        return {**self._fields(), VERSION_KEY: CURRENT_FORMAT}

    def to_dict(self) -> dict[str, Any]:
        return self.to_json()

    def _fields(self) -> dict[str, Any]:
        """``dataclasses.asdict(self)``, the same dict, faster."""
        return {name: _plain(getattr(self, name)) for name in _field_names(self.__class__)}

    # ---------------------------------------------------------------- store I/O

    @classmethod
    def read(cls, store: ObjectStore, key: str) -> tuple[Self, str]:
        """The record at ``key`` and its ETag (raises NotFound, RecordError)."""
        data, etag = store.get_json(key)
        return cls.from_json(data), etag

    @classmethod
    def read_if_exists(cls, store: ObjectStore, key: str) -> tuple[Self | None, str | None]:
        try:
            return cls.read(store, key)
        except NotFound:
            return None, None

    def create(self, store: ObjectStore, key: str) -> str:
        """Create-once (our own earlier write of the same bytes counts as success)."""
        return store.create_json(key, self.to_json())

    def put(self, store: ObjectStore, key: str) -> str:
        return store.put_json(key, self.to_json())

    def swap(self, store: ObjectStore, key: str, expected_etag: str | None) -> str:
        """Compare-and-swap (``None``: create only if absent)."""
        return store.swap_json(key, self.to_json(), expected_etag)
