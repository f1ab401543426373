"""The repository stands on its own, and its README is a user's page, not a lab notebook.

* (a) no text file of the code, the tests, the scripts, the container files, the instance config or the
  docs cites design notes kept outside the repository, an issue number or a seed number: code cites
  ``docs/architecture.md`` instead;
* (b) README.md's first 40 lines give the two commands;
* (c) no line of README.md and no comment or docstring under ``freshidx/`` carries a date (a dated
  measurement belongs in docs/benchmarks.md). Allowed: an example *value*, written as one (in backticks, or
  after "e.g.") and carrying an hour: an ISO timestamp ``2026-11-21T14:05Z`` or Dagster's hour key
  ``2026-11-24-01:00``; and, on README's ``FRESHIDX_PARTITIONS_START`` row only, the day that setting takes;
* (d) every ``docs/*.md`` link in README.md names a file that exists, and its ``#anchor`` a heading of it;
* (e) so does every ``docs/*.md#anchor`` that code, tests or the docs themselves cite.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# What the repository must not cite. The patterns are spelled so that this file does not match them itself.
CITATION = re.compile("|".join([
    "DESIG" + "N",                     # the design notes outside the repository
    r"(?<!defs/)shared[/]",            # ... and their folder (freshidx.defs.shared is ours)
    r"(?i:issue) [0-9]",               # issue numbers
    r"(?i:issue) [#]",
    r"(?i:seed) [0]",                  # seed numbers
]))
CITATION_ROOTS = ["freshidx", "freshidx_tests", "scripts", "docker", "docs", "dagster.yaml", "README.md"]

DATE = re.compile(r"(?<![\d.])(\d{4})-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])(?!\d)")
HOUR_AFTER = re.compile(r"T\d\d|-\d\d:\d\d")  # an ISO timestamp's time, or the hour of a Dagster hour key
CODE_SPAN = re.compile(r"``.+?``|`[^`\n]+`")


def text_files(root: Path) -> Iterator[Path]:
    paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    for path in paths:
        if "__pycache__" in path.parts:
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue  # binary
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        yield path


def test_nothing_cites_what_lies_outside_the_repository() -> None:
    found = []
    for root in CITATION_ROOTS:
        for path in text_files(REPO / root):
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if CITATION.search(line):
                    found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not found, "cite docs/architecture.md instead:\n" + "\n".join(found)


def test_readme_gives_both_commands_in_its_first_40_lines() -> None:
    head = "\n".join((REPO / "README.md").read_text(encoding="utf-8").splitlines()[:40])
    assert "bash scripts/demo.sh" in head
    assert "bash scripts/test.sh" in head


def undated(line: str, *, days_allowed: bool = False) -> list[str]:
    """The dates on ``line`` that are not example values (see the module docstring)."""
    spans = [m.span() for m in CODE_SPAN.finditer(line)]
    bad = []
    for m in DATE.finditer(line):
        in_code = any(a <= m.start() and m.end() <= b for a, b in spans)
        as_example = in_code or "e.g." in line[max(0, m.start() - 8):m.start()]
        with_hour = bool(HOUR_AFTER.match(line, m.end()))
        if not (as_example and (with_hour or (days_allowed and in_code))):
            bad.append(m.group(0))
    return bad


def test_the_date_rule_itself() -> None:
    assert undated("measured on 2026-11-26: 1.2 s") == ["2026-11-26"]
    assert undated("(2026-11-28 15:20, load 2)") == ["2026-11-28"]
    assert undated("an hour key ``2026-11-24-01:00``") == []
    assert undated("ISO-8601 UTC, e.g. 2026-11-21T14:05:07.123Z") == []
    assert undated("a bare `2026-11-24` in backticks") == ["2026-11-24"]
    assert undated("a bare `2026-11-24` in backticks", days_allowed=True) == []
    assert undated("not in backticks: 2026-11-21T14:05Z") == ["2026-11-21"]


def test_readme_carries_no_dates() -> None:
    found = []
    for n, line in enumerate((REPO / "README.md").read_text(encoding="utf-8").splitlines(), 1):
        row_of_the_day_setting = line.startswith("| `FRESHIDX_PARTITIONS_START`")
        found += [f"README.md:{n}: {d}: {line.strip()}" for d in undated(line, days_allowed=row_of_the_day_setting)]
    assert not found, "dated figures belong in docs/benchmarks.md:\n" + "\n".join(found)


def comments_and_docstrings(source: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of every comment and every line of every docstring."""
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                for offset, line in enumerate(first.value.value.splitlines()):
                    yield first.lineno + offset, line


def test_no_comment_or_docstring_in_the_package_carries_a_date() -> None:
    found = []
    for path in sorted((REPO / "freshidx").rglob("*.py")):
        for n, text in comments_and_docstrings(path.read_text(encoding="utf-8")):
            found += [f"{path.relative_to(REPO)}:{n}: {d}: {text.strip()}" for d in undated(text)]
    assert not found, "comments carry no dated measurements (docs/benchmarks.md has the figures):\n" + "\n".join(found)


def slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"#{1,6} (.+)", line)
        if m:
            base = slug(m.group(1))
            out.add(base if base not in seen else f"{base}-{seen[base]}")
            seen[base] = seen.get(base, 0) + 1
    return out


LINK = re.compile(r"\]\((docs/[\w.-]+\.md)(?:#([^)\s]*))?\)")
DOCS_LINK = re.compile(r"\]\(([\w.-]+\.md)(?:#([^)\s]*))?\)")
CITED = re.compile(r"docs/([\w.-]+\.md)#([\w-]+)")


def unresolved(target: Path, anchor: str | None) -> str | None:
    if not target.is_file():
        return f"{target.relative_to(REPO)} does not exist"
    if anchor and anchor not in anchors(target):
        return f"{target.relative_to(REPO)} has no heading for #{anchor}"
    return None


def test_every_docs_link_in_the_readme_resolves() -> None:
    links = LINK.findall((REPO / "README.md").read_text(encoding="utf-8"))
    assert {"docs/architecture.md", "docs/operations.md", "docs/deployment.md", "docs/benchmarks.md"} <= {
        f for f, _ in links}
    problems = [p for f, a in links if (p := unresolved(REPO / f, a or None))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("root", ["freshidx", "freshidx_tests", "docs"])
def test_every_cited_docs_anchor_resolves(root: str) -> None:
    problems = []
    for path in text_files(REPO / root):
        text = path.read_text(encoding="utf-8")
        cited = [(REPO / "docs" / f, a) for f, a in CITED.findall(text)]
        if path.suffix == ".md":  # links between the docs themselves
            cited += [(path.parent / f, a or None) for f, a in DOCS_LINK.findall(text)]
        problems += [f"{path.relative_to(REPO)}: {p}" for target, a in cited if (p := unresolved(target, a))]
    assert not problems, "\n".join(problems)
