"""The quarantine: invalid records written by Spark tasks as JSON lines, one object per (partition, task),
each task returning a :class:`QuarantineCommit` (:func:`write_quarantine`)."""

from __future__ import annotations

import base64
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from freshidx.spark import quarantine_once
from freshidx.spark.raw_source import store_from_json, store_to_json
from freshidx.spark.task_files import COPY_CHUNK_BYTES, check_name, ensure_parent, task_ids
from freshidx.spark.transform import INVALID_COLUMNS, QUARANTINE_EXTRA_COLUMNS
from freshidx.store import StoreConfig, layout
from freshidx.store.object_store import check_key
from freshidx.store.partitions import PartitionId
from freshidx.store.records import QuarantineLine

log = logging.getLogger(__name__)

_QUARANTINE_RESULT_DDL = "commit string"
_QUARANTINE_RESULT_SCHEMA = pa.schema([pa.field("commit", pa.string())])


@dataclass(frozen=True)
class QuarantineCommit:
    partition: str
    key: str
    records: int
    reasons: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {"partition": self.partition, "key": self.key, "records": self.records,
                "reasons": dict(sorted(self.reasons.items()))}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QuarantineCommit:
        return cls(
            partition=str(d["partition"]),
            key=str(d["key"]),
            records=int(d["records"]),
            reasons={str(k): int(v) for k, v in d["reasons"].items()},
        )


def quarantine_key(source: str, partition: str, run_id: str, task: int, attempt: int) -> str:
    prefix = layout.quarantine_prefix(source, PartitionId.parse(partition), run_id)
    return prefix + f"part-{task:05d}-a{attempt}.jsonl"


class _QuarantineFile:
    def __init__(self, fs: Any, config: StoreConfig, key: str) -> None:
        path = config.arrow_path(check_key(key))
        ensure_parent(fs, config, path)
        self.key = key
        self.stream = fs.open_output_stream(path)
        self.records = 0
        self.reasons: Counter[str] = Counter()

    def write(self, file: str, line: int, raw: str | None, reason: str,
              original: bytes | None = None, detail: str | None = None) -> None:
        # Not UTF-8: `raw` is for reading, `raw_base64` the bytes.
        encoded = base64.b64encode(original).decode("ascii") if original is not None else None
        self.stream.write(QuarantineLine(file, line, raw, reason, raw_base64=encoded, detail=detail).jsonl())
        self.records += 1
        self.reasons[reason] += 1


def _copy_object(fs: Any, config: StoreConfig, key: str, to_prefix: str) -> None:
    """Copy a raw object into the quarantine (streamed; the raw object itself is left alone)."""
    dst = config.arrow_path(check_key(to_prefix + key.rsplit("/", 1)[-1]))
    ensure_parent(fs, config, dst)
    try:
        with fs.open_input_stream(config.arrow_path(check_key(key)), compression=None) as src, \
                fs.open_output_stream(dst, compression=None) as out:
            while chunk := src.read(COPY_CHUNK_BYTES):
                out.write(chunk)
    except FileNotFoundError:
        log.warning("quarantine: %s disappeared before it could be copied", key)


def _quarantine_task(
    store_json: str, source: str, run_id: str, once: bool = False
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task, attempt = task_ids()
        config = store_from_json(store_json)
        fs = config.arrow_fs()
        open_files: dict[str, _QuarantineFile] = {}
        done: dict[str, bool] = {}  # once: raw file → already quarantined by an earlier build
        written: dict[str, set[str]] = {}  # once: partition → raw files written here
        try:
            for batch in batches:
                names = [*INVALID_COLUMNS, *(c for c in QUARANTINE_EXTRA_COLUMNS if c in batch.schema.names)]
                cols = {name: batch.column(name).to_pylist() for name in names}
                for i in range(batch.num_rows):
                    partition = cols["partition"][i]
                    if once:
                        file_key = cols["file"][i]
                        if file_key not in done:  # checked again here: another build may have won meanwhile
                            done[file_key] = quarantine_once.exists(
                                fs, config, quarantine_once.done_marker_key(source, partition, file_key))
                        if done[file_key]:
                            continue
                        written.setdefault(partition, set()).add(file_key)
                    out = open_files.get(partition)
                    if out is None:
                        out = _QuarantineFile(fs, config, quarantine_key(source, partition, run_id, task, attempt))
                        open_files[partition] = out
                    out.write(cols["file"][i], cols["line"][i], cols["raw"][i], cols["reason"][i],
                              *(cols[c][i] if c in cols else None for c in QUARANTINE_EXTRA_COLUMNS))
                    if cols["line"][i] == 0 and cols["file"][i]:  # a whole object: keep a copy of it
                        _copy_object(fs, config, cols["file"][i], out.key.rsplit("/", 1)[0] + "/objects/")
        finally:
            for out in open_files.values():
                out.stream.close()
        for partition, files in written.items():  # only after the files are closed: a marker means complete
            quarantine_once.write_done_markers(fs, config, source, partition, files, run_id, open_files[partition].key)
        commits = [
            QuarantineCommit(partition=p, key=f.key, records=f.records, reasons=dict(f.reasons))
            for p, f in sorted(open_files.items())
        ]
        if commits:
            yield pa.RecordBatch.from_arrays(
                [pa.array([json.dumps(c.to_dict(), sort_keys=True) for c in commits], pa.string())],
                schema=_QUARANTINE_RESULT_SCHEMA,
            )

    return run


def write_quarantine(
    invalid: DataFrame,
    store_config: StoreConfig,
    source: str,
    run_id: str,
    after_partition: str | None,
    *,
    once: bool = False,
    one_task: bool = False,
) -> list[QuarantineCommit]:
    """Write invalid records of partitions strictly after ``after_partition`` (None: all) as JSON lines.

    One object per (partition, task): ``quarantine/<source>/<partition>/<run_id>/part-TTTTT-aA.jsonl``
    holding ``{"file", "line", "raw", "reason"}`` per line, in file/line order, plus ``raw_base64``
    (the exact bytes of a line that was not UTF-8; ``raw`` is then only for reading) and ``detail``
    where ``invalid`` has them (:data:`~freshidx.spark.transform.QUARANTINE_EXTRA_COLUMNS`). A row for a
    whole unreadable object (``line`` 0) also copies the object to ``…/<run_id>/objects/<name>``.
    Written by Spark tasks; returns their commits sorted by partition and key (empty list when
    nothing was written). ``once``: skip raw files whose done marker exists and write the marker of
    every file written (:mod:`freshidx.spark.quarantine_once`: each bad record quarantined once).
    ``one_task``: ``invalid`` is in one partition already (a build that read one file group): written by
    that one task, without a shuffle by partition.
    """
    check_name("source", source)
    check_name("run_id", run_id)
    if after_partition is not None:
        PartitionId.parse(after_partition)  # a typo here would silently select everything
    df = invalid.select(*INVALID_COLUMNS, *(c for c in QUARANTINE_EXTRA_COLUMNS if c in invalid.columns))
    if after_partition is not None:
        df = df.filter(F.col("partition") > F.lit(after_partition))
    df = (df if one_task else df.repartition("partition")).sortWithinPartitions("partition", "file", "line")
    rows = df.mapInArrow(
        _quarantine_task(store_to_json(store_config), source, run_id, once), _QUARANTINE_RESULT_DDL
    ).collect()
    commits = [QuarantineCommit.from_dict(json.loads(r["commit"])) for r in rows]
    return sorted(commits, key=lambda c: (c.partition, c.key))


def quarantine_in_task(store_json: str, source: str, run_id: str, invalid: pa.Table) -> list[QuarantineCommit]:
    """What :func:`write_quarantine` with ``once=True`` writes, from inside the Spark task that holds
    ``invalid`` (:data:`INVALID_COLUMNS` and the extra columns) already: no job of its own. Files named by
    the task's partition and attempt, like the job's single-task form."""
    if invalid.num_rows == 0:
        return []
    ordered = invalid.sort_by([("partition", "ascending"), ("file", "ascending"), ("line", "ascending")])
    run = _quarantine_task(store_json, source, run_id, once=True)
    commits = [QuarantineCommit.from_dict(json.loads(text))
               for batch in run(iter(ordered.to_batches())) for text in batch.column("commit").to_pylist()]
    return sorted(commits, key=lambda c: (c.partition, c.key))
