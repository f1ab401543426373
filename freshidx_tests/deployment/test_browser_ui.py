"""The Dagster UI in a real browser (Debian's Chromium driven by Playwright), against one real ``dagster dev``.

What a user does, step by step as they would, then checked
through the CLI (``freshidx status --json`` / ``freshidx ledger --json``) and the store:

1. ``delta_index_sensor`` requests a run by itself: a new partition lands in the store, the run for it
   appears in the UI's Runs list (filtered by its partition tag), says "Launched by
   delta_index_sensor", and ends "Success"; the pointer and the ledger name that run.
2. "Materialize" on the ``delta_index`` asset page (sensor stopped, a newer partition written): the
   notification links to the launched run, which ends "Success" and publishes that partition.
3. A backfill of 3 ``ads_hourly`` hours from the asset's Partitions view (Materialize…, type the range,
   Launch backfill): one run per hour (``FRESHIDX_HOURLY_MAX_HOURS_PER_RUN=1``), each followed to
   "Success", the backfill page says "Succeeded", and each hour is rebuilt by one of its runs.

Then (the UI tells the truth): on every asset's Checks tab, each check's description
and state as shown (the list entry's status and icon, "Evaluation result", the latest evaluation's
text) match what the checks report through GraphQL, the descriptions are the ones defined in
``freshidx.sla.check_rules``, and the reported state is what the checks compute from the store right now.

Runs are followed with GraphQL polling (cheap on a busy 2-core box), and the UI's run page is read
when a run starts and once it has ended. Needs ``/usr/bin/chromium`` and the ``playwright`` package;
skips with the reason otherwise.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from freshidx.catchup import planner as catchup
from freshidx.publish.commit import read_pointer
from freshidx.settings import Settings
from freshidx.sla import check_rules as sla
from freshidx.store import ObjectStore, StoreConfig, layout, open_store
from freshidx.store.partitions import PartitionId
from freshidx.tools.devserver import BACKFILL_TERMINAL_STATUSES, RUN_TERMINAL_STATUSES, DagsterDev, prepare_home
from freshidx.tools.generate import GeneratorConfig, write_partition
from freshidx_tests.support.browser_fixture import (
    RUN_STATUS_LABELS,
    CheckView,
    DagsterUi,
    chromium_page,
    unavailable_reason,
)
from freshidx_tests.support.polling import poll_until

REPO = Path(__file__).resolve().parents[2]
GEN = GeneratorConfig(seed=13, ads=200, products=40, changes_per_partition=20)
HOURS_PER_RUN = 1  # a backfill of 3 hours = 3 runs, each followed
SENSOR = "delta_index_sensor"
TAG_PARTITION = "freshidx/source_partition"
#: Run deadlines (s): a Spark run on a busy 2-core box, possibly queued behind the SLA's full rebuild.
RUN_DEADLINE = 900

RUN_QUERY = """
query FreshidxUiRun($runId: ID!) { runOrError(runId: $runId) { __typename
  ... on Run { runId status tags { key value } } ... on Error { message } } }
"""
RUNS_BY_TAG_QUERY = """
query FreshidxUiRunsByTag($filter: RunsFilter!) { runsOrError(filter: $filter) { __typename
  ... on Runs { results { runId } } ... on PythonError { message } } }
"""
RECENT_RUNS_QUERY = """
query FreshidxUiRecentRuns { runsOrError(limit: 12) { __typename
  ... on Runs { results { runId status creationTime assetSelection { path } tags { key value } } }
  ... on PythonError { message } } }
"""
CHECKS_QUERY = """
{ assetNodes { assetKey { path }
    assetChecksOrError { __typename ... on AssetChecks { checks { name description
        executionForLatestMaterialization { status timestamp evaluation { severity description } } } } } } }
"""


@dataclass
class Setup:
    dev: DagsterDev
    ui: DagsterUi
    store: ObjectStore
    env: dict[str, str]
    hours: list[dt.datetime]  # three closed hours with data, the backfill's range


@pytest.fixture
def setup(request: pytest.FixtureRequest, tmp_path: Path, local_store_config: StoreConfig) -> Iterator[Setup]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"no browser for the UI test: {reason}")
    try:  # runs lease the suite's shared Spark Connect server when conftest provides one
        spark: dict[str, str] = request.getfixturevalue("shared_spark_connect")
    except pytest.FixtureLookupError:
        spark = {}  # a local SparkSession per run
    store = open_store(local_store_config)
    h0 = catchup.floor_hour(dt.datetime.now(dt.UTC)) - dt.timedelta(hours=5)
    hours = [h0 + dt.timedelta(hours=i) for i in range(3)]
    for hour in hours:  # closed hours, two batches each; also the first thing the delta sensor publishes
        for minute in (10, 40):
            write_partition(store, GEN, PartitionId(hour + dt.timedelta(minutes=minute)))
    env = {
        "FRESHIDX_STORE": local_store_config.uri, "PYSPARK_PYTHON": sys.executable,
        "FRESHIDX_PARTITIONS_START": (h0 - dt.timedelta(days=1)).strftime("%Y-%m-%d"),
        # The catch-up sensor stays off: the hours are built by the UI backfill under test only.
        "FRESHIDX_CATCHUP_AUTOSTART": "false",
        "FRESHIDX_HOURLY_MAX_HOURS_PER_RUN": str(HOURS_PER_RUN),
        "FRESHIDX_SLA_INTERVAL_SECONDS": "10",
        **spark,
    }
    home = prepare_home(tmp_path / "dagster_home", REPO / "dagster.yaml")
    dev = DagsterDev(home=home, module="freshidx.definitions", env=env, cwd=REPO)
    dev.start()
    try:
        dev.wait_ready(timeout=420)
        with chromium_page(tmp_path / "chromium-profile") as page:
            yield Setup(dev, DagsterUi(page, dev.url, tmp_path / "screenshots"), store, env, hours)
    finally:
        dev.stop()


# ------------------------------------------------------------------------------------------------ helpers


def cli_json(env: dict[str, str], *args: str) -> Any:
    """``freshidx <args> --json`` as a user runs it (a subprocess); its parsed output."""
    proc = subprocess.run([sys.executable, "-m", "freshidx.cli", *args, "--json"], env={**os.environ, **env},
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"freshidx {' '.join(args)} exited {proc.returncode}: {proc.stderr[-3000:]}"
    return json.loads(proc.stdout)


def run_ids_tagged(d: DagsterDev, key: str, value: str) -> list[str]:
    """Ids of the runs carrying tag ``key=value``, through GraphQL: the test waits with this (cheap) and
    reads the UI once there is something to show (every read of a page loads the whole UI)."""
    runs = d.graphql(RUNS_BY_TAG_QUERY, {"filter": {"tags": [{"key": key, "value": value}]}})["runsOrError"]
    assert runs["__typename"] == "Runs", runs
    return [r["runId"] for r in runs["results"]]


def run_info(d: DagsterDev, run_id: str) -> tuple[str, dict[str, str]]:
    run = d.graphql(RUN_QUERY, {"runId": run_id})["runOrError"]
    assert run["__typename"] == "Run", run
    return str(run["status"]), {t["key"]: t["value"] for t in run["tags"]}


def recent_runs(d: DagsterDev) -> str:
    """The newest runs, one line each (id, status, created, assets, who launched it): what a failed
    assertion about which run published something needs to say."""
    runs = d.graphql(RECENT_RUNS_QUERY)["runsOrError"]
    lines = []
    for r in runs.get("results") or []:
        tags = {t["key"]: t["value"] for t in r["tags"]}
        who = {k: v for k, v in tags.items() if k.startswith(("dagster/sensor", "dagster/backfill", "freshidx/"))}
        assets = ",".join("/".join(a["path"]) for a in r.get("assetSelection") or [])
        created = dt.datetime.fromtimestamp(r["creationTime"], dt.UTC).strftime("%H:%M:%S.%f")[:-3]
        lines.append(f"  {r['runId'][:8]} {r['status']:<9} {created} [{assets}] {who}")
    return "\n".join(lines) or repr(runs)


def follow_run(s: Setup, run_id: str, what: str) -> str:
    """Open the run's page in the UI, wait for the run to end, and return the status the UI then shows.

    The run must end in SUCCESS; a failure names the run and leaves a screenshot of its page."""
    with s.ui.step(f"open the {what} run {run_id[:8]}"):
        first = s.ui.run_status_label(run_id)
    assert first in RUN_STATUS_LABELS.values(), f"{what} run {run_id}: the UI shows status {first!r}"
    s.ui.park()  # read again once the run has ended

    def ended() -> str | None:
        status = s.dev.run_status(run_id)
        return status if status in RUN_TERMINAL_STATUSES else None

    status = poll_until(ended, timeout=RUN_DEADLINE, interval=2, what=f"the {what} run {run_id} to end")
    with s.ui.step(f"read the ended {what} run {run_id[:8]}"):
        shown = s.ui.run_status_label(run_id)
    if status != "SUCCESS":
        errors = "\n  ".join(s.dev.run_errors(run_id)) or "(no error events)"
        raise AssertionError(f"{what} run {run_id} ended {status} (UI: {shown!r}); its page: "
                             f"{s.ui.screenshot(f'{what}-run-{run_id[:8]}')}; log: {s.dev.log_path}; "
                             f"its errors:\n  {errors}")
    assert shown == RUN_STATUS_LABELS["SUCCESS"], (
        f"{what} run {run_id} succeeded but its page shows {shown!r}: {s.ui.screenshot(f'{what}-ended')}")
    return shown


def ledger_entries(s: Setup, pipeline: str, **filters: str) -> list[dict[str, Any]]:
    args = ["ledger", "--pipeline", pipeline]
    for key, value in filters.items():
        args += [f"--{key}", value]
    return list(cli_json(s.env, *args))


def graphql_checks(d: DagsterDev) -> dict[str, dict[str, dict[str, Any]]]:
    """asset → check name → {name, description, executionForLatestMaterialization} (every asset node)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for node in d.graphql(CHECKS_QUERY)["assetNodes"]:
        checks = (node["assetChecksOrError"] or {}).get("checks") or []
        out["/".join(node["assetKey"]["path"])] = {c["name"]: c for c in checks}
    return out


def expected_view(check: dict[str, Any]) -> CheckView:
    """What the Checks tab must show for a check GraphQL reports as ``check``."""
    execution = check["executionForLatestMaterialization"]
    evaluation = (execution or {}).get("evaluation") or {}
    paragraphs = tuple(" ".join(str(t).split()) for t in (check["description"], evaluation.get("description")) if t)
    if execution is None:
        return CheckView("Not evaluated", "status", "Not evaluated", "status", paragraphs)
    status = execution["status"]
    if status == "SUCCEEDED":
        return CheckView("Succeeded", "check_circle", "Passed", "check_circle", paragraphs)
    if status == "FAILED":  # a warning is drawn as one, an error as a red cross
        icon = "warning_outline" if evaluation.get("severity") == "WARN" else "cancel"
        return CheckView("Failed", icon, "Failed", icon, paragraphs)
    if status == "EXECUTION_FAILED":
        return CheckView("Failed", "cancel", "Failed", "cancel", paragraphs)
    if status == "SKIPPED":
        return CheckView("Skipped", "dot", "Skipped", "dot", paragraphs)
    return CheckView("In progress", None, "Running", None, paragraphs)  # IN_PROGRESS: a spinner, no icon


def computed_outcomes(s: Setup) -> dict[tuple[str, str], sla.CheckOutcome]:
    """What each check computes from the store now, with the settings ``dagster dev`` runs with."""
    import dagster as dg

    from freshidx.defs.sla.checks import consecutive_delta_failures

    settings = Settings.from_env(env=s.env)
    instance = dg.DagsterInstance.from_config(str(s.dev.home))
    try:
        failures = consecutive_delta_failures(instance)
    finally:
        instance.dispose()
    observed = sla.observe(s.store, settings, dt.datetime.now(dt.UTC), failures)
    return {(o.asset, o.check): o for o in sla.evaluate(observed, settings)}


# ------------------------------------------------------------------------------------------------- test


@pytest.mark.daemon
@pytest.mark.heavy  # 4-16 min on 2 cores (the VM's speed varies): the module the suite starts among the first
@pytest.mark.timeout(3600)  # four Spark runs and a full rebuild on a busy 2-core box, each polled generously
def test_user_flows_and_asset_checks_in_a_real_browser(setup: Setup) -> None:
    s = setup
    d, ui = s.dev, s.ui

    # --- 1. delta_index_sensor requests a run by itself for a partition that just landed ------------
    p_sensor = PartitionId.from_datetime(dt.datetime.now(dt.UTC) - dt.timedelta(minutes=4))
    write_partition(s.store, GEN, p_sensor)
    poll_until(lambda: run_ids_tagged(d, TAG_PARTITION, p_sensor.path), timeout=RUN_DEADLINE, interval=2,
               what=f"a run tagged {p_sensor.path}")
    with ui.step(f"find the sensor's run for {p_sensor.path} in the Runs list"):
        runs = poll_until(lambda: ui.run_ids_in_list(tag=(TAG_PARTITION, p_sensor.path)), timeout=RUN_DEADLINE,
                          interval=5, what=f"a run tagged {p_sensor.path} in the UI's Runs list")
    assert len(runs) == 1, f"the Runs list shows {len(runs)} runs for {p_sensor.path}: {runs}"
    sensor_run = runs[0]
    follow_run(s, sensor_run, "sensor")
    with ui.step("read who launched the sensor's run"):
        launched_by = ui.run_launched_by()
    assert launched_by == SENSOR, f"run {sensor_run} page says launched by {launched_by!r}"
    _, tags = run_info(d, sensor_run)
    assert tags.get("dagster/sensor_name") == SENSOR and tags.get(TAG_PARTITION) == p_sensor.path, tags
    status = cli_json(s.env, "status")
    assert status["delta"]["source_partition"] == p_sensor.path, status["delta"]
    assert status["delta"]["run_id"] == sensor_run, status["delta"]
    decisions = {(e["decision"], e.get("run_id")) for e in ledger_entries(s, "delta", partition=p_sensor.compact)}
    assert {("accepted", sensor_run), ("published", sensor_run)} <= decisions, decisions

    # --- 2. Materialize delta_index from its asset page ----------------------------------------------
    # So that the newer partition below is the button's to publish, not the sensor's.
    d.stop_sensor(SENSOR, settle_with="freshidx_run_health_sensor")
    stop_settled = dt.datetime.now(dt.UTC).strftime("%H:%M:%S.%f")[:-3]
    p_ui = PartitionId.from_datetime(dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1))
    assert p_ui > p_sensor
    write_partition(s.store, GEN, p_ui)
    written = dt.datetime.now(dt.UTC).strftime("%H:%M:%S.%f")[:-3]
    with ui.step("click Materialize on delta_index"):
        ui_run = ui.materialize("delta_index")
    assert ui_run != sensor_run
    follow_run(s, ui_run, "Materialize")
    _, tags = run_info(d, ui_run)
    assert "dagster/sensor_name" not in tags, f"the button's run {ui_run} carries sensor tags: {tags}"
    status = cli_json(s.env, "status")
    published = {k: status["delta"].get(k) for k in ("source_partition", "run_id", "seq")}
    assert (published["source_partition"], published["run_id"]) == (p_ui.path, ui_run), (
        f"the button's run {ui_run} (stop settled {stop_settled}, partition written {written}): "
        f"delta {published}; runs:\n{recent_runs(d)}")
    decisions = {(e["decision"], e.get("run_id")) for e in ledger_entries(s, "delta", partition=p_ui.compact)}
    assert ("published", ui_run) in decisions, decisions
    assert not any(dec == "accepted" for dec, _ in decisions), f"the sensor took {p_ui.path}: {decisions}"
    d.start_sensor(SENSOR)

    # --- 3. A backfill of 3 ads_hourly hours from the partitions view --------------------------------
    keys = [catchup.dagster_key(h) for h in s.hours]
    with ui.step(f"launch a backfill of ads_hourly {keys[0]}...{keys[-1]}"):
        backfill_id, note = ui.launch_backfill("ads_hourly", f"[{keys[0]}...{keys[-1]}]")
    assert f"maximum of {HOURS_PER_RUN} partition" in note, note
    backfill = d.backfill_status(backfill_id)
    assert sorted(backfill["partitionNames"]) == keys, backfill

    def three_runs_listed() -> list[str] | None:
        ids = ui.backfill_run_ids(backfill_id)
        return ids if len(ids) >= 3 else None

    poll_until(lambda: len(run_ids_tagged(d, "dagster/backfill", backfill_id)) >= 3, timeout=RUN_DEADLINE,
               interval=2, what=f"3 runs of backfill {backfill_id}")
    with ui.step(f"list the runs of backfill {backfill_id}"):
        backfill_runs = poll_until(three_runs_listed, timeout=RUN_DEADLINE, interval=5,
                                   what=f"3 runs on backfill {backfill_id}'s page")
    assert len(backfill_runs) == 3, backfill_runs
    for run_id in reversed(backfill_runs):  # the list is newest first; follow them in launch order
        follow_run(s, run_id, "backfill")
    run_partitions: dict[str, str] = {}
    for run_id in backfill_runs:
        _, tags = run_info(d, run_id)
        assert tags.get("dagster/backfill") == backfill_id, tags
        # A multi-run backfill tags each run with its partition range; one hour per run here.
        start, end = tags.get("dagster/asset_partition_range_start"), tags.get("dagster/asset_partition_range_end")
        run_partitions[run_id] = tags.get("dagster/partition") or (str(start) if start == end else f"{start}...{end}")
    assert sorted(run_partitions.values()) == keys, run_partitions

    def backfill_ended() -> dict[str, Any] | None:
        b = d.backfill_status(backfill_id)
        return b if b["status"] in BACKFILL_TERMINAL_STATUSES else None

    ui.park()
    final = poll_until(backfill_ended, timeout=300, interval=2, what=f"backfill {backfill_id} to end")
    assert final["status"] == "COMPLETED_SUCCESS", final
    with ui.step(f"read backfill {backfill_id}'s status"):
        shown = ui.backfill_status_label(backfill_id)
    assert shown == "Succeeded", f"backfill {backfill_id} page shows {shown!r}: {ui.screenshot('backfill-status')}"
    rebuilt = [e for e in ledger_entries(s, "ads_hourly") if e["decision"] == "rebuilt"]
    for hour in s.hours:
        hid = layout.hour_id(hour)
        mine = [e for e in rebuilt if e["trigger_id"].startswith(f"{hid}.backfill-")]
        assert len(mine) == 1, f"{hid}: ledger has {mine}"
        assert mine[0]["run_id"] in backfill_runs and run_partitions[mine[0]["run_id"]] == catchup.dagster_key(hour)
        assert mine[0]["extra"]["kind"] == "backfill", mine[0]
        pointer, _ = read_pointer(s.store, layout.bucket_name(catchup.ASSET, hour))
        assert pointer is not None and pointer.version == mine[0]["extra"]["version"], (hid, pointer, mine[0])

    # --- 4. Each asset check as the Checks tab shows it = what the checks report ---------------------
    reported = graphql_checks(d)
    assert {a: set(c) for a, c in reported.items() if c} == {a: set(n) for a, n in sla.CHECK_NAMES.items()}, reported
    assert not reported["ads_hourly"], reported["ads_hourly"]
    for asset, checks in reported.items():
        with ui.step(f"count the checks on {asset}'s Checks tab"):
            shown_count = ui.checks_count(asset)
        assert shown_count == len(checks), f"{asset}: the Checks tab shows {shown_count}, GraphQL has {sorted(checks)}"
        for name, check in checks.items():
            assert check["description"] == sla.DESCRIPTIONS[name], f"{asset}.{name}: {check['description']!r}"
            last: list[str] = []

            def agrees(asset: str = asset, name: str = name, last: list[str] = last) -> CheckView | None:
                # GraphQL before and after reading the page: a new evaluation in between is retried.
                before = graphql_checks(d)[asset][name]
                execution = before["executionForLatestMaterialization"] or {}
                truth = computed_outcomes(s)[(asset, name)]
                reported_passed = execution.get("status") == "SUCCEEDED"
                last[:] = ["UI not read yet", f"GraphQL {before}", f"computed now: {truth.state}: {truth.description}"]
                # What the checks report is what they compute from the store now (evaluated, same verdict);
                # until then the page is not read (each read loads the whole UI).
                if execution.get("status") not in {"SUCCEEDED", "FAILED"} or reported_passed != truth.passed:
                    return None
                with ui.step(f"read check {asset}.{name} on the Checks tab"):
                    view = ui.check_view(asset, name)
                after = graphql_checks(d)[asset][name]
                last[0] = f"UI {view}"
                if before != after or view != expected_view(before):
                    return None
                return view

            try:
                poll_until(agrees, timeout=240, interval=3, what=f"{asset}.{name}: UI = GraphQL = computed")
            except TimeoutError as exc:
                shot = ui.screenshot(f"check-{asset}-{name}")
                raise AssertionError(f"{asset}.{name} as shown does not match what the check reports "
                                     f"(screenshot: {shot}):\n" + "\n".join(last)) from exc
