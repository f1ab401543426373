"""``freshidx spark-cds``: prepare the class archive Spark JVMs map (:mod:`freshidx.spark_server.local_cds` makes it,
local sessions map it through :mod:`freshidx.spark.local_archive`)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from freshidx.cli.base import LazyCommand, json_option


def cmd_spark_cds(*, directory: Path | None, driver_memory: str, force: bool, as_json: bool) -> int:
    from freshidx.spark_server.local_cds import prepare

    done = prepare(directory, driver_memory, force=force)
    if as_json:
        print(json.dumps(done.as_dict()))
    elif done.status in ("exists", "written"):
        print(f"class archive {done.status}: {done.archive}" + (f" ({done.seconds} s)" if done.seconds else ""))
    else:
        print(f"no class archive ({done.status})" + (f": {done.error}" if done.error else ""))
    # Sharing is an optimisation: local sessions work without it, so only a failed dump is an error.
    return 1 if done.status == "failed" else 0


spark_cds = LazyCommand(
    "spark-cds", cmd_spark_cds,
    click.Option(["--dir", "directory"], type=click.Path(path_type=Path), default=None,
                 help="archive directory (default FRESHIDX_SPARK_CDS_DIR, else ~/.cache/freshidx/cds)"),
    click.Option(["--driver-memory"], default="1g", show_default=True,
                 help="the heap it is made with (JVMs with any heap under 32 GiB map the 1g one)"),
    click.Option(["--force"], is_flag=True, help="make it again even if it exists"),
    json_option("one JSON object"),
    short_help="prepare the class archive that Spark JVMs map (faster start)",
    help="Run the JVM side of a small build in a throw-away local Spark JVM and keep the classes it loaded "
    "as an AppCDS archive: every later local session (Dagster runs, CLI, tests) maps it and starts faster, "
    "and so does a `freshidx spark-server` that has no archive of its own. "
    "Idempotent: a no-op when the archive for this JDK, Spark and heap size exists.",
)
