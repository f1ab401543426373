"""``freshidx demo``: the demo's options (the demo: :mod:`freshidx.tools.demo`)."""

from __future__ import annotations

import click

from freshidx.cli.base import LazyCommand, json_option, store_option

DEFAULT_HOME = ".freshidx"  # freshidx.settings.DEFAULT_HOME

demo = LazyCommand(
    "demo", "freshidx.tools.demo:cmd_demo",
    store_option("store URI (default: FRESHIDX_STORE, else <home>/store)"),
    click.Option(["--home"], default=DEFAULT_HOME,
                 help="working directory for the store (unless --store/FRESHIDX_STORE), instance and logs "
                 "(default ./.freshidx)"),
    click.Option(["--port"], type=int, default=3000, help="UI port on 127.0.0.1 (default 3000)"),
    click.Option(["--every"], type=float, default=60.0, help="seconds between upstream partitions"),
    click.Option(["--history-minutes"], type=int, default=120, help="back-dated history to seed"),
    click.Option(["--duration"], type=float, default=None, help="stop after this many seconds"),
    click.Option(["--seed"], type=int, default=0),
    json_option("print events as JSON lines"),
    click.Option(["--spark"], type=click.Choice(("connect", "local")), default="connect",
                 help="connect (default): a supervised Spark Connect server shared by all runs; "
                 "local: a SparkSession per run (~8-20 s start-up each)"),
    click.Option(["--spark-port"], type=int, default=15002, help="Spark Connect port on 127.0.0.1"),
    help="run the generator, a Spark server, a Dagster code server, UI and daemon on a local store, each "
         "restarted when it exits",
)
