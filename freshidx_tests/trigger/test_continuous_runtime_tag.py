"""Continuous runs carry their own run monitoring limit (``dagster/max_runtime``): planned restart + grace.

The pure derivation (grace, rounding, what a run with a wrong or missing tag is warned about), and the tag
where Dagster takes it from: the ``delta_continuous`` job the code location builds from its settings, and
the watchdog's run request. No JVM: the watchdog only reads the instance. The run under a real daemon with
run monitoring on is freshidx_tests/trigger/test_continuous_monitoring.py.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from freshidx.settings import Settings
from freshidx.trigger import continuous_rules
from freshidx.trigger.continuous_rules import MAX_RUNTIME_TAG, RESTART_GRACE, RUNTIME_TAG_GRACE, Limits

GRACE = RUNTIME_TAG_GRACE.total_seconds()


def test_grace_covers_the_deferred_restart_and_stays_finite() -> None:
    # The loop may take its planned restart RESTART_GRACE late, then finish a micro-batch and shut down.
    assert RESTART_GRACE + dt.timedelta(minutes=10) < RUNTIME_TAG_GRACE
    assert GRACE == 1800  # the figure docs/operations.md gives
    assert continuous_rules.monitoring_max_runtime(86400) == 86400 + 1800
    assert continuous_rules.monitoring_max_runtime(120) == 1920


def test_limit_is_whole_seconds_rounded_up() -> None:
    assert continuous_rules.monitoring_max_runtime(90.2) == 90 + 1800 + 1
    assert continuous_rules.monitoring_max_runtime(90.0) == 1890
    assert continuous_rules.max_runtime_tags(0.5) == {MAX_RUNTIME_TAG: "1801"}
    # Dagster parses the tag with float(): a whole number, no exponent, no decimals.
    assert continuous_rules.max_runtime_tags(31 * 24 * 3600) == {MAX_RUNTIME_TAG: str(31 * 24 * 3600 + 1800)}


LIMITS = Limits(trigger_seconds=0.5, max_runtime_seconds=120, max_rss_mb=2048)


@pytest.mark.parametrize(("tags", "says"), [
    ({MAX_RUNTIME_TAG: "1920"}, None),
    ({MAX_RUNTIME_TAG: "99999"}, None),
    ({"dagster/max_runtime_seconds": "1920"}, None),  # the alias Dagster also reads
    ({}, "no dagster/max_runtime tag"),
    ({MAX_RUNTIME_TAG: "3600", "other": "x"}, None),
    ({MAX_RUNTIME_TAG: "600"}, "below this run's planned restart plus its grace (1920 s)"),
    ({MAX_RUNTIME_TAG: "-1"}, "below"),
    ({MAX_RUNTIME_TAG: "0"}, "sets no limit"),
    ({MAX_RUNTIME_TAG: "a day"}, "sets no limit"),
])
def test_a_run_says_when_monitoring_would_not_guard_it(tags: dict[str, str], says: str | None) -> None:
    problem = continuous_rules.max_runtime_tag_problem(tags, LIMITS)
    assert problem is None if says is None else (problem is not None and says in problem), problem


@pytest.fixture(scope="module")
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:  # loading a repository resolves the current instance
        yield inst


def _defs(tmp: Path, runtime: str) -> dg.Definitions:
    from freshidx.definitions import build_definitions

    env = {"FRESHIDX_DELTA_MODE": "continuous", "FRESHIDX_CONTINUOUS_MAX_RUNTIME": runtime}
    return build_definitions(Settings.from_env(env, store=(tmp / "store").as_uri()))


def _watchdog_request(defs: dg.Definitions, instance: dg.DagsterInstance) -> Any:
    sensor = defs.resolve_sensor_def("delta_continuous_watchdog")
    with dg.build_sensor_context(instance=instance, definitions=defs,
                                 resources=dict(defs.resources or {})) as ctx:
        data = sensor.evaluate_tick(ctx)
    (req,) = data.run_requests
    return req


@pytest.mark.parametrize(("runtime", "limit"), [("120", "1920"), ("24h", "88200"), ("1h30m", "7200")])
def test_the_job_and_the_watchdog_request_carry_the_limit(tmp_path: Path, instance: dg.DagsterInstance,
                                                          runtime: str, limit: str) -> None:
    defs = _defs(tmp_path, runtime)
    job = defs.resolve_job_def("delta_continuous")
    assert job.tags[MAX_RUNTIME_TAG] == limit  # a UI launch of the job: the launchpad starts from these
    assert job.tags["dagster/priority"] == "10" and job.tags["freshidx/delta_mode"] == "continuous"
    watchdog = defs.resolve_sensor_def("delta_continuous_watchdog")
    assert watchdog.job_name == "delta_continuous"
    req = _watchdog_request(defs, instance)
    assert req.run_key == "delta_continuous:first" and req.tags[MAX_RUNTIME_TAG] == limit
    # A run created as the daemon creates the watchdog's (the job's tags, then the request's) carries it.
    run = instance.create_run_for_job(job, tags={**job.tags, **req.tags}, status=dg.DagsterRunStatus.NOT_STARTED)
    assert run.tags[MAX_RUNTIME_TAG] == limit
    assert continuous_rules.max_runtime_tag_problem(run.tags, Limits.from_settings(
        Settings.from_env({"FRESHIDX_CONTINUOUS_MAX_RUNTIME": runtime}))) is None
    instance.delete_run(run.run_id)


def test_default_settings_job_is_the_importable_one(tmp_path: Path) -> None:
    from freshidx.defs.delta.continuous_job import delta_continuous, make_delta_continuous

    default = Settings.from_env({}, store=(tmp_path / "store").as_uri())
    assert make_delta_continuous(default) is delta_continuous  # one object: no duplicate job in a location
    assert delta_continuous.tags[MAX_RUNTIME_TAG] == str(int(default.continuous_max_runtime) + 1800)
    other = Settings.from_env({"FRESHIDX_CONTINUOUS_MAX_RUNTIME": "2h"}, store=(tmp_path / "store").as_uri())
    assert make_delta_continuous(other) is not delta_continuous
    assert make_delta_continuous(other).tags[MAX_RUNTIME_TAG] == str(7200 + 1800)
