"""Rollback with a lost response: the swap landed, the answer did not.

Before the fix, ``rollback`` reported "pointer moved; re-run it", and re-running rolled back one
version further. Now it re-reads ``CURRENT`` (and the history entry of its generation) and treats its
own pointer as success. Faults are real: on S3 a proxy forwards the PUT to moto and drops the answer
(botocore retries and hears 412); on the local store they are injected at the store layer.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from freshidx.publish.commit import read_pointer
from freshidx.publish.retention import RetentionError, history_entries, rollback
from freshidx.store import ObjectStore, StoreConfig, layout, open_store
from freshidx.store.local import LocalStore
from freshidx_tests.conftest import make_s3_config
from freshidx_tests.publish.test_ambiguous_commit import LostResponses, Mode
from freshidx_tests.publish.test_retention import put_version
from freshidx_tests.support.s3_proxy import S3Proxy, drop_first


def three_versions(store: ObjectStore, cfg: StoreConfig) -> None:
    for i, (version, title) in enumerate((("v1", "apple"), ("v2", "banana"), ("v3", "cherry")), start=1):
        put_version(store, cfg, "full", version, title, i)


def assert_rolled_back_once(store: ObjectStore) -> None:
    """v3 → v2 exactly once: seq 4 is the rollback, and the history is walkable without a gap."""
    ptr, _ = read_pointer(store, "full")
    assert ptr is not None
    assert (ptr.version, ptr.seq, ptr.action, ptr.previous_version) == ("v2", 4, "rollback", "v3")
    assert [(e.version, e.action) for e in history_entries(store, "full")] == [
        ("v2", "rollback"), ("v3", "publish"), ("v2", "publish"), ("v1", "publish")]
    assert store.get_json(layout.history_key("full", 4))[0]["action"] == "rollback"


@pytest.mark.parametrize("mode", ["timeout", "retry"])
def test_lost_response_on_local_store_counts_as_rolled_back(tmp_path: Path, mode: Mode) -> None:
    cfg = StoreConfig(uri=(tmp_path / "store").as_uri())
    local = LocalStore(tmp_path / "store")
    three_versions(local, cfg)
    faulty = LostResponses(local, "/CURRENT", mode)
    pointer = rollback(faulty, "full")
    assert len(faulty.injected) == 1, faulty.injected  # the fault really hit the swap
    assert pointer.version == "v2" and pointer.seq == 4
    assert read_pointer(local, "full")[0] == pointer  # what we return is what readers see
    assert_rolled_back_once(local)


def test_lost_response_then_replaced_by_a_publisher_still_counts(tmp_path: Path) -> None:
    """Our swap landed, and a publication replaced it before we re-read: the history entry of our
    generation (written by that publisher) says the rollback happened."""
    cfg = StoreConfig(uri=(tmp_path / "store").as_uri())
    local = LocalStore(tmp_path / "store")
    three_versions(local, cfg)
    faulty = LostResponses(local, "/CURRENT", "timeout",
                           after_applied=lambda: put_version(local, cfg, "full", "v4", "durian", 4))
    pointer = rollback(faulty, "full")
    assert (pointer.version, pointer.seq, pointer.action) == ("v2", 4, "rollback")
    assert [e.version for e in history_entries(local, "full")] == ["v4", "v2", "v3", "v2", "v1"]


def test_pointer_moved_by_someone_else_is_still_refused(tmp_path: Path) -> None:
    """The re-read must not turn a real lost race into a success."""
    cfg = StoreConfig(uri=(tmp_path / "store").as_uri())
    local = LocalStore(tmp_path / "store")
    three_versions(local, cfg)

    class Racing(LostResponses):
        def swap(self, key: str, data: bytes, expected_etag: str | None) -> str:
            if "/CURRENT" in key and self.left > 0:
                self.left -= 1
                put_version(local, cfg, "full", "v4", "durian", 4)  # a publisher wins first
            return self.inner.swap(key, data, expected_etag)

    with pytest.raises(RetentionError, match="moved while rolling back"):
        rollback(Racing(local, "/CURRENT", "retry"), "full")
    ptr, _ = read_pointer(local, "full")
    assert ptr is not None and (ptr.version, ptr.seq, ptr.action) == ("v4", 4, "publish")


def test_lost_response_on_s3_counts_as_rolled_back(moto_endpoint: str) -> None:
    cfg = make_s3_config(moto_endpoint)
    direct = open_store(cfg)
    three_versions(direct, cfg)
    with S3Proxy(moto_endpoint, drop_first(1, "PUT", "/CURRENT")) as proxy:
        store = open_store(dataclasses.replace(cfg, endpoint_url=proxy.endpoint), for_writing=True)
        pointer = rollback(store, "full")
    dropped = [s for s in proxy.seen if s.status is None]
    assert len(dropped) == 1 and "/CURRENT" in dropped[0].path, dropped
    # botocore retried the PUT moto had applied and heard 412: before the fix, "re-run it".
    retry = [s for s in proxy.requests("PUT", dropped[0].path) if s.status is not None]
    assert retry and retry[0].status == 412, proxy.seen
    assert (pointer.version, pointer.seq) == ("v2", 4)
    assert_rolled_back_once(direct)
