"""End-to-end tests of ``freshidx.tools.devserver.DagsterDev`` against a real ``dagster dev`` process.

The code location is ``devserver_fixture_defs.py`` (loaded with ``-f``); everything is observed through
the webserver's GraphQL API, and every wait is a poll with a deadline.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from freshidx.tools.devserver import (
    CodeLocationLoadError,
    DagsterDev,
    DagsterDevExited,
    WaitAborted,
    prepare_home,
    process_group_pids,
)
from freshidx_tests.support.devserver_fixture_defs import DROP_DIR_ENV
from freshidx_tests.support.polling import poll_until

pytestmark = pytest.mark.daemon

FIXTURE_DEFS = Path(__file__).parents[1] / "support" / "devserver_fixture_defs.py"

# Telemetry off; DefaultRunCoordinator launches runs straight from the submitter (no 5 s queue loop).
DAGSTER_YAML = """\
telemetry:
  enabled: false
run_coordinator:
  module: dagster._core.run_coordinator
  class: DefaultRunCoordinator
"""

READY_TIMEOUT = 150.0
BACKFILL_PARTITIONS = ["2026-11-20-00:00", "2026-11-20-01:00"]
BACKFILL_RANGE = ("2026-11-20-02:00", "2026-11-20-03:00")

_RUN_DETAILS_QUERY = """
query RunDetails($runId: ID!) {
  runOrError(runId: $runId) {
    __typename
    ... on Run { runId status pipelineName assetSelection { path } tags { key value } }
  }
}
"""


def _make_home(tmp_path: Path) -> Path:
    src = tmp_path / "config" / "dagster.yaml"  # not in cwd: dagster dev warns about a cwd dagster.yaml
    src.parent.mkdir()
    src.write_text(DAGSTER_YAML)
    home = prepare_home(tmp_path / "home", src)
    assert (home / "dagster.yaml").read_text() == DAGSTER_YAML
    return home


def _report(timings: dict[str, float]) -> None:
    print("devserver timings: " + ", ".join(f"{k}={v:.1f}s" for k, v in timings.items()))


def test_prepare_home_minimal(tmp_path: Path) -> None:
    home = prepare_home(tmp_path / "h" / "nested", None)
    assert home == tmp_path / "h" / "nested"
    assert "enabled: false" in (home / "dagster.yaml").read_text()


def test_dagster_dev_lifecycle(tmp_path: Path) -> None:
    drop_dir = tmp_path / "drop"
    drop_dir.mkdir()
    dev = DagsterDev(
        home=_make_home(tmp_path),
        python_file=FIXTURE_DEFS,
        env={DROP_DIR_ENV: str(drop_dir)},
        cwd=tmp_path,
    )
    timings: dict[str, float] = {}
    try:
        t0 = time.monotonic()
        # Started as from a background job of a non-interactive shell (`nohup … &`, CI): SIGINT is
        # inherited ignored. The stop below must still be clean (rc 0, not a SIGKILL after the deadline).
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            dev.start()
        finally:
            signal.signal(signal.SIGINT, previous)
        dev.wait_ready(timeout=READY_TIMEOUT)
        timings["ready"] = time.monotonic() - t0

        assert dev.url == f"http://127.0.0.1:{dev.port}"
        assert dev.location_name == "devserver_fixture_defs.py"
        assert dev.repository_name == "__repository__"
        assert dev.locations == {"devserver_fixture_defs.py": ["__repository__"]}
        assert dev.is_running

        # Backfill first: the backfill daemon only looks every 30 s, so let it run in parallel.
        t_bf = time.monotonic()
        backfill_id = dev.launch_partition_backfill(
            "hourly", partition_keys=BACKFILL_PARTITIONS, title="devserver test"
        )
        bf = dev.backfill_status(backfill_id)
        assert bf["numPartitions"] == 2
        assert sorted(bf["partitionNames"]) == BACKFILL_PARTITIONS
        # The range form resolves to the same kind of backfill; cancel it before the daemon sees it
        # (running its runs too costs ~15 s on a 2-core box).
        range_backfill_id = dev.launch_partition_backfill("hourly", range=BACKFILL_RANGE, title="range")
        assert dev.backfill_status(range_backfill_id)["numPartitions"] == 2
        assert dev.cancel_backfill(range_backfill_id)["status"] in ("CANCELING", "CANCELED")

        # Sensor: RUNNING by default; a dropped file becomes a run keyed by the file name.
        state = dev.sensor_state("drop_sensor")
        assert state["status"] == "RUNNING"
        assert state["minIntervalSeconds"] == 1
        staging = tmp_path / "staging.tmp"
        staging.write_text("x")
        t_drop = time.monotonic()
        staging.rename(drop_dir / "part-0001.ready")

        def sensor_run_id() -> str | None:
            for tick in dev.sensor_state("drop_sensor")["ticks"]:
                if "part-0001.ready" in tick["runKeys"] and tick["runIds"]:
                    return str(tick["runIds"][0])
            return None

        run_id = poll_until(sensor_run_id, timeout=60, what="sensor tick with a run for the dropped file")
        timings["drop->run_created"] = time.monotonic() - t_drop
        assert dev.wait_run(run_id, timeout=60) == "SUCCESS", dev.run_errors(run_id)
        timings["drop->run_success"] = time.monotonic() - t_drop
        run = _run_details(dev, run_id)
        assert {"key": "dagster/run_key", "value": "part-0001.ready"} in run["tags"]
        assert run["assetSelection"] == [{"path": ["noop"]}]

        # Sensor stop/start round trip through the mutations.
        assert dev.stop_sensor("drop_sensor")["status"] == "STOPPED"
        assert dev.start_sensor("drop_sensor")["status"] == "RUNNING"

        # UI-style Materialize of `noop`.
        t_mat = time.monotonic()
        mat_id = dev.materialize(["noop"], tags={"freshidx/test": "materialize"})
        assert dev.wait_run(mat_id, timeout=60) == "SUCCESS", dev.run_errors(mat_id)
        timings["materialize->success"] = time.monotonic() - t_mat
        run = _run_details(dev, mat_id)
        assert run["pipelineName"] == "__ASSET_JOB"
        assert run["assetSelection"] == [{"path": ["noop"]}]
        assert {"key": "freshidx/test", "value": "materialize"} in run["tags"]

        # Backfill: one run per partition (no BackfillPolicy), all succeed.
        def backfill_done() -> dict[str, Any] | None:
            status = dev.backfill_status(backfill_id)
            assert status["status"] not in ("FAILED", "COMPLETED_FAILED", "CANCELED"), status
            return status if _succeeded_partitions(status) == BACKFILL_PARTITIONS else None

        bf = poll_until(backfill_done, timeout=120, interval=0.5, what="backfill runs to succeed")
        timings["backfill->runs_success"] = time.monotonic() - t_bf
        assert len(bf["runs"]) == 2
        assert dev.backfill_status(range_backfill_id)["runs"] == []
    finally:
        pgid = dev.pid
        t_stop = time.monotonic()
        rc = dev.stop()
        timings["stop"] = time.monotonic() - t_stop
        _report(timings)

    assert rc == 0
    assert not dev.is_running
    assert pgid is not None and process_group_pids(pgid) == []
    assert dev.stop() == 0  # idempotent


def test_broken_code_location_fails_fast(tmp_path: Path) -> None:
    # The defs file imports a helper with a syntax error: dagster wraps the SyntaxError in a
    # DagsterUserCodeLoadError, so this also checks that the cause chain reaches the message.
    (tmp_path / "broken_helper.py").write_text("def broken(:\n    pass\n")
    broken = tmp_path / "broken_defs.py"
    broken.write_text("import dagster as dg\n\nimport broken_helper\n\ndefs = dg.Definitions()\n")
    dev = DagsterDev(home=_make_home(tmp_path), python_file=broken, cwd=tmp_path)
    t0 = time.monotonic()
    try:
        dev.start()
        with pytest.raises(CodeLocationLoadError) as info:
            dev.wait_ready(timeout=READY_TIMEOUT)
        elapsed = time.monotonic() - t0
    finally:
        dev.stop()
    print(f"broken location reported after {elapsed:.1f}s")
    assert info.value.location == "broken_defs.py"
    assert "SyntaxError" in info.value.error_message
    assert "broken_helper.py" in str(info.value)
    assert elapsed < READY_TIMEOUT  # failed on the error, not on the deadline
    assert dev.group_pids() == []


def test_process_exit_is_reported_with_log_tail(tmp_path: Path) -> None:
    # A missing workspace file makes `dagster dev` exit during argument parsing.
    missing = tmp_path / "no-such-workspace.yaml"
    dev = DagsterDev(home=prepare_home(tmp_path / "home", None), workspace=missing, cwd=tmp_path)
    try:
        with pytest.raises(DagsterDevExited) as info:
            dev.__enter__()
    finally:
        dev.stop()
    assert "no-such-workspace.yaml" in str(info.value)
    assert dev.log_path == tmp_path / "home" / "dagster-dev.log"
    assert dev.group_pids() == []


def _succeeded_partitions(backfill: dict[str, Any]) -> list[str]:
    return sorted(
        t["value"]
        for r in backfill["runs"]
        if r["status"] == "SUCCESS"
        for t in r["tags"]
        if t["key"] == "dagster/partition"
    )


def _run_details(dev: DagsterDev, run_id: str) -> dict[str, Any]:
    data = dev.graphql(_RUN_DETAILS_QUERY, {"runId": run_id})
    run = data["runOrError"]
    assert run["__typename"] == "Run", run
    return dict(run)


def test_wait_ready_can_be_aborted(tmp_path: Path) -> None:
    # What `freshidx demo` relies on to stop promptly when SIGTERM arrives during start-up.
    dev = DagsterDev(home=_make_home(tmp_path), python_file=FIXTURE_DEFS, cwd=tmp_path)
    calls = []
    try:
        dev.start()
        with pytest.raises(WaitAborted):
            dev.wait_ready(timeout=READY_TIMEOUT, abort=lambda: calls.append(1) or len(calls) > 2)
    finally:
        dev.stop()
    assert len(calls) == 3
    assert dev.group_pids() == []


def test_a_taken_port_moves_a_picked_port_and_fails_a_chosen_one(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A socket bound without listening passes the connect probe, then the webserver's bind fails (as when
    another process takes the port between the probe and the bind): ``dagster dev`` keeps its daemon
    running without a webserver. A port the caller chose raises at once; a port DagsterDev picked is
    replaced by another free one and the server comes up."""
    import socket

    from freshidx.tools import devserver
    from freshidx.tools.devserver import WebserverPortTaken

    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))  # no SO_REUSEADDR, no listen: the webserver cannot bind it
        taken = blocker.getsockname()[1]
        (tmp_path / "chosen").mkdir()
        (tmp_path / "picked").mkdir()
        chosen = DagsterDev(home=_make_home(tmp_path / "chosen"), port=taken, python_file=FIXTURE_DEFS, cwd=tmp_path)
        try:
            chosen.start()
            with pytest.raises(WebserverPortTaken, match=str(taken)):
                chosen.wait_ready(timeout=READY_TIMEOUT)
        finally:
            chosen.stop()
        assert chosen.group_pids() == []

        ports = iter([taken])
        real_free_port = devserver.free_port
        monkeypatch.setattr(devserver, "free_port", lambda host="127.0.0.1": next(ports, None) or real_free_port(host))
        picked = DagsterDev(home=_make_home(tmp_path / "picked"), python_file=FIXTURE_DEFS, cwd=tmp_path)
        assert picked.port == taken
        try:
            picked.start()
            picked.wait_ready(timeout=READY_TIMEOUT)
            assert picked.port != taken and picked.server_info_status() == 200
            assert picked.location_name == "devserver_fixture_defs.py"
        finally:
            picked.stop()
        assert picked.group_pids() == []
