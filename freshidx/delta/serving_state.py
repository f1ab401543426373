"""What serves now, as the builds read it: the full version a build rests on and the delta's segments.

Both builds start here (a delta micro-batch: what it merges with and appends to; a full build: what it
can be built from, :mod:`freshidx.full.plan`). Reads pointers and manifests only.
"""

from __future__ import annotations

import logging

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
