"""The warnings policy: a deprecated, beta or preview Dagster API (or a deprecated PySpark one) is an error.

* (a) the suite runs under it: pyproject.toml's ``[tool.pytest.ini_options] filterwarnings`` turns
  ``DeprecationWarning``, ``FutureWarning`` (Dagster's ``SupersessionWarning`` is one) and Dagster's
  ``BetaWarning`` and ``PreviewWarning`` into errors; each exception names one exact message and says why;
* (b) freshidx's own processes are held to it too, which pytest's filter does not reach: a child
  interpreter applies the same policy, imports every module of the package (the CLI, the Spark server
  supervisor, the tools, the definitions) and resolves the code location as a code server does, with
  no ``FRESHIDX_*`` set, and fails on any warning the policy makes an error. The exceptions that still
  match are printed (``-s`` shows them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import dagster as dg
import pytest

REPO = Path(__file__).resolve().parents[2]
POLICY: list[str] = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"][
    "ini_options"]["filterwarnings"]

# The child applies the policy as pytest does (in order, so a later entry wins; the message is a regex
# matched at its start), except that an exception shows its warning instead of hiding it, so the
# exceptions still in use are reported.
CHILD = r"""
import importlib, json, pkgutil, sys, warnings

shown = []
warnings.showwarning = lambda message, category, *rest: shown.append(f"{category.__name__}: {message}")
for entry in json.loads(sys.argv[1]):
    action, message, category, module, lineno = (entry.split(":") + [""] * 4)[:5]
    owner, _, name = (category or "Warning").rpartition(".")
    cls = getattr(importlib.import_module(owner or "builtins"), name)
    warnings.filterwarnings("always" if action == "ignore" else action, message, cls, module, int(lineno or 0))

import freshidx

for info in pkgutil.walk_packages(freshidx.__path__, "freshidx."):
    if not info.name.endswith("__main__"):  # `python -m` entry points run their command on import
        importlib.import_module(info.name)
importlib.import_module("freshidx.definitions").defs.get_repository_def()
print(json.dumps(sorted(set(shown))))
"""


def test_the_policy_makes_deprecated_beta_and_preview_dagster_apis_errors() -> None:
    for category in ("DeprecationWarning", "FutureWarning", "dagster.BetaWarning", "dagster.PreviewWarning"):
        assert f"error::{category}" in POLICY
    for entry in POLICY:
        action, message, category, module = (entry.split(":") + [""] * 3)[:4]
        if action == "ignore":  # an exception names its message, or (a third party's own) its module
            assert message or module, entry
    # ... and it is in force in this process: the API freshidx used to call fails here
    with pytest.raises(DeprecationWarning, match="partitions_def"):
        dg.define_asset_job("deprecated_job", selection="*", partitions_def=dg.StaticPartitionsDefinition(["a"]))
    with pytest.raises(dg.BetaWarning, match="backfill_policy"):
        dg.asset(name="beta_asset", backfill_policy=dg.BackfillPolicy.single_run())(lambda: None)


def test_freshidx_processes_load_without_deprecated_beta_or_preview_apis(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRESHIDX_") and k != "PYTHONWARNINGS"}
    child = subprocess.run([sys.executable, "-c", CHILD, json.dumps(POLICY)], capture_output=True, text=True,
                           env={**env, "PYTHONDONTWRITEBYTECODE": "1"}, cwd=tmp_path, timeout=600)
    assert child.returncode == 0, child.stderr[-4000:]
    shown = json.loads(child.stdout.splitlines()[-1])
    print("warnings the policy still lets through:", *shown, sep="\n  ")
    # Loaded on default settings, it wrote nothing where it ran (no ./.freshidx, no instance directory).
    assert not list(tmp_path.iterdir())
