"""The micro-batch's state lookup (freshidx.delta.executor.state_lookup.select_rows), pure Arrow: which rows of
the published state a batch needs, read from row groups that hold them only, and decoded once per worker
(freshidx.delta.executor.decoded_cache)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from freshidx.delta.executor import file_cache, key_index, state_lookup
from freshidx.delta.executor.decoded_cache import LOAD_THREADS, DecodedCache
from freshidx.delta.executor.key_index import LAYOUT, MAX_KEY_BYTES, KeyIndex, query_keys, rows_and_hits
from freshidx.delta.executor.state_files import MappedState, ParquetState, StateFile, StateReader
from freshidx.delta.executor.state_lookup import Parts, segment_of, select_rows
from freshidx.delta.executor.warm_state import ReadPace, warm_files
from freshidx.spark.shards import COVERED_ARROW_SCHEMA, COVERED_FILE, DOCS_ARROW_SCHEMA, DOCS_FILE, conform


def _file(f: pq.ParquetFile, name: str, kind: str, opened: list[str] | None = None) -> StateFile:
    def opener() -> StateReader:
        if opened is not None:
            opened.append(name)
        return ParquetState(f)

    return StateFile(name, kind, opener)


def _docs(path: Path, rows: list[tuple[str, str]], row_group: int) -> pq.ParquetFile:
    table = pa.table({
        "ad_id": [a for a, _ in rows], "campaign_id": ["c"] * len(rows), "product_id": [p for _, p in rows],
        "title": ["t"] * len(rows), "keywords": [["k"]] * len(rows), "bid": [1.0] * len(rows),
        "status": ["active"] * len(rows), "updated_at": pa.array([0] * len(rows), pa.timestamp("us", "UTC")),
        "version": [1] * len(rows),
    })
    pq.write_table(pa.Table.from_batches([conform(b, DOCS_ARROW_SCHEMA) for b in table.to_batches()]),
                   path, row_group_size=row_group)
    return pq.ParquetFile(path)


def _covered(path: Path, rows: list[tuple[str, str]]) -> pq.ParquetFile:
    names = COVERED_ARROW_SCHEMA.names
    cols = {"ad_id": [a for a, _ in rows], "status": [s for _, s in rows], "version": [2] * len(rows),
            "updated_at": pa.array([0] * len(rows), pa.timestamp("us", "UTC"))}
    table = pa.table({n: cols[n] for n in names if n in cols})
    pq.write_table(table, path)
    return pq.ParquetFile(path)


def test_selects_batch_ads_their_old_products_and_every_ad_of_touched_products(tmp_path: Path) -> None:
    # Products p0..p9, 4 ads each, sorted by product, 8 rows per row group (5 groups).
    rows = [(f"a{p}{i}", f"p{p}") for p in range(10) for i in range(4)]
    docs = _docs(tmp_path / DOCS_FILE, rows, row_group=8)
    covered = _covered(tmp_path / COVERED_FILE, [("a11", "deleted"), ("a90", "active"), ("z", "paused")])
    # The batch: a10 changes (p1 touched), a30 moved to p7 (its old product p3 and p7 touched),
    # z (paused before, in no product now) comes back.
    keys = pa.table({"ad_id": ["a10", "a30", "z"], "product_id": ["p1", "p7", "p2"]})
    files = [_file(docs, "d", DOCS_FILE), _file(covered, "c", COVERED_FILE)]
    out = pa.Table.from_batches(list(select_rows(keys, files, DecodedCache(0))))
    got = sorted(zip(out.column("ad_id").to_pylist(), out.column("status").to_pylist(), strict=True))
    touched = {"p1", "p2", "p3", "p7"}
    want = sorted([(a, "active") for a, p in rows if p in touched] + [("a11", "deleted"), ("z", "paused")])
    assert got == want
    assert out.schema.names == DOCS_ARROW_SCHEMA.names


def test_reads_only_row_groups_that_hold_a_needed_row(tmp_path: Path) -> None:
    rows = [(f"a{p}{i}", f"p{p}") for p in range(10) for i in range(4)]
    docs = _docs(tmp_path / DOCS_FILE, rows, row_group=8)
    read = _spy_row_groups(docs)
    keys = pa.table({"ad_id": ["a00"], "product_id": ["p0"]})
    out = pa.Table.from_batches(list(select_rows(keys, [_file(docs, "d", DOCS_FILE)], DecodedCache(0))))
    assert sorted(out.column("ad_id").to_pylist()) == ["a00", "a01", "a02", "a03"]
    assert read == [0]  # p0 lives in the first row group only


def test_a_reused_worker_decodes_each_immutable_file_once(tmp_path: Path) -> None:
    rows = [(f"a{p}{i}", f"p{p}") for p in range(10) for i in range(4)]
    docs = _docs(tmp_path / DOCS_FILE, rows, row_group=8)
    read = _spy_row_groups(docs)
    cache, opened = DecodedCache(1 << 20), []
    first = pa.table({"ad_id": ["a00"], "product_id": ["p0"]})
    second = pa.table({"ad_id": ["a01", "a90"], "product_id": ["p0", "p9"]})
    got = [sorted(pa.Table.from_batches(list(select_rows(k, [_file(docs, "d", DOCS_FILE, opened)], cache)))
                  .column("ad_id").to_pylist()) for k in (first, second, first)]
    assert got[0] == got[2] == ["a00", "a01", "a02", "a03"]
    assert got[1] == ["a00", "a01", "a02", "a03", "a90", "a91", "a92", "a93"]
    # the key pass and row group 0 once, row group 4 (p9) when first needed; the file opened twice only
    assert read == [0, 4] and opened == ["d", "d"]
    # over budget: nothing is kept, every call reads again
    small, opened = DecodedCache(16), []
    for _ in range(2):
        list(select_rows(first, [_file(docs, "d", DOCS_FILE, opened)], small))
    assert opened == ["d", "d"] and small.nbytes == 0


def test_missing_values_load_at_the_same_time_and_cached_ones_not_again() -> None:
    cache = DecodedCache(1 << 20)
    cache.get("b", lambda: "cached b", len)
    both = threading.Barrier(2, timeout=300)  # each load waits for the other: passes only when they overlap
    calls: list[str] = []

    def load(key: str) -> str:
        calls.append(key)
        both.wait()
        return f"loaded {key}"

    got = cache.get_many([(k, lambda k=k: load(k)) for k in ("a", "b", "c")], len)
    assert got == ["loaded a", "cached b", "loaded c"] and sorted(calls) == ["a", "c"]
    assert cache.get_many([("a", lambda: "again"), ("c", lambda: "again")], len) == ["loaded a", "loaded c"]
    # over budget nothing is kept, and every value is still returned
    assert DecodedCache(0).get_many([("x", lambda: "x1"), ("y", lambda: "y1")], len) == ["x1", "y1"]


def _spy_row_groups(docs: pq.ParquetFile) -> list[int]:
    read: list[int] = []
    original = docs.read_row_group

    def spy(i: int, *args: object, **kwargs: object) -> pa.Table:
        read.append(i)
        return original(i, *args, **kwargs)

    docs.read_row_group = spy  # type: ignore[method-assign]
    return read


def test_the_worker_cache_outlives_tasks_shipped_by_value() -> None:
    # A Connect client may ship freshidx by value (code_shipping.ship_by_value): every task unpickles its
    # own copy of the module globals it references, yet must find the one cache of its worker process.
    from pyspark import cloudpickle

    import freshidx
    from freshidx.delta.executor import decoded_cache

    cloudpickle.register_pickle_by_value(freshidx)
    try:
        payload = cloudpickle.dumps(state_lookup.merged_rows)  # what a segment task carries
        tasks = [cloudpickle.loads(payload) for _ in range(2)]
    finally:
        cloudpickle.unregister_pickle_by_value(freshidx)
    caches = [t.__globals__["resolve_worker_cache"](1 << 20) for t in tasks]
    assert caches[0] is caches[1] is decoded_cache.worker_cache(1 << 20)
    assert tasks[0].__globals__ is not tasks[1].__globals__  # (the copies the cache must not live in)


def test_an_index_another_client_cached_serves_the_next_one(tmp_path: Path) -> None:
    # Each Connect client process ships its own by-value copy of KeyIndex; a kept session's reused worker
    # keeps the index an earlier client built. Checking it with isinstance failed every sensor run's
    # segment task once (TypeError, retried as attempt 1 on a worker without the decoded state).
    rows = [(f"a{p}{i}", f"p{p}") for p in range(10) for i in range(4)]
    docs = _docs(tmp_path / DOCS_FILE, rows, row_group=8)
    used: list[str] = []

    def rows_of_ads(self: KeyIndex, ads: np.ndarray, hashes: np.ndarray | None = None) -> np.ndarray:
        used.append("rows_of_ads")
        return KeyIndex.rows_of_ads(self, ads, hashes)

    other_client = type("KeyIndex", (), {**{k: v for k, v in vars(KeyIndex).items()
                                            if k not in ("__dict__", "__weakref__")}, "rows_of_ads": rows_of_ads})
    assert other_client is not KeyIndex
    keys = docs.read(columns=["ad_id", "product_id"])
    sizes = [docs.metadata.row_group(g).num_rows for g in range(docs.metadata.num_row_groups)]
    cached = other_client.build(keys, sizes)
    assert type(cached) is other_client and not isinstance(cached, KeyIndex)
    cache = DecodedCache(1 << 20)
    cache.get(("d", "key-index", LAYOUT), lambda: cached, lambda v: v.nbytes, lasting=True)
    batch = pa.table({"ad_id": ["a30"], "product_id": ["p7"]})
    opened: list[str] = []
    got = _rows(pa.Table.from_batches(list(select_rows(batch, [_file(docs, "d", DOCS_FILE, opened)], cache))))
    assert got == _rows(pa.Table.from_batches(list(select_rows(batch, [_file(docs, "d", DOCS_FILE)],
                                                              DecodedCache(0)))))
    assert {r[1] for r in got} == {"p3", "p7"} and len(got) == 8
    assert used == ["rows_of_ads", "rows_of_ads"]  # the cached index answered both passes, none was rebuilt


def test_warmed_files_serve_the_next_lookup_without_reading(tmp_path: Path) -> None:
    rows = [(f"a{p}{i}", f"p{p}") for p in range(10) for i in range(4)]
    docs = _docs(tmp_path / DOCS_FILE, rows, row_group=8)
    covered = _covered(tmp_path / COVERED_FILE, [("a30", "deleted"), ("zz", "paused")])
    cache = DecodedCache(1 << 20)
    # A budget already spent: one key index and no row group; the next call goes on.
    assert warm_files([_file(docs, "d", DOCS_FILE), _file(covered, "c", COVERED_FILE)], cache,
                      deadline=time.monotonic(), pace=ReadPace()) == (1, False)
    decoded = warm_files([_file(docs, "d", DOCS_FILE), _file(covered, "c", COVERED_FILE)], cache)
    assert decoded == (1 + 5 + 1, True)  # the other key index and every row group
    opened: list[str] = []
    batch = pa.table({"ad_id": ["a30"], "product_id": ["p7"]})
    files = [_file(docs, "d", DOCS_FILE, opened), _file(covered, "c", COVERED_FILE, opened)]
    got = _rows(pa.Table.from_batches(list(select_rows(batch, files, cache))))
    assert opened == []  # every key index and row group came from the cache
    assert got == _rows(pa.Table.from_batches(list(select_rows(batch, [_file(docs, "d", DOCS_FILE),
                                                                       _file(covered, "c", COVERED_FILE)],
                                                              DecodedCache(0)))))
    assert warm_files([_file(docs, "d", DOCS_FILE), _file(covered, "c", COVERED_FILE)], cache) == (0, True)



def test_a_warm_up_stops_when_the_cache_is_full_instead_of_churning_it(tmp_path: Path) -> None:
    """A state larger than the cache: the warm-up fills it and stops (done), and the next one decodes
    nothing, where it used to decode every row group again, each pushing out another."""
    rows = [(f"a{p}{i:03d}", f"p{p}") for p in range(10) for i in range(100)]
    docs = _docs(tmp_path / DOCS_FILE, rows, row_group=100)
    files = [_file(docs, "d", DOCS_FILE)]
    whole = DecodedCache(1 << 30)
    assert warm_files(files, whole) == (1 + 10, True)  # the key index and every row group
    budget = whole.nbytes // 2
    cache = DecodedCache(budget)
    decoded, complete = warm_files(files, cache)
    assert complete and 1 < decoded < 1 + 10 and cache.nbytes <= budget
    assert warm_files(files, cache) == (0, True)  # nothing pushed out, nothing decoded again
    opened: list[str] = []
    batch = pa.table({"ad_id": ["a9099"], "product_id": ["p9"]})  # the lookup still finds the rest itself
    got = _rows(pa.Table.from_batches(list(select_rows(batch, [_file(docs, "d", DOCS_FILE, opened)], cache))))
    assert got == _rows(pa.Table.from_batches(list(select_rows(batch, [_file(docs, "d", DOCS_FILE)],
                                                              DecodedCache(0)))))


def test_a_spent_budget_starts_one_read_a_call_and_the_next_warm_up_goes_on(tmp_path: Path) -> None:
    """Past the deadline a call reads one key index (each call gets somewhere), then one row group a call."""
    count = 3
    parquet = [_docs(tmp_path / f"{i}-{DOCS_FILE}", [(f"a{i}", "p")], row_group=8) for i in range(count)]
    files = [_file(f, f"d{i}", DOCS_FILE) for i, f in enumerate(parquet)]
    cache, pace = DecodedCache(1 << 20), ReadPace()
    for _ in range(count):
        assert warm_files(files, cache, deadline=time.monotonic(), pace=pace) == (1, False)
    assert pace.seconds_per_row is not None  # learned from the reads
    assert warm_files(files, cache, deadline=time.monotonic(), pace=pace) == (1, False)  # a row group
    assert warm_files(files, cache, pace=pace) == (count - 1, True)  # the other row groups (one a file)
    assert warm_files(files, cache, pace=pace) == (0, True)


class _PinnedPace(ReadPace):
    """A pace that the reads do not change."""

    def __init__(self, seconds_per_row: float) -> None:
        super().__init__()
        self.seconds_per_row = seconds_per_row

    def measured(self, rows: int, seconds: float) -> None:
        pass


def test_key_index_reads_start_together_only_while_the_pace_says_they_end_in_time(tmp_path: Path) -> None:
    count = LOAD_THREADS + 3
    parquet = [_docs(tmp_path / f"{i}-{DOCS_FILE}", [(f"a{i}", "p")], row_group=8) for i in range(count)]
    files = [_file(f, f"d{i}", DOCS_FILE) for i, f in enumerate(parquet)]
    slow = _PinnedPace(seconds_per_row=3600.0)  # an hour a row: after the first read nothing else fits
    assert warm_files(files, DecodedCache(1 << 20), deadline=time.monotonic() + 60, pace=slow) == (1, False)
    fast = ReadPace()
    fast.measured(rows=1_000_000, seconds=1e-3)
    # every key index and row group within a minute's budget, in one call
    assert warm_files(files, DecodedCache(1 << 20), deadline=time.monotonic() + 60, pace=fast) == (2 * count, True)
    unknown = ReadPace()  # nothing measured yet: the first read alone, the others once it taught the pace
    decoded, _ = warm_files(files, DecodedCache(1 << 20), deadline=time.monotonic() + 60, pace=unknown)
    assert decoded >= 1 and unknown.seconds_per_row is not None


def _rows(out: pa.Table) -> list[tuple]:
    return sorted(zip(*(out.column(c).to_pylist() for c in ("ad_id", "product_id", "status", "version")),
                      strict=True), key=repr)


@pytest.mark.parametrize("colliding", [False, True], ids=["hashes", "colliding-hashes"])
@pytest.mark.parametrize("seed", range(6))
def test_key_index_answers_as_the_scan(tmp_path: Path, seed: int, colliding: bool,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The key index (lookups by hash) selects exactly the rows the is_in scan selects: ads in several
    files, ads that moved product, products on row group edges, non-ASCII ids, ids of different lengths,
    and (seed 5) an id too long for the index, which makes that file fall back to the scan. With a hash of
    three values, nearly every id shares its hash with others: the bytes settle every lookup."""
    import random

    if colliding:  # in key_index and where state_lookup hashes the wanted ids once for every file
        def three_valued(keys: np.ndarray) -> np.ndarray:
            return (np.char.str_len(keys) % 3).astype(np.uint64)

        monkeypatch.setattr(key_index, "key_hashes", three_valued)
        monkeypatch.setattr(state_lookup, "key_hashes", three_valued)

    rng = random.Random(seed)
    ids = [f"ad-{i}" + ("é" * rng.randrange(3)) for i in range(300)]
    if seed == 5:
        ids[7] = "x" * (MAX_KEY_BYTES + 1)
    products = [f"p{i}" for i in range(40)]
    files = []
    for n in range(3):  # three state files (full shard, segments), each with its own rows of some ads
        rows = sorted(((a, rng.choice(products)) for a in rng.sample(ids, 150)), key=lambda r: r[1])
        files.append(_file(_docs(tmp_path / f"docs-{n}.parquet", rows, row_group=rng.choice((7, 16, 64))),
                           f"d{n}", DOCS_FILE))
    gone = [(a, rng.choice(("deleted", "paused", "active"))) for a in rng.sample(ids, 40)]
    files.append(_file(_covered(tmp_path / "covered.parquet", gone), "c", COVERED_FILE))
    batch = pa.table({"ad_id": [*rng.sample(ids, 25), "never-seen"],
                      "product_id": [*(rng.choice(products) for _ in range(25)), None]})
    indexed = _rows(pa.Table.from_batches(list(select_rows(batch, files, DecodedCache(0))), DOCS_ARROW_SCHEMA))
    monkeypatch.setattr(KeyIndex, "build", classmethod(lambda cls, keys, sizes: None))
    scanned = _rows(pa.Table.from_batches(list(select_rows(batch, files, DecodedCache(0))), DOCS_ARROW_SCHEMA))
    assert indexed == scanned and len(indexed) > 25


def test_key_index_lookups() -> None:
    keys = pa.table({"ad_id": ["b", "a", "c", "a", "é"], "product_id": ["p2", "p1", None, "p2", "p1"]})
    index = KeyIndex.build(keys, [2, 3])
    assert index is not None and index.num_rows == 5
    assert index.rows_of_ads(query_keys(pa.array(["a", "zz", "é"]))).tolist() == [1, 3, 4]
    assert sorted(index.products_of_rows(np.array([0, 2, 4]))) == [b"p1", b"p2"]  # row 2 has none
    assert index.rows_of_products(query_keys(pa.array(["p2", "p9"]))).tolist() == [0, 3]
    assert index.ads_of_rows(np.array([4, 0])).tolist() == ["é".encode(), b"b"]
    assert KeyIndex.build(pa.table({"ad_id": ["a", "b" * (MAX_KEY_BYTES + 1)]}), [2]) is None
    # rows and which of the asked ids the file holds, aligned with the ask (an id wider than the index: absent)
    rows, hits = rows_and_hits(index, query_keys(pa.array(["a", "zz", "é", "x" * 9])))
    assert rows.tolist() == [1, 3, 4] and hits.sum() == 2 and hits.tolist() == [
        k in (b"a", "é".encode()) for k in query_keys(pa.array(["a", "zz", "é", "x" * 9])).tolist()]
    assert query_keys(pa.array(["a", None, "a\0", "b" * (MAX_KEY_BYTES + 1)])).tolist() == [b"a"]
    # A file of one row per ad (every state file) is searched once per id: same answers, at the edges too.
    unique = KeyIndex.build(pa.table({"ad_id": ["b", "a", "é", "d"]}), [4])
    assert unique is not None and unique.ads_unique and not index.ads_unique
    asked = query_keys(pa.array(["a", "zz", "é", "x" * 9, "0", "d"]))  # before the first, after the last
    rows, hits = rows_and_hits(unique, asked)
    assert rows.tolist() == [1, 2, 3] and hits.tolist() == [k in (b"a", "é".encode(), b"d") for k in asked.tolist()]


def _layer(tmp: Path, name: str, rows: pa.Table, layer: int, over_full: bool, mapped: bool) -> list[StateFile]:
    """A published piece of state as the shard writer leaves it: the active rows whole (docs), every row's
    key columns (covered, the kill-list); read from Parquet or from mapped copies (``file_cache``)."""
    docs = rows.filter(pc.equal(rows.column("status"), "active"))
    pq.write_table(docs.cast(DOCS_ARROW_SCHEMA), tmp / f"{name}-docs.parquet", row_group_size=7)
    pq.write_table(rows.select(COVERED_ARROW_SCHEMA.names).cast(COVERED_ARROW_SCHEMA),
                   tmp / f"{name}-covered.parquet", row_group_size=7)
    files = []
    for kind, stem in ((DOCS_FILE, "docs"), (COVERED_FILE, "covered")):
        path, copy = tmp / f"{name}-{stem}.parquet", tmp / f"{name}-{stem}.arrow"
        if mapped:
            file_cache.write_mapped(path, copy)
        opener = (lambda p=copy: MappedState(p)) if mapped else (lambda p=path: ParquetState(pq.ParquetFile(p)))
        files.append(StateFile(f"{name}/{kind}", kind, opener, layer, over_full))
    return files


@pytest.mark.parametrize("mapped", [False, True], ids=["parquet", "mapped"])
@pytest.mark.parametrize("seed", range(5))
def test_newest_layer_answers_as_every_row(tmp_path: Path, seed: int, mapped: bool) -> None:
    """Each needed ad's row from the newest segment holding it (and from the full version unless that
    segment was built over it) gives the micro-batch's merge the same rows as every row of every piece of
    state: over micro-batches of updates, deletes, pauses, products moving and versions out of order,
    with a new full version in the middle that knows late records no kept segment saw. Split over two
    segment tasks (each reading the rows of its own part's products), the same rows, each written once."""
    import datetime as dt
    import random

    from freshidx.delta import segment_merge
    from freshidx.record_rules import latest_per_ad

    rng = random.Random(seed)
    t0 = dt.datetime(2026, 11, 27, tzinfo=dt.UTC)

    def records(n: int, top: int) -> pa.Table:
        return pa.Table.from_pylist([{
            "ad_id": f"a{rng.randrange(40)}", "campaign_id": "c", "product_id": f"p{rng.randrange(6)}",
            "title": rng.choice(["x", "y"]), "keywords": [rng.choice(["k", "l"])], "bid": 1.0,
            "status": rng.choice(["active", "active", "active", "paused", "deleted"]),
            "updated_at": t0 + dt.timedelta(seconds=rng.randrange(3)), "version": rng.randint(1, top),
        } for _ in range(n)], schema=DOCS_ARROW_SCHEMA)

    seen = records(60, 3)
    full, full_id = latest_per_ad(seen), 0
    segments: list[tuple[pa.Table, int]] = []
    fewer = 0
    for step in range(10):
        if step == 5:  # a new full version; it also holds late records the kept segments never saw
            seen = pa.concat_tables([seen, records(15, step + 3)])
            full, full_id = latest_per_ad(seen), 1
        batch = latest_per_ad(records(rng.randint(1, 8), step + 3))
        seen = pa.concat_tables([seen, batch])
        newest, every = (_state(tmp_path / f"{step}-{layered}", batch, full, full_id, segments, layered, mapped)
                         for layered in (True, False))
        merged = segment_merge.segment_rows(batch, newest)
        assert _all_rows(merged) == _all_rows(segment_merge.segment_rows(batch, every))
        assert newest.num_rows <= every.num_rows
        # Two segment tasks, each building the touched products of its part from the part of the batch
        # that bears on them, write exactly those rows, with the same re-index flags.
        by_part = []
        for p in range(2):
            owned = Parts(2, frozenset({p}))
            state = _state(tmp_path / f"{step}-part{p}", batch, full, full_id, segments, True, mapped, owned)
            by_part.append(_all_rows(segment_of(batch, state, owned)))
        assert sorted(by_part[0] + by_part[1], key=repr) == _all_rows(segment_of(batch, newest))
        assert not {r[0] for r in by_part[0]} & {r[0] for r in by_part[1]}  # an ad in one part only ...
        assert not {r[2] for r in by_part[0]} - {None} & {r[2] for r in by_part[1]}  # ... and a product
        fewer += newest.num_rows < every.num_rows
        segments.append((segment_merge.segment_rows(batch, every), full_id))
    assert fewer  # the layers did leave rows unread


def _state(tmp: Path, batch: pa.Table, full: pa.Table, full_id: int, segments: list[tuple[pa.Table, int]],
           layered: bool, mapped: bool, parts: Parts | None = None) -> pa.Table:
    """The rows select_rows reads for ``batch``: with the layers (each segment's own, over the full version
    when built on ``full_id``), or every piece of state as one layer (every row of every file)."""
    tmp.mkdir()
    files = _layer(tmp, "full", full, 0, False, mapped)
    for n, (rows, base) in enumerate(segments, start=1):
        files += _layer(tmp, f"seg{n}", rows, n if layered else 0, layered and base == full_id, mapped)
    return pa.Table.from_batches(list(select_rows(batch, files, DecodedCache(0), parts)), DOCS_ARROW_SCHEMA)


def _all_rows(t: pa.Table) -> list[tuple]:
    return sorted((tuple(r.values()) for r in t.to_pylist()), key=repr)


def test_key_indexes_outlast_row_groups_in_the_worker_cache() -> None:
    """A micro-batch touching more row groups than the budget holds must not push the key indexes (small,
    ~1 s to rebuild at a million documents) out on every pass; they go only once nothing else is left."""
    cache = DecodedCache(100)
    loads: list[str] = []

    def get(key: str, weight: int, lasting: bool = False) -> str:
        def load() -> str:
            loads.append(key)
            return key
        return cache.get(key, load, lambda _: weight, lasting=lasting)

    get("index-1", 20, True)
    get("index-2", 20, True)
    for g in range(10):  # a pass over more row groups than fit
        get(f"group-{g}", 30)
    loads.clear()
    get("index-1", 20, True)
    get("index-2", 20, True)
    assert loads == [] and cache.nbytes <= 100  # both indexes still there
    get("group-9", 30)
    assert loads == []  # the newest row groups too
    get("big", 90)  # a row group that would need the indexes' room is not kept: other row groups go first
    assert cache.nbytes == 40
    get("index-3", 90, True)  # key indexes alone over the budget: the least recently used go
    assert cache.nbytes == 90
    loads.clear()
    get("index-1", 20, True)
    get("index-3", 90, True)
    assert loads == ["index-1", "index-3"]


@pytest.mark.parametrize("size", [1, 2, 7, 1000, 50_000])
def test_the_bucket_walk_finds_what_a_bisection_finds(size: int) -> None:
    """An index's hash directory answers as ``np.searchsorted`` on both sides: hashes at both ends of the
    range, repeated hashes (a crowded bucket, walked then bisected), absent ones in between."""
    rng = np.random.default_rng(size)
    top = np.iinfo(np.uint64).max
    hashes = np.sort(np.concatenate([
        rng.integers(0, top, size, dtype=np.uint64, endpoint=True),
        np.full(min(size, 9), rng.integers(0, top, dtype=np.uint64)),  # one hash nine times
        np.array([0, top], np.uint64)]))
    buckets = key_index.directory(hashes)
    wanted = np.concatenate([rng.choice(hashes, 500), rng.integers(0, top, 500, dtype=np.uint64, endpoint=True),
                             np.array([0, 1, top - 1, top], np.uint64)])
    for side in ("left", "right"):
        found = key_index._search(hashes, buckets, wanted, side)
        assert found.tolist() == np.searchsorted(hashes, wanted, side).tolist(), side
