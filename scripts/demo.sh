#!/usr/bin/env bash
# One command: set up (venv, packages, Java check) and run the main job on the embedded default:
# local object store under ./.freshidx, a supervised Spark Connect server (--spark local: a SparkSession
# per run), a Dagster code server, UI (http://127.0.0.1:3000) and daemon; the demo restarts any of them that exits.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
# The class archive every Spark JVM of the demo maps (~45-60 s once per install; then a no-op, 0.4 s).
.venv/bin/freshidx spark-cds >&2 || echo "could not prepare the class archive for Spark (JVMs start without one)" >&2
exec .venv/bin/freshidx demo "$@"
