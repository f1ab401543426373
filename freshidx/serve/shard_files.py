"""A published version's files, fetched into a reader's cache (docs/architecture.md#index-format-and-serving).

Only the files its manifest lists are read (never a listing); each is checked against the manifest's size
and sha256, written under a temp directory and the directory renamed into place in one step, so a
half-download is never where :class:`freshidx.serve.searcher.Searcher` looks. A delta shard's kill-list
(``covered.parquet``) is decoded as soon as its bytes are verified, on the fetching thread, while the
other files are still arriving (:mod:`freshidx.serve.kill_list` builds it mostly without the interpreter
lock).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from freshidx.serve.kill_list import KillList, read_kill_list
from freshidx.serve.versions import ServingError
from freshidx.spark.index_format import COVERED_FILE, INDEX_DIR, is_lock_file
from freshidx.store import ObjectStore, layout

DOWNLOAD_THREADS = 8
TMP_PREFIX = ".tmp-"


@dataclass
class Fetched:
    """What one download brought: its bytes, the kill-lists it decoded on the way (by shard directory
    name) and the seconds spent decoding them (on the fetching threads, beside the download)."""

    bytes: int = 0
    kill_lists: dict[str, KillList] = field(default_factory=dict)
    kill_list_s: float = 0.0


def shard_dir_name(shard: int | str) -> str:
    return f"shard-{int(shard):05d}"


def _is_kill_list(rel: str) -> bool:
    """Whether a path relative to the version dir (``shard-NNNNN/...``) is a shard's ``covered.parquet``."""
    return rel.endswith("/" + COVERED_FILE)


def wanted_files(index: str, version: str, manifest: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """(file entry, path relative to the version dir) of every file serving needs."""
    out: list[tuple[dict[str, Any], str]] = []
    for s in manifest["shards"]:
        prefix = layout.shard_prefix(index, version, int(s["shard"]), int(s["attempt"]))
        shard_dir = shard_dir_name(s["shard"]) + "/"
        for f in s["files"]:
            key = str(f["key"])
            if not key.startswith(prefix):
                raise ServingError(f"manifest of {index}/{version}: {key} is outside its shard prefix {prefix}")
            rel = key[len(prefix):]
            wanted = rel.startswith(INDEX_DIR) or (index == "delta" and rel == COVERED_FILE)
            if not wanted or is_lock_file(rel):
                continue
            name = rel[len(INDEX_DIR):] if rel.startswith(INDEX_DIR) else rel
            if not name or "/" in name:
                raise ServingError(f"manifest of {index}/{version}: unexpected file {key}")
            out.append((f, shard_dir + rel))
    return out


def download_version(store: ObjectStore, index: str, version: str, manifest: dict[str, Any], final: Path
                     ) -> Fetched:
    """Download and verify ``version``'s files into ``final`` (created by one rename)."""
    # Kill-lists first: their decoding then runs while the index files arrive instead of after the last one.
    files = sorted(wanted_files(index, version, manifest), key=lambda item: not _is_kill_list(item[1]))
    tmp = final.parent / f"{TMP_PREFIX}{version}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        def fetch(item: tuple[dict[str, Any], str]) -> tuple[int, str, KillList | None, float]:
            entry, rel = item
            data = store.get_data(str(entry["key"]))
            if len(data) != int(entry["bytes"]):
                raise ServingError(f"{entry['key']}: {len(data)} bytes, manifest says {entry['bytes']}")
            if hashlib.sha256(data).hexdigest() != entry["sha256"]:
                raise ServingError(f"{entry['key']}: sha256 mismatch")
            dest = tmp / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
            if not _is_kill_list(rel):
                return len(data), rel, None, 0.0
            t0 = time.perf_counter()
            kill = read_kill_list(data)
            return len(data), rel, kill, time.perf_counter() - t0

        out = Fetched()
        with ThreadPoolExecutor(max_workers=DOWNLOAD_THREADS) as pool:
            for size, rel, kill, seconds in pool.map(fetch, files):
                out.bytes += size
                if kill is not None:
                    out.kill_lists[rel.split("/", 1)[0]] = kill
                    out.kill_list_s += seconds
        for s in manifest["shards"]:  # an empty shard still needs its directory
            (tmp / shard_dir_name(s["shard"])).mkdir(exist_ok=True)
        (tmp / ".complete.json").write_text(json.dumps({"index": index, "version": version, "files": len(files)}))
        try:
            os.rename(tmp, final)  # atomic: a half-download is never at `final`
        except OSError:
            if not final.is_dir():
                raise
            # someone else completed the same version first: theirs is as good as ours
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def remove_stale_temp_dirs(index_dir: Path) -> None:
    """Half-downloads a previous process left behind."""
    if index_dir.is_dir():
        for p in index_dir.iterdir():
            if p.name.startswith(TMP_PREFIX):
                shutil.rmtree(p, ignore_errors=True)
