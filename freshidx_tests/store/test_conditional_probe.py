"""Stores that ignore conditional writes are refused for writing; reads still work.

The store without conditional writes is moto behind a real proxy that strips ``If-None-Match`` /
``If-Match``: exactly what some S3-compatible servers and proxies do.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from dagster_aws.s3 import S3Resource

from freshidx.defs.shared.resources import ObjectStoreResource
from freshidx.publish.commit import publish, read_pointer
from freshidx.store import ConditionalWritesUnsupported, StoreConfig, layout, open_store
from freshidx.store.s3 import PROBE_PREFIX
from freshidx_tests.conftest import MOTO_ACCESS_KEY, MOTO_SECRET_KEY, make_s3_config
from freshidx_tests.publish.test_publish import draft
from freshidx_tests.support.s3_proxy import Action, S3Proxy, strip_conditions


def probe_puts(proxy: S3Proxy) -> int:
    return len(proxy.requests("PUT", "/" + PROBE_PREFIX))


def test_moto_passes_the_probe_once_and_leaves_no_probe_object(moto_endpoint: str) -> None:
    cfg = make_s3_config(moto_endpoint)
    with S3Proxy(moto_endpoint) as proxy:  # plain forwarding, to count the probe's requests
        via = dataclasses.replace(cfg, endpoint_url=proxy.endpoint)
        open_store(via, for_writing=True)
        assert probe_puts(proxy) == 4  # create, create again, If-Match current, If-Match stale
        store = open_store(via, for_writing=True)
        store.create("x/once", b"1")  # the first conditional write does not probe again
        assert probe_puts(proxy) == 4
    assert open_store(cfg).list(PROBE_PREFIX).objects == []


def test_store_ignoring_conditional_headers_is_refused_for_writing_and_readable(moto_endpoint: str) -> None:
    cfg = make_s3_config(moto_endpoint)
    direct = open_store(cfg)
    published = draft(direct, 0)
    publish(direct, published)
    with S3Proxy(moto_endpoint, strip_conditions) as proxy:
        via = dataclasses.replace(cfg, endpoint_url=proxy.endpoint)
        with pytest.raises(ConditionalWritesUnsupported) as err:
            open_store(via, for_writing=True)
        msg = str(err.value)
        assert cfg.uri in msg and proxy.endpoint in msg  # names the store ...
        assert "If-None-Match: * (create-once) overwrote an existing object" in msg  # ... what is missing
        assert "If-Match with a stale ETag (compare-and-swap) overwrote the object" in msg
        assert "Known good" in msg and "reads still work" in msg
        # Reads work through the same server.
        store = open_store(via)
        ptr, _ = read_pointer(store, "delta")
        assert ptr is not None and ptr.version == published.version
        assert [o.key for o in store.list("indexes/delta/history/").objects] == [layout.history_key("delta", 1)]
        # Writes that rely on the conditions are refused before anything is written (cached verdict).
        probes = probe_puts(proxy)
        newer = draft(direct, 5)
        with pytest.raises(ConditionalWritesUnsupported):
            publish(store, newer)
        assert probe_puts(proxy) == probes
        # The Dagster resource builds its S3 client itself; its store is refused the same way.
        s3 = S3Resource(endpoint_url=proxy.endpoint, region_name="us-east-1",
                        aws_access_key_id=MOTO_ACCESS_KEY, aws_secret_access_key=MOTO_SECRET_KEY)
        res = ObjectStoreResource(uri=cfg.uri, s3=s3)
        with pytest.raises(ConditionalWritesUnsupported):
            res.open().create("ledger/x.json", b"{}")
    assert read_pointer(direct, "delta")[0].version == published.version  # type: ignore[union-attr]
    assert not direct.exists(layout.manifest_key("delta", newer.version))
    assert not direct.exists("ledger/x.json")


def test_store_ignoring_only_if_match_is_refused_naming_if_match(moto_endpoint: str) -> None:
    def strip_if_match(method: str, path: str, headers: dict[str, str]) -> Action:
        return "strip_conditions" if any(k.lower() == "if-match" for k in headers) else "forward"

    cfg = make_s3_config(moto_endpoint)
    with S3Proxy(moto_endpoint, strip_if_match) as proxy, pytest.raises(ConditionalWritesUnsupported) as err:
        open_store(dataclasses.replace(cfg, endpoint_url=proxy.endpoint), for_writing=True)
    assert "If-Match with a stale ETag" in str(err.value)
    assert "If-None-Match: * (create-once) overwrote" not in str(err.value)


def test_probe_is_not_fooled_by_lost_responses(moto_endpoint: str) -> None:
    """The probe's own create and If-Match land but their answers are lost (botocore retries and
    hears 412): a store that does enforce the conditions must still pass."""
    puts = [0]

    def drop_1st_and_3rd_probe_put(method: str, path: str, headers: dict[str, str]) -> Action:
        if method != "PUT" or "/" + PROBE_PREFIX not in path:
            return "forward"
        puts[0] += 1
        return "drop_response" if puts[0] in (1, 4) else "forward"  # 4th = 3rd step after 1 retry

    cfg = make_s3_config(moto_endpoint)
    with S3Proxy(moto_endpoint, drop_1st_and_3rd_probe_put) as proxy:
        open_store(dataclasses.replace(cfg, endpoint_url=proxy.endpoint), for_writing=True)
    assert [s.status for s in proxy.requests("PUT", "/" + PROBE_PREFIX)] == [None, 412, 412, None, 412, 412]


def test_local_store_needs_no_probe(tmp_path: Path) -> None:
    store = open_store(StoreConfig(uri=(tmp_path / "s").as_uri()), for_writing=True)
    store.create("a", b"1")
    assert store.list("").objects[0].key == "a"
