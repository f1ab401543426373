"""Ambiguous commits: a write that landed but whose response was lost is a success.

On S3 the lost response is real: a proxy forwards the PUT to moto, which applies it, and closes the
connection without answering; botocore retries, and the retry of a conditional write gets 412. On
the local store the same thing is injected at the store layer. Either way the run must end
``published`` with pointer, history, manifest and ledger all saying so, never ``superseded``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import pytest

from freshidx.delta.after_build import record_outcome
from freshidx.publish.commit import DraftManifest, PublishResult, publish, read_pointer
from freshidx.store import (
    ListPage,
    ObjectInfo,
    ObjectStore,
    StoredObject,
    WriteOutcomeUnknown,
    layout,
    open_store,
)
from freshidx.store.local import LocalStore
from freshidx.store.object_store import dump_json
from freshidx.store.partitions import PartitionId
from freshidx.trigger import ledger
from freshidx_tests.conftest import make_s3_config
from freshidx_tests.publish.test_publish import draft, history
from freshidx_tests.support.s3_proxy import S3Proxy, drop_first

Mode = Literal["timeout", "retry"]


class LostResponses(ObjectStore):
    """The local store with lost responses injected at the store layer.

    The chosen conditional write is applied; then the caller either hears nothing
    (``timeout``: :class:`WriteOutcomeUnknown`) or hears the answer to a client retry of the same
    request (``retry``: the store's own PreconditionFailed, as S3 answers 412), like botocore does.
    """

    def __init__(self, inner: LocalStore, match: str, mode: Mode, times: int = 1,
                 after_applied: Callable[[], None] | None = None) -> None:
        self.inner, self.match, self.mode, self.left = inner, match, mode, times
        self.after_applied = after_applied
        self.uri, self.stats = inner.uri, inner.stats
        self.injected: list[str] = []

    def _lost(self, key: str, op: Callable[[], str]) -> str:
        if self.match not in key or self.left <= 0:
            return op()
        self.left -= 1
        op()  # applied ...
        self.injected.append(key)
        if self.after_applied is not None:
            self.after_applied()
        if self.mode == "timeout":  # ... and nobody heard back
            raise WriteOutcomeUnknown(f"{key}: injected lost response")
        return op()  # ... and the client's retry of the same request is what the caller hears

    def create(self, key: str, data: bytes) -> str:
        return self._lost(key, lambda: self.inner.create(key, data))

    def swap(self, key: str, data: bytes, expected_etag: str | None) -> str:
        return self._lost(key, lambda: self.inner.swap(key, data, expected_etag))

    def get(self, key: str) -> StoredObject:
        return self.inner.get(key)

    def head(self, key: str) -> ObjectInfo:
        return self.inner.head(key)

    def put(self, key: str, data: bytes) -> str:
        return self.inner.put(key, data)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def _list_page(
        self, prefix: str, *, delimiter: str | None, start_after: str | None, max_keys: int,
        continuation: str | None,
    ) -> tuple[ListPage, str | None]:
        return self.inner.list_page(prefix, delimiter=delimiter, start_after=start_after,
                                    max_keys=max_keys, continuation=continuation)


def write_key(write: str, seq: int) -> str:
    """The part of the key of each write a delta publication makes (seq = the new generation)."""
    return {"manifest": "/manifest.json", "CURRENT": "/CURRENT",
            "history": layout.history_key("delta", seq).split("indexes/delta/", 1)[1],
            "ledger": "ledger/delta/"}[write]


def publish_run(store: ObjectStore, d: DraftManifest) -> PublishResult:
    """What the IO manager does: publish, then the ledger entries."""
    result = publish(store, d)
    record_outcome(store, d, result, f"run-{d.version[-8:]}")
    return result


def assert_published(store: ObjectStore, d: DraftManifest, result: PublishResult, seq: int) -> None:
    assert result.outcome == "published", result
    ptr, _ = read_pointer(store, "delta")
    assert ptr is not None and ptr.version == d.version and ptr.seq == seq
    assert [h["seq"] for h in history(store)] == list(range(1, seq + 1))
    assert history(store)[-1]["version"] == d.version
    assert store.get_json(layout.manifest_key("delta", d.version))[0] == json.loads(dump_json(d.to_dict()))
    assert not store.exists(layout.refusal_key("delta", d.version))
    decision = ledger.decision(store, "delta", PartitionId.parse(d.source_partition or ""))
    assert decision is not None and decision["decision"] == ledger.PUBLISHED, decision


WRITES = ["manifest", "CURRENT", "history", "ledger"]


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalStore]:
    yield LocalStore(tmp_path / "store")


@pytest.mark.parametrize("mode", ["timeout", "retry"])
@pytest.mark.parametrize("write", WRITES)
def test_lost_response_on_local_store_is_resolved_by_rereading(local: LocalStore, write: str, mode: Mode) -> None:
    publish(local, draft(local, 0))
    faulty = LostResponses(local, write_key(write, 2), mode)
    d = draft(local, 5)
    result = publish_run(faulty, d)
    assert len(faulty.injected) == 1, faulty.injected  # the fault really hit that write
    assert_published(local, d, result, seq=2)


def test_lost_cas_then_replaced_by_a_newer_publisher_still_counts_as_published(local: LocalStore) -> None:
    """Our swap landed, its answer was lost, and a newer version replaced ours before we re-read:
    ``CURRENT`` no longer names us, but the history entry of our generation does."""
    publish(local, draft(local, 0))
    newer = draft(local, 10)
    faulty = LostResponses(local, "/CURRENT", "timeout", after_applied=lambda: publish(local, newer))
    d = draft(local, 5)
    result = publish_run(faulty, d)
    assert result.outcome == "published" and "replaced by version " + newer.version in result.reason
    assert [h["version"] for h in history(local)][1:] == [d.version, newer.version]
    assert ledger.decision(local, "delta", PartitionId.parse(d.source_partition or ""))["decision"] \
        == ledger.PUBLISHED  # type: ignore[index]
    assert not local.exists(layout.refusal_key("delta", d.version))


@pytest.mark.parametrize(("write", "first"), [(w, False) for w in WRITES] + [("CURRENT", True)])
def test_lost_response_on_s3_is_resolved_by_rereading(moto_endpoint: str, write: str, first: bool) -> None:
    """``first``: the very first publication, whose pointer write is create-once (If-None-Match)."""
    cfg = make_s3_config(moto_endpoint)
    direct = open_store(cfg)
    if not first:
        publish(direct, draft(direct, 0))
    seq = 1 if first else 2
    match = write_key(write, seq)
    d = draft(direct, 5)
    with S3Proxy(moto_endpoint, drop_first(1, "PUT", match)) as proxy:
        store = open_store(dataclasses.replace(cfg, endpoint_url=proxy.endpoint), for_writing=True)
        result = publish_run(store, d)
    dropped = [s for s in proxy.seen if s.status is None]
    assert len(dropped) == 1 and match in dropped[0].path, dropped
    # botocore retried the write S3 had applied, and heard 412: the ambiguous case, not a loss.
    retry = [s for s in proxy.requests("PUT", dropped[0].path) if s.status is not None]
    assert retry and retry[0].status == 412, proxy.seen
    assert_published(direct, d, result, seq=seq)


def test_cas_without_any_response_on_s3_is_resolved_by_rereading(moto_endpoint: str) -> None:
    """Every attempt's response is lost (botocore gives up: outcome unknown): re-read, not fail."""
    cfg = make_s3_config(moto_endpoint)
    direct = open_store(cfg)
    publish(direct, draft(direct, 0))
    d = draft(direct, 5)
    with S3Proxy(moto_endpoint, drop_first(100, "PUT", "/CURRENT")) as proxy:
        store = open_store(dataclasses.replace(cfg, endpoint_url=proxy.endpoint), for_writing=True)
        result = publish_run(store, d)
    assert proxy.requests("PUT", "/CURRENT") and all(s.status is None for s in proxy.requests("PUT", "/CURRENT"))
    assert_published(direct, d, result, seq=2)
