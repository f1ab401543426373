#!/usr/bin/env bash
# The supported versions beyond the main suite's (Python 3.11 on requirements.lock), each in a virtualenv made
# afresh under .lanes/ (scripts/test.sh runs this beside the main suite; `--fast` runs only the fast lane part):
#   py3.12-lowest   Python 3.12 with the lowest pyspark, pyarrow, tantivy and pandas that pyproject.toml
#                   declares (scripts/lanes/lowest.txt): the fast lane, then pyspark 4.0 in local mode and
#                   through Spark Connect (server and client of that minor) publishing micro-batches.
#   py3.13-dagster  `pip install .` into a Python 3.13 virtualenv that already holds the lowest dagster
#                   pyproject.toml declares (scripts/lanes/lowest-dagster.txt): that dagster stays and
#                   freshidx.definitions imports; then the newest releases the other ranges allow: the fast lane.
# A Python that cannot be found is an error under CI=true and a skipped lane (with a line saying so) elsewhere.
#   bash scripts/python_lanes.sh [--fast] [LANE ...]   --fast: the lanes' fast-lane tests only; LANE: run only these
#   bash scripts/python_lanes.sh --prepare              only make the virtualenvs (scripts/test.sh runs this in the
#                                                       background during the main suite: mostly downloads)
#   bash scripts/python_lanes.sh --prepared [...]       the tests, in virtualenvs --prepare made (made now if not)
set -euo pipefail
cd "$(dirname "$0")/.."
# Test servers' ports from above the kernel's ephemeral range: the main suite may be running beside the
# lanes, picking from below it (freshidx_tests/conftest.py free_port).
export FRESHIDX_TEST_PORTS=high
FAST_ONLY=""
PHASE=all  # all | prepare | prepared
while [[ "${1:-}" == --* ]]; do
  case $1 in
    --fast) FAST_ONLY=--fast ;;
    --prepare) PHASE=prepare ;;
    --prepared) PHASE=prepared ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
LANES=("$@")
[[ ${#LANES[@]} -eq 0 ]] && LANES=(py3.12-lowest py3.13-dagster)

WHEELS="${XDG_CACHE_HOME:-$HOME/.cache}/freshidx/wheels"
LANE_WHEELS="${XDG_CACHE_HOME:-$HOME/.cache}/freshidx/lane-wheels"
# Slow tests the lowest lane runs besides the fast lane: a micro-batch published through a Spark Connect server
# of the lane's pyspark (kill -9 at every step), kept sessions on it, and local-mode builds published.
LOWEST_SLOW_TESTS=(freshidx_tests/delta/test_micro_batch_crash.py freshidx_tests/spark_server/test_kept_session.py
                   freshidx_tests/full/test_full_from_state.py freshidx_tests/spark/test_spark_resource.py)

find_python() {  # find_python 3.12 -> the path of a CPython 3.12, or nothing
  local v=$1 c
  for c in "python$v" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/"python$v" /usr/bin/"python$v" \
           /usr/local/bin/"python$v"; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$v'.split('.'))))" 2>/dev/null; then
      command -v "$c"; return 0
    fi
  done
  return 1
}

# pyspark is published as a source distribution only (~450 MB of jars): each version's wheel is built once.
pyspark_wheel() {  # pyspark_wheel 4.0.0
  local v=$1 build
  if [ ! -f "$LANE_WHEELS/pyspark-$v-py2.py3-none-any.whl" ]; then
    mkdir -p "$LANE_WHEELS"
    build=$(mktemp -d "$LANE_WHEELS/.build.XXXXXX")
    echo "building the pyspark $v wheel once into $LANE_WHEELS …" >&2
    .venv/bin/python -m pip wheel -q --no-deps --no-cache-dir "pyspark==$v" -w "$build" >&2
    mv "$build"/pyspark-*.whl "$LANE_WHEELS"/
    rm -rf "$build"
  fi
}

prepared() {  # prepared NAME: with --prepared, whether --prepare made this lane's virtualenv
  [ "$PHASE" = prepared ] && [ -f ".lanes/$1/.prepared" ]
}

new_venv() {  # new_venv NAME PYTHON -> .lanes/NAME, empty
  rm -rf ".lanes/$1"
  mkdir -p .lanes
  "$2" -m venv ".lanes/$1"
  ".lanes/$1/bin/python" -m pip install -q --upgrade pip >&2
}

missing_python() {
  if [ "${CI:-}" = "true" ]; then
    echo "lane $1: no Python $2 found (python$2 on PATH or under pyenv)" >&2; return 1
  fi
  echo "lane $1: skipped, no Python $2 found (python$2 on PATH or under pyenv; CI requires it)" >&2
}

fast_lane() {  # fast_lane VENV [pytest args]: the tests that start no JVM and no dagster dev
  local venv=$1; shift
  # The simulator's 10,000 schedules are pure Python over an in-memory store: the main suite runs them; a
  # lane runs its determinism and planted-bug tests.
  PYSPARK_PYTHON="$PWD/$venv/bin/python" "$venv/bin/python" -m pytest -p no:cacheprovider -n 2 -m "not slow" \
    -q freshidx_tests --deselect "freshidx_tests/tools/test_simulation.py::test_schedules_hold_every_invariant" "$@"
}

lane_lowest() {
  local py name=py3.12-lowest venv=.lanes/py3.12-lowest spark
  py=$(find_python 3.12) || { missing_python "$name" 3.12; return; }
  spark=$(sed -n 's/^pyspark\[connect\]==\([0-9.]*\).*/\1/p' scripts/lanes/lowest.txt)
  echo "== lane $name: $py, $(grep -v '^#' scripts/lanes/lowest.txt | tr '\n' ' ')" >&2
  if ! prepared "$name"; then
    pyspark_wheel "$spark"
    new_venv "$name" "$py"
    .venv/bin/uv pip install -q --python "$venv/bin/python" --find-links "$LANE_WHEELS" \
      -r scripts/lanes/lowest.txt -e '.[test]' > "$venv/install.log" 2>&1 \
      || { tail -30 "$venv/install.log" >&2; return 1; }
    touch "$venv/.prepared"
  fi
  [ "$PHASE" = prepare ] && return
  "$venv/bin/python" -c "import pyspark, pyarrow; print('lane $name: pyspark', pyspark.__version__, 'pyarrow', pyarrow.__version__)"
  fast_lane "$venv"
  [ "$FAST_ONLY" = "--fast" ] && return
  # Local Spark JVMs of this pyspark map no class archive (the one under ~/.cache is the main suite's Spark's).
  FRESHIDX_SPARK_CDS_DIR=off PYSPARK_PYTHON="$PWD/$venv/bin/python" "$venv/bin/python" -m pytest -p no:cacheprovider \
    -n 2 --dist loadfile -q "${LOWEST_SLOW_TESTS[@]}"
}

lane_dagster() {
  local py name=py3.13-dagster venv=.lanes/py3.13-dagster want got
  py=$(find_python 3.13) || { missing_python "$name" 3.13; return; }
  want=$(sed -n 's/^dagster==\([0-9.]*\).*/\1/p' scripts/lanes/lowest-dagster.txt)
  echo "== lane $name: $py, dagster $want already installed, then pip install ." >&2
  if prepared "$name"; then
    [ "$PHASE" = prepare ] || { cat "$venv/.prepared"; fast_lane "$venv"; }
    return
  fi
  new_venv "$name" "$py"
  {
    .venv/bin/uv pip install --python "$venv/bin/python" --find-links "$WHEELS" -r scripts/lanes/lowest-dagster.txt \
      && "$venv/bin/python" -m pip install --find-links "$WHEELS" . \
      && got=$("$venv/bin/python" -c "import dagster; print(dagster.__version__)") \
      && [ "$got" = "$want" ] \
      && (cd "$venv" && bin/python -c "import freshidx.definitions as d; assert d.defs is not None") \
      && .venv/bin/uv pip install --python "$venv/bin/python" --find-links "$WHEELS" \
           -c scripts/lanes/lowest-dagster.txt -e '.[test]'
  } > "$venv/install.log" 2>&1 || {
    tail -30 "$venv/install.log" >&2
    echo "lane $name: pip install . beside dagster $want failed (dagster now ${got:-?}; log $venv/install.log)" >&2
    return 1
  }
  echo "lane $name: pip install . kept dagster $got; freshidx.definitions imports (from the installed package)" \
    | tee "$venv/.prepared"
  [ "$PHASE" = prepare ] && return
  fast_lane "$venv"
}

rc=0
for lane in "${LANES[@]}"; do
  case $lane in
    py3.12-lowest) lane_lowest || rc=1 ;;
    py3.13-dagster) lane_dagster || rc=1 ;;
    *) echo "unknown lane $lane (py3.12-lowest, py3.13-dagster)" >&2; rc=2 ;;
  esac
done
exit $rc
