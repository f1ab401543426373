"""``freshidx status``: what is serving, how fresh, what was skipped (data: :mod:`freshidx.status`)."""

from __future__ import annotations

import json

import click

from freshidx.cli.base import LazyCommand, json_option, store_option


def cmd_status(*, store: str | None, as_json: bool, spark_server_state: str | None) -> int:
    from freshidx.settings import Settings
    from freshidx.status import collect, locate_spark_server_state, render
    from freshidx.store import open_store

    settings = Settings.from_env(store=store)
    st = open_store(settings.store_config())
    # The state must belong to this store: a CWD-relative default described some other demo's server.
    where = locate_spark_server_state(st, spark_server_state, settings.spark_server_state)
    s = collect(st, settings.source, spark_server_state=where.state_dir, spark_server_found_by=where.found_by,
                delta_mode=settings.delta_mode)
    print(json.dumps(s, indent=1, default=str) if as_json else render(s))
    return 0


status = LazyCommand(
    "status", cmd_status,
    store_option(),
    json_option("one JSON object"),
    click.Option(["--spark-server-state"], metavar="DIR",
                 help="state dir of the Spark Connect server serving this store (default: "
                 "FRESHIDX_SPARK_SERVER_STATE, else the demo's own, found from the store)"),
    help="what is serving, how fresh, what was skipped",
)
