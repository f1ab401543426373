"""``freshidx status``: what is serving, how fresh, what was skipped (data: :mod:`freshidx.serve.status`)."""

from __future__ import annotations

import json

import click

from freshidx.cli.base import LazyCommand, json_option, open_command_store, store_option


def cmd_status(*, store: str | None, as_json: bool, spark_server_state: str | None) -> int:
    from freshidx.serve.status import collect, locate_spark_server_state, render

    settings, st = open_command_store(store, reads_only=True)
    # The state must belong to this store: a CWD-relative default described some other demo's server.
    where = locate_spark_server_state(st, spark_server_state, settings.spark_server_state,
                                      configured_url=settings.spark_server_url)
    s = collect(st, settings.source, spark_server_state=where.state_dir, spark_server_found_by=where.found_by)
    print(json.dumps(s, indent=1, default=str) if as_json else render(s))
    return 0


status = LazyCommand(
    "status", cmd_status,
    store_option(),
    json_option("one JSON object"),
    click.Option(["--spark-server-state"], metavar="DIR|URL",
                 help="state dir, or control endpoint http://host:port, of the Spark Connect server serving this "
                 "store (default: FRESHIDX_SPARK_SERVER_URL, else FRESHIDX_SPARK_SERVER_STATE, else the demo's own, "
                 "found from the store)"),
    help="what is serving, how fresh, what was skipped",
)
