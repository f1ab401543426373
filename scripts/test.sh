#!/usr/bin/env bash
# One command: set up (venv, packages, Java check), lint, and run the whole test suite.
# Tests start their own servers (moto S3, dagster dev) on free loopback ports.
#   bash scripts/test.sh            the full suite (what CI runs)
#   bash scripts/test.sh --fast     the fast lane: every test that starts no JVM and no dagster dev
# Other arguments are passed to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
.venv/bin/ruff check freshidx freshidx_tests
if [[ "${1:-}" == "--fast" ]]; then
    shift
    exec .venv/bin/python -m pytest -n 2 -m "not slow" --durations=10 freshidx_tests "$@"
fi
# Four workers on the 2-core box, one test file each at a time, longest files first
# (conftest.MODULE_SECONDS): much of the suite waits on JVMs, dagster dev and sensor ticks. With the
# deployment tests (cluster, PostgreSQL, browser) in the suite, four workers took 1074 s on a quiet box
# (~11.6 GiB used at peak); three without them 789 s the same day (the deployment modules alone: 343 s).
exec .venv/bin/python -m pytest -n 3 --dist loadfile --no-loadscope-reorder --durations=25 freshidx_tests "$@"
