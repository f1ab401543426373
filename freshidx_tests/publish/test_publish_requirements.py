"""Publication requirements and their pure check (:mod:`freshidx.publish.requirements`): no store."""

from __future__ import annotations

import dataclasses
from typing import Any

from freshidx.delta.segments import BuildKind
from freshidx.publish.commit import DraftManifest, Pointer
from freshidx.publish.requirements import (
    INCREMENTAL,
    RequireBase,
    RequireDropWithin,
    RequireNewerThanServing,
    RequireNothingServing,
    RequireValid,
    Serving,
    base_requirement,
    check,
    gate_requirements,
    needs_serving_manifest,
    staged_keys,
    swap_requirements,
)

T = "2026-11-21T14:{:02d}:00.000000Z"


def pointer(version: str, minute: int, *, docs: int = 10, cutoff: bool = False) -> Pointer:
    return Pointer(index="delta", version=version, seq=1, position=T.format(minute), manifest="m", doc_count=docs,
                   published_at=T.format(minute), run_id=f"run-{version}", cutoff=T.format(minute) if cutoff else None)


def draft(version: str, minute: int, *, docs: int = 10, shards: int = 2, **inputs: Any) -> DraftManifest:
    sh = [{"shard": n, "attempt": 0, "doc_count": docs // shards,
           "files": [{"key": f"{version}/shards/shard-{n:05d}-a0/docs.parquet", "bytes": 100}]} for n in range(shards)]
    return DraftManifest(index="delta", version=version, position=T.format(minute), run_id="r", shards=sh,
                         doc_count=docs, num_shards=shards, inputs=dict(inputs))


def staged(d: DraftManifest, **sizes: int | None) -> dict[str, int | None]:
    """Every file of ``d`` staged with its size, except the overrides (by shard number)."""
    out: dict[str, int | None] = {k: 100 for k in staged_keys(d)}
    for shard, size in sizes.items():
        out[d.shards[int(shard.removeprefix("s"))]["files"][0]["key"]] = size
    return out


def segmented(d: DraftManifest, base: str | None, build: str) -> DraftManifest:
    seg = {"version": d.version, "shards": d.shards}
    return dataclasses.replace(d, segments=[seg], inputs={**d.inputs, "based_on": base, "build": build})


# ---------------------------------------------------------------------------- each requirement


def test_drop_within_holds_without_a_serving_count_and_within_the_fraction() -> None:
    req = RequireDropWithin(0.5)
    assert req.validate(Serving(None), draft("v", 1, docs=1)).outcome is None
    assert req.validate(Serving(pointer("s", 0, docs=0)), draft("v", 1, docs=1)).outcome is None
    assert req.validate(Serving(pointer("s", 0, docs=10)), draft("v", 1, docs=6)).outcome is None
    assert req.validate(Serving(pointer("s", 0, docs=10)), draft("v", 1, docs=5)).outcome is None  # at the floor
    failed = req.validate(Serving(pointer("s", 0, docs=10)), draft("v", 1, docs=4))
    assert failed.outcome == "invalid" and "document count collapsed: 4 < 5" in failed.reason


def test_valid_checks_shape_counts_and_staged_files() -> None:
    d = draft("v", 1)
    assert RequireValid(staged(d)).validate(Serving(None), d).outcome is None
    missing = RequireValid(staged(d, s1=None)).validate(Serving(None), d)
    assert missing.outcome == "invalid" and missing.reason == f"staged file missing: {d.shards[1]['files'][0]['key']}"
    size = RequireValid(staged(d, s0=99)).validate(Serving(None), d)
    assert "staged file size mismatch" in size.reason and "99 != 100" in size.reason
    empty = draft("e", 1, docs=0)
    assert RequireValid(staged(empty)).validate(Serving(None), empty).reason == "empty document set"
    assert RequireValid(staged(empty), allow_empty=True).validate(Serving(None), empty).outcome is None
    renumbered = dataclasses.replace(d, shards=[{**d.shards[0], "shard": 1}, d.shards[1]])
    assert "not 0..n-1" in RequireValid(staged(d)).validate(Serving(None), renumbered).reason
    fewer = dataclasses.replace(d, num_shards=3)
    assert "expected 3 shards, got 2" in RequireValid(staged(d)).validate(Serving(None), fewer).reason
    formatted = draft("f", 1, format="tantivy-v1")
    assert "lacks" in RequireValid(staged(formatted)).validate(Serving(None), formatted).reason
    miscounted = dataclasses.replace(d, doc_count=11)
    assert "doc_count does not equal" in RequireValid(staged(d)).validate(Serving(None), miscounted).reason


def test_nothing_serving_is_create_once_and_final() -> None:
    req = RequireNothingServing()
    assert req.validate(Serving(None), draft("v", 1)).outcome is None
    verdict = check([req], Serving(pointer("s", 0)), draft("v", 1))
    assert (verdict.outcome, verdict.final, verdict.requirement) == ("superseded", True, req)
    assert verdict.reason == "superseded: already published as version s (run run-s)"


def test_base_holds_over_its_base_or_nothing_and_is_not_final_otherwise() -> None:
    d = draft("v", 1)
    assert RequireBase("a").validate(Serving(pointer("a", 0)), d).outcome is None
    assert RequireBase("a").validate(Serving(None), d).outcome is None
    verdict = check([RequireBase("a")], Serving(pointer("b", 0)), d)
    assert verdict.outcome == "invalid" and not verdict.final
    assert verdict.reason.startswith("validation failed: base changed: built on delta version a, but b serves")
    assert "built on no delta" in check([RequireBase(None)], Serving(pointer("b", 0)), d).reason


def test_base_requirement_of_a_draft() -> None:
    assert INCREMENTAL == BuildKind.INCREMENTAL  # the delta's build kind, spelled as the manifest stores it
    assert base_requirement(draft("v", 1)) is None  # not segmented (the full index, a catch-up hour)
    assert base_requirement(segmented(draft("v", 1), "a", "incremental")) == RequireBase("a")
    assert base_requirement(segmented(draft("v", 1), None, "incremental")) == RequireBase(None)
    assert base_requirement(segmented(draft("v", 1), None, "rebuild")) is None  # rests on the window alone


def test_newer_than_serving_by_position() -> None:
    req = RequireNewerThanServing()
    assert req.validate(Serving(None), draft("v", 1)).reason == "nothing published yet"
    newer = req.validate(Serving(pointer("s", 1)), draft("v", 2))
    assert newer.outcome is None and "is newer than published" in newer.reason
    for minute in (0, 1):  # older, and the same partition again
        verdict = check([req], Serving(pointer("s", 1)), draft("v", minute))
        assert verdict.outcome == "superseded" and verdict.final and "not newer" in verdict.reason


def test_newer_than_serving_same_cutoff_compares_inputs() -> None:
    serving = pointer("s", 1, cutoff=True)
    manifest = {"inputs": {"files_sha256": "aaa", "listed_at": T.format(5)}}
    same = dataclasses.replace(draft("v", 1, files_sha256="aaa", listed_at=T.format(9)), cutoff=T.format(1))
    assert needs_serving_manifest(same, serving) and not needs_serving_manifest(same, pointer("s", 1))
    unchanged = check([RequireNewerThanServing()], Serving(serving, manifest), same)
    assert unchanged.outcome == "unchanged" and unchanged.final
    late = dataclasses.replace(same, inputs={"files_sha256": "bbb", "listed_at": T.format(9)})
    ok = check([RequireNewerThanServing()], Serving(serving, manifest), late)
    assert ok.ok and ok.reason.startswith("same cutoff")
    slow = dataclasses.replace(same, inputs={"files_sha256": "bbb", "listed_at": T.format(3)})
    assert check([RequireNewerThanServing()], Serving(serving, manifest), slow).outcome == "superseded"


def test_a_compaction_is_newer_than_exactly_the_version_it_compacted() -> None:
    compacted = draft("m", 1, build="compaction", based_on="s")
    assert check([RequireNewerThanServing()], Serving(pointer("s", 1)), compacted).ok
    assert check([RequireNewerThanServing()], Serving(pointer("t", 1)), compacted).outcome == "superseded"


# ---------------------------------------------------------------------------- check: order and the gate


def test_first_failing_requirement_decides_in_order() -> None:
    d = segmented(draft("v", 1), "a", "incremental")  # built on a; b (a later position) serves: fails all three
    serving = Serving(pointer("b", 5))
    reqs = swap_requirements(d, only_if_absent=True)
    assert [type(r) for r in reqs] == [RequireNothingServing, RequireBase, RequireNewerThanServing]
    assert check(reqs, serving, d).requirement == reqs[0]
    assert check(reqs[1:], serving, d).requirement == reqs[1]
    assert check(reqs[2:], serving, d).requirement == reqs[2]
    assert [type(r) for r in swap_requirements(draft("v", 1))] == [RequireNewerThanServing]


def test_all_holding_says_why_the_draft_is_newer() -> None:
    d = segmented(draft("v", 5), "a", "incremental")
    verdict = check(swap_requirements(d), Serving(pointer("a", 1)), d)
    assert verdict.ok and verdict.outcome is None and not verdict.final and verdict.requirement is None
    assert "is newer than published" in verdict.reason


def test_the_gate_reports_every_problem_of_its_requirements_together() -> None:
    d = draft("v", 1, docs=2)
    gate = gate_requirements(d, staged(d, s1=None), max_drop_fraction=0.5)
    assert [type(r) for r in gate] == [RequireDropWithin, RequireValid]
    verdict = check(gate, Serving(pointer("s", 0, docs=10)), d)
    assert verdict.outcome == "invalid" and verdict.requirement == gate[0] and not verdict.final
    assert verdict.reason.startswith("validation failed: document count collapsed: 2 < 5")
    assert verdict.reason.endswith(f"; staged file missing: {d.shards[1]['files'][0]['key']}")
    forced = gate_requirements(d, staged(d), max_drop_fraction=None)  # force: no drop guard
    assert [type(r) for r in forced] == [RequireValid] and check(forced, Serving(pointer("s", 0, docs=10)), d).ok
