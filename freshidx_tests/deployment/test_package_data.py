"""The instance config tools copy into a DAGSTER_HOME is package data, and one source of truth: the
shipped ``freshidx/dagster_home/dagster.yaml`` is byte-identical to the checkout's top-level
``dagster.yaml`` (what ``dagster dev`` in the repository, Docker and the tests use)."""

from __future__ import annotations

import tomllib
from fnmatch import fnmatch
from pathlib import Path

from freshidx.tools.devserver import packaged_dagster_yaml, prepare_home

REPO = Path(__file__).resolve().parents[2]


def test_packaged_dagster_yaml_is_the_top_level_one() -> None:
    shipped = packaged_dagster_yaml()
    assert shipped.is_file()
    assert shipped.read_bytes() == (REPO / "dagster.yaml").read_bytes(), (
        "freshidx/dagster_home/dagster.yaml differs from dagster.yaml: edit both (or copy one over the other)")


def test_the_package_declares_it_as_package_data() -> None:
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["freshidx"]
    assert any(fnmatch("dagster_home/dagster.yaml", g) for g in globs), globs


def test_prepare_home_copies_the_packaged_config(tmp_path: Path) -> None:
    home = prepare_home(tmp_path / "home", packaged_dagster_yaml())
    assert (home / "dagster.yaml").read_bytes() == packaged_dagster_yaml().read_bytes()
