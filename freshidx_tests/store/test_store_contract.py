"""One contract, two stores: a temp directory and a moto S3 server over HTTP on loopback."""

from __future__ import annotations

import threading

import pytest

from freshidx.store import InvalidKey, NotFound, ObjectStore, PreconditionFailed


def test_get_put_roundtrip_and_etag_changes(store: ObjectStore) -> None:
    e1 = store.put("a/b/c.json", b'{"x": 1}')
    obj = store.get("a/b/c.json")
    assert obj.data == b'{"x": 1}' and obj.etag == e1
    e2 = store.put("a/b/c.json", b'{"x": 2}')
    assert e2 != e1 and store.get("a/b/c.json").etag == e2
    assert store.head("a/b/c.json").size == len(b'{"x": 2}')
    assert store.get_data("a/b/c.json") == b'{"x": 2}'


def test_missing_key_raises_not_found(store: ObjectStore) -> None:
    with pytest.raises(NotFound):
        store.get("nope/missing.json")
    with pytest.raises(NotFound):
        store.head("nope/missing.json")
    with pytest.raises(NotFound):
        store.get_data("nope/missing.json")
    assert not store.exists("nope/missing.json")
    store.delete("nope/missing.json")  # deleting a missing key is fine


def test_create_once(store: ObjectStore) -> None:
    store.create("m/manifest.json", b"first")
    with pytest.raises(PreconditionFailed):
        store.create("m/manifest.json", b"second")
    assert store.get("m/manifest.json").data == b"first"


def test_compare_and_swap(store: ObjectStore) -> None:
    etag = store.swap("p/CURRENT", b"v1", None)  # None: must not exist yet
    with pytest.raises(PreconditionFailed):
        store.swap("p/CURRENT", b"v1-again", None)
    etag2 = store.swap("p/CURRENT", b"v2", etag)
    with pytest.raises(PreconditionFailed):
        store.swap("p/CURRENT", b"stale", etag)  # stale etag loses
    assert store.get("p/CURRENT").data == b"v2"
    assert store.get("p/CURRENT").etag == etag2


def test_concurrent_swaps_exactly_one_wins(store: ObjectStore) -> None:
    etag = store.swap("race/CURRENT", b"base", None)
    barrier = threading.Barrier(6)
    wins: list[int] = []
    losses: list[int] = []

    def contender(i: int) -> None:
        barrier.wait()
        try:
            store.swap("race/CURRENT", f"w{i}".encode(), etag)
            wins.append(i)
        except PreconditionFailed:
            losses.append(i)

    threads = [threading.Thread(target=contender, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1 and len(losses) == 5
    assert store.get("race/CURRENT").data == f"w{wins[0]}".encode()


def test_listing_delimiter_start_after_and_pages(store: ObjectStore) -> None:
    for k in ["r/x=1/a", "r/x=1/b", "r/x=2/a", "r/x=3/a", "r/top"]:
        store.put(k, b"1")
    page = store.list("r/", delimiter="/")
    assert page.prefixes == ["r/x=1/", "r/x=2/", "r/x=3/"]
    assert [o.key for o in page.objects] == ["r/top"]
    after = [o.key for o in store.iter_objects("r/", start_after="r/x=1/b")]
    assert after == ["r/x=2/a", "r/x=3/a"]  # "r/top" sorts before "r/x=1/b"
    # paging: 2 keys per page still yields every key once, in order
    keys, token = [], None
    while True:
        pg, token = store.list_page("r/", max_keys=2, continuation=token)
        keys += [o.key for o in pg.objects]
        if token is None:
            break
    assert keys == ["r/top", "r/x=1/a", "r/x=1/b", "r/x=2/a", "r/x=3/a"]


def test_keys_cannot_escape_the_root(store: ObjectStore) -> None:
    for bad in ["../etc/passwd", "a/../../b", "/abs", "a//b", "a/./b", "x\\y"]:
        with pytest.raises(InvalidKey):
            store.put(bad, b"x")


def test_list_calls_are_counted(store: ObjectStore) -> None:
    store.put("c/1", b"1")
    store.put("c/d/2", b"2")
    before, entries = store.stats.list_calls, store.stats.listed_entries
    store.list("c/")  # two keys
    store.list("c/", delimiter="/")  # one key, one common prefix
    assert store.stats.list_calls - before == 2
    assert store.stats.listed_entries - entries == 4


def test_create_json_of_identical_bytes_is_our_own_write(store: ObjectStore) -> None:
    """create_json survives a lost response: the same bytes already there mean our create landed;
    other bytes are somebody else's object (PreconditionFailed, as before)."""
    etag = store.create_json("l/entry.json", {"decision": "published"})
    assert store.create_json("l/entry.json", {"decision": "published"}) == etag
    with pytest.raises(PreconditionFailed):
        store.create_json("l/entry.json", {"decision": "refused"})
    with pytest.raises(PreconditionFailed):  # the raw create-once primitive is unchanged
        store.create("l/entry.json", store.get("l/entry.json").data)
