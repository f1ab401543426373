"""Publication protocol (docs/architecture.md#invariants, 1-3), on a local directory and on the moto S3 server."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import subprocess
import sys
import threading

import pytest

from freshidx.publish.commit import DraftManifest, Pointer, PublishResult, iso, new_version, publish, read_pointer
from freshidx.store import ObjectStore, StoreConfig, layout, open_store
from freshidx.store.partitions import PartitionId

T0 = dt.datetime(2026, 11, 21, 14, 0, tzinfo=dt.UTC)


def draft(store: ObjectStore, minutes: int, *, docs: int = 10, stage: bool = True) -> DraftManifest:
    """A draft whose shards really exist in the store (what the Spark build would have staged)."""
    p = PartitionId(T0 + dt.timedelta(minutes=minutes))
    version = new_version(p.at)
    shards = []
    for shard in range(2):
        key = layout.shard_prefix("delta", version, shard, 0) + "docs.parquet"
        body = b"x" * (100 + shard)
        if stage:
            store.put(key, body)
        shards.append({"shard": shard, "attempt": 0, "doc_count": docs // 2, "covered_count": docs // 2,
                       "files": [{"key": key, "bytes": len(body), "sha256": "-", "rows": docs // 2}]})
    return DraftManifest(index="delta", version=version, position=iso(p.at), run_id=f"run-{minutes}",
                         shards=shards, doc_count=docs, num_shards=2, source_partition=p.path,
                         window_start=iso(p.at - dt.timedelta(hours=5)), window_end=iso(p.at))


def history(store: ObjectStore) -> list[dict]:
    return [store.get_json(o.key)[0] for o in store.list("indexes/delta/history/").objects]


def test_publish_then_newer_then_history(store: ObjectStore) -> None:
    d1 = draft(store, 0)
    r1 = publish(store, d1)
    assert r1.outcome == "published" and r1.pointer is not None and r1.pointer.seq == 1
    d2 = draft(store, 5)
    r2 = publish(store, d2)
    assert r2.outcome == "published"
    ptr, _ = read_pointer(store, "delta")
    assert ptr is not None
    assert (ptr.version, ptr.seq, ptr.previous_version) == (d2.version, 2, d1.version)
    assert ptr.source_partition == d2.source_partition  # pointer = watermark
    assert [h["version"] for h in history(store)] == [d1.version, d2.version]
    manifest = store.get_json(layout.manifest_key("delta", d2.version))[0]
    assert manifest["shards"] == d2.shards


def test_older_or_equal_publish_is_refused_and_recorded(store: ObjectStore) -> None:
    newer = draft(store, 10)
    assert publish(store, newer).outcome == "published"
    for minutes in (5, 10):  # older, and same partition again
        old = draft(store, minutes)
        r = publish(store, old)
        assert r.outcome == "superseded", r
        refusal = store.get_json(layout.refusal_key("delta", old.version))[0]
        assert refusal["outcome"] == "superseded" and refusal["current_version"] == newer.version
    ptr, _ = read_pointer(store, "delta")
    assert ptr is not None and ptr.version == newer.version and ptr.seq == 1


def test_validation_gate_keeps_previous_version_serving(store: ObjectStore) -> None:
    good = draft(store, 0)
    publish(store, good)
    missing = draft(store, 5, stage=False)  # staged files absent
    r = publish(store, missing)
    assert r.outcome == "invalid" and "staged file missing" in r.reason
    empty = dataclasses.replace(draft(store, 10, docs=0))
    r = publish(store, empty)
    assert r.outcome == "invalid" and "empty document set" in r.reason
    ptr, _ = read_pointer(store, "delta")
    assert ptr is not None and ptr.version == good.version
    assert not store.exists(layout.manifest_key("delta", missing.version))  # never got a manifest
    assert store.get_json(layout.refusal_key("delta", empty.version))[0]["outcome"] == "invalid"


CRASH_SCRIPT = """
import json, sys
from freshidx.store import StoreConfig, open_store
from freshidx.publish.commit import DraftManifest, publish
cfg = StoreConfig(**json.loads(sys.argv[1]))
publish(open_store(cfg), DraftManifest(**json.loads(sys.argv[2])))
print("survived")
"""


def run_publisher(cfg: StoreConfig, d: DraftManifest, crash_at: str | None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if crash_at:
        env["FRESHIDX_CRASH_AT"] = crash_at
    cfg_json = json.dumps({f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})
    return subprocess.run([sys.executable, "-c", CRASH_SCRIPT, cfg_json, json.dumps(d.to_dict())],
                          env=env, capture_output=True, text=True, timeout=120)


def test_process_killed_after_staging_before_cas_leaves_pointer_unchanged(
    store: ObjectStore, store_config: StoreConfig
) -> None:
    serving = draft(store, 0)
    publish(store, serving)
    before = store.get(layout.pointer_key("delta"))
    staged = draft(store, 5)
    proc = run_publisher(store_config, staged, "before_cas")
    assert proc.returncode == 86 and "survived" not in proc.stdout, proc.stderr
    after = store.get(layout.pointer_key("delta"))
    assert after.data == before.data  # unchanged ...
    assert Pointer.from_dict(json.loads(after.data)).version == serving.version  # ... and readable
    # The staged version exists (manifest written) but nothing references it.
    assert store.exists(layout.manifest_key("delta", staged.version))
    # The next publish proceeds normally.
    assert publish(store, draft(store, 10)).outcome == "published"


def test_process_killed_right_after_cas_history_heals(store: ObjectStore, store_config: StoreConfig) -> None:
    publish(store, draft(store, 0))
    d = draft(store, 5)
    proc = run_publisher(store_config, d, "after_cas")
    assert proc.returncode == 86
    ptr, _ = read_pointer(store, "delta")
    assert ptr is not None and ptr.version == d.version and ptr.seq == 2
    assert [h["seq"] for h in history(store)] == [1]  # history entry 2 was lost with the process
    publish(store, draft(store, 10))
    assert [h["seq"] for h in history(store)] == [1, 2, 3]  # healed by the next publisher


@pytest.mark.parametrize("first_swap", ["newer", "older"])
def test_concurrent_publishers_newer_wins_older_refused(store: ObjectStore, first_swap: str) -> None:
    """Both publishers read the same pointer, then swap in a forced order (both interleavings)."""
    base = draft(store, 0)
    publish(store, base)
    drafts = {"older": draft(store, 5), "newer": draft(store, 10)}
    second = "older" if first_swap == "newer" else "newer"
    both_read = threading.Barrier(2)
    first_done = threading.Event()
    results: dict[str, PublishResult] = {}

    def go(name: str) -> None:
        calls = [0]

        def sync(_: Pointer | None) -> None:
            calls[0] += 1
            if calls[0] == 1:  # both hold the same pointer and ETag ...
                both_read.wait(timeout=30)
                if name == second:  # ... and the second one swaps only after the first has published
                    assert first_done.wait(timeout=30)

        try:
            results[name] = publish(store, drafts[name], before_swap=sync)
        finally:
            if name == first_swap:
                first_done.set()

    threads = [threading.Thread(target=go, args=(n,)) for n in ("older", "newer")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    ptr, _ = read_pointer(store, "delta")
    assert ptr is not None and ptr.version == drafts["newer"].version
    assert results["newer"].outcome == "published"
    if first_swap == "newer":  # the older one's CAS fails, it re-reads, sees a newer index: refused
        assert results["older"].outcome == "superseded" and results["older"].cas_attempts == 2
        refusal = store.get_json(layout.refusal_key("delta", drafts["older"].version))[0]
        assert refusal["current_version"] == drafts["newer"].version
    else:  # the older one published first; the newer one's CAS failed, it re-read and replaced it
        assert results["older"].outcome == "published" and results["newer"].cas_attempts == 2
    assert [h["version"] for h in history(store)][-1] == drafts["newer"].version


def test_older_publisher_arriving_second_is_refused(store: ObjectStore) -> None:
    older, newer = draft(store, 5), draft(store, 10)
    assert publish(store, newer).outcome == "published"
    r = publish(store, older)
    assert r.outcome == "superseded"
    assert store.get_json(layout.refusal_key("delta", older.version))[0]["current_version"] == newer.version


def test_open_store_from_uri_string_roundtrip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    s = open_store(str(tmp_path / "s"))
    publish(s, draft(s, 0))
    assert read_pointer(s, "delta")[0] is not None


def test_collapsed_document_count_is_refused_unless_forced(store: ObjectStore) -> None:
    assert publish(store, draft(store, 0, docs=1000)).outcome == "published"
    collapsed = draft(store, 5, docs=10)
    r = publish(store, collapsed, max_drop_fraction=0.5)
    assert r.outcome == "invalid" and "collapsed" in r.reason
    assert read_pointer(store, "delta")[0].doc_count == 1000  # type: ignore[union-attr]
    forced = draft(store, 10, docs=10)
    assert publish(store, forced, max_drop_fraction=None).outcome == "published"  # force = no guard
    assert publish(store, draft(store, 15, docs=8), max_drop_fraction=0.5).outcome == "published"  # 20% drop ok


def test_shard_without_index_files_fails_the_schema_check(store: ObjectStore) -> None:
    d = draft(store, 0)
    d.inputs["format"] = "tantivy-v1"  # the staged shards hold only docs.parquet: not an index
    r = publish(store, d)
    assert r.outcome == "invalid" and "lacks" in r.reason


def test_publishing_the_serving_draft_again_is_published_not_superseded(store: ObjectStore) -> None:
    """A step retried after its swap landed (response lost, process died after the CAS) finds its
    own version serving: that is a success, with history and manifest intact, no refusal."""
    d = draft(store, 0)
    assert publish(store, d).outcome == "published"
    again = publish(store, d)
    assert again.outcome == "published" and again.pointer is not None and again.pointer.seq == 1
    assert [h["version"] for h in history(store)] == [d.version]
    assert not store.exists(layout.refusal_key("delta", d.version))


def _segmented(store: ObjectStore, minutes: int, base: DraftManifest | None, build: str = "") -> DraftManifest:
    """An incremental draft: the base's segments plus a new one (a rebuild when ``base`` is None, unless
    ``build`` says "incremental": the first delta over the full index alone)."""
    d = draft(store, minutes)
    build = build or ("incremental" if base else "rebuild")
    seg = {"version": d.version, "position": d.position, "kind": build,
           "shards": d.shards, "doc_count": d.doc_count, "covered_count": d.doc_count, "files": [],
           "listed_at": d.position}
    earlier = list(base.segments or []) if base else []
    return dataclasses.replace(d, segments=[*earlier, seg], doc_count=d.doc_count * (len(earlier) + 1),
                               inputs={"based_on": base.version if base else None, "build": build})


def test_two_first_micro_batches_over_the_full_index_never_lose_a_segment(store: ObjectStore) -> None:
    """Two first deltas, each incremental over the full index alone (no delta yet): the second to publish
    would drop the first one's segment, so it is refused (not final) and its retry builds on the first."""
    b = _segmented(store, 5, None, build="incremental")
    c = _segmented(store, 10, None, build="incremental")
    assert publish(store, b).outcome == "published"
    refused = publish(store, c)
    assert refused.outcome == "invalid" and "built on no delta" in refused.reason, refused
    retried = _segmented(store, 10, b)
    assert publish(store, retried).outcome == "published"
    manifest = store.get_json(layout.manifest_key("delta", retried.version))[0]
    assert [s["version"] for s in manifest["segments"]] == [b.version, retried.version]


def test_two_micro_batches_on_the_same_base_never_lose_a_segment(store: ObjectStore) -> None:
    """Both extend version A; B publishes first. C (newer partition) must not replace B with a version that
    lacks B's segment: it is refused as not final (validation), and the retry builds on B."""
    a = _segmented(store, 0, None)
    assert publish(store, a).outcome == "published"
    b = _segmented(store, 5, a)
    c = _segmented(store, 10, a)
    assert publish(store, b).outcome == "published"
    refused = publish(store, c)
    assert refused.outcome == "invalid" and "base changed" in refused.reason, refused
    pointer, _ = read_pointer(store, "delta")
    assert pointer is not None and pointer.version == b.version
    retried = _segmented(store, 10, b)
    assert publish(store, retried).outcome == "published"
    manifest = store.get_json(layout.manifest_key("delta", retried.version))[0]
    assert [s["version"] for s in manifest["segments"]] == [a.version, b.version, retried.version]
