"""``freshidx search``: says when nothing is published, and which index answered when only one did."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from freshidx import cli
from freshidx.serve.searcher import NOTHING_PUBLISHED_EXIT
from freshidx.store import StoreConfig, open_store
from freshidx_tests.spark.test_index_shards import T0, ad, build_direct, publish_commits


@pytest.fixture(autouse=True)
def _no_ambient_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("FRESHIDX_")]:
        monkeypatch.delenv(key)


def search(cfg: StoreConfig, cache: Path, *extra: str) -> list[str]:
    return ["search", "red shoes", "--store", cfg.uri, "--cache", str(cache), *extra]


def search_json(cfg: StoreConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = cli.main(search(cfg, tmp_path / "cache", "--json"))
    return code, json.loads(capsys.readouterr().out)


def test_nothing_published_is_said_with_a_documented_exit(local_store_config: StoreConfig, tmp_path: Path) -> None:
    # An empty store (a store that does not exist is an error: test_cli_store_errors.py).
    Path(local_store_config.local_root).mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRESHIDX_")}
    run = subprocess.run([sys.executable, "-m", "freshidx.cli", *search(local_store_config, tmp_path / "cache")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == NOTHING_PUBLISHED_EXIT == 3
    assert run.stdout == ""
    assert (f"nothing published yet in {local_store_config.uri}: no delta or full index; "
            "is the demo/sensor running?") in run.stderr
    assert "0 hit(s)" not in run.stdout + run.stderr

    run = subprocess.run([sys.executable, "-m", "freshidx.cli", *search(local_store_config, tmp_path / "c", "--json")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 3
    out = json.loads(run.stdout)
    assert (out["published"], out["answered_by"], out["hits"]) == (False, [], [])
    assert out["versions"] == {"full": None, "delta": None} and "nothing published yet" in out["note"]


def test_only_the_full_index_answers(local_store_config: StoreConfig, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    store = open_store(local_store_config)
    publish_commits(store, "full", "f1", T0,
                    build_direct(local_store_config, "full", "f1", [ad(1, 1, title="red shoes"), ad(2, 1)]))
    assert cli.main(search(local_store_config, tmp_path / "cache")) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == ("full=f1 delta=–  1 hit(s)  (only the full index answered "
                                   "(the delta index is not published yet))")
    code, js = search_json(local_store_config, tmp_path, capsys)
    assert code == 0 and js["published"] is True and js["answered_by"] == ["full"]
    assert [(h["ad_id"], h["index"]) for h in js["hits"]] == [("ad-0001", "full")]


def test_only_the_delta_then_both_then_an_obsolete_delta(local_store_config: StoreConfig, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    store = open_store(local_store_config)
    later = T0 + dt.timedelta(minutes=10)
    publish_commits(store, "delta", "d1", later,
                    build_direct(local_store_config, "delta", "d1", [ad(1, 1, title="red shoes", version=2)]))
    code, js = search_json(local_store_config, tmp_path, capsys)
    assert code == 0 and js["answered_by"] == ["delta"] and "the full index is not published yet" in js["note"]
    assert [h["index"] for h in js["hits"]] == ["delta"]

    publish_commits(store, "full", "f1", T0, build_direct(local_store_config, "full", "f1", [ad(3, 2, title="red")]))
    code, js = search_json(local_store_config, tmp_path, capsys)
    assert code == 0 and js["answered_by"] == ["full", "delta"] and js["note"] is None
    assert js["versions"] == {"full": "f1", "delta": "d1"}

    # A full index whose cutoff covers the delta makes the delta obsolete: only the full answers.
    publish_commits(store, "full", "f2", later + dt.timedelta(minutes=5),
                    build_direct(local_store_config, "full", "f2", [ad(1, 1, title="red shoes", version=2)]))
    code, js = search_json(local_store_config, tmp_path, capsys)
    assert code == 0 and js["answered_by"] == ["full"]
    assert js["note"] == "only the full index answered (the delta index is older than the full cutoff)"
