"""A driver's S3 read that gets no answer in time is asked again at once; a write is never abandoned.

Through a proxy that holds chosen requests until the test releases them (a request stuck on the
network), in front of a real moto server."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from freshidx.settings import Settings
from freshidx.store import NotFound, StoreConfig, open_store
from freshidx.store.s3 import S3Store
from freshidx_tests.conftest import make_s3_config
from freshidx_tests.support.s3_proxy import S3Proxy, stall_first

QUICK_S = 0.2


def _via(cfg: StoreConfig, proxy: S3Proxy, first_try_s: float = QUICK_S) -> StoreConfig:
    return dataclasses.replace(cfg, endpoint_url=proxy.endpoint, first_try_seconds=first_try_s)


def test_a_stalled_read_is_answered_by_its_second_try(moto_endpoint: str) -> None:
    cfg = make_s3_config(moto_endpoint)
    open_store(cfg).put("a/x", b"payload")
    with S3Proxy(moto_endpoint, stall_first(3, every_other=True)) as proxy:
        store = open_store(_via(cfg, proxy))
        assert store.get("a/x").data == b"payload"
        assert store.head("a/x").size == 7
        assert [o.key for o in store.list("a/").objects] == ["a/x"]
        assert store.stats.quick_retries == 3
        with pytest.raises(NotFound):
            store.get("a/missing")  # not stalled: a 404 is an answer, not retried
        assert store.stats.quick_retries == 3
        # Each stalled request is still held: the answers came from the second tries.
        assert [s.method for s in proxy.requests()] == ["GET", "HEAD", "GET", "GET"]


def test_a_write_outlasting_the_quick_timeout_is_sent_once(moto_endpoint: str) -> None:
    cfg = make_s3_config(moto_endpoint)
    with S3Proxy(moto_endpoint, stall_first(1, "PUT")) as proxy:
        store = open_store(_via(cfg, proxy))
        # The fault: the PUT is held five quick timeouts long. A write abandoned after the quick timeout
        # and sent again could land after its own retry: writes wait for their answer.
        release = threading.Timer(5 * QUICK_S, proxy.release)
        release.start()
        store.put("a/y", b"1")
        release.join()
        assert [s.method for s in proxy.requests()] == ["PUT"]
        assert store.stats.quick_retries == 0
        assert store.get("a/y").data == b"1"


def test_zero_turns_the_first_try_off(moto_endpoint: str) -> None:
    cfg = make_s3_config(moto_endpoint)
    off, on = open_store(dataclasses.replace(cfg, first_try_seconds=0.0)), open_store(cfg)
    assert isinstance(off, S3Store) and isinstance(on, S3Store)
    assert off.quick_client is None and on.quick_client is not None


def test_the_setting_reaches_the_store_config() -> None:
    settings = Settings.from_env({}, store="s3://b/p", s3_first_try_seconds=0.5)
    assert settings.store_config().first_try_seconds == 0.5
    assert Settings.from_env({}, store="s3://b/p").store_config().first_try_seconds == 1.0
    with pytest.raises(ValueError, match="FRESHIDX_S3_FIRST_TRY_SECONDS"):
        StoreConfig.from_env("s3://b/p", {"FRESHIDX_S3_FIRST_TRY_SECONDS": "soon"})
