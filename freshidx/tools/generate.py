"""The upstream simulator: writes minute partitions of ad-change JSON lines into the object store,
live (one per clock minute) or on a simulated timeline, optionally after back-dated history; and
``freshidx generate``'s command. What a partition contains is :mod:`freshidx.tools.generator`.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from freshidx.procs import sigterm_as_interrupt
from freshidx.store.object_store import ObjectStore
from freshidx.store.partitions import PartitionId
from freshidx.tools.generator import (
    SOURCE_RE,
    VOCABULARY,
    GeneratorConfig,
    PartitionWritten,
    partition_base_version,
    partition_records,
    split_lines,
)
from freshidx.trigger.listing import newest_partition

# The generator's names that callers of the simulator use are re-exported here.
__all__ = [
    "SOURCE_RE",
    "VOCABULARY",
    "GeneratorConfig",
    "PartitionWritten",
    "cmd_generate",
    "generate",
    "history_partitions",
    "main",
    "partition_base_version",
    "partition_records",
    "split_lines",
    "write_partition",
]

_HISTORY_STEP = dt.timedelta(minutes=5)
_DEFAULT_STEP = dt.timedelta(minutes=5)


def write_partition(store: ObjectStore, cfg: GeneratorConfig, partition: PartitionId) -> PartitionWritten:
    """Write one partition, one atomic ``put`` per file (files of a burst appear one by one)."""
    lines, stats = partition_records(cfg, partition)
    chunks = split_lines(lines, len(stats.keys))
    assert len(chunks) == len(stats.keys)
    for key, chunk in zip(stats.keys, chunks, strict=True):
        store.put(key, ("\n".join(chunk) + "\n").encode("utf-8"))
    return stats


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------


def _floor(at: dt.datetime, step: dt.timedelta) -> dt.datetime:
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return at - (at - epoch) % step


def history_partitions(now: dt.datetime, history: dt.timedelta) -> list[PartitionId]:
    """Partitions every 5 minutes (aligned to :00, :05, …) strictly inside ``(now - history, now)``."""
    if history <= dt.timedelta(0):
        return []
    at = _floor(now - history, _HISTORY_STEP)
    out: list[PartitionId] = []
    while at < now:
        if at > now - history:
            out.append(PartitionId(at))
        at += _HISTORY_STEP
    return out


def generate(
    store: ObjectStore,
    cfg: GeneratorConfig,
    *,
    count: int | None,
    every_s: float,
    start: dt.datetime | None = None,
    step: dt.timedelta | None = None,
    history: dt.timedelta | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    on_written: Callable[[PartitionWritten], None] | None = None,
) -> list[PartitionWritten]:
    """Write ``count`` partitions (``None`` = forever), sleeping ``every_s`` between two of them.

    * ``history``: first, without sleeping, back-dated partitions every 5 minutes strictly inside
      ``(now - history, now)`` where ``now`` is the clock (live) or ``start`` (simulated). They are
      not counted in ``count``.
    * live (``start is None``): each partition is the clock's minute, or the newest written one (by this
      run or, in the store, by an earlier one) plus a minute when the clock has not moved past it (never
      two writes to one partition).
    * simulated: ``start``, ``start + step``, … (``step`` default 5 minutes, whole minutes); the clock
      is not read.

    ``on_written`` is called after each partition. Returns the partitions written; with
    ``count=None`` nothing is kept (the loop only ends by an exception), use ``on_written``.
    """
    first, step = _timeline(count, every_s, start, step, history)
    written: list[PartitionWritten] = []
    # Live: never again a partition already written, by this run or by one before it that ran ahead of the
    # clock (a partition more often than once a minute): a restart continues after it.
    last: PartitionId | None = newest_partition(store, cfg.source)[0] if first is None else None

    def emit(partition: PartitionId) -> None:
        nonlocal last
        result = write_partition(store, cfg, partition)
        last = partition if last is None or partition > last else last
        if count is not None:
            written.append(result)
        if on_written is not None:
            on_written(result)

    if history:
        # Live: before the clock's minute, which the first live write takes (else every later write
        # would be pushed a minute into the future by the "never twice" rule below).
        now = first.at if first is not None else _clock_minute(clock).at
        for partition in history_partitions(now, history):
            emit(partition)

    i = 0
    while count is None or i < count:
        if i:
            sleep(every_s)
        if first is not None:
            emit(PartitionId(first.at + i * step))
        else:
            partition = _clock_minute(clock)
            emit(partition if last is None or partition > last else PartitionId(last.at + dt.timedelta(minutes=1)))
        i += 1
    return written


def _timeline(count: int | None, every_s: float, start: dt.datetime | None, step: dt.timedelta | None,
              history: dt.timedelta | None) -> tuple[PartitionId | None, dt.timedelta]:
    """Check :func:`generate`'s arguments; return the simulated timeline's first partition (``None``:
    live) and its step."""
    if count is not None and (isinstance(count, bool) or count < 0):
        raise ValueError(f"count must be None or >= 0, got {count!r}")
    if not math.isfinite(every_s) or every_s < 0:
        raise ValueError(f"every_s must be >= 0, got {every_s!r}")
    if step is not None and start is None:
        raise ValueError("step is only meaningful with start (simulated timeline)")
    step = _DEFAULT_STEP if step is None else step
    if step <= dt.timedelta(0) or step % dt.timedelta(minutes=1):
        raise ValueError(f"step must be a positive whole number of minutes, got {step}")
    if history is not None and history < dt.timedelta(0):
        raise ValueError(f"history must be >= 0, got {history}")
    return (PartitionId.from_datetime(start) if start is not None else None), step


def _clock_minute(clock: Callable[[], float]) -> PartitionId:
    return PartitionId.from_datetime(dt.datetime.fromtimestamp(clock(), dt.UTC))


# ---------------------------------------------------------------------------------------------
# CLI: the options are declared in freshidx.cli.generate (``freshidx generate``); ``python -m
# freshidx.tools.generate [generate] [options]`` runs the same command.
# ---------------------------------------------------------------------------------------------


def _describe(result: PartitionWritten) -> str:
    files = len(result.keys)
    return (
        f"wrote {result.keys[0].rsplit('/', 1)[0]}/ ({files} file{'s' if files != 1 else ''}): "
        f"{result.records} lines, {result.valid} valid, {result.malformed} malformed, "
        f"{result.duplicates} duplicates, {result.deletes} deletes{', burst' if result.burst else ''}"
    )


def cmd_generate(*, store: str | None, source: str | None, every: float, count: int | None, seed: int,
                 history_minutes: int, start: dt.datetime | None, step_minutes: int | None, changes: int | None,
                 as_json: bool) -> int:
    """Run the simulator with the options of ``freshidx generate``. Returns the exit code (Ctrl-C or
    SIGTERM: a clean exit 0)."""
    from freshidx.settings import Settings, SettingsError
    from freshidx.store import open_store

    def fail(message: str) -> int:
        print(f"freshidx generate: error: {message}", file=sys.stderr)
        return 2

    if step_minutes is not None and start is None:
        return fail("--step-minutes needs --start (it sets the simulated timeline)")
    try:
        settings = Settings.from_env(store=store, source=source)
    except SettingsError as exc:
        return fail(str(exc))
    overrides: dict[str, Any] = {"source": settings.source, "seed": seed}
    if changes is not None:
        overrides["changes_per_partition"] = changes
    try:
        cfg = GeneratorConfig(**overrides)
    except ValueError as exc:
        return fail(str(exc))
    st = open_store(settings.store_config())

    def report(result: PartitionWritten) -> None:
        if as_json:
            print(json.dumps(result.to_json(), sort_keys=True), flush=True)
        else:
            print(_describe(result), flush=True)

    if not as_json:
        print(f"generating into {st.uri} (source {cfg.source}, seed {cfg.seed})", flush=True)
    try:
        with sigterm_as_interrupt():
            generate(
                st, cfg,
                count=count,
                every_s=every,
                start=start,
                step=dt.timedelta(minutes=step_minutes) if step_minutes is not None else None,
                history=dt.timedelta(minutes=history_minutes) if history_minutes else None,
                on_written=report,
            )
    except KeyboardInterrupt:
        print("freshidx generate: interrupted, stopping", file=sys.stderr, flush=True)
        return 0
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m freshidx.tools.generate [generate] [options]``."""
    from freshidx.cli.base import run
    from freshidx.cli.generate import generate as command

    args = list(sys.argv[1:] if argv is None else argv)
    return run(command, args[1:] if args[:1] == ["generate"] else args, "python -m freshidx.tools.generate")


if __name__ == "__main__":
    sys.exit(main())
