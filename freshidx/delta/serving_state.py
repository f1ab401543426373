"""What serves now, as the builds read it: the full version a build rests on and the delta's segments.

Both builds start here (a delta micro-batch: what it merges with and appends to; a full build: what it
can be built from, :mod:`freshidx.full.full_plan`). Reads pointers and manifests only.
"""

from __future__ import annotations

import logging

from freshidx.delta.executor.state_lookup import StateLayer
from freshidx.delta.segments import FullBase, Segment
from freshidx.publish.commit import Pointer, parse_iso, read_manifest, read_pointer
from freshidx.store import NotFound, ObjectStore
from freshidx.store.records import Manifest

log = logging.getLogger(__name__)


def full_base(store: ObjectStore) -> tuple[FullBase | None, Manifest | None]:
    """The serving full version (cutoff, listing time) and its manifest; ``(None, None)`` before the first."""
    pointer, _ = read_pointer(store, "full")
    if pointer is None:
        return None, None
    manifest = read_manifest(store, "full", pointer.version)
    listed = manifest.listed_at
    cutoff = parse_iso(pointer.cutoff or pointer.position)
    return FullBase(pointer.version, cutoff, parse_iso(listed) if listed else None), manifest


def delta_segments(store: ObjectStore, reader: str) -> tuple[Pointer | None, list[Segment] | None]:
    """The serving delta's pointer and segments, oldest first (segments ``None``: the version is not
    segmented or its manifest cannot be read, which ``reader`` logs as its fallback)."""
    pointer, _ = read_pointer(store, "delta")
    if pointer is None:
        return None, None
    try:
        return pointer, read_manifest(store, "delta", pointer.version).segment_list()
    except (NotFound, KeyError, TypeError, ValueError) as exc:
        log.warning("%s: serving delta manifest %s unreadable (%s)", reader, pointer.version, exc)
        return pointer, None


def known_layers(full: FullBase, full_manifest: Manifest, segments: list[Segment]) -> list[StateLayer]:
    """What a micro-batch over ``full`` and ``segments`` (oldest first) knows, as the state lookup reads it."""
    return [StateLayer(full_manifest.shards),
            *(StateLayer(s.shards, over_full=s.full_version == full.version) for s in segments)]


def state_layers(store: ObjectStore) -> tuple[tuple[str, str | None], list[StateLayer]] | None:
    """What the next micro-batch reads as known: the serving full version, then the serving delta's
    segments (oldest first), and the pair of versions that names it; ``None`` before the first full index."""
    full, full_manifest = full_base(store)
    if full is None or full_manifest is None:
        return None
    delta, kept = delta_segments(store, "state layers")
    return (full.version, delta.version if delta is not None else None), known_layers(full, full_manifest, kept or [])
