"""Readiness policies (docs/architecture.md#readiness): each hour is not ready with a visible reason, then ready.

Every test runs against the local store and the moto S3 server. Time passes by handing ``now`` to
:func:`check_ready`, never by sleeping; for ``quiet_period`` ``now`` is derived from the store's own
``last_modified`` (the S3 server's clock), so the tests do not depend on clock agreement.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from freshidx.catchup.readiness import (
    MANIFEST,
    MARKER,
    POLICIES,
    HourListing,
    Readiness,
    check_ready,
    list_hour,
    write_hour_manifest,
    write_marker,
)
from freshidx.settings_values import READINESS_POLICIES
from freshidx.store import ObjectStore, layout
from freshidx.store.partitions import PartitionId

SRC = "ad_updates"
HOUR = dt.datetime(2026, 10, 1, 5, tzinfo=dt.UTC)
END = HOUR + dt.timedelta(hours=1)
PREFIX = layout.raw_hour_prefix(SRC, PartitionId(HOUR).hour_path)
GRACE = 60
QUIET = 300


def put(store: ObjectStore, name: str, data: bytes = b'{"id": 1}\n', hour: dt.datetime = HOUR) -> str:
    key = layout.raw_hour_prefix(SRC, PartitionId(hour).hour_path) + name
    store.put(key, data)
    return key


def ready(store: ObjectStore, policy: str, now: dt.datetime, *, newer: bool = False,
          listing: HourListing | None = None) -> Readiness:
    listing = listing if listing is not None else list_hour(store, SRC, HOUR)
    return check_ready(store, listing, policy, now=now, quiet_seconds=QUIET, close_grace_seconds=GRACE,
                       newer_data_visible=newer)


def test_policy_names_match_settings() -> None:
    assert POLICIES == READINESS_POLICIES


def test_hour_not_over_is_never_ready(store: ObjectStore) -> None:
    put(store, "minute=05/part-00000.jsonl")
    write_marker(store, SRC, HOUR)
    write_hour_manifest(store, SRC, HOUR, {"minute=05/part-00000.jsonl": 1})
    listing = list_hour(store, SRC, HOUR)
    for policy in POLICIES:
        store.stats.reset()
        r = ready(store, policy, HOUR + dt.timedelta(minutes=59, seconds=59), newer=True, listing=listing)
        assert not r.ready and r.policy == policy
        assert "05:00–06:00 UTC not over until 2026-10-01T06:00:00Z" in r.reason
        assert store.stats.get_calls == 0  # nothing is read before the hour is over
        assert ready(store, policy, END + dt.timedelta(days=3650), listing=listing).ready  # past any store clock


def test_list_hour_is_one_listing_of_that_hour_only(store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
    a = put(store, "minute=00/part-00000.jsonl")
    b = put(store, "minute=59/part-00001.jsonl", b"x" * 7)
    c = put(store, "minute=59/part-00000.jsonl")
    put(store, "minute=30/.part-00002.jsonl.crc")  # hidden: not data, not malformed
    put(store, "minute=30/_temporary")
    marker = write_marker(store, SRC, HOUR)
    for other in (HOUR - dt.timedelta(hours=1), END, HOUR + dt.timedelta(days=1)):
        put(store, "minute=00/part-00000.jsonl", hour=other)
    store.put(f"raw/{SRC}/year=2026/month=10/day=01/hour=050/minute=00/x.jsonl", b"{}")  # sibling prefix

    prefixes: list[str | None] = []
    real = store.list_page

    def spy(prefix: str, **kw: Any) -> Any:
        prefixes.append(prefix)
        return real(prefix, **kw)

    monkeypatch.setattr(store, "list_page", spy)
    store.stats.reset()
    listing = list_hour(store, SRC, HOUR)
    assert store.stats.list_calls == 1 and prefixes == [PREFIX]
    assert store.stats.get_calls == 0
    assert [o.key for o in listing.files] == [a, c, b]
    assert [o.size for o in listing.files][2] == 7
    assert set(listing.controls) == {MARKER} and listing.controls[MARKER].key == marker
    assert listing.ignored == []
    assert listing.hour == HOUR and listing.source == SRC
    assert listing.newest_modified is not None and listing.newest_modified.tzinfo is dt.UTC


def test_malformed_keys_are_ignored_and_reported(store: ObjectStore) -> None:
    good = put(store, "minute=05/part-00000.jsonl")
    bad = [
        put(store, "minute=5/part-00000.jsonl"),  # not zero-padded
        put(store, "minute=60/part-00000.jsonl"),  # out of range
        put(store, "minute=05/nested/part-00000.jsonl"),  # below the minute partition
        put(store, "stray.jsonl"),  # directly under the hour, not a control file
        put(store, "second=05/part-00000.jsonl"),  # wrong segment name
    ]
    listing = list_hour(store, SRC, HOUR)
    assert [o.key for o in listing.files] == [good]
    assert sorted(i.key for i in listing.ignored) == sorted(bad)
    assert all(i.reason for i in listing.ignored)
    r = ready(store, "visible", END + dt.timedelta(seconds=GRACE), listing=listing)
    assert r.ready and "5 malformed keys under the hour ignored" in r.reason


def test_list_hour_rejects_bad_arguments(store: ObjectStore) -> None:
    with pytest.raises(ValueError, match="start of an hour"):
        list_hour(store, SRC, HOUR + dt.timedelta(minutes=5))
    with pytest.raises(ValueError, match="naive"):
        list_hour(store, SRC, HOUR.replace(tzinfo=None))
    with pytest.raises(ValueError, match="bad source"):
        list_hour(store, "../etc", HOUR)


def test_unknown_policy_is_a_value_error(store: ObjectStore) -> None:
    with pytest.raises(ValueError, match="'eventually'"):
        ready(store, "eventually", END)


# ---- visible ----


def test_visible_waits_for_grace_then_ready(store: ObjectStore) -> None:
    put(store, "minute=10/part-00000.jsonl")
    r = ready(store, "visible", END + dt.timedelta(seconds=GRACE - 1))
    assert not r.ready
    assert "close grace period of 60s to end at 2026-10-01T06:01:00Z" in r.reason
    r = ready(store, "visible", END + dt.timedelta(seconds=GRACE))
    assert r.ready and r.expected_rows is None and "1 data file visible" in r.reason


def test_visible_empty_hour_closed_only_when_newer_data_visible(store: ObjectStore) -> None:
    put(store, "minute=00/part-00000.jsonl", hour=HOUR - dt.timedelta(hours=1))
    late = END + dt.timedelta(hours=5)
    r = ready(store, "visible", late, newer=False)
    assert not r.ready and f"no data files under {PREFIX} and nothing newer visible" in r.reason
    r = ready(store, "visible", late, newer=True)
    assert r.ready and "empty hour closed" in r.reason
    # upstream moving on does not shortcut the grace period
    r = ready(store, "visible", END, newer=True)
    assert not r.ready and "grace" in r.reason
    # data appearing makes the hour ready without newer data
    put(store, "minute=45/part-00000.jsonl")
    assert ready(store, "visible", late, newer=False).ready


# ---- marker ----


def test_marker_waits_for_success_file(store: ObjectStore) -> None:
    put(store, "minute=10/part-00000.jsonl")
    put(store, "minute=10/_SUCCESS")  # a marker in a minute partition is not the hour's marker
    much_later = END + dt.timedelta(days=2)
    r = ready(store, "marker", much_later, newer=True)
    assert not r.ready and r.reason == f"waiting for marker {PREFIX}_SUCCESS"
    key = write_marker(store, SRC, HOUR)
    assert key == PREFIX + MARKER
    r = ready(store, "marker", END)  # no grace: the marker is the signal
    assert r.ready and key in r.reason


# ---- quiet_period ----


def test_quiet_period_waits_after_last_write(store: ObjectStore) -> None:
    put(store, "minute=10/part-00000.jsonl")
    last = list_hour(store, SRC, HOUR).newest_modified
    assert last is not None
    now = last + dt.timedelta(seconds=QUIET - 10)
    assert now >= END  # HOUR lies in the past of the store's clock
    r = ready(store, "quiet_period", now)
    assert not r.ready
    assert "quiet period of 300s ends at" in r.reason and "last write under" in r.reason

    # a new write restarts the quiet period
    put(store, "minute=11/part-00000.jsonl")
    last2 = list_hour(store, SRC, HOUR).newest_modified
    assert last2 is not None and last2 >= last
    assert not ready(store, "quiet_period", last2 + dt.timedelta(seconds=QUIET - 1)).ready
    r = ready(store, "quiet_period", last2 + dt.timedelta(seconds=QUIET))
    assert r.ready and "2 data files" in r.reason


def test_quiet_period_empty_hour_needs_newer_data(store: ObjectStore) -> None:
    late = END + dt.timedelta(days=3650)  # beyond any store clock
    r = ready(store, "quiet_period", late)
    assert not r.ready and "nothing newer visible" in r.reason
    assert ready(store, "quiet_period", late, newer=True).ready


# ---- manifest ----


def write_manifest_doc(store: ObjectStore, doc: Any) -> None:
    store.put_json(PREFIX + MANIFEST, doc)


def test_manifest_waits_for_manifest_then_files(store: ObjectStore) -> None:
    a = put(store, "minute=05/part-00000.jsonl", b'{"id": 1}\n{"id": 2}\n')
    r = ready(store, "manifest", END + dt.timedelta(days=1), newer=True)
    assert not r.ready and r.reason == f"waiting for manifest {PREFIX}_manifest.json"

    # upstream promises 7 files; one is there
    names = [f"minute={m:02d}/part-00000.jsonl" for m in (5, 10, 15, 20, 25, 30, 35)]
    write_manifest_doc(store, {"files": [{"name": n, "rows": 2} for n in names]})
    store.stats.reset()
    r = ready(store, "manifest", END)
    assert store.stats.get_calls == 1  # at most one GET, of the manifest
    assert not r.ready
    assert "waiting for 6 of 7 files listed in the manifest" in r.reason
    assert "minute=10/part-00000.jsonl" in r.reason and "(+1 more)" in r.reason

    for n in names[1:]:
        put(store, n, b'{"id": 1}\n{"id": 2}\n')
    extra = put(store, "minute=40/part-00000.jsonl")  # present but not promised: does not block
    write_hour_manifest(store, SRC, HOUR, {n: 2 for n in names})
    r = ready(store, "manifest", END)
    assert r.ready, r.reason
    assert r.expected_rows == {PREFIX + n: 2 for n in names} and a in r.expected_rows
    assert extra not in r.expected_rows
    assert "14 rows promised" in r.reason and "1 data file under the hour not listed in the manifest" in r.reason


def test_manifest_size_mismatch_then_ready(store: ObjectStore) -> None:
    key = put(store, "minute=05/part-00000.jsonl", b"abc")
    write_manifest_doc(store, {"files": [{"name": "minute=05/part-00000.jsonl", "rows": 3, "bytes": 10}]})
    r = ready(store, "manifest", END)
    assert not r.ready
    assert "size mismatch for 1 file: minute=05/part-00000.jsonl has 3 bytes, manifest says 10" in r.reason
    put(store, "minute=05/part-00000.jsonl", b"0123456789")  # upstream finished rewriting it
    r = ready(store, "manifest", END)
    assert r.ready and r.expected_rows == {key: 3}


def test_manifest_empty_file_list_closes_an_empty_hour(store: ObjectStore) -> None:
    write_manifest_doc(store, {"files": []})
    r = ready(store, "manifest", END)
    assert r.ready and r.expected_rows == {}


MALFORMED: list[tuple[Any, str]] = [
    (b"{not json", "not valid JSON"),
    (b"\xff\xfe", "not valid JSON"),
    ([1, 2], "expected an object"),
    ({"files": "minute=05/a"}, "expected an object"),
    ({"files": [{"name": "minute=05/../../../../../etc/passwd", "rows": 1}]}, "must be minute=mm/<file>"),
    ({"files": [{"name": "/minute=05/part-00000.jsonl", "rows": 1}]}, "absolute"),
    ({"files": [{"name": "minute=05/..", "rows": 1}]}, "not a data file name"),
    ({"files": [{"name": "minute=61/part-00000.jsonl", "rows": 1}]}, "out of range"),
    ({"files": [{"name": "minute=05/_SUCCESS", "rows": 1}]}, "not a data file name"),
    ({"files": [{"name": "minute=05\\..\\x", "rows": 1}]}, "forbidden characters"),
    ({"files": [{"name": "minute=05/part-00000.jsonl"}]}, "rows must be an integer >= 0"),
    ({"files": [{"name": "minute=05/part-00000.jsonl", "rows": -1}]}, "rows must be an integer >= 0"),
    ({"files": [{"name": "minute=05/part-00000.jsonl", "rows": True}]}, "rows must be an integer >= 0"),
    ({"files": [{"name": "minute=05/part-00000.jsonl", "rows": 1, "bytes": "9"}]}, "bytes must be"),
    ({"files": [{"name": "minute=05/part-00000.jsonl", "rows": 1}] * 2}, "listed twice"),
    ({"files": ["minute=05/part-00000.jsonl"]}, "files[0] is not an object"),
]


def test_malformed_manifest_is_not_ready_with_reason(store: ObjectStore) -> None:
    put(store, "minute=05/part-00000.jsonl")
    for doc, why in MALFORMED:  # one store for all cases: each rewrites the manifest
        store.put(PREFIX + MANIFEST, doc if isinstance(doc, bytes) else json.dumps(doc).encode())
        r = ready(store, "manifest", END + dt.timedelta(days=1), newer=True)
        assert not r.ready and r.expected_rows is None, doc
        assert r.reason.startswith(f"malformed manifest {PREFIX}{MANIFEST}: "), r.reason
        assert why in r.reason, (doc, r.reason)
    # fixed by upstream: ready
    write_hour_manifest(store, SRC, HOUR, {"minute=05/part-00000.jsonl": 1})
    assert ready(store, "manifest", END).ready


def test_write_hour_manifest_accepts_keys_and_records_sizes(store: ObjectStore) -> None:
    key = put(store, "minute=07/part-00000.jsonl", b"12345")
    mkey = write_hour_manifest(store, SRC, HOUR, {key: 4})
    assert mkey == PREFIX + MANIFEST
    doc, _ = store.get_json(mkey)
    assert doc == {"files": [{"name": "minute=07/part-00000.jsonl", "rows": 4, "bytes": 5}]}
    with pytest.raises(ValueError):
        write_hour_manifest(store, SRC, HOUR, {"minute=07/../x": 1})
