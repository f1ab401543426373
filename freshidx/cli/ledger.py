"""``freshidx ledger``: why did this run happen, why was this partition not processed; ``ledger retry``."""

from __future__ import annotations

import datetime as dt
import json
import sys
from typing import TYPE_CHECKING, Any

import click

from freshidx.cli.base import LazyCommand, LazyGroup, Parsed, json_option, open_command_store, store_option

if TYPE_CHECKING:
    from freshidx.store import ObjectStore

PIPELINES = ("delta", "full", "sla", "ads_hourly", "delta_compaction")


def _open(store: str | None, *, reads_only: bool) -> ObjectStore:
    return open_command_store(store, reads_only=reads_only)[1]


def cmd_retry(*, store: str | None, pipeline: str, partition: str | None, hour: str | None, reason: str) -> int:
    from freshidx.store.partitions import PartitionError
    from freshidx.trigger import ledger

    if pipeline == "ads_hourly":
        return _retry_hour(store, hour, reason)
    if not partition:
        print("freshidx ledger retry: --partition is required for --pipeline delta", file=sys.stderr)
        return 2
    try:
        minute = ledger.parse_partition(partition).minute()
    except PartitionError as exc:
        print(f"freshidx ledger retry: --partition: {exc}", file=sys.stderr)
        return 2
    st = _open(store, reads_only=False)
    final = ledger.decision(st, pipeline, minute)
    if final is not None:
        print(f"{minute.path} already has a final decision: {final.decision} ({final.reason})",
              file=sys.stderr)
        return 1
    grant = ledger.grant_retry(st, pipeline, minute, reason)
    print(f"granted {grant}: the sensor requests a new attempt on its next tick if {minute.path} "
          "is still the newest partition")
    return 0


def _retry_hour(store: str | None, hour_id: str | None, reason: str) -> int:
    from freshidx.catchup import planner
    from freshidx.trigger.lifecycle import Decision, Mark, attempt_state

    try:
        hour = planner.parse_hour_id(hour_id or "")
    except ValueError:
        print(f"freshidx ledger retry: --hour: expected YYYYMMDDTHH, got {hour_id!r}", file=sys.stderr)
        return 2
    st = _open(store, reads_only=False)
    if planner.processed(st, planner.ASSET, hour):
        print(f"{hour_id} is already processed; launch a backfill of it from the UI to rebuild it", file=sys.stderr)
        return 1
    trigger = planner.trigger(hour)
    n = attempt_state(planner.hour_entries(st, planner.ASSET, hour), trigger.base).grants + 1
    while not planner.record(st, planner.ASSET, hour, trigger.then(Mark.GRANT, n), Decision.RETRY_GRANTED, reason):
        n += 1
    print(f"granted {trigger.then(Mark.GRANT, n)}: the catch-up sensor retries the hour on its next tick")
    return 0


def entries(store: ObjectStore, pipelines: list[str], since: dt.date | None,
            until: dt.date | None) -> list[dict[str, Any]]:
    from freshidx.trigger import ledger
    from freshidx.trigger.lifecycle import started_claim

    out: list[dict[str, Any]] = []
    for pipeline in pipelines:
        rows = [dict(e) for e in ledger.read(store, pipeline, since, until)]  # as stored (its format too)
        # Attempts are accepted by the sensor before a run exists; the run links itself (P.aN.run).
        started = {claim: r for r in rows if (claim := started_claim(r["trigger_id"])) is not None}
        for r in rows:
            if started_claim(r["trigger_id"]) is not None:
                continue
            if r.get("run_id") is None and r["trigger_id"] in started:
                r["run_id"] = started[r["trigger_id"]]["run_id"]
            out.append(r)
    return out


def cmd_ledger(*, store: str | None, pipeline: str, since: dt.date | None, until: dt.date | None,
               partition: str | None, as_json: bool) -> int:
    from freshidx.store.partitions import PartitionError
    from freshidx.trigger import ledger

    selector: ledger.PartitionSelector | None = None
    if partition:
        try:
            selector = ledger.parse_partition(partition)
        except PartitionError as exc:
            # Exit 2 like any usage error: a silent empty answer would read as "nothing happened".
            print(f"freshidx ledger: --partition: {exc}", file=sys.stderr)
            return 2
    st = _open(store, reads_only=True)
    pipelines = list(PIPELINES) if pipeline == "all" else [pipeline]
    if selector is not None and since is None and until is None:
        since = until = selector.date  # a partition's entries are keyed under its own date
    rows = entries(st, pipelines, since, until)
    if selector is not None:
        rows = [r for r in rows if selector.matches(r.get("partition"))]
    if as_json:
        print(json.dumps(rows, indent=1, default=str))
        return 0
    width = max((len(r["pipeline"]) for r in rows), default=5)
    for r in rows:
        subject = r.get("partition") or r.get("scope") or r["trigger_id"]
        run = f"  run {r['run_id'][:8]}" if r.get("run_id") else ""
        print(f"{r['at'][:19]}  {r['pipeline']:{width}}  {subject:45}  {r['decision']:18}{run}  {r['reason']}")
    if not rows and selector is not None:
        print(f"no ledger entry for {selector.path} ({', '.join(pipelines)}, {since or '…'} to {until or '…'})",
              file=sys.stderr)
    return 0


DATE = Parsed("DATE", dt.date.fromisoformat)

retry = LazyCommand(
    "retry", cmd_retry,
    store_option("store URI"),
    click.Option(["--pipeline"], type=click.Choice(("delta", "ads_hourly")), default="delta"),
    click.Option(["--partition"], help="delta: partition 20261124T0148 or year=…/minute=mm"),
    click.Option(["--hour"], help="ads_hourly: hour id YYYYMMDDTHH (UTC), e.g. 20261121T14"),
    click.Option(["--reason"], default="operator retry"),
    help="grant one more attempt to a failed or parked partition",
)

ledger_group = LazyGroup(
    "ledger", [retry],
    store_option(),
    click.Option(["--pipeline"], type=click.Choice((*PIPELINES, "all")), default="all"),
    click.Option(["--since"], type=DATE, help="first date (YYYY-MM-DD, UTC)"),
    click.Option(["--until"], type=DATE, help="last date (YYYY-MM-DD, UTC)"),
    click.Option(["--partition"], help="only entries of this partition: 20261124T0148, "
                 "year=2026/month=11/day=24/hour=01/minute=48, or an hour (2026-11-24-01:00, 20261124T01, "
                 "year=…/hour=01) for every partition of it; reads only that date unless --since/--until"),
    json_option("a JSON list of entries"),
    target=cmd_ledger,
    help="trigger decisions: processed, superseded, refused, remediation",
)
