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
    p.set_defaults(func=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    from freshidx.status import collect, render
    from freshidx.store import open_store

    settings = Settings.from_env(store=args.store)
    s = collect(open_store(settings.store_config()), settings.source,
                spark_server_state=settings.spark_server_state or _default_server_state())
    print(json.dumps(s, indent=1, default=str) if args.json else render(s))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from freshidx import demo, generate, ledger_cli

    parser = argparse.ArgumentParser(prog="freshidx", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    generate.add_parser(sub)
    _status_parser(sub)
    demo.add_parser(sub)
    ledger_cli.add_parser(sub)
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


def _default_server_state() -> str | None:
    import os

    path = os.path.join(os.getcwd(), ".freshidx", "spark-server")
    return path if os.path.isdir(path) else None
