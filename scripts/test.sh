#!/usr/bin/env bash
# One command: set up (venv, packages, Java check), lint, and run the whole test suite.
# Tests start their own servers (moto S3, dagster dev) on free loopback ports.
#   bash scripts/test.sh            the full suite on Python 3.11 (requirements.lock) and the version lanes
#                                   (scripts/python_lanes.sh: Python 3.12 with the lowest pyspark/pyarrow/tantivy,
#                                   Python 3.13 beside the lowest dagster; beside the main suite, at low
#                                   priority): what CI runs
#   bash scripts/test.sh --fast     the fast lane: every test that starts no JVM and no dagster dev
# Other arguments are passed to pytest (and leave the version lanes out).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
.venv/bin/ruff check freshidx freshidx_tests
.venv/bin/lint-imports
if [[ "${1:-}" == "--fast" ]]; then
    shift
    exec .venv/bin/python -m pytest -n 2 -m "not slow" --durations=10 freshidx_tests "$@"
fi
# The class archive the suite's ~13 local Spark JVMs map (none in the fast lane): ~8 CPU-s less each
# on 2 cores (freshidx.spark_server.local_cds). Made once per JDK and Spark install (~60 s), then a no-op.
# Not in bootstrap.sh: the demo's default runs use a Connect server, which has its own archive.
.venv/bin/freshidx spark-cds >&2 || echo "could not prepare the class archive for local Spark (it starts without one)" >&2
# Four workers on the 2-core box, one test file each at a time, longest files first
# (conftest.MODULE_SECONDS). The cores are busy ~100% of the run (JVMs, dagster dev, Dagster runs);
# a fourth worker still overlaps the waits of start-ups and sensor ticks (four were faster than three
# in clean clones with the deployment tests; the figures: docs/benchmarks.md).
rc=0
lanes_pid=""
if [[ $# -eq 0 ]]; then
    # The version lanes run beside the main suite at low priority: their virtualenvs (downloads, a pyspark
    # wheel built once), then their tests, on the CPU the main suite leaves (most of it near its end, when
    # only its last tests remain). Their output is shown after the main suite's.
    mkdir -p .lanes
    ( nice -n 15 bash scripts/python_lanes.sh --prepare > .lanes/prepare.log 2>&1 || exit 3
      nice -n 15 bash scripts/python_lanes.sh --prepared > .lanes/run.log 2>&1 ) &
    lanes_pid=$!
fi
.venv/bin/python -m pytest -n 4 --dist loadfile --no-loadscope-reorder --durations=25 freshidx_tests "$@" || rc=$?
if [[ -n "$lanes_pid" ]]; then
    lanes_rc=0
    wait "$lanes_pid" || lanes_rc=$?
    cat .lanes/prepare.log >&2
    if [[ $lanes_rc -eq 3 ]]; then
        echo "making the version lanes' virtualenvs failed (.lanes/prepare.log); making them again" >&2
        bash scripts/python_lanes.sh --prepared || rc=1
    else
        cat .lanes/run.log >&2
        [[ $lanes_rc -eq 0 ]] || rc=1
    fi
fi
exit $rc
