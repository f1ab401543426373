"""``freshidx ledger``: why did this run happen, why was this partition not processed."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from typing import Any

from freshidx import ledger
from freshidx.settings import Settings
from freshidx.store import open_store

PIPELINES = ("delta", "full", "sla", "ads_hourly")


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("ledger", help="trigger decisions: processed, superseded, refused, remediation")
    p.add_argument("--store", help="store URI (default: FRESHIDX_STORE or ./.freshidx/store)")
    p.add_argument("--pipeline", choices=(*PIPELINES, "all"), default="all")
    p.add_argument("--since", type=dt.date.fromisoformat, help="first date (YYYY-MM-DD, UTC)")
    p.add_argument("--until", type=dt.date.fromisoformat, help="last date (YYYY-MM-DD, UTC)")
    p.add_argument("--partition", help="only entries of this partition: 20261124T0148, "
                   "year=2026/month=11/day=24/hour=01/minute=48, or an hour (2026-11-24-01:00, 20261124T01, "
                   "year=…/hour=01) for every partition of it; reads only that date unless --since/--until")
    p.add_argument("--json", action="store_true", help="a JSON list of entries")
    p.set_defaults(func=cmd_ledger)
    sub = p.add_subparsers(dest="action")
    r = sub.add_parser("retry", help="grant one more attempt to a failed or parked partition")
    r.add_argument("--store", help="store URI")
    r.add_argument("--pipeline", choices=("delta", "ads_hourly"), default="delta")
    r.add_argument("--partition", help="delta: partition 20261124T0148 or year=…/minute=mm")
    r.add_argument("--hour", help="ads_hourly: hour id YYYYMMDDTHH (UTC), e.g. 20261121T14")
    r.add_argument("--reason", default="operator retry")
    r.set_defaults(func=cmd_retry)


def cmd_retry(args: argparse.Namespace) -> int:
    from freshidx.partitions import PartitionError

    if args.pipeline == "ads_hourly":
        return _retry_hour(args)
    if not args.partition:
        print("freshidx ledger retry: --partition is required for --pipeline delta", file=sys.stderr)
        return 2
    try:
        partition = ledger.parse_partition(args.partition).minute()
    except PartitionError as exc:
        print(f"freshidx ledger retry: --partition: {exc}", file=sys.stderr)
        return 2
    store = open_store(Settings.from_env(store=args.store).store_config())
    final = ledger.decision(store, args.pipeline, partition)
    if final is not None:
        print(f"{partition.path} already has a final decision: {final['decision']} ({final['reason']})",
              file=sys.stderr)
        return 1
    grant = ledger.grant_retry(store, args.pipeline, partition, args.reason)
    print(f"granted {grant}: the sensor requests a new attempt on its next tick if {partition.path} "
          "is still the newest partition")
    return 0


def _retry_hour(args: argparse.Namespace) -> int:
    from freshidx import catchup

    try:
        hour = catchup.parse_hour_id(args.hour or "")
    except ValueError:
        print(f"freshidx ledger retry: --hour: expected YYYYMMDDTHH, got {args.hour!r}", file=sys.stderr)
        return 2
    store = open_store(Settings.from_env(store=args.store).store_config())
    if catchup.processed(store, catchup.ASSET, hour):
        print(f"{args.hour} is already processed; launch a backfill of it from the UI to rebuild it", file=sys.stderr)
        return 1
    entries_ = catchup.hour_entries(store, catchup.ASSET, hour)
    n = sum(1 for k in entries_ if k.startswith("grant-")) + 1
    while not catchup.record(store, catchup.ASSET, hour, f".grant-{n}", "retry_granted", args.reason):
        n += 1
    print(f"granted {args.hour}.grant-{n}: the catch-up sensor retries the hour on its next tick")
    return 0


def entries(store: Any, pipelines: list[str], since: dt.date | None, until: dt.date | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for pipeline in pipelines:
        rows = list(ledger.read(store, pipeline, since, until))
        # Attempts are accepted by the sensor before a run exists; the run links itself (P.aN.run).
        started = {r["trigger_id"].removesuffix(".run"): r for r in rows if r["trigger_id"].endswith(".run")}
        for r in rows:
            if r["trigger_id"].endswith(".run"):
                continue
            if r.get("run_id") is None and r["trigger_id"] in started:
                r["run_id"] = started[r["trigger_id"]]["run_id"]
            out.append(r)
    return out


def cmd_ledger(args: argparse.Namespace) -> int:
    from freshidx.partitions import PartitionError

    selector: ledger.PartitionSelector | None = None
    if args.partition:
        try:
            selector = ledger.parse_partition(args.partition)
        except PartitionError as exc:
            # Exit 2 like any usage error: a silent empty answer would read as "nothing happened".
            print(f"freshidx ledger: --partition: {exc}", file=sys.stderr)
            return 2
    settings = Settings.from_env(store=args.store)
    store = open_store(settings.store_config())
    pipelines = list(PIPELINES) if args.pipeline == "all" else [args.pipeline]
    since, until = args.since, args.until
    if selector is not None and since is None and until is None:
        since = until = selector.date  # a partition's entries are keyed under its own date
    rows = entries(store, pipelines, since, until)
    if selector is not None:
        rows = [r for r in rows if selector.matches(r.get("partition"))]
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
        return 0
    for r in rows:
        subject = r.get("partition") or r.get("scope") or r["trigger_id"]
        run = f"  run {r['run_id'][:8]}" if r.get("run_id") else ""
        print(f"{r['at'][:19]}  {r['pipeline']:5}  {subject:45}  {r['decision']:18}{run}  {r['reason']}")
    if not rows and selector is not None:
        print(f"no ledger entry for {selector.path} ({', '.join(pipelines)}, {since or '…'} to {until or '…'})",
              file=sys.stderr)
    return 0
