"""Module names say which room they are in: no two product modules share a file name, and no import renames one.

Two ``build.py`` (or a ``records.py`` beside ``store/records/``) make every traceback, grep and docstring ask
"which one?"; an ``import ... as`` alias gives a module a second name that readers then cite. The exceptions
are the same role in parallel packages, listed below with why.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import freshidx

ROOT = Path(freshidx.__file__).parent

# Same role in parallel packages: every Dagster pipeline package under defs/ has its own assets and (where
# it publishes its own way) its own IO manager; reading the path's package tells them apart.
PARALLEL_DEFS_ROLES = {"assets.py", "io_manager.py"}
# `freshidx <command>`'s module is named after the command (cli/status.py, cli/bench.py ...), like the
# implementation it imports lazily from elsewhere.
CLI = "cli"
# A module beside a package of the same name, same role in parallel pipelines: full/executor.py is the full
# build's code that runs inside Spark tasks, as the package delta/executor/ is the delta's.
MODULE_BESIDE_PACKAGE = {("full", "executor.py")}


def _modules() -> list[Path]:
    return sorted(p.relative_to(ROOT) for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


def _exempt(rel: Path) -> bool:
    if rel.name in ("__init__.py", "__main__.py") or rel.parts[0] == CLI:
        return True
    return rel.parts[0] == "defs" and len(rel.parts) == 3 and rel.name in PARALLEL_DEFS_ROLES


def test_module_file_names_are_unique() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for rel in _modules():
        if not _exempt(rel):
            by_name[rel.name].append(str(rel))
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not shared, f"product modules sharing a file name (give each a name that says what it is): {shared}"


def test_no_module_is_named_like_a_package() -> None:
    packages = {p.name for p in ROOT.rglob("*") if p.is_dir() and (p / "__init__.py").exists()}
    clashes = [str(rel) for rel in _modules()
               if not _exempt(rel) and rel.stem in packages and tuple(rel.parts[-2:]) not in MODULE_BESIDE_PACKAGE]
    assert not clashes, f"modules named like a package of freshidx: {clashes}"


def test_the_allow_lists_still_match() -> None:
    """An exception that no longer matches anything goes with the collision it excused."""
    names = [rel.name for rel in _modules() if rel.parts[0] == "defs" and len(rel.parts) == 3]
    assert all(names.count(role) > 1 for role in PARALLEL_DEFS_ROLES), names
    assert all((ROOT / pkg / name).exists() for pkg, name in MODULE_BESIDE_PACKAGE)


def _is_module(dotted: str) -> bool:
    path = ROOT.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _renaming_aliases(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"import {a.name} as {a.asname}" for a in node.names
                      if a.name.startswith("freshidx.") and a.asname and a.asname != a.name.rsplit(".", 1)[-1]]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("freshidx"):
            found += [f"from {node.module} import {a.name} as {a.asname}" for a in node.names
                      if a.asname and a.asname != a.name and _is_module(f"{node.module}.{a.name}")]
    return found


def test_no_import_alias_renames_a_freshidx_module() -> None:
    found = {str(rel): hits for rel in _modules() if (hits := _renaming_aliases((ROOT / rel).read_text()))}
    assert not found, f"import aliases that rename a freshidx module (use the module's name, or rename it): {found}"


def test_the_alias_check_sees_an_alias() -> None:
    found = _renaming_aliases("from freshidx.delta import segment_merge as merge\nimport freshidx.store.layout as lay\n"
                              "from freshidx.publish.commit import iso as iso_time\n")  # a function: not a module
    assert sorted(found) == ["from freshidx.delta import segment_merge as merge", "import freshidx.store.layout as lay"]
