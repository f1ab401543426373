"""What hides a part's hits (freshidx.serve.versions.KillLists): every newer applied segment's kill-list, asked in
turn, never copied into one set at a swap."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from freshidx.serve.versions import KillLists, LoadedVersion, Part, VersionSet


def _part(version: str, position: str, covered: set[str]) -> Part:
    return Part(version=version, position=position, path=Path("/nonexistent"), shards=[], covered=frozenset(covered))


def _loaded(index: str, version: str, position: str, parts: list[Part]) -> LoadedVersion:
    pointer: Any = None  # not read by the rules under test
    return LoadedVersion(index=index, version=version, position=position, parts=parts, pointer=pointer)


def test_an_id_is_hidden_when_any_list_holds_it() -> None:
    hidden = KillLists().with_list(frozenset({"a"})).with_list(frozenset({"b"}))
    assert "a" in hidden and "b" in hidden and "c" not in hidden
    assert "a" not in KillLists()
    assert KillLists().with_list(frozenset()).lists == ()  # an empty kill-list adds nothing to ask


def test_each_part_is_hidden_by_exactly_the_newer_applied_segments_lists() -> None:
    s1, s2, s3 = _part("d1", "p1", {"x"}), _part("d2", "p2", {"y"}), _part("d3", "p3", {"z"})
    full = _loaded("full", "f", "p0", [_part("f", "p0", set())])
    searched = VersionSet(full=full, delta=_loaded("delta", "d3", "p3", [s1, s2, s3])).searched
    by_part = {part.version: hidden for _, _, part, hidden in searched}
    assert by_part["d3"].lists == ()
    assert by_part["d2"].lists == (s3.covered,)
    assert by_part["d1"].lists == (s3.covered, s2.covered)
    assert by_part["f"].lists == (s3.covered, s2.covered, s1.covered)  # the very sets, not a union of copies
    assert all(a is b for a, b in zip(by_part["f"].lists, (s3.covered, s2.covered, s1.covered), strict=True))
    assert {"x", "y", "z"} <= {i for i in "xyz" if i in by_part["f"]}


def test_segments_the_full_version_already_holds_hide_nothing() -> None:
    old, new = _part("d1", "p1", {"x"}), _part("d2", "p3", {"y"})
    full = _loaded("full", "f", "p2", [_part("f", "p2", set())])
    searched = VersionSet(full=full, delta=_loaded("delta", "d2", "p3", [old, new])).searched
    assert [part.version for _, _, part, _ in searched] == ["d2", "f"]
    assert "x" not in searched[-1][3] and "y" in searched[-1][3]
