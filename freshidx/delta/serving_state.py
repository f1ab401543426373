"""What serves now, as the builds read it: the full version a build rests on and the delta's segments.

Both builds start here (a delta micro-batch: what it merges with and appends to; a full build: what it
can be built from, :mod:`freshidx.full.plan`). Reads pointers and manifests only.
"""

from __future__ import annotations

import logging
from typing import Any

from freshidx.delta.segments import FullBase, Segment, segments_of
from freshidx.publish.commit import Pointer, parse_iso, read_manifest, read_pointer
from freshidx.store import NotFound, ObjectStore

log = logging.getLogger(__name__)


def full_base(store: ObjectStore) -> tuple[FullBase | None, dict[str, Any] | None]:
    """The serving full version (cutoff, listing time) and its manifest; ``(None, None)`` before the first."""
    pointer, _ = read_pointer(store, "full")
    if pointer is None:
        return None, None
    manifest = read_manifest(store, "full", pointer.version)
    listed = manifest.get("inputs", {}).get("listed_at")
    cutoff = parse_iso(pointer.cutoff or pointer.position)
    return FullBase(pointer.version, cutoff, parse_iso(listed) if listed else None), manifest


def delta_segments(store: ObjectStore, reader: str) -> tuple[Pointer | None, list[Segment] | None]:
    """The serving delta's pointer and segments, oldest first (segments ``None``: the version is not
    segmented or its manifest cannot be read, which ``reader`` logs as its fallback)."""
    pointer, _ = read_pointer(store, "delta")
    if pointer is None:
        return None, None
    try:
        return pointer, segments_of(read_manifest(store, "delta", pointer.version))
    except (NotFound, KeyError, TypeError, ValueError) as exc:
        log.warning("%s: serving delta manifest %s unreadable (%s)", reader, pointer.version, exc)
        return pointer, None
