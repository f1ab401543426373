"""What serving holds in memory: the published versions it downloaded and opened, and the immutable
set of them one search sees (:mod:`freshidx.serve.searcher` loads and swaps them; the rules of which parts
a search reads and what hides what are here, docs/architecture.md#index-format-and-serving)."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import tantivy

from freshidx.publish.commit import Pointer
from freshidx.serve.kill_list import KillList, KillLists


class ServingError(RuntimeError):
    """A published version cannot be served (missing index files, checksum mismatch, ...)."""


@dataclass(frozen=True)
class Hit:
    ad_id: str
    score: float
    index: str  # "full" | "delta"
    version: str  # the index version the hit comes from
    title: str
    product_id: str
    bid: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Shard:
    shard: int
    index: tantivy.Index
    searcher: tantivy.Searcher
    doc_count: int


@dataclass
class Part:
    """The shards one version wrote, downloaded and opened: a full version, or one delta segment."""

    version: str  # the version that wrote the files (the cache directory's name)
    position: str
    path: Path
    shards: list[Shard]
    covered: KillList  # the kill-list (loaded for the delta only)


@dataclass
class LoadedVersion:
    """One published version, downloaded and opened: its parts, oldest first (one for a full version
    or a delta built before segments)."""

    index: str
    version: str
    position: str
    parts: list[Part]
    pointer: Pointer

    @property
    def shards(self) -> list[Shard]:
        return [sh for part in self.parts for sh in part.shards]


@dataclass(eq=False)
class VersionSet:
    """What one search sees: at most one version of each index. Never mutated after the swap,
    except the bookkeeping of who is still using it."""

    full: LoadedVersion | None
    delta: LoadedVersion | None
    users: int = 0
    retired: bool = False
    _cleaned: bool = field(default=False, repr=False)

    @property
    def active_delta(self) -> LoadedVersion | None:
        """The delta, unless a full version at least as new makes it obsolete (module docstring)."""
        if self.delta is None:
            return None
        if self.full is not None and self.delta.position <= self.full.position:
            return None
        return self.delta

    @functools.cached_property
    def applied_segments(self) -> list[Part]:
        """The delta's segments newer than the full version, oldest first."""
        delta = self.active_delta
        if delta is None:
            return []
        return [p for p in delta.parts if self.full is None or p.position > self.full.position]

    @functools.cached_property
    def kill_list(self) -> frozenset[str]:
        """Every applied segment's kill-list as one set (for reports: a search uses :attr:`searched`)."""
        return frozenset().union(*(p.covered for p in self.applied_segments))

    @functools.cached_property
    def searched(self) -> list[tuple[str, str, Part, KillLists]]:
        """(index, version, part, what hides the part's hits) for every part a search reads. Computed once
        per version set (it never changes after the swap), not per query; no set of ids is copied."""
        out: list[tuple[str, str, Part, KillLists]] = []
        hidden = KillLists()
        delta = self.active_delta
        if delta is not None:
            for part in reversed(self.applied_segments):  # newest first: each is hidden by the newer ones
                out.append(("delta", delta.version, part, hidden))
                hidden = hidden.with_list(part.covered)
        if self.full is not None:
            for part in self.full.parts:
                out.append(("full", self.full.version, part, hidden))
        return out

    def versions(self) -> dict[str, str | None]:
        return {
            "full": self.full.version if self.full else None,
            "delta": self.delta.version if self.delta else None,
        }
