"""Serving: follow the ``CURRENT`` pointers, cache published shards locally, fan queries out
(docs/architecture.md#index-format-and-serving).

:class:`Searcher` resolves ``indexes/full/CURRENT`` and ``indexes/delta/CURRENT``, downloads the shard
files each version's *manifest* lists (never a listing) into ``cache_dir/<index>/<version>/``,
verifying size and sha256, opens every shard with tantivy and answers :meth:`Searcher.search` by
querying all shards of both indexes, dropping full-index hits the delta covers (its kill-list:
every ad id in the delta's ``covered.parquet`` files, updated *or* deleted) and merging the top k by
score.

Consistency: the loaded versions form one immutable :class:`VersionSet`. ``search`` takes a reference
to the current set when it starts and uses only that; :meth:`Searcher.refresh` loads new versions
completely (download into a temp dir, verify, rename, open) before swapping that single reference.
A search therefore always sees exactly one version of each index, never a mix. Cached versions
that are no longer current are deleted once the last search still using them finishes.

A delta version is a list of segments, oldest first (``freshidx.delta.segments``); each is downloaded once
into ``cache_dir/delta/<version that built it>/`` and shared by every delta version that lists it, so
a new delta version costs the download of its newest segment only. A segment's hits are dropped when a
newer segment's kill-list holds the ad; full-index hits when any applied segment's does.

A segment is applied only while it is newer than the full version (its position, the newest source
partition it consumed, is later than the full version's cutoff). Once a full rebuild with a later
cutoff is published, the older segments hold nothing the full version lacks, and possibly stale
states, so they are ignored until the next delta version drops them.

One ``cache_dir`` per Searcher: it deletes what it does not serve.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import tantivy

from freshidx.publish.commit import Pointer, read_manifest, read_pointer
from freshidx.serve.kill_list import KillList, of_shards, read_kill_list
from freshidx.serve.refresh_timings import RefreshTimings
from freshidx.serve.shard_files import (
    TMP_PREFIX,
    Fetched,
    download_version,
    remove_stale_temp_dirs,
    shard_dir_name,
)
from freshidx.serve.topk import search_set
from freshidx.serve.versions import Hit, LoadedVersion, Part, ServingError, Shard, VersionSet
from freshidx.spark.index_format import COVERED_FILE, INDEX_DIR, SEARCH_FIELDS, open_index, schema
from freshidx.store import ObjectStore

log = logging.getLogger(__name__)

INDEXES = ("full", "delta")
_WORD_RE = re.compile(r"[^\W_]+")


def default_search_threads() -> int:
    """One search thread per core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


class Searcher:
    """Query the published full + delta indexes of ``store``; cache shards under ``cache_dir``.

    The constructor loads the current versions (``load=False`` to defer to :meth:`refresh`).
    Thread-safe: any number of threads may call :meth:`search` while one calls :meth:`refresh`.
    A query searches its shards on ``search_threads`` threads shared by every caller (default: one per
    core; 1 searches them one after another in the caller's thread); :meth:`close` ends them.
    """

    def __init__(self, store: ObjectStore, cache_dir: str | os.PathLike[str], *, load: bool = True,
                 search_threads: int | None = None) -> None:
        threads = search_threads if search_threads is not None else default_search_threads()
        if threads < 1:
            raise ValueError(f"search_threads must be >= 1, got {threads}")
        self._search_pool = ThreadPoolExecutor(threads, thread_name_prefix="freshidx-search") \
            if threads > 1 else None
        self.store = store
        self.cache_dir = Path(cache_dir).resolve()
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # guards _current and the users counters
        self._refresh_lock = threading.Lock()  # one refresh at a time
        self._cleanup_lock = threading.Lock()
        self._retired: list[VersionSet] = []
        self._loading: set[tuple[str, str]] = set()  # versions being loaded: cleanup must not touch them
        self._current = VersionSet(None, None)
        self.last_refresh: RefreshTimings | None = None  # the last refresh that swapped in new versions
        self._parser = tantivy.Index(schema())  # in RAM; only parses queries (same schema as every shard)
        self._schema = schema()
        for name in INDEXES:
            remove_stale_temp_dirs(self.cache_dir / name)
        if load:
            self.refresh()

    def close(self) -> None:
        """End the search threads (a search after this runs its shards in the caller's thread)."""
        pool, self._search_pool = self._search_pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def __enter__(self) -> Searcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ versions

    @property
    def current(self) -> VersionSet:
        return self._current

    def versions(self) -> dict[str, str | None]:
        return self._current.versions()

    def refresh(self) -> bool:
        """Re-read both pointers; load and swap in new versions. Returns True if anything changed.

        A new version is fully downloaded, verified and opened before the swap; on any error the
        current set stays in place and the error propagates.
        """
        with self._refresh_lock:
            timings = RefreshTimings()
            t0 = time.perf_counter()
            current = self._current
            with timings.timed("pointers_s"):
                pointers = {name: read_pointer(self.store, name)[0] for name in INDEXES}
            try:
                loaded: dict[str, LoadedVersion | None] = {}
                for name in INDEXES:
                    ptr = pointers[name]
                    have: LoadedVersion | None = getattr(current, name)
                    if ptr is None:
                        loaded[name] = None
                    elif have is not None and have.version == ptr.version:
                        loaded[name] = have
                    else:
                        loaded[name] = self._load(name, ptr, have, timings)
                if all(loaded[n] is getattr(current, n) for n in INDEXES):
                    return False
                new = VersionSet(full=loaded["full"], delta=loaded["delta"])
                with self._lock:
                    old, self._current = self._current, new
                    old.retired = True
                    self._retired.append(old)
                timings.total_s = time.perf_counter() - t0
                self.last_refresh = timings
            finally:
                with self._lock:
                    self._loading.clear()
            log.info("serving %s (was %s)", new.versions(), old.versions())
        self._maybe_cleanup()
        return True

    def _version_dir(self, index: str, version: str) -> Path:
        return self.cache_dir / index / version

    def _load(self, index: str, pointer: Pointer, have: LoadedVersion | None, timings: RefreshTimings) -> LoadedVersion:
        with timings.timed("manifests_s"):
            manifest = read_manifest(self.store, index, pointer.version)
        listed = manifest.segment_list() if index == "delta" else None
        pieces = [(seg.version, seg.position, {"shards": seg.shards}) for seg in listed] \
            if listed else [(pointer.version, pointer.position, {"shards": manifest.shards})]
        # Segments the serving version already has open are shared, not downloaded or opened again.
        open_parts = {part.version: part for part in have.parts} if have is not None else {}
        parts = [open_parts.get(version) or self._load_part(index, version, position, files, timings)
                 for version, position, files in pieces]
        return LoadedVersion(index=index, version=pointer.version, position=pointer.position, parts=parts,
                             pointer=pointer)

    def _load_part(self, index: str, version: str, position: str, manifest: dict[str, Any],
                   timings: RefreshTimings) -> Part:
        with self._lock:
            self._loading.add((index, version))
        final = self._version_dir(index, version)
        timings.parts_loaded += 1
        fetched = Fetched()
        if not final.is_dir():
            with timings.timed("download_s"):
                fetched = download_version(self.store, index, version, manifest, final)
            timings.downloaded_bytes += fetched.bytes
            timings.kill_list_s += fetched.kill_list_s
        try:
            return self._open_part(index, version, position, manifest, final, fetched.kill_lists, timings)
        except Exception:
            shutil.rmtree(final, ignore_errors=True)  # unusable: do not keep it in the cache
            raise

    def _open_part(self, index: str, version: str, position: str, manifest: dict[str, Any], final: Path,
                   decoded: dict[str, KillList], timings: RefreshTimings) -> Part:
        """Open ``final``'s shards; the kill-lists the download decoded are used, the others read."""
        shards: list[Shard] = []
        covered: list[KillList] = []
        for s in sorted(manifest["shards"], key=lambda s: int(s["shard"])):
            shard_dir = final / shard_dir_name(s["shard"])
            idx_dir = shard_dir / INDEX_DIR.rstrip("/")
            if not (idx_dir / "meta.json").is_file():
                raise ServingError(
                    f"{index} version {version} shard {s['shard']} has no tantivy index "
                    f"(built by a writer without index files?)"
                )
            with timings.timed("open_s"):
                idx = open_index(str(idx_dir))
                searcher = idx.searcher()
                shards.append(Shard(int(s["shard"]), idx, searcher, int(searcher.num_docs)))
            if shard_dir.name in decoded:
                covered.append(decoded[shard_dir.name])
            elif index == "delta" and (shard_dir / COVERED_FILE).is_file():
                with timings.timed("kill_list_s"):
                    covered.append(read_kill_list(shard_dir / COVERED_FILE))
        return Part(version=version, position=position, path=final, shards=shards, covered=of_shards(covered))

    # ------------------------------------------------------------------ snapshot bookkeeping

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[VersionSet]:
        """The current version set, pinned (its files stay) until the block exits."""
        with self._lock:
            snap = self._current
            snap.users += 1
        try:
            yield snap
        finally:
            with self._lock:
                snap.users -= 1
                release = snap.retired and snap.users == 0
            if release:
                self._maybe_cleanup()

    def _maybe_cleanup(self) -> None:
        """Delete cached versions no current or in-use version set refers to."""
        with self._cleanup_lock:
            with self._lock:
                self._retired = [s for s in self._retired if s.users > 0]
                keep: set[tuple[str, str]] = set(self._loading)
                for s in [self._current, *self._retired]:
                    for lv in (s.full, s.delta):
                        if lv is not None:
                            keep.update((lv.index, part.version) for part in lv.parts)
            for name in INDEXES:
                d = self.cache_dir / name
                if not d.is_dir():
                    continue
                for p in d.iterdir():
                    if p.name.startswith(TMP_PREFIX) or (name, p.name) in keep:
                        continue
                    shutil.rmtree(p, ignore_errors=True)
                    log.info("removed cached %s version %s", name, p.name)

    # ------------------------------------------------------------------ queries

    def parse_query(self, query: str) -> tuple[tantivy.Query | None, bool]:
        """``(query, fell_back)`` for a user query over ``title`` and ``keywords``.

        The query language is tantivy's (``red shoes``, ``"red shoes"``, ``title:red AND -blue``,
        ``bid:[1 TO 5]``, ``*``, ...). An empty query gives ``(None, False)``. A query tantivy cannot
        parse (unbalanced quotes or brackets, a dangling operator, an unknown field) does **not**
        raise: it falls back to a plain term query, the query's words (letters and digits,
        lowercased, like the default tokenizer) OR-ed over ``title`` and ``keywords``, and
        ``fell_back`` is True. A query without any word gives ``(None, True)``: no hits.
        """
        if not query.strip():
            return None, False
        try:
            return self._parser.parse_query(query, list(SEARCH_FIELDS)), False
        except ValueError:
            pass
        words = list(dict.fromkeys(_WORD_RE.findall(query.lower())))
        if not words:
            return None, True
        clauses = [
            (tantivy.Occur.Should, tantivy.Query.term_query(self._schema, f, w))
            for w in words for f in SEARCH_FIELDS
        ]
        return tantivy.Query.boolean_query(clauses), True

    def search(self, query: str, k: int = 10) -> list[Hit]:
        """Top ``k`` hits over both indexes (see the module docstring). Never raises on a bad query."""
        if k <= 0:
            return []
        q, _ = self.parse_query(query)
        if q is None:
            return []
        with self.snapshot() as snap:
            return search_set(snap, q, k, self._search_pool)


# ---------------------------------------------------------------------- CLI (freshidx.cli.search)


NOTHING_PUBLISHED_EXIT = 3  # documented in docs/operations.md: distinct from errors (1) and usage (2)
