"""``freshidx`` command line. Every command takes ``--store``, and ``--json`` where it prints."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from freshidx.settings import Settings, SettingsError


def _status_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("status", help="what is serving, how fresh, what was skipped")
    p.add_argument("--store", help="store URI (default: FRESHIDX_STORE or ./.freshidx/store)")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.add_argument("--spark-server-state", metavar="DIR",
                   help="state dir of the Spark Connect server serving this store (default: "
                   "FRESHIDX_SPARK_SERVER_STATE, else the demo's own, found from the store)")
    p.set_defaults(func=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    from freshidx.status import collect, locate_spark_server_state, render
    from freshidx.store import open_store

    settings = Settings.from_env(store=args.store)
    store = open_store(settings.store_config())
    # The state must belong to this store: a CWD-relative default described some other demo's server.
    where = locate_spark_server_state(store, args.spark_server_state, settings.spark_server_state)
    s = collect(store, settings.source, spark_server_state=where.state_dir, spark_server_found_by=where.found_by)
    print(json.dumps(s, indent=1, default=str) if args.json else render(s))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from freshidx import demo, generate, ledger_cli, quarantine_cli

    parser = argparse.ArgumentParser(prog="freshidx", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    generate.add_parser(sub)
    _status_parser(sub)
    demo.add_parser(sub)
    ledger_cli.add_parser(sub)
    quarantine_cli.add_parser(sub)
    from freshidx import bench, retention, serving
    from freshidx.spark import server

    server.add_parser(sub)
    serving.add_search_parser(sub)
    retention.add_rollback_parser(sub)
    retention.add_gc_parser(sub)
    bench.add_bench_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except SettingsError as exc:
        print(f"freshidx: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

