"""Dagster's own tooling reads freshidx: ``dg check defs`` and ``dg list defs`` work from the project root.

pyproject.toml's ``[tool.dg]`` makes the repository a dg project whose code location is the module
``freshidx.definitions`` (what workspace.yaml and ``dagster api grpc -m`` load). The commands run as
users run them, from the virtualenv's ``dg`` with the virtualenv active, in a copy of the project (its
pyproject.toml and package) with no ``FRESHIDX_*`` set, so that the test can show:

* (a) both succeed, and ``dg list defs --json`` lists the assets, jobs and sensors of the code location;
* (b) dg does not read ``freshidx/defs/`` as a folder of dg components: a component file dropped there,
  which dg's YAML check would reject, is not looked at;
* (c) they write nothing into the project (no ``./.freshidx``, no instance directory, no caches): the
  instance lives in a temporary ``DAGSTER_HOME``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ASSETS = {"delta_index", "full_index", "ads_hourly", "delta_compaction", "raw_ad_updates"}
JOBS = {"delta_index_job", "full_index_job", "ads_hourly_job", "delta_compaction_job", "delta_continuous"}
SENSORS = {"delta_index_sensor", "delta_continuous_watchdog", "ads_hourly_sensor", "freshidx_sla_sensor",
           "delta_compaction_sensor", "freshidx_run_health_sensor"}
# A component file that dg's YAML check rejects (no `type`), were it to read freshidx/defs/ as components.
NOT_A_COMPONENT = "attributes:\n  not: a component\n"


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def dg(args: list[str], project: Path, home: Path) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "dg"
    assert script.exists(), "dg is missing: install the test extra (dagster-dg-cli)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRESHIDX_")}
    # As after `source .venv/bin/activate`: dg runs the definitions in its own interpreter, this one.
    # HOME too: dg keeps its user config and telemetry log there (the project sets no [tool.dg.cli]: dg 1.13.0
    # cannot read that section).
    env.update(VIRTUAL_ENV=sys.prefix, DAGSTER_HOME=str(home), HOME=str(home), PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([str(script), *args], capture_output=True, text=True, env=env, cwd=project, timeout=600)


def test_dg_checks_and_lists_the_code_location(tmp_path: Path) -> None:
    project, home = tmp_path / "project", tmp_path / "dagster_home"
    project.mkdir()
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    shutil.copy(REPO / "pyproject.toml", project)
    shutil.copytree(REPO / "freshidx", project / "freshidx", ignore=shutil.ignore_patterns("__pycache__"))
    (project / "freshidx" / "defs" / "not_a_component").mkdir()
    (project / "freshidx" / "defs" / "not_a_component" / "defs.yaml").write_text(NOT_A_COMPONENT)
    before = files(project)

    check = dg(["check", "defs"], project, home)
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-4000:]
    assert "All definitions loaded successfully" in check.stdout, check.stdout[-2000:]

    listed = dg(["list", "defs", "--json"], project, home)
    assert listed.returncode == 0, listed.stderr[-4000:]
    defs = json.loads(listed.stdout)
    assert {a["asset_key"] for a in defs["assets"]} == ASSETS
    assert {j["name"] for j in defs["jobs"]} == JOBS
    assert {s["name"] for s in defs["sensors"]} == SENSORS
    assert {s["name"] for s in defs["schedules"]} == {"full_index_schedule"}

    assert files(project) == before
