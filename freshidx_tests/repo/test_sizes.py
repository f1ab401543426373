"""Sizes a reader can hold: every module under ``freshidx/`` (tooling included) has at most
:data:`MAX_MODULE_LINES` lines and every function at most :data:`MAX_FUNCTION_LINES`, counted from its
``def`` line to its last line (decorators excluded, as ``ast`` gives ``end_lineno - lineno + 1``).

A long module is split by meaning into sibling modules, a long function into named steps.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "freshidx"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def long_modules(paths: list[Path], root: Path = PACKAGE.parent) -> list[str]:
    """``path (N lines)`` of every module over :data:`MAX_MODULE_LINES` (lines = newline characters)."""
    sizes = [(p.relative_to(root).as_posix(), p.read_text(encoding="utf-8").count("\n")) for p in paths]
    return [f"{name} ({n} lines)" for name, n in sizes if n > MAX_MODULE_LINES]


def long_functions(paths: list[Path], root: Path = PACKAGE.parent) -> list[str]:
    """``path:line name (N lines)`` of every function or method over :data:`MAX_FUNCTION_LINES`."""
    out = []
    for p in paths:
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"), filename=str(p))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    out.append(f"{p.relative_to(root).as_posix()}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_the_check_walks_the_whole_package() -> None:
    names = {p.relative_to(PACKAGE.parent).as_posix() for p in _modules()}
    assert {"freshidx/definitions.py", "freshidx/tools/demo.py", "freshidx/defs/delta/sensor.py"} <= names


def test_counting_follows_the_rule(tmp_path: Path) -> None:
    body = [f"    x{i} = {i}" for i in range(58)]
    lines = [
        "class C:",
        "    @staticmethod",  # decorators are not counted
        "    def fits():",  # line 3: 1 + 58 + 1 = 60 lines
        *["    " + b for b in body], "        return 0",
        "",
        "async def too_long():",  # line 64: 61 lines
        *body, "    x = 1", "    return 1",
    ]
    lines += ["# filler"] * (401 - len(lines))
    sample = tmp_path / "sample.py"
    sample.write_text("\n".join(lines) + "\n")
    assert long_functions([sample], tmp_path) == ["sample.py:64 too_long (61 lines)"]
    assert long_modules([sample], tmp_path) == ["sample.py (401 lines)"]
    sample.write_text("\n".join(lines[:-1]) + "\n")
    assert long_modules([sample], tmp_path) == []


def test_no_module_over_400_lines() -> None:
    too_long = long_modules(_modules())
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines (split by meaning):\n" + "\n".join(too_long)


def test_no_function_over_60_lines() -> None:
    too_long = long_functions(_modules())
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines (extract named steps):\n" + "\n".join(too_long)
