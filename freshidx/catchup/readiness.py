"""When is an upstream hour closed? Readiness policies for the catch-up consumer (docs/architecture.md#readiness).

The catch-up consumer processes every hour exactly once, so closing an hour too early loses the
records that arrive afterwards (they become corrections at best). Upstreams signal completeness in
different ways, hence one policy per source:

* ``visible``: the hour has ended, a grace period has passed and the hour has data (or upstream has
  moved past it, which closes it as empty);
* ``marker``: upstream wrote ``hour=HH/_SUCCESS``;
* ``quiet_period``: nothing under the hour was written for ``quiet_seconds``;
* ``manifest``: upstream wrote ``hour=HH/_manifest.json`` listing the files (and rows) it promises,
  and every listed file is present with the promised size. The promised row counts are handed to
  the Spark build, which verifies them.

Every answer carries a human-readable reason (what is awaited and until when, or why the hour is
ready), so a waiting hour is never a silent one. The module is pure apart from the store reads:
:func:`list_hour` makes one bounded listing of the hour prefix, :func:`check_ready` at most one GET
(of the manifest). Keys found upstream are parsed strictly and never turned into paths of ours;
names inside a manifest are validated the same way, and a bad manifest is "not ready", never an
exception that would fail the sensor.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

from freshidx.store import NotFound, ObjectInfo, ObjectStore, layout
from freshidx.store.partitions import PartitionError, PartitionId
from freshidx.trigger.listing import Ignored

POLICIES = ("visible", "marker", "quiet_period", "manifest")  # = freshidx.settings_values.READINESS_POLICIES
MARKER = "_SUCCESS"
MANIFEST = "_manifest.json"
CONTROL_FILES = (MARKER, MANIFEST)
MAX_MANIFEST_BYTES = 32 * 1024 * 1024  # ~300k file entries; anything bigger is refused, not read
_SHOWN = 5  # file names quoted in a reason
_SOURCE_RE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")  # same as Settings.source
_HOUR = dt.timedelta(hours=1)


@dataclass(frozen=True)
class HourListing:
    """Everything under ``raw/<source>/…/hour=HH/``, from one listing."""

    source: str
    hour: dt.datetime  # UTC, minute 0
    files: list[ObjectInfo]  # data files in valid minute partitions of this hour, sorted by key
    controls: dict[str, ObjectInfo]  # "_SUCCESS" / "_manifest.json" found directly under hour=HH/
    ignored: list[Ignored]  # malformed keys under the hour (reported, never used)
    newest_modified: dt.datetime | None  # newest last_modified of anything under the hour

    @property
    def prefix(self) -> str:
        return hour_prefix(self.source, self.hour)


@dataclass(frozen=True)
class Readiness:
    ready: bool
    policy: str
    reason: str  # why not ready yet (what is awaited and until when), or why ready
    expected_rows: dict[str, int] | None = None  # manifest policy: data file key -> promised rows


# ---------------------------------------------------------------------------------------------
# helpers


def _utc_hour(hour: dt.datetime) -> dt.datetime:
    if hour.tzinfo is None:
        raise ValueError(f"naive hour {hour!r}: hours are UTC and must say so")
    h = hour.astimezone(dt.UTC)
    if h.minute or h.second or h.microsecond:
        raise ValueError(f"{hour.isoformat()} is not the start of an hour")
    return h


def _check_source(source: str) -> str:
    if not _SOURCE_RE.match(source):
        raise ValueError(f"bad source name {source!r}")
    return source


def hour_prefix(source: str, hour: dt.datetime) -> str:
    """``raw/<source>/year=…/month=…/day=…/hour=HH/`` (validated source, whole UTC hour)."""
    return layout.raw_hour_prefix(_check_source(source), PartitionId(_utc_hour(hour)).hour_path)


def _ts(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _hour_label(hour: dt.datetime) -> str:
    return f"{hour:%Y-%m-%d} {hour:%H}:00–{hour + _HOUR:%H}:00 UTC"


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:_SHOWN])
    return shown + (f" (+{len(names) - _SHOWN} more)" if len(names) > _SHOWN else "")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def is_data_name(name: str) -> bool:
    """Data files are plain names not starting with ``_`` or ``.`` (those are upstream control/temp files)."""
    return bool(name) and not name.startswith(("_", "."))


def check_relative_name(name: Any, hour_path: str) -> str:
    """Validate a file name relative to an hour prefix: ``minute=mm/<plain data file name>``.

    Returns the name or raises ValueError saying what is wrong. Nothing else is accepted: no
    absolute paths, no ``..``, no nested directories, no control or hidden files.
    """
    if not isinstance(name, str):
        raise ValueError(f"name must be a string, got {type(name).__name__}")
    if not name or name.startswith("/") or "\\" in name or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise ValueError(f"name {name!r} is empty, absolute or has forbidden characters")
    parts = name.split("/")
    if len(parts) != 2:
        raise ValueError(f"name {name!r} must be minute=mm/<file>")
    minute, file = parts
    try:
        PartitionId.parse(f"{hour_path}/{minute}")
    except PartitionError as exc:
        raise ValueError(f"name {name!r}: {exc}") from exc
    if file in (".", "..") or not is_data_name(file):
        raise ValueError(f"name {name!r}: {file!r} is not a data file name")
    return name


# ---------------------------------------------------------------------------------------------
# listing


def list_hour(store: ObjectStore, source: str, hour: dt.datetime) -> HourListing:
    """Everything under one hour prefix: one bounded listing (paged), never anything outside it."""
    hour = _utc_hour(hour)
    prefix = hour_prefix(source, hour)
    hour_path = PartitionId(hour).hour_path
    files: list[ObjectInfo] = []
    controls: dict[str, ObjectInfo] = {}
    ignored: list[Ignored] = []
    newest: dt.datetime | None = None
    for obj in store.iter_objects(prefix):
        if not obj.key.startswith(prefix):  # defensive: a store must not return keys outside the prefix
            continue
        if newest is None or obj.last_modified > newest:
            newest = obj.last_modified
        rel = obj.key[len(prefix):]
        if "/" not in rel:
            if rel in CONTROL_FILES:
                controls[rel] = obj
            else:
                ignored.append(Ignored(obj.key, "not in a minute=mm/ partition (and not a known control file)"))
            continue
        minute, _, name = rel.partition("/")
        try:
            PartitionId.parse(f"{hour_path}/{minute}")
        except PartitionError as exc:
            ignored.append(Ignored(obj.key, str(exc)))
            continue
        if "/" in name or not name:
            ignored.append(Ignored(obj.key, "nested below the minute partition"))
            continue
        if not is_data_name(name):
            continue  # hidden/temporary upstream files and markers are not data (and not malformed)
        files.append(obj)
    files.sort(key=lambda o: o.key)
    # S3 clients hand back tzlocal(); normalise so reasons and comparisons are plainly UTC
    return HourListing(source, hour, files, controls, ignored, newest.astimezone(dt.UTC) if newest else None)


# ---------------------------------------------------------------------------------------------
# readiness


def check_ready(
    store: ObjectStore,
    listing: HourListing,
    policy: str,
    *,
    now: dt.datetime,
    quiet_seconds: int,
    close_grace_seconds: int,
    newer_data_visible: bool,
) -> Readiness:
    """Is ``listing.hour`` closed under ``policy`` at ``now``? Never raises for upstream content.

    ``newer_data_visible``: upstream has data for a later hour, so an hour with no data files is
    empty rather than late (``visible`` and ``quiet_period`` close it as empty).
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown readiness policy {policy!r} (one of {', '.join(POLICIES)})")
    if now.tzinfo is None:
        raise ValueError("naive now: pass a timezone-aware UTC datetime")
    if quiet_seconds < 0 or close_grace_seconds < 0:
        raise ValueError("quiet_seconds and close_grace_seconds must be >= 0")
    hour = _utc_hour(listing.hour)
    end = hour + _HOUR
    if now < end:
        return Readiness(False, policy, f"hour {_hour_label(hour)} not over until {_ts(end)}")
    if policy == "visible":
        result = _visible(listing, end, now, close_grace_seconds, newer_data_visible)
    elif policy == "marker":
        result = _marker(listing)
    elif policy == "quiet_period":
        result = _quiet(listing, now, quiet_seconds, newer_data_visible)
    else:
        result = _manifest(store, listing)
    if listing.ignored:
        result = Readiness(result.ready, result.policy,
                           f"{result.reason}; {_plural(len(listing.ignored), 'malformed key')} under the hour ignored",
                           result.expected_rows)
    return result


def _empty(listing: HourListing, policy: str, newer_data_visible: bool) -> Readiness | None:
    """An hour without data files: closed as empty once upstream has moved past it, else awaited."""
    if listing.files:
        return None
    if newer_data_visible:
        return Readiness(True, policy, f"empty hour closed: no data files under {listing.prefix} "
                                       "and newer data is visible upstream")
    return Readiness(False, policy, f"no data files under {listing.prefix} and nothing newer visible")


def _visible(listing: HourListing, end: dt.datetime, now: dt.datetime, grace: int, newer: bool) -> Readiness:
    grace_end = end + dt.timedelta(seconds=grace)
    if now < grace_end:
        return Readiness(False, "visible", f"waiting for the close grace period of {grace}s to end at "
                                           f"{_ts(grace_end)} ({_plural(len(listing.files), 'data file')} so far)")
    empty = _empty(listing, "visible", newer)
    if empty is not None:
        return empty
    return Readiness(True, "visible", f"{_plural(len(listing.files), 'data file')} visible; "
                                      f"close grace ended at {_ts(grace_end)}")


def _marker(listing: HourListing) -> Readiness:
    marker = listing.controls.get(MARKER)
    if marker is None:
        return Readiness(False, "marker", f"waiting for marker {listing.prefix}{MARKER}")
    return Readiness(True, "marker", f"marker {marker.key} written at {_ts(marker.last_modified)} "
                                     f"({_plural(len(listing.files), 'data file')})")


def _quiet(listing: HourListing, now: dt.datetime, quiet: int, newer: bool) -> Readiness:
    empty = _empty(listing, "quiet_period", newer)
    if empty is not None and not empty.ready:
        return empty
    last = listing.newest_modified
    if last is not None:
        quiet_end = last + dt.timedelta(seconds=quiet)
        if now < quiet_end:
            return Readiness(False, "quiet_period", f"last write under {listing.prefix} at {_ts(last)}; "
                                                    f"quiet period of {quiet}s ends at {_ts(quiet_end)}")
    if empty is not None:
        return empty
    assert last is not None  # there are data files
    return Readiness(True, "quiet_period", f"no new object under the hour since {_ts(last)} (quiet for >= {quiet}s); "
                                           f"{_plural(len(listing.files), 'data file')}")


def _manifest(store: ObjectStore, listing: HourListing) -> Readiness:
    info = listing.controls.get(MANIFEST)
    key = f"{listing.prefix}{MANIFEST}"
    if info is None:
        return Readiness(False, "manifest", f"waiting for manifest {key}")

    def malformed(what: str) -> Readiness:
        return Readiness(False, "manifest", f"malformed manifest {key}: {what}")

    if info.size > MAX_MANIFEST_BYTES:
        return malformed(f"{info.size} bytes, more than the {MAX_MANIFEST_BYTES} allowed")
    try:
        doc = store.get(key).json()
    except NotFound:
        return Readiness(False, "manifest", f"waiting for manifest {key} (listed, but gone when read)")
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return malformed(f"not valid JSON ({type(exc).__name__}: {str(exc)[:200]})")
    entries, problems = _parse_manifest(doc, PartitionId(listing.hour).hour_path)
    if problems:
        extra = f" (+{len(problems) - 3} more problems)" if len(problems) > 3 else ""
        return malformed("; ".join(problems[:3]) + extra)

    present = {o.key: o for o in listing.files}
    missing: list[str] = []
    mismatched: list[str] = []
    for name, (_rows, size) in entries.items():
        obj = present.get(listing.prefix + name)
        if obj is None:
            missing.append(name)
        elif size is not None and obj.size != size:
            mismatched.append(f"{name} has {obj.size} bytes, manifest says {size}")
    if missing or mismatched:
        waits: list[str] = []
        if missing:
            waits.append(f"waiting for {len(missing)} of {_plural(len(entries), 'file')} listed in the manifest: "
                         f"{_names(missing)}")
        if mismatched:
            waits.append(f"size mismatch for {_plural(len(mismatched), 'file')}: {_names(mismatched)}")
        return Readiness(False, "manifest", "; ".join(waits))
    expected = {listing.prefix + name: rows for name, (rows, _size) in entries.items()}
    reason = (f"all {_plural(len(entries), 'file')} listed in manifest {key} present "
              f"({sum(expected.values())} rows promised)")
    unlisted = len(present.keys() - expected.keys())
    if unlisted:
        reason += f"; {_plural(unlisted, 'data file')} under the hour not listed in the manifest"
    return Readiness(True, "manifest", reason, expected)


def _parse_manifest(doc: Any, hour_path: str) -> tuple[dict[str, tuple[int, int | None]], list[str]]:
    """``{"files": [{"name", "rows", "bytes"?}, …]}`` → {name: (rows, bytes)} and a list of problems."""
    if not isinstance(doc, dict) or not isinstance(doc.get("files"), list):
        return {}, ['expected an object {"files": [...]}']
    entries: dict[str, tuple[int, int | None]] = {}
    problems: list[str] = []

    def count(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    for i, entry in enumerate(doc["files"]):
        where = f"files[{i}]"
        if not isinstance(entry, dict):
            problems.append(f"{where} is not an object")
            continue
        try:
            name = check_relative_name(entry.get("name"), hour_path)
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
            continue
        if not count(entry.get("rows")):
            problems.append(f"{where} ({name}): rows must be an integer >= 0, got {entry.get('rows')!r}")
            continue
        size = entry.get("bytes")
        if size is not None and not count(size):
            problems.append(f"{where} ({name}): bytes must be an integer >= 0, got {size!r}")
            continue
        if name in entries:
            problems.append(f"{where}: {name} listed twice")
            continue
        entries[name] = (entry["rows"], size)
    return entries, problems


# ---------------------------------------------------------------------------------------------
# writing control files (tests, the data generator)


def write_marker(store: ObjectStore, source: str, hour: dt.datetime) -> str:
    """Write ``hour=HH/_SUCCESS`` (empty). Returns its key."""
    key = hour_prefix(source, hour) + MARKER
    store.put(key, b"")
    return key


def write_hour_manifest(store: ObjectStore, source: str, hour: dt.datetime, files_rows: dict[str, int]) -> str:
    """Write ``hour=HH/_manifest.json`` promising ``files_rows`` (name or full key -> rows). Returns its key.

    Names are stored relative to the hour prefix; sizes come from ``store.head`` (the files must exist).
    """
    prefix = hour_prefix(source, hour)
    hour_path = PartitionId(_utc_hour(hour)).hour_path
    files: list[dict[str, Any]] = []
    for name_or_key, rows in sorted(files_rows.items()):
        name = name_or_key[len(prefix):] if name_or_key.startswith(prefix) else name_or_key
        check_relative_name(name, hour_path)
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
            raise ValueError(f"rows for {name} must be an integer >= 0, got {rows!r}")
        files.append({"name": name, "rows": rows, "bytes": store.head(prefix + name).size})
    key = prefix + MANIFEST
    store.put_json(key, {"files": files})
    return key
