"""What the index should serve, brute force, and what it serves, for ``freshidx bench chaos``.

* :func:`oracle` (pure): the latest version of each ad over every valid record, active ads only; ties
  as ``freshidx.record_rules.tie_break_order`` settles them (version, then ``updated_at``, then status
  with inactive beating active, then the other fields). It knows nothing of segments, windows,
  kill-lists or folding: only the records.
* :func:`raw_records` (reads): every record of every raw partition up to a watermark, read and validated
  by the same line reader and validator a micro-batch task uses (:mod:`freshidx.spark.object_lines`,
  :mod:`freshidx.spark.line_parse`, checked line by line against Spark by their tests). A line that reader
  cannot settle without Spark is counted (``uncertain``) and its ad left out of the comparison.
* :func:`served_docs` (reads): every document a search can return now: each searched part's documents
  minus what newer parts hide (:attr:`freshidx.serve.versions.VersionSet.searched`).
* :func:`compare` (pure): ``lost`` (oracle ads not served) and ``wrong`` (served ads that differ from the
  oracle, should not be served, or are served twice).
"""

from __future__ import annotations

import datetime as dt
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from freshidx.store import ObjectStore, StoreConfig
from freshidx.store.partitions import PartitionId

#: Fields a served document stores and the comparison checks (``keywords`` is indexed, not stored).
COMPARED = ("version", "campaign_id", "product_id", "title", "bid")


def rank(r: Mapping[str, Any]) -> tuple[Any, ...]:
    """Greatest wins: the order of ``freshidx.record_rules.tie_break_order``."""
    return (r["version"], r["updated_at"], r["status"], r["campaign_id"], r["product_id"], r["title"],
            tuple(r.get("keywords") or ()), r["bid"])


def oracle(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """ad_id -> the record that should be served, for every ad whose latest record is active."""
    best: dict[str, Mapping[str, Any]] = {}
    for r in records:
        cur = best.get(r["ad_id"])
        if cur is None or rank(r) > rank(cur):
            best[r["ad_id"]] = r
    return {a: dict(r) for a, r in best.items() if r["status"] == "active"}


@dataclass
class Comparison:
    lost: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    served: int = 0
    expected: int = 0


def compare(served: Mapping[str, list[dict[str, Any]]], expected: Mapping[str, Mapping[str, Any]],
            skip: frozenset[str] = frozenset()) -> Comparison:
    """``served``: ad_id -> every visible copy; ``skip``: ads left out (an uncertain line touched them)."""
    out = Comparison(served=sum(len(v) for v in served.values()), expected=len(expected))
    for ad in expected:
        if ad not in skip and ad not in served:
            out.lost.append(ad)
    for ad, copies in served.items():
        if ad in skip:
            continue
        want = expected.get(ad)
        if want is None or len(copies) != 1 or any(_differs(copies[0].get(f), want.get(f)) for f in COMPARED):
            out.wrong.append(ad)
    out.lost.sort()
    out.wrong.sort()
    return out


def _differs(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is None or b is None or abs(float(a) - float(b)) > 1e-9 * max(1.0, abs(float(b)))
    return bool(a != b)


# ------------------------------------------------------------------------------------------ reads


@dataclass
class RawRead:
    records: list[dict[str, Any]]
    partitions: list[PartitionId]
    uncertain_ads: frozenset[str]
    uncertain_lines: int
    invalid_lines: int


def raw_records(store: ObjectStore, config: StoreConfig, source: str, until: PartitionId) -> RawRead:
    """Every valid record (with its ``partition`` path) of the raw partitions up to ``until`` (inclusive)."""
    from freshidx.catchup.state import oldest_hour
    from freshidx.delta.window_files import files_in_window

    oldest = oldest_hour(store, source)
    if oldest is None:
        return RawRead([], [], frozenset(), 0, 0)
    files, _ = files_in_window(store, source, oldest - dt.timedelta(minutes=1), until)
    out = RawRead([], sorted(files), frozenset(), 0, 0)
    uncertain: set[str] = set()
    for pid, objs in files.items():
        for obj in objs:
            _read_object(config, obj.key, pid.path, out, uncertain)
    out.uncertain_ads = frozenset(uncertain)
    return out


def _read_object(config: StoreConfig, key: str, partition_path: str, out: RawRead, uncertain: set[str]) -> None:
    import pyarrow as pa

    from freshidx.spark.line_parse import parse_lines
    from freshidx.spark.raw_source import read_files

    for batch in read_files(config, [(key, partition_path)]):
        table = pa.Table.from_batches([batch])
        parsed = parse_lines(table)
        if parsed is None:  # some line needs Spark's reading: take the lines one by one
            for i in range(table.num_rows):
                one = parse_lines(table.slice(i, 1))
                if one is None:
                    out.uncertain_lines += 1
                    uncertain.update(_ad_ids_in(table.column("raw")[i].as_py()))
                else:
                    _take(one, out)
        else:
            _take(parsed, out)


def _take(parsed: Any, out: RawRead) -> None:
    for row in parsed.to_pylist():
        if row["reason"] is not None:
            out.invalid_lines += 1
            continue
        out.records.append({k: row[k] for k in ("partition", "ad_id", "campaign_id", "product_id", "title",
                                                "keywords", "bid", "status", "updated_at", "version")})


def _ad_ids_in(raw: str | None) -> list[str]:
    """The ad id an uncertain line may carry (best effort; such lines are rare)."""
    import json

    try:
        obj = json.loads(raw or "")
    except ValueError:
        return []
    ad = obj.get("ad_id") if isinstance(obj, dict) else None
    return [str(ad)] if ad is not None else []


def served_docs(store: ObjectStore) -> tuple[dict[str, list[dict[str, Any]]], dict[str, str | None]]:
    """ad_id -> every copy a search can return now, and the versions served."""
    import tantivy

    from freshidx.serve.searcher import Searcher

    out: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="freshidx-chaos-serve-") as cache:
        searcher = Searcher(store, cache)
        with searcher.snapshot() as snap:
            for _index, _version, part, hidden in snap.searched:
                for sh in part.shards:
                    if not sh.doc_count:
                        continue
                    result = sh.searcher.search(tantivy.Query.all_query(), limit=sh.doc_count)
                    for _score, addr in result.hits:
                        doc = sh.searcher.doc(addr)
                        ad = doc.get_first("ad_id")
                        if ad in hidden:
                            continue
                        out.setdefault(ad, []).append({f: doc.get_first(f) for f in COMPARED})
            versions = snap.versions()
    return out, versions
