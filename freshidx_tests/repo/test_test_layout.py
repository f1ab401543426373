"""The tests mirror the product's packages: ``freshidx_tests/<package>/test_*.py``, shared helpers in
``freshidx_tests/support/``, fixtures in ``freshidx_tests/conftest.py``.

Every folder is a package (the tests import each other as ``freshidx_tests.<package>.test_x`` and
``python -m freshidx_tests.support.cluster_fixture`` runs as a module), and test base names are unique:
``conftest.MODULE_SECONDS`` and ``SLOW_MODULES`` are keyed by them."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _folders() -> list[Path]:
    skip = {"__pycache__", "data"}  # data/ holds fixtures (a store written by an old release), not tests
    return sorted(p for p in TESTS.rglob("*") if p.is_dir() and not skip & set(p.relative_to(TESTS).parts))


def test_no_test_module_sits_at_the_top() -> None:
    assert sorted(p.name for p in TESTS.glob("test_*.py")) == []


def test_every_test_folder_is_a_package() -> None:
    folders = _folders()
    assert folders, TESTS
    assert [str(d.relative_to(TESTS)) for d in folders if not (d / "__init__.py").is_file()] == []


def test_test_base_names_are_unique() -> None:
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert len(names) > 50, names
    assert sorted(name for name, n in names.items() if n > 1) == []
