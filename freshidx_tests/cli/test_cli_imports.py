"""The CLI starts light: ``freshidx --help`` / ``<cmd> --help`` import neither Spark nor Dagster,
``freshidx search`` imports no Spark (checked in child processes, from ``-X importtime``/``sys.modules``).

The wall time of ``freshidx --help`` is printed (``-s`` shows it), not asserted.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from freshidx import cli
from freshidx.store import StoreConfig, open_store
from freshidx_tests.spark.test_index_shards import T0, ad, build_direct, publish_commits

HEAVY = ("pyspark", "dagster", "py4j")
SUBCOMMANDS = (
    ["generate"], ["status"], ["demo"], ["ledger"], ["ledger", "retry"], ["quarantine"], ["quarantine", "list"],
    ["quarantine", "export"], ["quarantine", "replay"], ["spark-server"], ["search"], ["rollback"], ["gc"],
    ["bench"], ["bench", "build"], ["bench", "query"], ["bench", "freshness"], ["bench", "soak"],
)


def env_without_freshidx() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FRESHIDX_")}


def freshidx_command() -> list[str]:
    """The installed console script (what users run), else the module."""
    script = shutil.which("freshidx", path=os.path.dirname(sys.executable))
    return [script] if script else [sys.executable, "-m", "freshidx.cli"]


def imported(importtime_stderr: str) -> set[str]:
    """Module names from ``-X importtime`` lines (``import time: self | cumulative | name``)."""
    return {line.rsplit("|", 1)[1].strip() for line in importtime_stderr.splitlines()
            if line.startswith("import time:") and line.count("|") == 2}


def heavy(modules: set[str]) -> set[str]:
    return {m for m in modules if m.split(".")[0] in HEAVY}


def run_with_importtime(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    env = {**env_without_freshidx(), "PYTHONPROFILEIMPORTTIME": "1"}
    proc = subprocess.run([*freshidx_command(), *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=120)
    modules = imported(proc.stderr)
    assert "freshidx.cli" in modules, proc.stderr[-2000:]  # the profile was taken
    return proc, modules


def test_help_imports_neither_spark_nor_dagster(tmp_path: Path) -> None:
    proc, modules = run_with_importtime(["--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "search" in proc.stdout and "spark-server" in proc.stdout
    assert not heavy(modules), sorted(heavy(modules))
    assert "pydantic" not in modules and "freshidx.settings" not in modules

    # every sub-command's --help, in one child
    code = ("import json, sys\nfrom freshidx.cli import main\n"
            f"codes = [main([*c, '--help']) for c in {[list(c) for c in SUBCOMMANDS]!r}]\n"
            "print(json.dumps({'codes': codes, 'modules': sorted(sys.modules)}))\n")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env_without_freshidx(),
                           cwd=tmp_path, timeout=120)
    assert child.returncode == 0, child.stderr[-2000:]
    out = json.loads(child.stdout.splitlines()[-1])
    assert out["codes"] == [0] * len(SUBCOMMANDS)
    assert not heavy(set(out["modules"])), sorted(heavy(set(out["modules"])))

    # wall time of `freshidx --help` (a number for the record; no timing assertion)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run([*freshidx_command(), "--help"], capture_output=True, env=env_without_freshidx(),
                       cwd=tmp_path, timeout=120, check=True)
        times.append(time.perf_counter() - t0)
    print(f"\nfreshidx --help: median {statistics.median(times):.3f} s, min {min(times):.3f} s "
          f"(5 runs, load {os.getloadavg()[0]:.1f})")


def test_search_imports_no_spark(local_store_config: StoreConfig, tmp_path: Path) -> None:
    store = open_store(local_store_config)
    publish_commits(store, "full", "f1", T0,
                    build_direct(local_store_config, "full", "f1", [ad(1, 1, title="red shoes"), ad(2, 1)]))
    publish_commits(store, "delta", "d1", T0 + dt.timedelta(minutes=10),
                    build_direct(local_store_config, "delta", "d1", [ad(3, 2, title="red hat", version=2)]))
    proc, modules = run_with_importtime(
        ["search", "red", "--store", local_store_config.uri, "--cache", str(tmp_path / "cache"), "--json"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["answered_by"] == ["full", "delta"]  # the delta (and its kill-list) was loaded too
    assert "freshidx.serve.searcher" in modules and "tantivy" in modules
    assert not {m for m in modules if m.split(".")[0] in ("pyspark", "py4j")}, sorted(heavy(modules))


def test_settings_error_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FRESHIDX_WINDOW_MINUTES", "-5")
    assert cli.main(["status", "--store", (tmp_path / "s").as_uri()]) == 2
    err = capsys.readouterr().err
    assert err.startswith("freshidx: ") and "FRESHIDX_WINDOW_MINUTES" in err


def test_cli_defaults_mirror_the_library() -> None:
    """The CLI modules keep a few defaults as literals (importing their owners would import Spark,
    Dagster or pydantic on ``--help``): they must say what the library does."""
    from freshidx import settings
    from freshidx.cli import bench as cli_bench
    from freshidx.cli import demo as cli_demo
    from freshidx.cli import generate as cli_generate
    from freshidx.cli import retention as cli_retention
    from freshidx.cli import spark_server as cli_spark_server
    from freshidx.publish import retention
    from freshidx.serve import searcher as serving
    from freshidx.spark import shards
    from freshidx.spark_server import server_config
    from freshidx.store import layout
    from freshidx.tools import bench, bench_freshness, generate

    assert cli_retention.INDEX_NAMES == layout.INDEX_NAMES
    assert cli_retention.DEFAULT_GRACE_MINUTES == retention.DEFAULT_GRACE_MINUTES
    assert cli_retention.DEFAULT_MAX_VERSIONS == retention.DEFAULT_MAX_VERSIONS
    assert (cli_bench.BUILD_ROUNDS, cli_bench.BUILD_WARMUP) == (bench.BUILD_ROUNDS, bench.BUILD_WARMUP)
    assert cli_bench.MODES == bench_freshness.MODES
    assert cli_bench.WINDOW_MINUTES == bench_freshness.WINDOW_MINUTES
    assert cli_spark_server.DEFAULT_PORT == server_config.DEFAULT_PORT
    assert cli_spark_server.DEFAULT_STATE_DIR == server_config.DEFAULT_STATE_DIR
    assert cli_demo.DEFAULT_HOME == settings.DEFAULT_HOME
    assert generate.GeneratorConfig.changes_per_partition == cli_generate.CHANGES_PER_PARTITION
    assert serving.COVERED_FILE == shards.COVERED_FILE
