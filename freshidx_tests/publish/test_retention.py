"""Rollback (pointer CAS to an earlier published version) and GC of old / abandoned / orphaned files."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from freshidx import cli
from freshidx.publish.commit import iso, publish, read_pointer
from freshidx.publish.retention import (
    RetentionError,
    gc,
    history_entries,
    rollback,
)
from freshidx.serve.searcher import Searcher
from freshidx.spark.index_format import INDEX_DIR
from freshidx.store import ObjectStore, StoreConfig, layout, open_store
from freshidx_tests.spark.test_index_shards import T0, ad, build_direct, draft, publish_commits

HOUR = dt.timedelta(hours=1)


def at(i: int) -> dt.datetime:
    return T0 + dt.timedelta(minutes=i)


def put_version(store: ObjectStore, cfg: StoreConfig, index: str, version: str, title: str, minute: int) -> None:
    publish_commits(store, index, version, at(minute), build_direct(cfg, index, version, [ad(1, 1, title=title)], 1))


def test_rollback_restores_previous_answer(local_store_config: StoreConfig, tmp_path: Path) -> None:
    cfg = local_store_config
    store = open_store(cfg)
    with pytest.raises(RetentionError, match="nothing published"):
        rollback(store, "full")
    put_version(store, cfg, "full", "v1", "apple", 1)
    put_version(store, cfg, "full", "v2", "banana", 2)
    searcher = Searcher(store, tmp_path / "cache")
    assert [h.title for h in searcher.search("banana")] == ["banana"] and searcher.search("apple") == []

    for bad in ("nope", "v2"):  # never published; already current
        with pytest.raises(RetentionError):
            rollback(store, "full", bad)
    pointer = rollback(store, "full")  # default: the previous published version
    assert (pointer.version, pointer.action, pointer.seq, pointer.previous_version) == ("v1", "rollback", 3, "v2")
    assert pointer.position == iso(at(1))
    assert read_pointer(store, "full")[0] == pointer
    assert store.get_json(layout.history_key("full", 3))[0]["action"] == "rollback"
    assert searcher.refresh() is True
    assert [h.title for h in searcher.search("apple")] == ["apple"] and searcher.search("banana") == []
    with pytest.raises(RetentionError, match="no published version before"):
        rollback(store, "full")  # v1 is the oldest
    # forward again to v2 explicitly, then a normal publication proceeds (newer than v2's position)
    assert rollback(store, "full", "v2").version == "v2"
    put_version(store, cfg, "full", "v3", "cherry", 3)
    assert [e.version for e in history_entries(store, "full")] == ["v3", "v2", "v1", "v2", "v1"]
    # a publication not newer than the (rolled back) pointer is still refused
    res = publish(store, draft("full", "v0", at(3), build_direct(cfg, "full", "v0", [ad(1, 1)], 1)))
    assert res.outcome == "superseded"
    # files gone: refused
    gone = next(k for k in (o.key for o in store.list(layout.version_prefix("full", "v1")).objects)
                if k.endswith(".store"))
    store.delete(gone)
    with pytest.raises(RetentionError, match="file"):
        rollback(store, "full", "v1")
    with pytest.raises(ValueError):
        rollback(store, "nope")


def test_gate_refusals_leave_the_serving_answer(local_store_config: StoreConfig, tmp_path: Path) -> None:
    cfg = local_store_config
    store = open_store(cfg)
    ads = [ad(i, i, title=f"banana {i}") for i in range(1, 11)]
    publish_commits(store, "full", "v1", at(1), build_direct(cfg, "full", "v1", ads, 2))
    searcher = Searcher(store, tmp_path / "cache")
    serving = [(h.ad_id, h.version) for h in searcher.search("banana", k=20)]
    assert len(serving) == 10 and {v for _, v in serving} == {"v1"}

    empty = publish(store, draft("full", "v2", at(2), build_direct(cfg, "full", "v2", [], 2)))
    assert empty.outcome == "invalid" and "empty document set" in empty.reason
    one = build_direct(cfg, "full", "v3", [ad(1, 1, title="cherry")], 2)
    collapsed = publish(store, draft("full", "v3", at(3), one), max_drop_fraction=0.5)
    assert collapsed.outcome == "invalid" and "collapsed" in collapsed.reason
    # The reader already serving and a reader started now both answer from v1, as before.
    assert searcher.refresh() is False
    assert [(h.ad_id, h.version) for h in searcher.search("banana", k=20)] == serving
    fresh = Searcher(store, tmp_path / "cache-fresh")
    assert fresh.versions()["full"] == "v1" and fresh.search("cherry") == []
    assert [(h.ad_id, h.version) for h in fresh.search("banana", k=20)] == serving


def _orphan(store: ObjectStore, index: str, version: str, shard: int, attempt: int) -> str:
    key = layout.shard_prefix(index, version, shard, attempt) + INDEX_DIR + "meta.json"
    store.put(key, b"{}")
    return layout.shard_prefix(index, version, shard, attempt)


def test_gc(store_config: StoreConfig, tmp_path: Path) -> None:
    cfg = store_config
    store = open_store(cfg)
    for i in range(1, 6):
        put_version(store, cfg, "delta", f"v{i}", f"title{i}", 10 + i)
    # refused (superseded) build: manifest written, never current
    res = publish(store, draft("delta", "v0-late", at(1), build_direct(cfg, "delta", "v0-late", [ad(2, 2)], 1)))
    assert res.outcome == "superseded"
    # abandoned build: staged files, no manifest
    build_direct(cfg, "delta", "v9-staged", [ad(3, 3)], 1)
    # attempt orphans (a retried task's first upload) in the current and in an old version
    orphan_current = _orphan(store, "delta", "v5", 0, 7)
    orphan_old = _orphan(store, "delta", "v1", 0, 3)
    current_files = {o.key for o in store.list(layout.version_prefix("delta", "v5")).objects} - {
        orphan_current + "index/meta.json"}
    other_index = build_direct(cfg, "full", "f1", [ad(1, 1)], 1)

    young = gc(store, "delta", keep_last=2, grace=HOUR)  # everything is younger than the grace period
    assert (young.deleted_versions, young.deleted_orphans, young.deleted_objects) == ([], [], 0)
    assert young.kept == ["v5", "v4"] and young.current == "v5"
    assert set(young.young) == {"v1", "v2", "v3", "v0-late", "v9-staged"}

    later = dt.datetime.now(dt.UTC) + 2 * HOUR
    dry = gc(store, "delta", keep_last=2, grace=HOUR, now=later, dry_run=True)
    assert sorted(dry.deleted_versions) == ["v0-late", "v1", "v2", "v3", "v9-staged"]
    assert store.exists(layout.manifest_key("delta", "v1"))  # dry run: nothing deleted

    report = gc(store, "delta", keep_last=2, grace=HOUR, now=later)
    assert sorted(report.deleted_versions) == ["v0-late", "v1", "v2", "v3", "v9-staged"]
    assert report.deleted_orphans == [orphan_current]
    assert orphan_old.startswith(layout.version_prefix("delta", "v1"))  # went with its version
    remaining = {o.key for o in store.list("indexes/delta/versions/").objects}
    assert remaining == current_files | {o.key for o in store.list(layout.version_prefix("delta", "v4")).objects}
    assert all(store.exists(k) for k in current_files)
    assert {f.key for c in other_index for f in c.files} <= {o.key for o in store.list("indexes/full/").objects}
    assert store.exists(layout.pointer_key("delta")) and store.exists(layout.history_key("delta", 5))
    assert store.list("indexes/delta/versions/", delimiter="/").prefixes == [
        layout.version_prefix("delta", "v4"), layout.version_prefix("delta", "v5")]

    # rolled back to an old version: the current version is kept whatever keep_last says
    rollback(store, "delta", "v4")
    again = gc(store, "delta", keep_last=1, grace=HOUR, now=later)
    assert again.kept == ["v4"] and again.deleted_versions == ["v5"]
    assert read_pointer(store, "delta")[0].version == "v4"  # type: ignore[union-attr]
    assert [h.title for h in Searcher(store, tmp_path / "cache").search("title4")] == ["title4"]
    with pytest.raises(RetentionError):
        rollback(store, "delta", "v5")  # its files are gone now


def test_gc_is_bounded(local_store_config: StoreConfig) -> None:
    store = open_store(local_store_config)
    for i in range(1, 5):
        put_version(store, local_store_config, "full", f"v{i}", "x", i)
    later = dt.datetime.now(dt.UTC) + 2 * HOUR
    first = gc(store, "full", keep_last=1, grace=HOUR, now=later, max_versions=2)
    assert first.truncated and first.deleted_versions == ["v1", "v2"]
    second = gc(store, "full", keep_last=1, grace=HOUR, now=later, max_versions=2)
    assert not second.truncated and second.deleted_versions == ["v3"] and second.kept == ["v4"]
    with pytest.raises(ValueError):
        gc(store, "full", keep_last=0, grace=HOUR)


def test_cli(local_store_config: StoreConfig, capsys: pytest.CaptureFixture[str]) -> None:
    store = open_store(local_store_config)
    put_version(store, local_store_config, "full", "v1", "a", 1)
    put_version(store, local_store_config, "full", "v2", "b", 2)
    store_args = ["--store", local_store_config.uri]

    assert cli.main(["rollback", "full", "--json", *store_args]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["pointer"]["version"] == "v1" and out["pointer"]["action"] == "rollback"
    assert cli.main(["rollback", "full", "--to", "zzz", "--json", *store_args]) == 1
    assert not json.loads(capsys.readouterr().out)["ok"]

    assert cli.main(["gc", "full", "--keep", "1", "--grace-minutes", "0", "--dry-run", "--json", *store_args]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["dry_run"] and report["current"] == "v1" and report["deleted_versions"] == ["v2"]
    assert cli.main(["gc", "delta", *store_args]) == 0
    assert "current None" in capsys.readouterr().out
