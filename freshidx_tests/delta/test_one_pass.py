"""One pass per incremental micro-batch (freshidx.delta.executor.one_pass): a micro-batch is one Spark job
whose tasks also count, quarantine and check conflicts; the Arrow conflict pre-check never misses one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from freshidx.cli.quarantine import entries
from freshidx.delta.delta_build import DeltaPlan, build_delta
from freshidx.delta.executor import one_pass
from freshidx.delta.executor.state_lookup import state_file_refs
from freshidx.delta.executor.warm_state import warm_state
from freshidx.delta.serving_state import state_layers
from freshidx.full.full_build import build_full
from freshidx.publish.commit import publish
from freshidx.serve.searcher import Searcher
from freshidx.settings import Settings
from freshidx.spark import transform
from freshidx.store import StoreConfig, layout, open_store
from freshidx_tests.delta.test_version_conflicts import SOURCE, _lines, rec
from freshidx_tests.support.harness import at


def _valid_arrow(spark: SparkSession, rows: list[tuple[int, str, int, str]]) -> Any:
    parsed = transform.parse_records(_lines(spark, rows))
    return parsed.filter("reason is null").select(*transform.TYPED_FIELDS).toArrow()


def test_the_arrow_pre_check_says_maybe_whenever_spark_finds_a_conflict(spark: SparkSession) -> None:
    same = [(0, "a.jsonl", 1, rec("ad-2", 0, "same")), (5, "b.jsonl", 1, rec("ad-2", 0, "same", spelled=True)),
            (0, "a.jsonl", 2, rec("ad-4", 0, "v1")), (0, "a.jsonl", 3, rec("ad-4", 0, "v2", version=2)),
            (0, "a.jsonl", 4, "{not json")]
    assert not one_pass.may_conflict(_valid_arrow(spark, same))
    differing = [rec("ad-2", 0, "same", seconds=1), rec("ad-2", 0, "same", status="paused"),
                 rec("ad-2", 0, "other"), rec("ad-2", 0, "same", bid=2.5)]
    base = json.loads(rec("ad-5", 0, "kw"))
    # Lists that differ only in nulls, and separators inside values: never equal by accident.
    pairs = [[json.dumps({**base, "keywords": kw}) for kw in (a, b)]
             for a, b in [(None, []), (["k", None], [None, "k"]), ([None], []), (["a b"], ["a", "b"]),
                          (["a|b"], ["a", "b"])]]
    pairs += [[json.dumps({**base, "title": t}) for t in ("x|1:y", "x")]]
    cases = [[*same, (5, "c.jsonl", 9, d)] for d in differing]
    cases += [[(0, "a.jsonl", 1, a), (5, "b.jsonl", 1, b)] for a, b in pairs]
    for rows in cases:
        assert transform.may_have_version_conflicts(transform.parse_records(_lines(spark, rows)))
        assert one_pass.may_conflict(_valid_arrow(spark, rows)), rows


def _publish(store: Any, draft: Any) -> None:
    result = publish(store, draft, max_drop_fraction=None)
    assert result.outcome == "published", result.reason


def _put(store: Any, minutes: int, lines: list[str], name: str = "part-0.jsonl") -> str:
    key = layout.raw_partition_prefix(SOURCE, at(minutes)) + name
    store.put(key, "".join(line + "\n" for line in lines).encode())
    return key


@pytest.mark.parametrize("shards", [1, 3])
def test_a_micro_batch_is_one_spark_job_that_also_quarantines_and_reports(
        spark: SparkSession, tmp_path: Path, shards: int) -> None:
    """At most ``shards`` segment shards, and no more than the session's two task slots: each task parses
    the whole batch, so a second wave would parse it again."""
    cfg = StoreConfig(uri=(tmp_path / "store").as_uri())
    store = open_store(cfg)
    settings = Settings.from_env({}, store=cfg.uri, window_minutes=60, delta_segment_shards=shards,
                                 delta_segment_shard_mb=0)
    _put(store, 0, [rec(f"ad-{i}", 0, f"anchor {i}") for i in range(20)])
    _publish(store, build_full(spark, store, cfg, settings, cutoff=at(0), run_id="full-0", run_info={}))

    def micro_batch(minutes: int, run_id: str) -> tuple[Any, list[int]]:
        spark.sparkContext.setJobGroup(run_id, "micro-batch")
        try:
            draft = build_delta(spark, store, cfg, settings, DeltaPlan(at(minutes), None, run_id, {}))
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        return draft, list(spark.sparkContext.statusTracker().getJobIdsForGroup(run_id))

    key = _put(store, 5, [rec("ad-1", 5, "changed one", version=2), "{broken", rec("ad-30", 5, "new thirty"),
                          json.dumps({**json.loads(rec("ad-31", 5, "x")), "bid": "1.5"})])
    draft, jobs = micro_batch(5, f"mb-5-{shards}")
    assert draft.inputs["build"] == "incremental" and len(draft.shards) == min(shards, 2)
    assert len(jobs) == 1, f"one Spark job per micro-batch, got {len(jobs)}"
    assert draft.invalid["reasons"] == {"malformed_json": 1, "bad_bid": 1}
    assert [(q["partition"], q["records"]) for q in draft.invalid["quarantine"]] == [(at(5).path, 2)]
    assert sorted((e["file"], e["line"], e["reason"]) for _, e in entries(store, SOURCE)) == [
        (key, 2, "malformed_json"), (key, 4, "bad_bid")]
    assert {f"{k}_seconds" for k in one_pass.STEPS} <= draft.stats.keys()
    _publish(store, draft)
    # What the continuous loop does while idle: one job decodes the state the next micro-batch reads.
    named = state_layers(store)
    assert named is not None and named[0] == (draft.segments[-1]["full_version"], draft.version)
    # A spent budget: the key indexes only (the idle loop's next tick goes on), then the rest.
    assert not warm_state(spark, cfg, named[1], tasks=shards, cache_bytes=64 << 20, budget_s=0.0).complete
    warmed = warm_state(spark, cfg, named[1], tasks=shards, cache_bytes=64 << 20)
    assert warmed.files == len(state_file_refs(named[1])) > 0 and warmed.complete
    assert warmed.decoded > 0  # the new segment's row groups at least: no worker has decoded them yet

    # A conflict inside the batch: the second job reports both copies; the winner is served.
    _put(store, 10, [rec("ad-c", 10, "alpha conflict"), rec("ad-c", 10, "beta conflict", seconds=30)])
    draft, jobs = micro_batch(10, f"mb-10-{shards}")
    assert draft.inputs["build"] == "incremental" and len(jobs) > 1
    assert draft.invalid["conflicts"]["ads"] == 1 and draft.invalid["conflicts"]["records"] == 2
    assert draft.invalid["reasons"] == {} and draft.invalid["quarantine"] == []
    _publish(store, draft)
    s = Searcher(store, tmp_path / "cache")
    s.refresh()
    assert [h.ad_id for h in s.search("changed", k=10)] == ["ad-1"]
    assert [(h.ad_id, h.title) for h in s.search("conflict", k=10)] == [("ad-c", "beta conflict")]

    # A line only Spark reads for sure (a numeric ad_id is the text "123" there): the lines Spark parsed.
    odd = json.dumps({**json.loads(rec("x", 15, "numeric id")), "ad_id": 123})
    _put(store, 15, [odd, rec("ad-2", 15, "also changed", version=2)])
    draft, jobs = micro_batch(15, f"mb-15-{shards}")
    assert draft.inputs["build"] == "incremental" and len(jobs) == 2 and "spark_parse_seconds" in draft.stats
    _publish(store, draft)
    s.refresh()
    assert [h.ad_id for h in s.search("numeric", k=10)] == ["123"]
    assert [h.ad_id for h in s.search("also", k=10)] == ["ad-2"]
    anchors = {h.ad_id for h in s.search("anchor", k=100)}
    assert not {"ad-1", "ad-2"} & anchors and len(anchors) == 18  # their old documents are killed


def test_the_task_survives_shipping_by_value(tmp_path: Path) -> None:
    # A Spark Connect client may ship freshidx by value (code_shipping.ship_by_value): the task and every
    # module global it reaches are pickled (a JSON decoder's C scanner, kept as a global, failed every
    # micro-batch that way).
    from pyspark import cloudpickle

    import freshidx
    from freshidx.spark.raw_source import ARROW_SCHEMA

    job = one_pass.MicroBatchJob("{}", [], [], 0, 0, "delta", "v", 2, SOURCE, "run", 3600)
    cloudpickle.register_pickle_by_value(freshidx)
    try:
        task = cloudpickle.loads(cloudpickle.dumps(one_pass._task(job, None)))
        parse = cloudpickle.loads(cloudpickle.dumps(one_pass.parse_lines))
    finally:
        cloudpickle.unregister_pickle_by_value(freshidx)
    assert callable(task)
    lines = [rec("ad-1", 5, "shipped"), "{broken"]
    table = pa.Table.from_pydict({"partition": [at(5).path] * 2, "file": ["k"] * 2, "line": [1, 2], "raw": lines,
                                  "bad_encoding": [False] * 2, "original": [None] * 2, "object_error": [None] * 2},
                                 schema=ARROW_SCHEMA)
    parsed = parse(table)
    assert parsed.column("reason").to_pylist() == [None, "malformed_json"]
