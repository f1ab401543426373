"""``freshidx status``: the Spark server state that belongs to the store, stale states, no ``None``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from freshidx import cli
from freshidx.serve.status import locate_spark_server_state, record_spark_server_state
from freshidx.store import StoreConfig, open_store


def dead_pid() -> int:
    """A pid that certainly belonged to a process that has exited (and was reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def write_state(state_dir: Path, **fields: Any) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    state = {"hostname": socket.gethostname(), "url": "sc://127.0.0.1:15002", "restarts": 0,
             "last_restart_at": None, "last_restart_reason": None, **fields}
    (state_dir / "state.json").write_text(json.dumps(state), encoding="utf-8")


def env_without_freshidx() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FRESHIDX_")}


@pytest.fixture(autouse=True)
def _no_ambient_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("FRESHIDX_")]:
        monkeypatch.delenv(key)


@pytest.fixture
def demo_home(tmp_path: Path) -> Path:
    """A demo home as `freshidx demo` lays it out: <home>/store next to <home>/spark-server."""
    home = tmp_path / "home"
    (home / "store").mkdir(parents=True)
    return home


def status_cli(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "freshidx.cli", "status", *args], cwd=cwd, text=True,
                          capture_output=True, env=env or env_without_freshidx(), timeout=120)


def test_stale_restarting_state_is_not_running_and_cwd_state_is_ignored(demo_home: Path, tmp_path: Path) -> None:
    gone = dead_pid()
    write_state(demo_home / "spark-server", status="restarting", supervisor_pid=gone, pid=dead_pid(),
                restarts=2, last_restart_at="2026-11-24T01:40:00+00:00", last_restart_reason="health")
    # Another demo's live-looking state in the working directory: it describes another store.
    elsewhere = tmp_path / "elsewhere"
    write_state(elsewhere / ".freshidx" / "spark-server", status="up", supervisor_pid=os.getpid(),
                pid=os.getpid(), url="sc://127.0.0.1:19999")
    uri = (demo_home / "store").as_uri()

    text = status_cli(["--store", uri], cwd=elsewhere)
    assert text.returncode == 0, text.stderr
    out = text.stdout
    assert f"connect server not running (last state: restarting, supervisor pid {gone} gone)" in out
    assert "19999" not in out and str(demo_home / "spark-server") in out
    assert "last restart 2026-11-24T01:40:00+00:00 (health)" in out
    assert "None" not in out
    assert "delta   –  nothing published yet" in out and "newest visible: – (no raw partition yet)" in out

    js = json.loads(status_cli(["--store", uri, "--json"], cwd=elsewhere).stdout)
    srv = js["spark_server"]
    assert (srv["status"], srv["last_status"], srv["running"]) == ("not running", "restarting", False)
    assert srv["supervisor_pid"] == gone and srv["state_dir"] == str(demo_home / "spark-server")
    assert js["spark_server_found_by"] == f"demo home {demo_home}"


def test_explicit_state_dir_wins_and_live_state_is_shown(demo_home: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    write_state(demo_home / "spark-server", status="restarting", supervisor_pid=dead_pid())
    live = tmp_path / "live-server"
    write_state(live, status="up", supervisor_pid=os.getpid(), pid=os.getpid(), url="sc://127.0.0.1:15077")
    uri = (demo_home / "store").as_uri()

    assert cli.main(["status", "--store", uri, "--spark-server-state", str(live)]) == 0
    out = capsys.readouterr().out
    assert f"connect server up  sc://127.0.0.1:15077  pid {os.getpid()}" in out
    assert "restarts 0  (never restarted)" in out and "None" not in out and f"{live}, --spark-server-state" in out

    monkeypatch.setenv("FRESHIDX_SPARK_SERVER_STATE", str(live))
    assert cli.main(["status", "--store", uri, "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["spark_server"]["running"] is True and js["spark_server_found_by"] == "FRESHIDX_SPARK_SERVER_STATE"


def test_store_without_server_state_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # A stale state in the CWD's default place must not be attributed to an unrelated store.
    write_state(tmp_path / ".freshidx" / "spark-server", status="restarting", supervisor_pid=dead_pid())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "elsewhere-store").mkdir(parents=True)  # status reads a store, never creates one
    uri = (tmp_path / "data" / "elsewhere-store").as_uri()
    assert cli.main(["status", "--store", uri]) == 0
    out = capsys.readouterr().out
    assert "spark   –  no Connect server state for this store" in out
    assert "restarting" not in out and "None" not in out
    assert cli.main(["status", "--store", uri, "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["spark_server"] is None and js["spark_server_found_by"] == "none"


def test_default_store_finds_its_demo_home_from_the_cwd(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # The embedded default (./.freshidx/store) still finds ./.freshidx/spark-server: same demo home.
    write_state(tmp_path / ".freshidx" / "spark-server", status="up", supervisor_pid=os.getpid(), pid=os.getpid())
    (tmp_path / ".freshidx" / "store").mkdir()  # the demo made it
    monkeypatch.chdir(tmp_path)
    assert cli.main(["status", "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["spark_server"]["status"] == "up" and js["spark_server_found_by"].startswith("demo home ")


def test_state_recorded_in_the_store_is_found_from_anywhere(tmp_path: Path) -> None:
    store = open_store(StoreConfig(uri=(tmp_path / "s3-like" / "root").as_uri()))
    state_dir = tmp_path / "demo-elsewhere" / "spark-server"
    write_state(state_dir, status="draining", supervisor_pid=os.getpid(), pid=os.getpid())
    assert locate_spark_server_state(store).state_dir is None
    record_spark_server_state(store, state_dir)
    where = locate_spark_server_state(store)
    assert (where.state_dir, where.found_by) == (str(state_dir), "recorded in the store by the demo")
    # A record written on another host names a path that means nothing here.
    store.put_json("runtime/spark-server.json", {"state_dir": str(state_dir), "hostname": "other-host"})
    assert locate_spark_server_state(store).state_dir is None


def test_state_from_another_host_is_not_judged_by_local_pids(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    state_dir = tmp_path / "remote-server"
    write_state(state_dir, status="up", hostname="spark-box-7", supervisor_pid=dead_pid(), pid=1)
    (tmp_path / "st").mkdir()
    assert cli.main(["status", "--store", (tmp_path / "st").as_uri(), "--spark-server-state", str(state_dir)]) == 0
    out = capsys.readouterr().out
    assert "connect server up" in out and "state written on host spark-box-7; liveness not checked" in out


def test_merged_segment_kind_is_shown_in_full(local_store_config: StoreConfig, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from freshidx.delta import compaction_plan
    from freshidx.delta import compaction_run as compact_delta
    from freshidx.publish.commit import publish
    from freshidx.settings import Settings
    from freshidx_tests.delta.test_compaction import three_segments_published
    from freshidx_tests.publish.test_publish import _segmented

    st = open_store(local_store_config)
    _, _, c = three_segments_published(st, monkeypatch)
    settings = Settings.from_env({}, store=local_store_config.uri, delta_compact_segments=2)
    done = compact_delta.compact_delta(None, st, local_store_config, settings, run_id="r")  # type: ignore[arg-type]
    assert done.outcome == "published", done
    assert publish(st, _segmented(st, 15, c), rebase=compact_delta.rebase_onto_compaction).outcome == "published"

    assert cli.main(["status", "--store", local_store_config.uri, "--json"]) == 0
    segs = json.loads(capsys.readouterr().out)["delta"]["segments"]
    assert [g["kind"] for g in segs] == [compaction_plan.MERGED_KIND, "incremental"], segs
    assert cli.main(["status", "--store", local_store_config.uri]) == 0
    out = capsys.readouterr().out
    assert f" {compaction_plan.MERGED_KIND} {segs[0]['docs']} docs, " in out and " incremental " in out, out
    assert " com " not in out and " inc " not in out
