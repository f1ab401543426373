"""``freshidx ledger --partition``: every documented form works; anything else is refused (exit 2)."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from freshidx import cli
from freshidx.catchup import planner as catchup
from freshidx.store import ObjectStore, StoreConfig, open_store
from freshidx.store.partitions import PartitionId
from freshidx.trigger import ledger

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
P0148 = PartitionId(dt.datetime(2026, 11, 24, 1, 48, tzinfo=dt.UTC))
P0150 = PartitionId(dt.datetime(2026, 11, 24, 1, 50, tzinfo=dt.UTC))
P0205 = PartitionId(dt.datetime(2026, 11, 24, 2, 5, tzinfo=dt.UTC))
HOUR01 = dt.datetime(2026, 11, 24, 1, tzinfo=dt.UTC)


@pytest.fixture(autouse=True)
def _no_ambient_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("FRESHIDX_")]:
        monkeypatch.delenv(key)


@pytest.fixture
def store(local_store_config: StoreConfig) -> ObjectStore:
    """A ledger as the sensors leave it: decisions, attempts and an ads_hourly hour around 01:48."""
    st = open_store(local_store_config)
    ledger.record_partition(st, "delta", P0148, ledger.ACCEPTED, "newest partition",
                            tid=ledger.TriggerId(P0148.compact).claim(1), attempt=1)
    ledger.record_partition(st, "delta", P0148, ledger.SUPERSEDED, f"superseded by {P0150.path}")
    ledger.record_partition(st, "delta", P0150, ledger.PUBLISHED, "published v1")
    ledger.record_partition(st, "delta", P0205, ledger.PUBLISHED, "published v2")
    catchup.record(st, catchup.ASSET, HOUR01, catchup.trigger(HOUR01), "processed", "hour closed")
    return st


def rows(capsys: pytest.CaptureFixture[str], cfg: StoreConfig, *args: str) -> list[tuple[str, str]]:
    assert cli.main(["ledger", "--store", cfg.uri, "--json", *args]) == 0
    return sorted((r["pipeline"], r["trigger_id"]) for r in json.loads(capsys.readouterr().out))


def test_minute_forms(store: ObjectStore, local_store_config: StoreConfig,
                      capsys: pytest.CaptureFixture[str]) -> None:
    want = [("delta", "20261124T0148"), ("delta", "20261124T0148.a1")]
    assert rows(capsys, local_store_config, "--partition", "20261124T0148") == want
    assert rows(capsys, local_store_config, "--partition", P0148.path) == want
    assert rows(capsys, local_store_config, "--partition", P0148.path + "/") == want
    # An explicit date range still applies instead of the partition's own date.
    assert rows(capsys, local_store_config, "--partition", "20261124T0148", "--since", "2026-11-20") == want
    assert rows(capsys, local_store_config, "--partition", "20261124T0148", "--since", "2026-11-25") == []


def test_hour_forms_select_every_partition_of_the_hour(store: ObjectStore, local_store_config: StoreConfig,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    want = [("ads_hourly", "20261124T01"), ("delta", "20261124T0148"), ("delta", "20261124T0148.a1"),
            ("delta", "20261124T0150")]
    for form in ("2026-11-24-01:00", "20261124T01", "year=2026/month=11/day=24/hour=01"):
        assert rows(capsys, local_store_config, "--partition", form) == want, form
    assert rows(capsys, local_store_config, "--partition", "2026-11-24-01:00", "--pipeline", "ads_hourly") == [
        ("ads_hourly", "20261124T01")]


def test_text_output_and_no_match_message(store: ObjectStore, local_store_config: StoreConfig,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["ledger", "--store", local_store_config.uri, "--partition", "20261124T0148"]) == 0
    out = capsys.readouterr()
    assert "superseded" in out.out and P0148.path in out.out and P0150.path not in out.out.replace(
        f"superseded by {P0150.path}", "")
    assert cli.main(["ledger", "--store", local_store_config.uri, "--partition", "20261124T0149"]) == 0
    out = capsys.readouterr()
    assert out.out == "" and "no ledger entry for year=2026/month=11/day=24/hour=01/minute=49" in out.err


@pytest.mark.parametrize("bad", ["2026-11-24T01:48", "20261124T0160", "20261124", "2026-11-24-01:30",
                                 "year=2026/month=13/day=24/hour=01/minute=48", "year=2026/month=11",
                                 "../../etc", "2026111T148"])
def test_unparseable_partition_is_rejected(bad: str, local_store_config: StoreConfig,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["ledger", "--store", local_store_config.uri, "--partition", bad]) == 2
    err = capsys.readouterr().err
    assert f"cannot read partition {bad!r}; accepted forms: 20261124T0148" in err
    assert "2026-11-24-01:00 (Dagster hour key" in err


def test_cli_subprocess_short_form_and_rejection(store: ObjectStore, local_store_config: StoreConfig) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRESHIDX_")}
    base = [sys.executable, "-m", "freshidx.cli", "ledger", "--store", local_store_config.uri]
    ok = subprocess.run([*base, "--partition", "20261124T0148"], capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0 and "superseded" in ok.stdout, ok.stderr
    bad = subprocess.run([*base, "--partition", "24/11/2026"], capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "accepted forms" in bad.stderr


def test_retry_accepts_the_short_form_and_refuses_an_hour(local_store_config: StoreConfig,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    st = open_store(local_store_config)
    assert cli.main(["ledger", "retry", "--store", local_store_config.uri, "--partition", "20261124T0148"]) == 0
    assert "granted 20261124T0148.grant-1" in capsys.readouterr().out
    assert ledger.grants(st, "delta", P0148) == 1
    assert cli.main(["ledger", "retry", "--store", local_store_config.uri, "--partition", "2026-11-24-01:00"]) == 2
    assert "is an hour; a single minute partition is needed" in capsys.readouterr().err


def test_every_partition_example_in_operations_md_works(store: ObjectStore, local_store_config: StoreConfig,
                                                        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    examples = re.findall(r"^freshidx (ledger(?: retry)? --partition \S+(?: --pipeline \S+)?)", DOCS.read_text(),
                          flags=re.M)
    assert len(examples) >= 6, examples
    for example in examples:
        argv = example.split()
        # The docs leave the store to the default; a retry needs a partition with no final decision.
        uri = (tmp_path / "fresh").as_uri() if argv[1] == "retry" else local_store_config.uri
        code = cli.main([*argv, "--store", uri])
        out = capsys.readouterr()
        assert code == 0, (example, out.err)
        if argv[1] != "retry":
            assert out.out, f"{example}: no entry printed"


def test_delta_compaction_entries_are_listed(local_store_config: StoreConfig,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from freshidx.delta import compaction_run as compact_delta

    st = open_store(local_store_config)
    # The compaction's own writer: ledger/delta_compaction/<date>/<time>-<run>.json, scope "delta <version>".
    result = compact_delta.CompactionResult("published", "merged 3 segments", based_on="v-base", version="v-merged")
    compact_delta._record(st, result, "run-compaction-1")
    for args in (("--pipeline", "delta_compaction"), ()):
        assert cli.main(["ledger", "--store", local_store_config.uri, "--json", *args]) == 0
        listed = [r for r in json.loads(capsys.readouterr().out) if r["pipeline"] == compact_delta.PIPELINE]
        assert len(listed) == 1, args
        entry = listed[0]
        assert (entry["decision"], entry["scope"], entry["run_id"]) == ("published", "delta v-base", "run-compaction-1")
        assert entry["extra"]["version"] == "v-merged" and entry["trigger_id"].endswith("-run-comp")
    assert cli.main(["ledger", "--store", local_store_config.uri]) == 0
    assert "delta_compaction  delta v-base" in capsys.readouterr().out
