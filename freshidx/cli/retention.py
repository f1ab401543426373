"""``freshidx rollback`` and ``freshidx gc`` (the operations: :mod:`freshidx.publish.retention`)."""

from __future__ import annotations

import datetime as dt
import json
import sys

import click

from freshidx.cli.base import LazyCommand, json_option, open_command_store, store_option

INDEX_NAMES = ("delta", "full")  # freshidx.store.layout.INDEX_NAMES
DEFAULT_GRACE_MINUTES = 60  # freshidx.publish.retention.DEFAULT_GRACE_MINUTES
DEFAULT_MAX_VERSIONS = 100  # freshidx.publish.retention.DEFAULT_MAX_VERSIONS


def cmd_rollback(*, index: str, to_version: str | None, store: str | None, as_json: bool) -> int:
    from freshidx.publish.retention import RetentionError, rollback

    _, st = open_command_store(store, reads_only=False)
    try:
        pointer = rollback(st, index, to_version)
    except RetentionError as exc:
        if as_json:
            print(json.dumps({"ok": False, "error": str(exc)}))
        else:
            print(f"freshidx rollback: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps({"ok": True, "pointer": pointer.to_dict()}, indent=1))
    else:
        print(f"{index}: now serving {pointer.version} (seq {pointer.seq}, was {pointer.previous_version})")
    return 0


def cmd_gc(*, index: str, keep: int | None, grace_minutes: float, dry_run: bool, max_versions: int,
           store: str | None, as_json: bool) -> int:
    from freshidx.publish.retention import gc, planned_gc

    settings, st = open_command_store(store, reads_only=dry_run)
    keep_last, grace = keep if keep is not None else settings.keep_versions, dt.timedelta(minutes=grace_minutes)
    # A dry run is the plan (what would be deleted and kept, and why), applied to nothing.
    plan = planned_gc(st, index, keep_last, grace, max_versions=max_versions) if dry_run else None
    report = plan.report(dry_run=True) if plan is not None else \
        gc(st, index, keep_last, grace, max_versions=max_versions)
    if as_json:
        print(json.dumps({**report.to_dict(), **({"plan": plan.describe()} if plan is not None else {})}, indent=1))
        return 0
    verb = "would delete" if dry_run else "deleted"
    print(f"{index}: current {report.current}, kept {report.kept}")
    print(f"{verb} {len(report.deleted_versions)} version(s), {len(report.deleted_orphans)} orphan dir(s), "
          f"{report.deleted_objects} object(s), {report.deleted_bytes} bytes"
          + ("; more left for the next call" if report.truncated else ""))
    if plan is not None:
        for line in plan.describe():
            print(f"  {line}")
        return 0
    for v in report.deleted_versions:
        print(f"  version {v}")
    for d in report.deleted_orphans:
        print(f"  orphan  {d}")
    return 0


def _index() -> click.Argument:
    return click.Argument(["index"], type=click.Choice(INDEX_NAMES))


rollback = LazyCommand(
    "rollback", cmd_rollback,
    _index(),
    click.Option(["--to", "to_version"], help="version to restore (default: the previous published one)"),
    store_option(),
    json_option("print the new pointer as JSON"),
    help="point an index back at an earlier published version",
)

gc = LazyCommand(
    "gc", cmd_gc,
    _index(),
    click.Option(["--keep"], type=int, default=None,
                 help="published versions to keep (default FRESHIDX_KEEP_VERSIONS)"),
    click.Option(["--grace-minutes"], type=float, default=float(DEFAULT_GRACE_MINUTES),
                 help=f"only delete what is older than this (default {DEFAULT_GRACE_MINUTES})"),
    click.Option(["--dry-run"], is_flag=True, help="report, delete nothing"),
    click.Option(["--max-versions"], type=int, default=DEFAULT_MAX_VERSIONS, help="versions examined per call"),
    store_option(),
    json_option("print the report as JSON"),
    help="delete old, abandoned and orphaned index files",
)
