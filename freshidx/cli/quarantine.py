"""``freshidx quarantine``: look at rejected input, get its exact bytes back, replay it after a fix.

The quarantine (``quarantine/<source>/<partition>/<run-id>/part-*.jsonl``, written by Spark tasks,
see ``freshidx.spark.shards.write_quarantine``) keeps one JSON object per rejected line:
``file``, ``line``, ``raw`` (the text), ``reason``, and ``raw_base64`` when the line was not UTF-8
(``raw`` then holds replacement characters, the bytes are in ``raw_base64``). A whole object that is
not readable JSON lines has ``line`` 0, a ``detail``, and a copy under ``…/<run-id>/objects/``.

The replay path (docs/operations.md):

1. ``freshidx quarantine export --partition P --out bad.jsonl`` writes the rejected lines exactly as
   upstream wrote them, one per line;
2. fix them (an editor, a script, or the upstream job);
3. ``freshidx quarantine replay bad.jsonl`` uploads the file as a new raw object in the current
   minute's partition, so the next micro-batch and every later full rebuild read it. Versions decide
   as always: a replayed record older than what is known changes nothing.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from freshidx.cli.base import LazyCommand, LazyGroup, json_option, open_command_store, store_option

if TYPE_CHECKING:
    from freshidx.store import ObjectStore
    from freshidx.store.partitions import PartitionId


def entries(store: ObjectStore, source: str, partition: PartitionId | None = None,
            run: str | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(partition path, entry)`` for every quarantined line, in key order."""
    from freshidx.store import layout

    root = f"quarantine/{source}/"
    prefix = layout.quarantine_prefix(source, partition, run) if partition and run else (
        f"{root}{partition.path}/" if partition else root)
    for obj in store.iter_objects(prefix):
        rel = obj.key[len(root):]
        if not rel.endswith(".jsonl") or "/objects/" in rel:
            continue
        part_path = "/".join(rel.split("/")[:5])
        for text in store.get(obj.key).data.decode("utf-8").splitlines():
            if text.strip():
                yield part_path, json.loads(text)


def original_bytes(entry: dict[str, Any]) -> bytes | None:
    """The line exactly as upstream wrote it (None for a whole-object entry)."""
    if entry.get("raw_base64") is not None:
        return base64.b64decode(entry["raw_base64"])
    raw = entry.get("raw")
    return None if raw is None else str(raw).encode("utf-8")


def _partition(value: str | None) -> PartitionId | None:
    from freshidx.store.partitions import PartitionError
    from freshidx.trigger.ledger import parse_partition

    if value is None:
        return None
    try:
        return parse_partition(value).minute()  # the same forms as `freshidx ledger --partition`
    except PartitionError as exc:
        raise SystemExit(f"freshidx quarantine: --partition: {exc}") from None


def cmd_list(*, store: str | None, as_json: bool, partition: str | None) -> int:
    settings, st = open_command_store(store, reads_only=True)
    counts: dict[str, Counter[str]] = {}
    for part, e in entries(st, settings.source, _partition(partition)):
        counts.setdefault(part, Counter())[str(e.get("reason"))] += 1
    if as_json:
        print(json.dumps({p: dict(c) for p, c in sorted(counts.items())}, indent=1))
    elif not counts:
        print("nothing quarantined")
    else:
        for p, c in sorted(counts.items()):
            print(f"{p}  " + ", ".join(f"{r} {n}" for r, n in c.most_common()))
    return 0


def cmd_export(*, store: str | None, as_json: bool, partition: str, run: str | None, out: str) -> int:
    settings, st = open_command_store(store, reads_only=True)  # writes only --out
    lines: list[bytes] = []
    objects: list[dict[str, Any]] = []
    for _, e in entries(st, settings.source, _partition(partition), run):
        data = original_bytes(e)
        if data is None:
            objects.append(e)
        else:
            lines.append(data)
    body = b"".join(line + b"\n" for line in lines)
    if out == "-":
        sys.stdout.buffer.write(body)
    else:
        Path(out).write_bytes(body)
    summary = {"lines": len(lines), "objects": [{"file": o.get("file"), "reason": o.get("reason"),
                                                   "detail": o.get("detail")} for o in objects]}
    text = f"{len(lines)} line(s) exported"
    if objects:
        names = ", ".join(str(o.get("file")) for o in objects)
        text += f"; {len(objects)} whole object(s) not exported (copies under quarantine/…/objects/): {names}"
    print(json.dumps(summary) if as_json else text, file=sys.stderr if out == "-" else sys.stdout)
    return 0


def cmd_replay(*, store: str | None, as_json: bool, file: str) -> int:
    from freshidx.store import layout
    from freshidx.store.partitions import PartitionId

    settings, st = open_command_store(store, reads_only=False)  # new raw input, as `freshidx generate`
    data = Path(file).read_bytes()
    if not data.strip():
        print(f"freshidx quarantine replay: {file} is empty; nothing uploaded", file=sys.stderr)
        return 2
    now = dt.datetime.now(dt.UTC)
    partition = PartitionId(now.replace(second=0, microsecond=0))
    key = (layout.raw_partition_prefix(settings.source, partition)
           + f"replay-{now.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}.jsonl")
    st.create_or_same(key, data if data.endswith(b"\n") else data + b"\n")
    lines = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
    print(json.dumps({"key": key, "partition": partition.path, "lines": lines}) if as_json
          else f"replayed {lines} line(s) as {key}")
    return 0


quarantine_group = LazyGroup(
    "quarantine",
    [
        LazyCommand("list", cmd_list, store_option(), json_option("print JSON"),
                    click.Option(["--partition"], help="one partition (path form year=…/minute=…)"),
                    help="quarantined records per partition and reason"),
        LazyCommand("export", cmd_export, store_option(), json_option("print JSON"),
                    click.Option(["--partition"], required=True, help="minute partition: 20261124T0148 or "
                                 "year=YYYY/month=MM/day=DD/hour=HH/minute=mm"),
                    click.Option(["--run"],
                                 help="only this run id (default: every run that quarantined the partition)"),
                    click.Option(["--out"], required=True, help="output file ('-' for standard output)"),
                    help="write the rejected lines of a partition byte for byte"),
        LazyCommand("replay", cmd_replay, store_option(), json_option("print JSON"),
                    click.Argument(["file"]),
                    short_help="upload a (fixed) JSON-lines file as new raw input of the current minute",
                    help="upload a (fixed) JSON-lines file as new raw input of the current minute\n\n"
                    "FILE: JSON lines, e.g. a fixed `quarantine export`"),
    ],
    help="rejected input: list, export exact bytes, replay after a fix",
)
