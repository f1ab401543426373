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

import argparse
import base64
import datetime as dt
import json
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from freshidx import layout
from freshidx.ledger import parse_partition
from freshidx.partitions import PartitionError, PartitionId
from freshidx.settings import Settings
from freshidx.store import ObjectStore, open_store


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("quarantine", help="rejected input: list, export exact bytes, replay after a fix")
    sub = p.add_subparsers(dest="quarantine_command", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--store", help="store URI (default: FRESHIDX_STORE or ./.freshidx/store)")
        q.add_argument("--json", action="store_true", help="print JSON")

    ls = sub.add_parser("list", help="quarantined records per partition and reason")
    common(ls)
    ls.add_argument("--partition", help="one partition (path form year=…/minute=…)")
    ls.set_defaults(func=cmd_list)

    ex = sub.add_parser("export", help="write the rejected lines of a partition byte for byte")
    common(ex)
    ex.add_argument("--partition", required=True,
                    help="minute partition: 20261124T0148 or year=YYYY/month=MM/day=DD/hour=HH/minute=mm")
    ex.add_argument("--run", help="only this run id (default: every run that quarantined the partition)")
    ex.add_argument("--out", required=True, help="output file ('-' for standard output)")
    ex.set_defaults(func=cmd_export)

    rp = sub.add_parser("replay", help="upload a (fixed) JSON-lines file as new raw input of the current minute")
    common(rp)
    rp.add_argument("file", help="JSON lines, e.g. a fixed `quarantine export`")
    rp.set_defaults(func=cmd_replay)


def entries(store: ObjectStore, source: str, partition: PartitionId | None = None,
            run: str | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(partition path, entry)`` for every quarantined line, in key order."""
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
    if value is None:
        return None
    try:
        return parse_partition(value).minute()  # the same forms as `freshidx ledger --partition`
    except PartitionError as exc:
        raise SystemExit(f"freshidx quarantine: --partition: {exc}") from None


def cmd_list(args: argparse.Namespace) -> int:
    settings = Settings.from_env(store=args.store)
    store = open_store(settings.store_config())
    counts: dict[str, Counter[str]] = {}
    for part, e in entries(store, settings.source, _partition(args.partition)):
        counts.setdefault(part, Counter())[str(e.get("reason"))] += 1
    if args.json:
        print(json.dumps({p: dict(c) for p, c in sorted(counts.items())}, indent=1))
    elif not counts:
        print("nothing quarantined")
    else:
        for p, c in sorted(counts.items()):
            print(f"{p}  " + ", ".join(f"{r} {n}" for r, n in c.most_common()))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    settings = Settings.from_env(store=args.store)
    store = open_store(settings.store_config())
    lines: list[bytes] = []
    objects: list[dict[str, Any]] = []
    for _, e in entries(store, settings.source, _partition(args.partition), args.run):
        data = original_bytes(e)
        if data is None:
            objects.append(e)
        else:
            lines.append(data)
    body = b"".join(line + b"\n" for line in lines)
    if args.out == "-":
        sys.stdout.buffer.write(body)
    else:
        Path(args.out).write_bytes(body)
    summary = {"lines": len(lines), "objects": [{"file": o.get("file"), "reason": o.get("reason"),
                                                   "detail": o.get("detail")} for o in objects]}
    text = f"{len(lines)} line(s) exported"
    if objects:
        names = ", ".join(str(o.get("file")) for o in objects)
        text += f"; {len(objects)} whole object(s) not exported (copies under quarantine/…/objects/): {names}"
    print(json.dumps(summary) if args.json else text, file=sys.stderr if args.out == "-" else sys.stdout)
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    settings = Settings.from_env(store=args.store)
    store = open_store(settings.store_config())
    data = Path(args.file).read_bytes()
    if not data.strip():
        print(f"freshidx quarantine replay: {args.file} is empty; nothing uploaded", file=sys.stderr)
        return 2
    now = dt.datetime.now(dt.UTC)
    partition = PartitionId(now.replace(second=0, microsecond=0))
    key = (layout.raw_partition_prefix(settings.source, partition)
           + f"replay-{now.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}.jsonl")
    store.create_or_same(key, data if data.endswith(b"\n") else data + b"\n")
    lines = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
    print(json.dumps({"key": key, "partition": partition.path, "lines": lines}) if args.json
          else f"replayed {lines} line(s) as {key}")
    return 0
