"""The declared versions, the lock and the version lanes agree (fast, no network).

``requirements.lock`` is the exact set the main suite runs on, made from files in this repository by the command
in its header; ``pyproject.toml`` declares the ranges; ``scripts/lanes/*.txt`` are the lower bounds that
``scripts/python_lanes.sh`` installs to prove them.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
LOCK = (REPO / "requirements.lock").read_text(encoding="utf-8")


def _pins(text: str) -> dict[str, Version]:
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", line
            pins[req.name.lower()] = Version(spec.version)
    return pins


def _declared() -> dict[str, Requirement]:
    reqs = [*PROJECT["dependencies"], *(r for extra in PROJECT["optional-dependencies"].values() for r in extra)]
    return {r.name.lower(): r for r in map(Requirement, reqs) if r.name != "freshidx"}


def _lower_bound(spec: SpecifierSet) -> Version:
    (low,) = [Version(s.version) for s in spec if s.operator == ">="]
    return low


def test_the_lock_is_made_from_files_in_the_repository() -> None:
    command = next(line for line in LOCK.splitlines() if "uv pip compile" in line).lstrip("# ")
    args = shlex.split(command)
    inputs = [args[i + 1] for i, a in enumerate(args) if a in ("-c", "-r", "--constraint")] + [args[3]]
    assert inputs and all((REPO / p).is_file() for p in inputs), inputs
    cited = set(re.findall(r"-[cr] (\S+?)[,\s]", LOCK))
    assert cited and all((REPO / p).is_file() for p in cited), cited  # no file outside the repository


def test_every_locked_direct_dependency_is_within_its_declared_range() -> None:
    pins = _pins(LOCK)
    for name, req in _declared().items():
        assert name in pins, f"{name} is declared but not locked"
        assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} outside {req.specifier}"


def test_the_lanes_install_the_declared_lower_bounds() -> None:
    declared = _declared()
    lanes = {**_pins((REPO / "scripts/lanes/lowest.txt").read_text(encoding="utf-8")),
             **_pins((REPO / "scripts/lanes/lowest-dagster.txt").read_text(encoding="utf-8"))}
    for name in ("pyspark", "pyarrow", "tantivy", "dagster", "dagster-aws", "dagster-pyspark"):
        assert lanes[name] == _lower_bound(declared[name].specifier), name
    # dagster 1.13.N goes with the integrations' 0.29.N: the lane installs one line.
    assert {lanes[n].micro for n in ("dagster", "dagster-aws", "dagster-pyspark")} == {lanes["dagster"].micro}


def test_every_declared_python_has_a_lane() -> None:
    python = SpecifierSet(PROJECT["requires-python"])
    supported = [v for v in ("3.10", "3.11", "3.12", "3.13", "3.14") if python.contains(v + ".0")]
    assert supported == ["3.11", "3.12", "3.13"]
    lanes = (REPO / "scripts/python_lanes.sh").read_text(encoding="utf-8")
    assert "find_python 3.12" in lanes and "find_python 3.13" in lanes
    assert "python_lanes.sh" in (REPO / "scripts/test.sh").read_text(encoding="utf-8")
