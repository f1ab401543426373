"""The upstream simulator: determinism, layout, versions, defect counts, timelines and the CLI."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
import signal
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from freshidx.raw_record import (
    MAX_BID,
    MAX_TITLE_CHARS,
    RAW_FIELDS,
    REASON_BAD_BID,
    REASON_BAD_STATUS,
    REASON_BAD_TIMESTAMP,
    REASON_BAD_VERSION,
    REASON_MALFORMED_JSON,
    REASON_MISSING_FIELD,
    REASON_TOO_LONG,
    STATUSES,
)
from freshidx.store import ObjectStore, StoreConfig, layout, open_store
from freshidx.store.partitions import PartitionId
from freshidx.tools import generate as gen
from freshidx.tools.generate import GeneratorConfig, PartitionWritten, generate, partition_records, write_partition
from freshidx_tests.conftest import s3_env

T0 = dt.datetime(2026, 11, 21, 14, 5, tzinfo=dt.UTC)
P0 = PartitionId(T0)
REPO = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------------------------------------
# An independent strict validator, written from raw_record.py only (not from the generator)
# ---------------------------------------------------------------------------------------------

_ISO_Z = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?Z$")


def _parse_ts(value: str) -> dt.datetime | None:
    if not _ISO_Z.match(value):
        return None
    try:
        return dt.datetime.fromisoformat(value[:-1] + "+00:00")
    except ValueError:
        return None


def strict_reason(line: str) -> str | None:
    """None when ``line`` is a valid raw record, else the quarantine reason."""
    try:
        obj = json.loads(line)
    except ValueError:
        return REASON_MALFORMED_JSON
    if not isinstance(obj, dict):
        return REASON_MALFORMED_JSON
    for name, (_, required) in RAW_FIELDS.items():
        if required and obj.get(name) is None:
            return f"{REASON_MISSING_FIELD}:{name}"
    for name in ("ad_id", "campaign_id", "product_id", "title", "status", "updated_at"):
        if not isinstance(obj[name], str):
            return f"bad_type:{name}"
    kw = obj.get("keywords")
    if kw is not None and (not isinstance(kw, list) or not all(isinstance(k, str) for k in kw)):
        return "bad_type:keywords"
    if obj["status"] not in STATUSES:
        return REASON_BAD_STATUS
    bid = obj["bid"]
    if isinstance(bid, bool) or not isinstance(bid, int | float) or not math.isfinite(bid):
        return REASON_BAD_BID
    if not 0 < bid <= MAX_BID:
        return REASON_BAD_BID
    if _parse_ts(obj["updated_at"]) is None:
        return REASON_BAD_TIMESTAMP
    version = obj["version"]
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        return REASON_BAD_VERSION
    if len(obj["title"]) > MAX_TITLE_CHARS:
        return REASON_TOO_LONG
    return None


def read_partition(store: ObjectStore, keys: list[str]) -> list[str]:
    lines: list[str] = []
    for key in keys:
        data = store.get(key).data
        assert data.endswith(b"\n") and not data.endswith(b"\n\n"), key
        lines.extend(data.decode("utf-8").split("\n")[:-1])
    return lines


def raw_keys(store: ObjectStore, source: str = "ad_updates") -> list[str]:
    return sorted(o.key for o in store.list(layout.raw_root(source)).objects)


def partition_of_key(key: str, source: str = "ad_updates") -> PartitionId:
    root = layout.raw_root(source)
    assert key.startswith(root), key
    middle, name = key[len(root):].rsplit("/", 1)
    assert re.fullmatch(r"part-\d{5}\.jsonl", name), key
    return PartitionId.parse(middle)


def simulated(store: ObjectStore, cfg: GeneratorConfig, n: int, step_min: int = 1) -> list[PartitionWritten]:
    def no_clock() -> float:
        raise AssertionError("simulated mode must not read the clock")

    return generate(
        store, cfg, count=n, every_s=0, start=T0, step=dt.timedelta(minutes=step_min),
        clock=no_clock, sleep=lambda s: None,
    )


@pytest.fixture
def local(local_store_config: StoreConfig) -> ObjectStore:
    return open_store(local_store_config)


# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("source", "Bad-Source"),
        ("source", "../etc"),
        ("seed", 1.5),
        ("ads", 0),
        ("products", -1),
        ("campaigns", 0),
        ("changes_per_partition", 0),
        ("files_per_partition", 0),
        ("malformed_rate", 1.5),
        ("duplicate_rate", -0.1),
        ("delete_rate", float("nan")),
        ("pause_rate", 2),
        ("burst_probability", True),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"GeneratorConfig\.{field}\b"):
        GeneratorConfig(**{field: value})


def test_a_ten_million_document_window_is_a_valid_config() -> None:
    # The benches seed 1.25 ads per document: a 10M-document window draws from 12.5M ad ids.
    cfg = GeneratorConfig(ads=12_500_000, products=4_000_000)
    assert cfg.ads == 12_500_000
    with pytest.raises(ValueError, match=r"GeneratorConfig\.ads\b"):
        GeneratorConfig(ads=1_000_000_001)


def test_config_rejects_rates_that_do_not_add_up() -> None:
    with pytest.raises(ValueError, match="delete_rate"):
        GeneratorConfig(delete_rate=0.6, pause_rate=0.6)
    assert GeneratorConfig(delete_rate=0.5, pause_rate=0.5).pause_rate == 0.5


# ---------------------------------------------------------------------------------------------
# Determinism and layout
# ---------------------------------------------------------------------------------------------


def test_same_seed_and_partition_give_identical_files(store: ObjectStore, tmp_path: Path) -> None:
    cfg = GeneratorConfig(seed=3, burst_probability=0.5, changes_per_partition=40)
    other = open_store(StoreConfig(uri=(tmp_path / "other").as_uri()))
    parts = [PartitionId(T0 + dt.timedelta(minutes=i)) for i in range(4)]
    for p in parts:
        a, b = write_partition(store, cfg, p), write_partition(other, cfg, p)
        assert a == b
        assert [store.get(k).data for k in a.keys] == [other.get(k).data for k in b.keys]
    assert raw_keys(store) == raw_keys(other)
    # a rewrite (restarted generator) produces the very same bytes
    again = write_partition(store, cfg, parts[0])
    assert read_partition(store, again.keys) == partition_records(cfg, parts[0])[0]


def test_different_seed_or_partition_gives_different_content() -> None:
    a, _ = partition_records(GeneratorConfig(seed=0), P0)
    b, _ = partition_records(GeneratorConfig(seed=1), P0)
    c, _ = partition_records(GeneratorConfig(seed=0), PartitionId(T0 + dt.timedelta(minutes=1)))
    assert a != b and a != c
    assert not set(a) & set(b)  # versions and times differ per line, so no line is shared


def test_layout_keys_parse_back_to_the_partition(store: ObjectStore) -> None:
    cfg = GeneratorConfig(source="ad_updates", burst_probability=1.0, files_per_partition=2)
    written = simulated(store, cfg, 3, step_min=7)
    assert [w.partition.at for w in written] == [T0 + dt.timedelta(minutes=7 * i) for i in range(3)]
    keys = raw_keys(store)
    assert keys == sorted(k for w in written for k in w.keys)
    for w in written:
        assert len(w.keys) >= 2  # bursts split the partition into several files
        assert [k.rsplit("/", 1)[1] for k in w.keys] == [f"part-{i:05d}.jsonl" for i in range(len(w.keys))]
        assert {partition_of_key(k) for k in w.keys} == {w.partition}
        assert all(k.startswith(layout.raw_partition_prefix("ad_updates", w.partition)) for k in w.keys)
    # other sources land under their own root only
    other = GeneratorConfig(source="product_signals")
    res = write_partition(store, other, P0)
    prefix = "raw/product_signals/year=2026/month=11/day=21/hour=14/minute=05/"
    assert res.keys and all(k.startswith(prefix) for k in res.keys)
    assert raw_keys(store) == keys


# ---------------------------------------------------------------------------------------------
# Content: validity, counts, versions
# ---------------------------------------------------------------------------------------------


def test_counts_match_an_independent_strict_check(store: ObjectStore) -> None:
    cfg = GeneratorConfig(
        seed=11, changes_per_partition=60, burst_probability=0.2, malformed_rate=0.03, duplicate_rate=0.04,
        delete_rate=0.04,
    )
    written = simulated(store, cfg, 20)
    totals: Counter[str] = Counter()
    all_reasons: Counter[str] = Counter()
    for w in written:
        lines = read_partition(store, w.keys)
        reasons = [strict_reason(line) for line in lines]
        valid = [line for line, r in zip(lines, reasons, strict=True) if r is None]
        bad = Counter(r for r in reasons if r is not None)
        unique = {json.dumps(json.loads(v), sort_keys=True) for v in valid}
        records = [json.loads(u) for u in unique]
        assert w.records == len(lines)
        assert w.valid == len(valid)
        assert w.malformed == sum(bad.values()) == len(lines) - len(valid)
        assert w.reasons == dict(bad)
        assert w.duplicates == len(valid) - len(set(valid)) == len(valid) - len(unique)
        assert w.unique == len(unique)
        assert w.deletes == sum(r["status"] == "deleted" for r in records)
        assert w.ad_ids == sorted({r["ad_id"] for r in records})
        # a duplicate is an exact repeat of a valid line, never of a malformed one
        assert all(n == 1 for line, n in Counter(lines).items() if strict_reason(line) is not None)
        totals.update(
            records=w.records, malformed=w.malformed, duplicates=w.duplicates, deletes=w.deletes,
            bursts=int(w.burst), paused=sum(r["status"] == "paused" for r in records),
        )
        all_reasons.update(r.split(":")[0] for r in bad.elements())
    for name in ("malformed", "duplicates", "deletes", "bursts", "paused"):
        assert totals[name] > 0, (name, totals)
    assert set(all_reasons) == {
        REASON_MALFORMED_JSON, REASON_MISSING_FIELD, REASON_BAD_STATUS, REASON_BAD_BID, REASON_BAD_TIMESTAMP,
    }
    # rates are roughly honoured
    assert 0.01 < totals["malformed"] / totals["records"] < 0.06
    assert 0.015 < totals["duplicates"] / totals["records"] < 0.08


def test_default_rates_produce_every_kind_of_trouble() -> None:
    cfg = GeneratorConfig()
    totals: Counter[str] = Counter()
    for i in range(20):
        lines, w = partition_records(cfg, PartitionId(T0 + dt.timedelta(minutes=5 * i)))
        reasons = [strict_reason(line) for line in lines]
        assert w.malformed == sum(r is not None for r in reasons)
        valid = [line for line, r in zip(lines, reasons, strict=True) if r is None]
        assert w.duplicates == len(valid) - len(set(valid))
        totals.update(malformed=w.malformed, duplicates=w.duplicates, deletes=w.deletes, bursts=int(w.burst))
    assert min(totals.values()) > 0 and len(totals) == 4, totals


def test_valid_records_are_realistic_and_consistent() -> None:
    cfg = GeneratorConfig(seed=5, changes_per_partition=100)
    product_of: dict[str, str] = {}
    campaign_of: dict[str, str] = {}
    ads_per_product: defaultdict[str, set[str]] = defaultdict(set)
    titles: defaultdict[str, set[str]] = defaultdict(set)
    vocabulary = set(gen.VOCABULARY)
    for i in range(10):
        p = PartitionId(T0 + dt.timedelta(minutes=5 * i))
        lines, _ = partition_records(cfg, p)
        for line in lines:
            if strict_reason(line) is not None:
                continue
            r = json.loads(line)
            assert set(r) <= set(RAW_FIELDS)
            assert product_of.setdefault(r["ad_id"], r["product_id"]) == r["product_id"]
            assert campaign_of.setdefault(r["ad_id"], r["campaign_id"]) == r["campaign_id"]
            ads_per_product[r["product_id"]].add(r["ad_id"])
            titles[r["ad_id"]].add(r["title"])
            assert len(r["title"].split()) >= 3 and set(r["title"].split()) <= vocabulary
            if "keywords" in r:
                assert 2 <= len(r["keywords"]) <= 5 and set(r["keywords"]) <= vocabulary
            assert isinstance(r["bid"], float) and 0.05 <= r["bid"] <= 20.0 and round(r["bid"], 2) == r["bid"]
            ts = _parse_ts(r["updated_at"])
            assert ts is not None and p.at <= ts <= p.at + dt.timedelta(minutes=1)
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", r["updated_at"])
    assert max(len(ads) for ads in ads_per_product.values()) > 1  # a product groups several ads
    assert any(len(t) > 1 for t in titles.values())  # titles change over time


def test_versions_strictly_increase_per_ad_across_partitions(local: ObjectStore) -> None:
    cfg = GeneratorConfig(seed=2, ads=150, changes_per_partition=50)
    written = simulated(local, cfg, 20)
    last_version: dict[str, int] = {}
    last_time: dict[str, dt.datetime] = {}
    updated_in: Counter[str] = Counter()
    for w in written:  # oldest partition first
        records = [json.loads(x) for x in read_partition(local, w.keys) if strict_reason(x) is None]
        by_ad: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in records:
            by_ad[r["ad_id"]].append(r)
        for ad, rs in by_ad.items():
            versions = sorted({r["version"] for r in rs})
            assert len(versions) == len({json.dumps(r, sort_keys=True) for r in rs})  # one line per version
            assert versions[0] > last_version.get(ad, -1), ad
            newest = max(rs, key=lambda r: r["version"])
            ts = _parse_ts(newest["updated_at"])
            assert ts is not None and ts >= last_time.get(ad, ts)
            last_version[ad], last_time[ad] = versions[-1], ts
            updated_in[ad] += 1
    assert max(updated_in.values()) >= 5  # the property was exercised on ads seen many times


def test_a_restarted_generator_keeps_versions_increasing(tmp_path: Path) -> None:
    cfg = GeneratorConfig(seed=9, ads=50, changes_per_partition=40, malformed_rate=0.0)
    a = open_store(StoreConfig(uri=(tmp_path / "a").as_uri()))
    b = open_store(StoreConfig(uri=(tmp_path / "b").as_uri()))
    first = simulated(a, cfg, 1)[0]
    # a "new process" (fresh store, nothing remembered) writing the next minute
    second = write_partition(b, cfg, PartitionId(T0 + dt.timedelta(minutes=1)))
    old = {json.loads(x)["ad_id"]: json.loads(x)["version"] for x in read_partition(a, first.keys)}
    new = [json.loads(x) for x in read_partition(b, second.keys)]
    shared = [r for r in new if r["ad_id"] in old]
    assert shared and all(r["version"] > old[r["ad_id"]] for r in shared)


def test_bursts_multiply_changes_and_split_files() -> None:
    quiet = GeneratorConfig(burst_probability=0.0, malformed_rate=0.0, duplicate_rate=0.0)
    loud = GeneratorConfig(burst_probability=1.0, malformed_rate=0.0, duplicate_rate=0.0)
    lines_q, stats_q = partition_records(quiet, P0)
    lines_l, stats_l = partition_records(loud, P0)
    assert not stats_q.burst and len(stats_q.keys) == 1 and stats_q.records == len(lines_q) == 200
    assert stats_l.burst and len(stats_l.keys) >= 2 and stats_l.records == len(lines_l) == 1000
    chunks = gen.split_lines(lines_l, len(stats_l.keys))
    assert [x for c in chunks for x in c] == lines_l and all(chunks)


# ---------------------------------------------------------------------------------------------
# Timelines: live, simulated, history
# ---------------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self, times: list[dt.datetime]) -> None:
        self.times = list(times)
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return self.times.pop(0).timestamp()


def spy_puts(store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    keys: list[str] = []
    real = store.put

    def put(key: str, data: bytes) -> str:
        keys.append(key)
        return real(key, data)

    monkeypatch.setattr(store, "put", put)
    return keys


def test_live_mode_never_writes_one_minute_twice(local: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
    same = T0.replace(second=7)
    clock = FakeClock([same, same, same + dt.timedelta(seconds=20), same + dt.timedelta(seconds=70),
                       same - dt.timedelta(hours=1)])
    sleeps: list[float] = []
    seen: list[PartitionWritten] = []
    puts = spy_puts(local, monkeypatch)
    written = generate(
        local, GeneratorConfig(burst_probability=0.0), count=5, every_s=12.5, clock=clock,
        sleep=sleeps.append, on_written=seen.append,
    )
    minutes = [w.partition.at for w in written]
    assert minutes == [T0 + dt.timedelta(minutes=i) for i in range(5)]
    assert seen == written
    assert sleeps == [12.5] * 4  # between partitions, not after the last
    assert len(puts) == len(set(puts)) == 5
    assert sorted({partition_of_key(k) for k in raw_keys(local)}) == [w.partition for w in written]


def test_a_restarted_live_generator_continues_after_partitions_written_ahead_of_the_clock(
        local: ObjectStore) -> None:
    # A partition every 12.5 s runs ahead of the clock's minute; a restart must not write those minutes again.
    before = generate(local, GeneratorConfig(), count=4, every_s=0, clock=FakeClock([T0] * 4), sleep=lambda s: None)
    assert [w.partition.at for w in before] == [T0 + dt.timedelta(minutes=i) for i in range(4)]
    after = generate(local, GeneratorConfig(), count=2, every_s=0, clock=FakeClock([T0] * 2), sleep=lambda s: None)
    assert [w.partition.at for w in after] == [T0 + dt.timedelta(minutes=i) for i in (4, 5)]


def test_live_mode_follows_the_clock_when_it_moves(local: ObjectStore) -> None:
    clock = FakeClock([T0 + dt.timedelta(minutes=m, seconds=30) for m in (0, 3, 10)])
    written = generate(local, GeneratorConfig(), count=3, every_s=0, clock=clock, sleep=lambda s: None)
    assert [w.partition.at.minute for w in written] == [5, 8, 15]
    assert clock.calls == 3


def test_simulated_mode_uses_start_and_step_only(local: ObjectStore) -> None:
    start = dt.datetime(2026, 11, 21, 16, 59, 42, tzinfo=dt.timezone(dt.timedelta(hours=2)))  # 14:59:42Z
    sleeps: list[float] = []
    written = generate(
        local, GeneratorConfig(), count=4, every_s=1.0, start=start, step=dt.timedelta(minutes=30),
        clock=FakeClock([]), sleep=sleeps.append,
    )
    assert [w.partition.path for w in written] == [
        "year=2026/month=11/day=21/hour=14/minute=59",
        "year=2026/month=11/day=21/hour=15/minute=29",
        "year=2026/month=11/day=21/hour=15/minute=59",
        "year=2026/month=11/day=21/hour=16/minute=29",
    ]
    assert sleeps == [1.0] * 3
    default_step = generate(local, GeneratorConfig(), count=2, every_s=0, start=T0, sleep=sleeps.append)
    assert [w.partition.at for w in default_step] == [T0, T0 + dt.timedelta(minutes=5)]


def test_history_then_live(local: ObjectStore) -> None:
    now = dt.datetime(2026, 11, 21, 14, 7, 30, tzinfo=dt.UTC)
    clock = FakeClock([now, now, now])
    sleeps: list[float] = []
    written = generate(
        local, GeneratorConfig(), count=2, every_s=60, history=dt.timedelta(minutes=30), clock=clock,
        sleep=sleeps.append,
    )
    assert [w.partition.at.strftime("%H:%M") for w in written] == [
        "13:40", "13:45", "13:50", "13:55", "14:00", "14:05",  # history, aligned to 5 minutes
        "14:07", "14:08",  # live (the second tick saw the same minute)
    ]
    assert sleeps == [60]  # history is written without sleeping
    keys = [k for w in written for k in w.keys]
    assert len(raw_keys(local)) == len(set(keys)) == len(keys)


def test_history_leaves_the_live_minute_to_the_live_writes(local: ObjectStore) -> None:
    # At 14:10:30 the 5-minute history must stop at 14:05: a history partition at 14:10 would push
    # every live partition a minute into the future (14:11 written at 14:10:30, 14:12 at 14:11:30).
    now = dt.datetime(2026, 11, 21, 14, 10, 30, tzinfo=dt.UTC)
    clock = FakeClock([now, now, now + dt.timedelta(seconds=60)])
    written = generate(local, GeneratorConfig(), count=2, every_s=60, history=dt.timedelta(minutes=12),
                       clock=clock, sleep=lambda s: None)
    assert [w.partition.at.strftime("%H:%M") for w in written] == ["14:00", "14:05", "14:10", "14:11"]


def test_history_in_simulated_mode_ends_before_start(local: ObjectStore) -> None:
    written = generate(
        local, GeneratorConfig(), count=1, every_s=0, start=T0.replace(minute=0),
        history=dt.timedelta(minutes=15), clock=FakeClock([]), sleep=lambda s: None,
    )
    assert [w.partition.at.strftime("%H:%M") for w in written] == ["13:50", "13:55", "14:00"]
    only_history = generate(
        local, GeneratorConfig(), count=0, every_s=0, start=T0.replace(minute=0),
        history=dt.timedelta(minutes=10), sleep=lambda s: None,
    )
    assert [w.partition.at.strftime("%H:%M") for w in only_history] == ["13:55"]


def test_forever_mode_runs_until_interrupted(local: ObjectStore) -> None:
    seen: list[PartitionWritten] = []

    def stop_after_three(w: PartitionWritten) -> None:
        seen.append(w)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        generate(local, GeneratorConfig(), count=None, every_s=0, start=T0, sleep=lambda s: None,
                 on_written=stop_after_three)
    assert [w.partition.at for w in seen] == [T0 + dt.timedelta(minutes=5 * i) for i in range(3)]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"count": -1}, "count"),
        ({"every_s": -1.0}, "every_s"),
        ({"step": dt.timedelta(minutes=5)}, "step"),
        ({"start": T0, "step": dt.timedelta(seconds=90)}, "step"),
        ({"start": T0, "step": dt.timedelta(0)}, "step"),
        ({"history": dt.timedelta(minutes=-5)}, "history"),
        ({"start": dt.datetime(2026, 11, 21, 14, 5)}, "naive"),
    ],
)
def test_generate_rejects_bad_arguments(local: ObjectStore, kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"count": 1, "every_s": 0.0, **kwargs}
    with pytest.raises(ValueError, match=match):
        generate(local, GeneratorConfig(), sleep=lambda s: None, **args)
    assert raw_keys(local) == []


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FRESHIDX_", "AWS_"))}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def _check_against_pure(store: ObjectStore, out: list[dict[str, Any]], seed: int, changes: int) -> None:
    cfg = GeneratorConfig(seed=seed, changes_per_partition=changes)
    for row in out:
        p = PartitionId.parse(row["partition"])
        lines, stats = partition_records(cfg, p)
        assert row["keys"] == stats.keys
        assert (row["records"], row["valid"], row["malformed"], row["duplicates"], row["deletes"],
                row["burst"]) == (stats.records, stats.valid, stats.malformed, stats.duplicates,
                                  stats.deletes, stats.burst)
        # another process (other hash seed) wrote byte-identical lines
        assert read_partition(store, row["keys"]) == lines


def test_cli_subprocess_local_store(tmp_path: Path) -> None:
    root = tmp_path / "store"
    proc = subprocess.run(
        [sys.executable, "-m", "freshidx.tools.generate", "--store", str(root), "--seed", "7", "--count", "3",
         "--every", "0", "--start", "2026-11-21T14:05:00Z", "--step-minutes", "2", "--changes", "50",
         "--history-minutes", "10", "--json"],
        capture_output=True, text=True, timeout=60, env=_env(), cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [row["partition"][-9:] for row in out] == [
        "minute=00", "minute=05", "minute=07", "minute=09",  # history (13:55, 14:05), then 14:05 + 2k
    ]
    store = open_store(StoreConfig(uri=root.as_uri()))
    assert raw_keys(store) == sorted(k for row in out for k in row["keys"])
    _check_against_pure(store, out, seed=7, changes=50)


def test_cli_subprocess_s3_store_from_env(s3_store_config: StoreConfig, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "freshidx.tools.generate", "generate", "--count", "2", "--every", "0",
         "--start", "2026-11-21T14:05+00:00", "--seed", "4", "--json"],
        capture_output=True, text=True, timeout=60, env=_env(**s3_env(s3_store_config)), cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(out) == 2
    store = open_store(s3_store_config)
    assert raw_keys(store) == sorted(k for row in out for k in row["keys"])
    _check_against_pure(store, out, seed=4, changes=GeneratorConfig.changes_per_partition)
    assert not (tmp_path / ".freshidx").exists()  # nothing went to the embedded default store


def _default_sigint() -> None:
    # Ctrl-C at a terminal reaches a process whose SIGINT is at its default. A suite started as a
    # background job of a non-interactive shell (`bash .ci/run &`) inherits SIGINT *ignored*, and so
    # would the generator (it rightly keeps an inherited ignore): reset it for the child.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_cli_ctrl_c_exits_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "freshidx.tools.generate", "--store", str(tmp_path / "store"), "--every", "3600",
         "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path,
        preexec_fn=_default_sigint,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the first partition is written
        if not line:
            err = proc.stderr.read() if proc.stderr else ""
            pytest.fail(f"generator exited early with {proc.wait()}: {err}")
        first = json.loads(line)
        proc.send_signal(sig)  # now sleeping for an hour
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr and "interrupted" in stderr
    assert stdout == ""  # nothing written after the interrupt
    store = open_store(StoreConfig(uri=(tmp_path / "store").as_uri()))
    assert raw_keys(store) == first["keys"]


def test_cli_human_output_in_process(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRESHIDX_STORE", (tmp_path / "envstore").as_uri())
    monkeypatch.setenv("FRESHIDX_SOURCE", "product_signals")
    rc = gen.main(["--count", "2", "--every", "0", "--start", "2026-11-21T14:05Z", "--changes", "10"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert out[0].startswith("generating into file://") and "product_signals" in out[0]
    assert [line.split()[1] for line in out[1:]] == [
        "raw/product_signals/year=2026/month=11/day=21/hour=14/minute=05/",
        "raw/product_signals/year=2026/month=11/day=21/hour=14/minute=10/",
    ]
    store = open_store(StoreConfig(uri=(tmp_path / "envstore").as_uri()))
    assert len(raw_keys(store, "product_signals")) >= 2


def test_add_parser_registers_cmd_generate() -> None:
    from freshidx.cli import parse

    args = parse(["generate", "--count", "1"])
    assert args.command.load() is gen.cmd_generate
    p = args.params
    assert (p["every"], p["seed"], p["history_minutes"], p["start"], p["store"], p["as_json"]) == (
        300.0, 0, 0, None, None, False,
    )


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["--every", "-1"], "--every"),
        (["--every", "soon"], "--every"),
        (["--count", "-2"], "--count"),
        (["--count", "x"], "--count"),
        (["--seed", "1.5"], "--seed"),
        (["--start", "2026-11-21T14:05"], "--start"),
        (["--start", "tomorrow"], "--start"),
        (["--step-minutes", "0", "--start", "2026-11-21T14:05Z"], "--step-minutes"),
        (["--changes", "0"], "--changes"),
        (["--history-minutes", "-5"], "--history-minutes"),
        (["--store", "ftp://host/x"], "--store"),
        (["--source", "Bad/Source"], "--source"),
    ],
)
def test_cli_bad_arguments_name_the_option(
    argv: list[str], option: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(SystemExit) as exc:
        gen.main(["--store", str(tmp_path / "s"), "--count", "1", *argv])
    assert exc.value.code == 2
    assert f"argument {option}" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_cli_step_without_start_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc = gen.main(["--store", str(tmp_path / "s"), "--count", "1", "--step-minutes", "5"])
    assert rc == 2
    assert "--step-minutes needs --start" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_cli_bad_environment_is_reported(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                         tmp_path: Path) -> None:
    monkeypatch.setenv("FRESHIDX_STORE", "ftp://nowhere/x")
    rc = gen.main(["--count", "1", "--every", "0"])
    assert rc == 2
    assert "FRESHIDX_STORE" in capsys.readouterr().err
