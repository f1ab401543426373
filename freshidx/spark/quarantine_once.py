"""Quarantine each bad record once, by whichever build reads it first (late partitions included).

Three builds read the same raw files (the delta's window, the full index's history, the hourly
buckets); each used to decide on its own what to quarantine, so records of a partition no delta
window covered were never quarantined, and others were quarantined by several builds. Now:

* **invalid records**: a file whose invalid records were written to the quarantine gets a *done
  marker* ``quarantine/<source>/<partition>/_done/<sha256(file key)[:32]>.done`` (written by the
  executor after the quarantine file is closed, so a marker always follows a complete write). The
  driver lists the markers of the partitions it reads (:func:`quarantined_files`, one paginated LIST
  from the build's oldest partition on) and hands only the other files to
  :func:`freshidx.spark.shards.write_quarantine`, whose tasks check the marker again before writing
  (two builds racing on a new file may both write it; never none). A file added later to a partition
  has no marker and is quarantined by the next build that reads it.
* **version conflicts** (:func:`freshidx.spark.transform.version_conflicts`) depend on which files a build
  read together, not on one file, so each copy gets its own deterministic key
  ``quarantine/<source>/<partition>/conflicts/<sha256(file, line)[:32]>.jsonl``, written only if absent:
  the first build that reads both copies reports them, later ones find them there.

Markers end in ``.done`` and sit under ``_done/``, so quarantine readers (``*.jsonl``) never see them.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from freshidx.spark import transform
from freshidx.spark.raw_source import store_from_json, store_to_json
from freshidx.spark.transform import CONFLICT_COLUMNS
from freshidx.store import ObjectStore, StoreConfig
from freshidx.store.object_store import check_key
from freshidx.store.records import QuarantineDone, QuarantineLine

DONE_DIR = "_done/"
CONFLICTS_DIR = "conflicts/"
_RESULT_DDL = "commit string"
_RESULT_SCHEMA = pa.schema([pa.field("commit", pa.string())])


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def partition_root(source: str, partition: str) -> str:
    return f"quarantine/{source}/{partition}/"


def done_marker_key(source: str, partition: str, file_key: str) -> str:
    """The marker saying the invalid records of raw file ``file_key`` are in the quarantine."""
    return f"{partition_root(source, partition)}{DONE_DIR}{_digest(file_key)}.done"


def conflict_copy_key(source: str, partition: str, file_key: str, line: int) -> str:
    """Where one reported copy of a version conflict lives (deterministic: written once)."""
    copy_id = _digest(f"{file_key}\n{line}")
    return f"{partition_root(source, partition)}{CONFLICTS_DIR}{copy_id}.jsonl"


def quarantined_files(store: ObjectStore, source: str, files: Iterable[tuple[str, str]]) -> set[str]:
    """The raw keys among ``files`` (``(key, partition path)`` pairs) that already have a done marker.

    One paginated LIST of ``quarantine/<source>/`` starting at the oldest partition of ``files``
    (partition paths sort chronologically): proportional to what was quarantined since then, so a
    delta pays for its window and only the full rebuild, which reads all history anyway, for all of it.
    """
    wanted: dict[str, str] = {}
    for key, partition in files:
        wanted[done_marker_key(source, partition, key)] = key
    if not wanted:
        return set()
    root = f"quarantine/{source}/"
    oldest = min(partition for _, partition in files)
    # "<root><oldest>" without its slash sorts just before every key of that partition.
    found: set[str] = set()
    for obj in store.iter_objects(root, start_after=f"{root}{oldest}"):
        if obj.key in wanted:
            found.add(wanted[obj.key])
    return found


# ------------------------------------------------------------------------ executor side


def exists(fs: Any, config: StoreConfig, key: str) -> bool:
    return bool(fs.get_file_info(config.arrow_path(check_key(key))).type != pafs.FileType.NotFound)


def write_small(fs: Any, config: StoreConfig, key: str, data: bytes) -> None:
    path = config.arrow_path(check_key(key))
    if not config.is_s3:  # local directories need creating; on S3 a "directory" is a stray object
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(path, compression=None) as out:
        out.write(data)


def write_done_markers(fs: Any, config: StoreConfig, source: str, partition: str, files: Iterable[str],
                       run_id: str, quarantine_key: str) -> None:
    """Called by a quarantine task after ``quarantine_key`` is closed: its files are done."""
    for file_key in sorted(set(files)):
        marker = QuarantineDone(file=file_key, run_id=run_id, quarantine=quarantine_key)
        write_small(fs, config, done_marker_key(source, partition, file_key), marker.data())


@dataclass
class ConflictReport:
    """What a build found and reported about ``(ad_id, version)`` conflicts, per group (hour) and all."""

    ads: Counter[str] = field(default_factory=Counter)  # group → conflicting (ad_id, version) keys
    records: Counter[str] = field(default_factory=Counter)  # group → copies read
    written: dict[str, Counter[str]] = field(default_factory=dict)  # group → partition → new copies
    examples: dict[str, list[str]] = field(default_factory=dict)  # group → a few "ad_id@version"

    def summary(self, group: str = "") -> dict[str, Any]:
        """The manifest's ``invalid.conflicts`` for one group (``""`` = the whole build)."""
        groups = [group] if group else sorted(set(self.ads) | set(self.records))
        written: Counter[str] = Counter()
        for g in groups:
            written.update(self.written.get(g, {}))
        examples = sorted(x for g in groups for x in self.examples.get(g, []))[:10]
        return {"ads": sum(self.ads[g] for g in groups), "records": sum(self.records[g] for g in groups),
                "reported": dict(sorted(written.items())), "examples": examples}


def _conflict_task(store_json: str, source: str, write: bool, group_col: str | None
                   ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        config = store_from_json(store_json)
        fs = config.arrow_fs() if write else None
        keys: dict[str, set[tuple[str, int]]] = {}
        records: Counter[str] = Counter()
        written: dict[str, Counter[str]] = {}
        examples: dict[str, list[str]] = {}
        for batch in batches:
            cols = {name: batch.column(name).to_pylist() for name in batch.schema.names}
            for i in range(batch.num_rows):
                group = "" if group_col is None else str(cols[group_col][i])
                ad, version = str(cols["ad_id"][i]), int(cols["version"][i])
                if (ad, version) not in keys.setdefault(group, set()) and len(examples.get(group, [])) < 10:
                    examples.setdefault(group, []).append(f"{ad}@{version}")
                keys[group].add((ad, version))
                records[group] += 1
                if fs is None:
                    continue
                partition, file_key, line = cols["partition"][i], cols["file"][i], int(cols["line"][i])
                key = conflict_copy_key(source, partition, file_key, line)
                if exists(fs, config, key):
                    continue  # an earlier build reported this copy already
                entry = QuarantineLine(file_key, line, cols["raw"][i], cols["reason"][i], detail=cols["detail"][i],
                                       ad_id=ad, version=version)
                write_small(fs, config, key, entry.jsonl())
                written.setdefault(group, Counter())[partition] += 1
        if records:
            commit = {"ads": {g: len(k) for g, k in keys.items()}, "records": dict(records),
                      "written": {g: dict(c) for g, c in written.items()}, "examples": examples}
            yield pa.RecordBatch.from_arrays([pa.array([json.dumps(commit)], pa.string())], schema=_RESULT_SCHEMA)

    return run


def report_conflicts(parsed: DataFrame, store_config: StoreConfig, source: str, *, write: bool = True,
                     group_col: str | None = None) -> ConflictReport:
    """Count the copies of :func:`freshidx.spark.transform.version_conflicts` in ``parsed`` (per ``group_col``)
    and, with ``write``, put each copy not reported yet under its :func:`conflict_copy_key`.

    Conflicts are rare: one cheap aggregation (:func:`freshidx.spark.transform.may_have_version_conflicts`)
    settles the usual case. Otherwise one more Spark job: the copies of one ``(ad_id, version)`` (per
    group) go to one task, so the per-task key counts add up exactly, and the driver gets one small
    commit row per task that saw a conflict."""
    group = (group_col,) if group_col else ()
    if not transform.may_have_version_conflicts(parsed, group):
        return ConflictReport()
    conflicts = transform.version_conflicts(parsed, group)
    cols = [*CONFLICT_COLUMNS, *group]
    keys = [*group, "ad_id", "version"]
    df = conflicts.select(*cols).repartition(*[F.col(k) for k in keys])
    task = _conflict_task(store_to_json(store_config), source, write, group_col)
    report = ConflictReport()
    for row in df.mapInArrow(task, _RESULT_DDL).collect():
        commit = json.loads(row["commit"])
        report.ads.update({str(g): int(n) for g, n in commit["ads"].items()})
        report.records.update({str(g): int(n) for g, n in commit["records"].items()})
        for g, by_partition in commit["written"].items():
            report.written.setdefault(str(g), Counter()).update({str(p): int(n) for p, n in by_partition.items()})
        for g, names in commit["examples"].items():
            report.examples.setdefault(str(g), []).extend(names)
    return report
