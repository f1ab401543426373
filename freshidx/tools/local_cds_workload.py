"""``python -m freshidx.tools.local_cds_workload ARCHIVE DRIVER_MEMORY``: the child process of
:func:`freshidx.spark_server.local_cds.prepare`. Starts a local session whose JVM dumps the classes it loaded
to ARCHIVE when it exits, after the JVM side of a build on a small generated partition: the raw read
(Arrow batches from Python tasks), JSON parsing and validation, the latest-per-ad shuffle, a Parquet
write and read. Not a whole index build: its Python work (tantivy) loads no JVM classes, and the
archive of the JVM side alone started sessions at least as fast on the 2-core box (start + first job
9–10 CPU-s against 11–13 with a whole full + delta build's archive, which took 72 CPU-s to make
against 67)."""

from __future__ import annotations

import datetime as dt
import sys
import tempfile
from pathlib import Path
from typing import Any

from freshidx.spark.local_archive import JAVA_OPTIONS


def main(argv: list[str]) -> int:
    archive, driver_memory = argv
    from freshidx.spark.session import LOCAL_DEFAULTS, build_local_session

    options = f"{LOCAL_DEFAULTS[JAVA_OPTIONS]} -XX:ArchiveClassesAtExit={archive} -Xlog:cds*=error"
    spark = build_local_session("local[2]", "freshidx-cds", {JAVA_OPTIONS: options,
                                                             "spark.driver.memory": driver_memory})
    print(f"JVM_PID {spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="freshidx-cds-") as tmp:
        _jvm_side_of_a_build(spark, Path(tmp))
    spark.stop()
    return 0  # the JVM dumps once this process exits and closes its gateway pipe


def _jvm_side_of_a_build(spark: Any, root: Path) -> None:
    from freshidx.spark import transform
    from freshidx.spark.raw_source import read_raw_lines
    from freshidx.store import StoreConfig, open_store
    from freshidx.store.partitions import PartitionId
    from freshidx.tools.generate import write_partition
    from freshidx.tools.generator import GeneratorConfig

    config = StoreConfig(uri=(root / "store").as_uri())
    partition = PartitionId(dt.datetime.now(dt.UTC).replace(second=0, microsecond=0) - dt.timedelta(minutes=5))
    written = write_partition(open_store(config), GeneratorConfig(seed=1, ads=300, products=30), partition)
    files = [(key, partition.path) for key in written.keys]
    parsed = transform.parse_records(read_raw_lines(spark, config, files)).localCheckpoint(eager=True)
    valid, invalid = transform.split_valid(parsed)
    invalid.groupBy("reason").count().collect()
    latest = transform.latest_per_ad(valid).select(*transform.TYPED_FIELDS)
    latest.write.parquet(str(root / "latest.parquet"))
    spark.read.parquet(str(root / "latest.parquet")).groupBy("product_id").count().collect()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
