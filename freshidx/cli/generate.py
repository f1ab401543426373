"""``freshidx generate``: the upstream simulator's options (the simulator: :mod:`freshidx.tools.generate`)."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable

import click

from freshidx.cli.base import LazyCommand, Parsed, json_option, store_option

CHANGES_PER_PARTITION = 200  # freshidx.tools.generator.GeneratorConfig.changes_per_partition


def store_uri(value: str) -> str:
    from freshidx.store import StoreConfig, normalize_uri

    uri = normalize_uri(value)
    StoreConfig(uri=uri)  # ValueError: a usage error naming --store
    return uri


def source_name(value: str) -> str:
    from freshidx.tools.generator import SOURCE_RE

    if not SOURCE_RE.match(value):
        raise ValueError(f"must match {SOURCE_RE.pattern}, got {value!r}")
    return value


def int_at_least(lo: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise ValueError(f"not an integer: {value!r}") from None
        if number < lo:
            raise ValueError(f"must be >= {lo}, got {number}")
        return number

    return parse


def seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"not a number of seconds: {value!r}") from None
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"must be a finite number >= 0, got {value!r}")
    return number


def utc_time(value: str) -> dt.datetime:
    try:
        at = dt.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"not an ISO-8601 time: {value!r} (e.g. 2026-11-21T14:05Z)") from None
    if at.tzinfo is None:
        raise ValueError(f"{value!r} has no timezone; partition times are UTC, say so (e.g. 2026-11-21T14:05Z)")
    return at


COUNT = Parsed("N", int_at_least(0))
MINUTES = Parsed("M", int_at_least(0))

generate = LazyCommand(
    "generate", "freshidx.tools.generate:cmd_generate",
    store_option("file:///abs/path or s3://bucket/prefix (default: $FRESHIDX_STORE, else ./.freshidx/store)",
                 type=Parsed("URI", store_uri), metavar="URI"),
    click.Option(["--source"], type=Parsed("SOURCE", source_name), default=None,
                 help="raw source name (default: $FRESHIDX_SOURCE, else ad_updates)"),
    click.Option(["--every"], type=Parsed("SECONDS", seconds), default=300.0, metavar="SECONDS",
                 help="seconds between two partitions (default 300)"),
    click.Option(["--count"], type=COUNT, default=None, metavar="N",
                 help="partitions to write, not counting --history-minutes (default: run until Ctrl-C)"),
    click.Option(["--seed"], type=Parsed("N", int_at_least(-(2**63))), default=0, metavar="N",
                 help="random seed (default 0)"),
    click.Option(["--history-minutes"], type=MINUTES, default=0, metavar="M",
                 help="first back-fill partitions every 5 minutes over the last M minutes (default 0)"),
    click.Option(["--start"], type=Parsed("ISO", utc_time), default=None, metavar="ISO",
                 help="simulated timeline: first partition time, e.g. 2026-11-21T14:05Z (default: wall clock)"),
    click.Option(["--step-minutes"], type=Parsed("M", int_at_least(1)), default=None, metavar="M",
                 help="simulated timeline: minutes between partitions (default 5; needs --start)"),
    click.Option(["--changes"], type=Parsed("N", int_at_least(1)), default=None, metavar="N",
                 help=f"changes per partition before bursts (default {CHANGES_PER_PARTITION})"),
    json_option("print one JSON object per partition written"),
    short_help="simulate the upstream: write raw partitions of ad changes",
    help="Write minute partitions of ad-change JSON lines to raw/<source>/year=/month=/day=/hour=/"
    "minute=/part-*.jsonl, with malformed lines, duplicates, deletes and bursts.",
)
