"""The ``freshidx`` command: every sub-command, in the order ``freshidx --help`` lists them."""

from __future__ import annotations

from freshidx.cli.base import LazyGroup
from freshidx.cli.bench import bench_group
from freshidx.cli.demo import demo
from freshidx.cli.generate import generate
from freshidx.cli.ledger import ledger_group
from freshidx.cli.quarantine import quarantine_group
from freshidx.cli.retention import gc, rollback
from freshidx.cli.search import search
from freshidx.cli.spark_cds import spark_cds
from freshidx.cli.spark_server import spark_server
from freshidx.cli.status import status

freshidx = LazyGroup(
    "freshidx",
    [generate, status, demo, ledger_group, quarantine_group, spark_server, spark_cds, search, rollback, gc,
     bench_group],
    help="freshidx command line. Every command takes --store, and --json where it prints.",
)
