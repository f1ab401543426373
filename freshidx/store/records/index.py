"""Records of a published dataset (an index or an hourly bucket, :func:`freshidx.store.layout.index_root`):
the pointer ``CURRENT`` and its history entries, a version's manifest, and a refusal."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from pydantic.dataclasses import dataclass

from freshidx.store import ObjectStore, layout
from freshidx.store.records.base import CONFIG, Record, iso, utcnow, version_field
from freshidx.store.records.segment import Segment


@dataclass(frozen=True, eq=False, config=CONFIG)
class Pointer(Record):
    """``<root>/CURRENT``: the version readers see and the position it covers (pointer = watermark);
    each one is also kept, create-once, as ``<root>/history/<seq>.json``."""

    KIND = "pointer"

    index: str
    version: str
    seq: int
    position: str
    manifest: str
    doc_count: int
    published_at: str
    run_id: str | None = None
    source_partition: str | None = None
    window_start: str | None = None
    window_end: str | None = None
    cutoff: str | None = None
    previous_version: str | None = None
    action: str = "publish"  # publish | rollback
    format_version: int = version_field()

    @classmethod
    def from_dict(cls, d: Any) -> Pointer:
        return cls.from_json(d)

    @classmethod
    def current(cls, store: ObjectStore, index: str) -> tuple[Pointer | None, str | None]:
        """``index``'s ``CURRENT`` and its ETag; ``(None, None)``: nothing published."""
        return cls.read_if_exists(store, layout.pointer_key(index))

    @classmethod
    def history(cls, store: ObjectStore, index: str, seq: int) -> Pointer:
        """The history entry of generation ``seq`` (raises NotFound)."""
        return cls.read(store, layout.history_key(index, seq))[0]


@dataclass(eq=False, config=CONFIG)
class Manifest(Record):
    """``<root>/versions/<version>/manifest.json``: what a build staged (written create-once before the
    pointer moves). ``inputs``, ``invalid``, ``stats`` and ``run`` differ by pipeline; what readers use of
    them is read through the properties below, which know the older manifests that lack a key."""

    KIND = "manifest"

    index: str
    version: str
    position: str  # ISO time the publication covers up to: source partition (delta) / cutoff (full)
    run_id: str | None
    shards: list[dict[str, Any]]
    doc_count: int
    num_shards: int
    source_partition: str | None = None  # partition path as written upstream (delta)
    window_start: str | None = None  # exclusive (delta)
    window_end: str | None = None  # inclusive (delta)
    cutoff: str | None = None  # (full)
    covered_count: int = 0
    #: A segment-built delta version: every segment it serves, oldest first (``freshidx.delta.segments``);
    #: ``shards`` are the newest segment's, the files this version wrote.
    segments: list[dict[str, Any]] | None = None
    inputs: dict[str, Any] = field(default_factory=dict)
    invalid: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)  # trigger kind/id, tags, code version
    created_at: str = field(default_factory=lambda: iso(utcnow()))
    format_version: int = version_field()

    @classmethod
    def of(cls, store: ObjectStore, index: str, version: str) -> Manifest:
        """The manifest of ``version`` (raises NotFound, RecordError)."""
        return cls.read(store, layout.manifest_key(index, version))[0]

    def write(self, store: ObjectStore) -> str:
        return self.create(store, layout.manifest_key(self.index, self.version))

    def segment_list(self) -> list[Segment] | None:
        """The segments it serves, oldest first; ``None``: not segment-built (a window build's older format)."""
        return None if self.segments is None else [Segment.from_json(s) for s in self.segments]

    def served_shards(self) -> list[dict[str, Any]]:
        """Every shard readers open: the shards of every segment, or the version's own."""
        return [sh for seg in self.segments for sh in seg["shards"]] if self.segments else list(self.shards)

    # ---------------------------------------------------------------- inputs (how it was built, from what)

    @property
    def build(self) -> str | None:
        """``inputs.build``: incremental | rebuild | compaction (delta), raw | state (full); None: older."""
        return _text(self.inputs, "build")

    @property
    def based_on(self) -> str | None:
        return _text(self.inputs, "based_on")

    @property
    def rebased_from(self) -> str | None:
        """The version a micro-batch was built on before it was moved onto a compaction of it."""
        return _text(self.inputs, "rebased_from")

    @property
    def files_sha256(self) -> str | None:
        """Digest over the inputs (key, etag, size) of a full build: the same digest is the same inputs."""
        return _text(self.inputs, "files_sha256")

    @property
    def source(self) -> str | None:
        return _text(self.inputs, "source")

    @property
    def listed_at(self) -> str | None:
        """When its build listed the store (files newer than this were not read); None: older format."""
        return _text(self.inputs, "listed_at")

    @property
    def index_format(self) -> str | None:
        return _text(self.inputs, "format")

    @property
    def full_version(self) -> str | None:
        return _text(self.inputs, "full_version")

    @property
    def full_cutoff(self) -> str | None:
        return _text(self.inputs, "full_cutoff")

    @property
    def rebuild_reason(self) -> str | None:
        return _text(self.inputs, "rebuild_reason")

    @property
    def raw_reason(self) -> str | None:
        return _text(self.inputs, "raw_reason")

    @property
    def base_full_version(self) -> str | None:
        return _text(self.inputs, "base_full_version")

    @property
    def segments_used(self) -> list[str]:
        return [str(v) for v in self.inputs.get("segments_used") or ()]

    @property
    def state_chain(self) -> int:
        return int(self.inputs.get("state_chain") or 0)

    @property
    def state_bases(self) -> tuple[str, ...]:
        return tuple(str(b) for b in self.inputs.get("state_bases") or ())

    @property
    def input_files(self) -> list[dict[str, Any]]:
        """The input objects it lists (delta, buckets: key, etag, size); ``[]`` when it only counts them."""
        files = self.inputs.get("files")
        return list(files) if isinstance(files, list) else []

    def input_etags(self) -> dict[str, str]:
        """``{key: etag}`` of the input objects it lists (buckets: what a late-data check compares)."""
        return {str(f["key"]): str(f["etag"]) for f in self.input_files}

    @property
    def input_file_count(self) -> int:
        return _count(self.inputs.get("files"))

    @property
    def input_partition_count(self) -> int:
        return _count(self.inputs.get("partitions"))

    @property
    def ignored_count(self) -> int:
        return len(self.inputs.get("ignored") or ())

    # ---------------------------------------------------------------- invalid records, stats, run

    @property
    def invalid_count(self) -> int:
        return int(self.invalid.get("count") or 0)

    @property
    def invalid_reasons(self) -> dict[str, int]:
        return dict(self.invalid.get("reasons") or {})

    @property
    def conflicting_ads(self) -> int:
        """(ad_id, version) keys read with different contents (valid records, reported apart)."""
        return int((self.invalid.get("conflicts") or {}).get("ads") or 0)

    @property
    def build_seconds(self) -> float:
        return float(self.stats.get("build_seconds") or 0.0)

    @property
    def total_build_seconds(self) -> float:
        return float(self.stats.get("total_build_seconds") or 0.0)

    @property
    def trigger(self) -> str | None:
        """``run.trigger``: sensor | continuous | catchup | … (None: a manual run of an older format)."""
        return _text(self.run, "trigger")

    @property
    def run_key(self) -> str | None:
        return _text(self.run, "run_key")

    @property
    def code_version(self) -> str:
        return str(self.run.get("code_version", "unknown"))

    @property
    def window_minutes(self) -> int | None:
        """The delta window its run was configured with (``run.settings.window_minutes``)."""
        value = (self.run.get("settings") or {}).get("window_minutes")
        return int(value) if value else None

    @property
    def forced(self) -> bool:
        return bool(self.run.get("force"))

    @property
    def max_drop_fraction(self) -> float | None:
        value = self.run.get("max_drop_fraction")
        return None if value is None else float(value)


@dataclass(frozen=True, eq=False, config=CONFIG)
class Refusal(Record):
    """``<root>/refused/<version>.json``: why a built version was not published (create-once)."""

    KIND = "refusal"

    index: str
    version: str
    position: str
    outcome: str  # superseded | unchanged | invalid
    reason: str
    at: str
    source_partition: str | None = None
    cutoff: str | None = None
    run_id: str | None = None
    current_version: str | None = None
    current_position: str | None = None
    format_version: int = version_field()

    def write(self, store: ObjectStore) -> str:
        return self.create(store, layout.refusal_key(self.index, self.version))


def _text(bag: dict[str, Any], key: str) -> str | None:
    value = bag.get(key)
    return None if value is None else str(value)


def _count(value: Any) -> int:
    """Manifests list inputs (delta, buckets) or, for the full index, count them."""
    if value is None:
        return 0
    return value if isinstance(value, int) else len(value)
