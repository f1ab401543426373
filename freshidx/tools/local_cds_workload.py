"""``python -m freshidx.tools.local_cds_workload ARCHIVE DRIVER_MEMORY``: the child process of
:func:`freshidx.spark.local_cds.prepare`. Starts a local session whose JVM dumps the classes it loaded
to ARCHIVE when it exits, and runs what a freshidx run runs (a full build of two small generated
partitions, then an incremental delta over them), so the archive holds the classes of the real paths:
JSON parsing, the Python data source, Arrow hand-over to Python workers, Parquet, the shuffle."""

from __future__ import annotations

import datetime as dt
import sys
import tempfile
from pathlib import Path
from typing import Any

from freshidx.spark.local_cds import JAVA_OPTIONS


def main(argv: list[str]) -> int:
    archive, driver_memory = argv
    from freshidx.spark.session import LOCAL_DEFAULTS, build_local_session

    options = f"{LOCAL_DEFAULTS[JAVA_OPTIONS]} -XX:ArchiveClassesAtExit={archive} -Xlog:cds*=error"
    spark = build_local_session("local[2]", "freshidx-cds", {JAVA_OPTIONS: options,
                                                             "spark.driver.memory": driver_memory})
    print(f"JVM_PID {spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="freshidx-cds-") as tmp:
        _index_build(spark, Path(tmp))
    spark.stop()
    return 0  # the JVM dumps once this process exits and closes its gateway pipe


def _index_build(spark: Any, root: Path) -> None:
    from freshidx.delta import DeltaPlan, build_delta
    from freshidx.full import build_full
    from freshidx.partitions import PartitionId
    from freshidx.publish import publish
    from freshidx.settings import Settings
    from freshidx.store import StoreConfig, open_store
    from freshidx.tools.generate import write_partition
    from freshidx.tools.generator import GeneratorConfig

    config = StoreConfig(uri=(root / "store").as_uri())
    store = open_store(config)
    now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    first, second = PartitionId(now - dt.timedelta(minutes=10)), PartitionId(now - dt.timedelta(minutes=5))
    gen = GeneratorConfig(seed=1, ads=300, products=30, changes_per_partition=100)
    write_partition(store, gen, first)
    settings = Settings.from_env({}, store=config.uri)
    publish(store, build_full(spark, store, config, settings, cutoff=first, run_id="cds-full", run_info={}))
    write_partition(store, gen, second)
    build_delta(spark, store, config, settings,
                DeltaPlan(partition=second, watermark=None, run_id="cds-delta", run_info={}))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
