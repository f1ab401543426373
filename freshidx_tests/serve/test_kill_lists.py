"""What hides a part's hits (freshidx.serve.kill_list.KillLists): every newer applied segment's kill-list, asked in
turn, never copied into one set at a swap; and one shard's kill-list as a reader holds it
(freshidx.serve.kill_list)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from freshidx.serve.kill_list import SortedIds, _in_order, kill_list_of, of_shards, read_kill_list
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


# ------------------------------------------------------------------ one shard's list (freshidx.serve.kill_list)


def test_ids_of_one_length_become_a_sorted_array_that_answers_like_a_set() -> None:
    ids = ["ad-0042", "ad-0007", None, "ad-0999", "ad-0007"]
    kill = kill_list_of(pa.chunked_array([pa.array(ids[:2]), pa.array(ids[2:])]))
    assert isinstance(kill, SortedIds)
    assert {"ad-0007", "ad-0042", "ad-0999"} == set(kill)
    assert all(i in kill for i in ("ad-0007", "ad-0042", "ad-0999"))
    # a neighbour, the ends of the range, another length, a prefix, a non-string: all absent
    assert not any(i in kill for i in ("ad-0008", "ad-0000", "ad-9999", "ad-00070", "ad-000", 7, None))


def test_a_sliced_column_keeps_only_its_own_ids() -> None:
    kill = kill_list_of(pa.array(["ad-1", "ad-2", "ad-3", "ad-4"]).slice(1, 2))
    assert isinstance(kill, SortedIds) and sorted(kill) == ["ad-2", "ad-3"] and "ad-1" not in kill


def test_ids_of_mixed_lengths_or_ending_in_nul_fall_back_to_a_set() -> None:
    assert kill_list_of(pa.array(["ad-1", "ad-22"])) == frozenset({"ad-1", "ad-22"})
    assert kill_list_of(pa.array(["ad-1\x00", "ad-22"])) == frozenset({"ad-1\x00", "ad-22"})
    trailing_nul = kill_list_of(pa.array(["ad1\x00", "ad2\x00"]))
    assert isinstance(trailing_nul, frozenset) and "ad1\x00" in trailing_nul and "ad1" not in trailing_nul
    assert kill_list_of(pa.array([None, None], pa.string())) == frozenset()


def test_a_covered_file_reads_into_its_kill_list(tmp_path: Path) -> None:
    path = tmp_path / "covered.parquet"
    pq.write_table(pa.table({"ad_id": ["ad-3", "ad-1", None], "status": ["deleted", "active", "active"]}), path)
    for source in (path, path.read_bytes()):
        kill = read_kill_list(source)
        assert sorted(kill) == ["ad-1", "ad-3"] and "ad-3" in kill and "ad-2" not in kill


def test_a_parts_shard_lists_are_asked_in_turn_never_merged() -> None:
    a, b = kill_list_of(pa.array(["ad-1", "ad-2"])), kill_list_of(pa.array(["ad-33"]))
    part = of_shards([a, frozenset(), b])
    assert isinstance(part, KillLists) and part.lists[0] is a and part.lists[1] is b
    assert "ad-2" in part and "ad-33" in part and "ad-3" not in part and sorted(part) == ["ad-1", "ad-2", "ad-33"]
    assert of_shards([a]) is a and of_shards([frozenset()]) == frozenset() and not of_shards([])
    assert of_shards([part, frozenset({"x"})]).lists == (a, b, frozenset({"x"}))  # type: ignore[union-attr]


def test_ids_in_order_are_checked_not_sorted_and_ids_out_of_order_still_sorted() -> None:
    assert _in_order(pa.array(["ad-1", "ad-1", "ad-2", "ad-B", "ad-a"]))  # byte order: "B" (0x42) before "a"
    assert not _in_order(pa.array(["ad-1", "ad-3", "ad-2"])) and not _in_order(pa.array(["ad-a", "ad-B"]))
    assert _in_order(pa.array([], pa.string())) and _in_order(pa.array(["ad-9"]))
    in_order, shuffled = pa.array(["ad-1", "ad-2", "ad-3"]), pa.array(["ad-3", "ad-1", "ad-2"])
    for column in (in_order, shuffled):
        kill = kill_list_of(column)
        assert isinstance(kill, SortedIds) and list(kill) == ["ad-1", "ad-2", "ad-3"] and "ad-2" in kill
