"""A segment descriptor: one entry of a delta manifest's ``segments`` (what the segment serves and read),
the unit the delta is made of (:mod:`freshidx.delta.segments`)."""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any

from pydantic import TypeAdapter
from pydantic.dataclasses import dataclass

from freshidx.store.records.base import CONFIG, FieldView, Record, version_field

#: ``extra`` key of a compacted segment: the original segments it holds (:class:`Constituent`).
MERGED_KEY = "merged"


@dataclass(frozen=True, config=CONFIG)
class Constituent(FieldView):
    """One original (micro-batch or rebuild) segment a compacted segment holds, as ``extra.merged``
    lists it; older entries may lack all but the version."""

    version: str
    position: str | None = None
    listed_at: str | None = None
    kind: str | None = None
    doc_count: int | None = None
    full_version: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, eq=False, config=CONFIG)
class Segment(Record):
    """One segment as a delta manifest lists it."""

    KIND = "segment"

    version: str  # the delta version that built it (its files are under that version's prefix)
    position: str  # ISO time of the newest partition it consumed
    kind: str  # BuildKind
    shards: list[dict[str, Any]]  # ShardCommit dicts (index files, docs.parquet, covered.parquet)
    doc_count: int
    covered_count: int
    files: list[str]  # raw keys it consumed (so a later micro-batch never reads them again)
    listed_at: str  # ISO time its build listed the store: files newer than this were not seen
    touched_products: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    # The full version its state rested on (None: none, or written before this field): its rows supersede
    # that version's (freshidx.delta.executor.state_lookup.StateFile).
    full_version: str | None = None
    format_version: int = version_field()

    @classmethod
    def from_dict(cls, d: Any) -> Segment:
        return cls.from_json(d)

    def constituents(self) -> list[Constituent]:
        """The original segments it holds, oldest first: itself unless a compaction merged it."""
        merged = self.extra.get(MERGED_KEY)
        if merged:
            return [_CONSTITUENT.validate_python(m) for m in merged]
        return [Constituent(version=self.version, position=self.position, listed_at=self.listed_at,
                            kind=self.kind, doc_count=self.doc_count, full_version=self.full_version)]


_CONSTITUENT: TypeAdapter[Constituent] = TypeAdapter(Constituent)
