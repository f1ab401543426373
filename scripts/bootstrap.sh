#!/usr/bin/env bash
# Idempotent setup: Python 3.11 virtualenv in .venv with freshidx[dev] at the versions of
# requirements.lock, and a Java runtime for Spark.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for c in python3.11 python3; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      PY=$c; break
    fi
  done
fi
if [ -z "$PY" ]; then
  echo "freshidx needs Python 3.11 (python3.11 or python3 on PATH, or PYTHON=/path/to/python3.11)" >&2
  exit 1
fi

# Spark needs Java 17+ (pyspark 4.x).
java_major() { java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1; }
if ! command -v java >/dev/null 2>&1 || [ "$(java_major)" -lt 17 ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    # Debian 12 has Java 17, Debian 13 only Java 21; Spark 4 runs on either.
    JRE=openjdk-17-jre-headless
    apt-get update -qq
    if ! apt-cache show "$JRE" >/dev/null 2>&1; then JRE=openjdk-21-jre-headless; fi
    echo "installing a Java runtime for Spark ($JRE) …" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$JRE" >/dev/null
  else
    echo "Spark needs Java 17 or 21 on PATH (e.g. apt-get install openjdk-17-jre-headless)" >&2
    exit 1
  fi
fi

# PostgreSQL server binaries for the Dagster-on-PostgreSQL test (freshidx_tests/deployment/test_compose_deployment.py
# starts its own server from initdb; Debian keeps initdb off PATH, under /usr/lib/postgresql/*/bin).
have_initdb() { command -v initdb >/dev/null 2>&1 || compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; }
if ! have_initdb; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing PostgreSQL for the Dagster-on-PostgreSQL test …" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; } \
      || echo "could not install postgresql; the PostgreSQL test will be skipped" >&2
  else
    echo "no PostgreSQL server (initdb) found; the PostgreSQL test will be skipped" \
         "(apt-get install postgresql)" >&2
  fi
fi

# Debian's Chromium for the browser test of the Dagster UI (freshidx_tests/deployment/test_browser_ui.py drives
# /usr/bin/chromium with Playwright, which cannot download browsers of its own here).
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing chromium for the browser test of the Dagster UI …" >&2
    { apt-get update -qq \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; } \
      || echo "could not install chromium; the browser test will be skipped" >&2
  else
    echo "no /usr/bin/chromium; the browser test will be skipped (apt-get install chromium chromium-driver)" >&2
  fi
fi

STAMP=.venv/.freshidx-installed
WANT=$(cat pyproject.toml requirements.lock | sha256sum | cut -d' ' -f1)
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  echo "installing freshidx and its dependencies into .venv (log: .venv/install.log) …" >&2
  # uv resolves and installs the same versions as pip in ~45 s instead of ~75 s on 2 cores (bytecode
  # compiled at install, as pip does, so test processes do not each compile on first import); pip
  # when uv cannot be installed or cannot reach the index (uv ignores pip.conf).
  # pyspark is published only as a source distribution (~450 MB of jars). uv built it into a wheel on every
  # fresh install here (~20 s) and kept every build in its cache (~1.4 GB each, never reused: 43 GiB in a
  # day of clean clones). Build the pinned version's wheel once into WHEELS and install from there;
  # without it (offline, no pip) uv builds it as before.
  WHEELS="${XDG_CACHE_HOME:-$HOME/.cache}/freshidx/wheels"
  SPARK_PIN=$(sed -n 's/^pyspark==\([0-9][0-9.]*\).*/\1/p' requirements.lock | head -1)
  if [ -n "$SPARK_PIN" ] && [ ! -f "$WHEELS/pyspark-$SPARK_PIN-py2.py3-none-any.whl" ] && mkdir -p "$WHEELS"; then
    rm -f "$WHEELS"/pyspark-*.whl  # only the pinned version is kept
    echo "building the pyspark $SPARK_PIN wheel once into $WHEELS (~30 s) …" >&2
    # Built beside it, then renamed into place: an interrupted build never leaves a truncated wheel.
    # Any failure here only costs the build uv then does itself.
    BUILD_DIR=""
    if ! { BUILD_DIR=$(mktemp -d "$WHEELS/.build.XXXXXX") \
           && .venv/bin/python -m pip wheel -q --no-deps --no-cache-dir "pyspark==$SPARK_PIN" -w "$BUILD_DIR" \
           && mv "$BUILD_DIR"/pyspark-*.whl "$WHEELS"/; } > .venv/wheel.log 2>&1; then
      echo "could not build it (see .venv/wheel.log); uv builds pyspark itself" >&2
    fi
    if [ -n "$BUILD_DIR" ]; then rm -rf "$BUILD_DIR"; fi
  fi
  FIND_LINKS=()
  if [ -d "$WHEELS" ]; then FIND_LINKS=(--find-links "$WHEELS"); fi
  if ! { .venv/bin/python -m pip install -q uv \
           && .venv/bin/uv pip install --python .venv/bin/python --compile-bytecode "${FIND_LINKS[@]}" \
                -r requirements.lock -e '.[dev]'; } \
      > .venv/install.log 2>&1 \
     && ! { echo "uv failed; installing with pip" && .venv/bin/python -m pip install --upgrade pip \
              && .venv/bin/python -m pip install "${FIND_LINKS[@]}" -r requirements.lock -e '.[dev]'; } >> .venv/install.log 2>&1; then
    tail -40 .venv/install.log >&2
    echo "package installation failed; full log in .venv/install.log" >&2
    exit 1
  fi
  echo "$WANT" > "$STAMP"
fi

# Byte-compile freshidx itself (an editable install is not compiled at install): where
# PYTHONDONTWRITEBYTECODE is set (as on our test machine) every process that imports it (Dagster runs, code
# servers, Spark's Python workers, CLI calls) would compile it again: ~0.1 s of CPU each.
# Incremental: only changed files are compiled again. A syntax error is not fatal here: ruff, next in
# scripts/test.sh, names it.
.venv/bin/python -m compileall -q freshidx freshidx_tests >/dev/null || true
