"""Limits and priorities live on the definitions, and the shipped instance configs are stock.

The pools are on the assets, so a UI "Materialize", a backfill, a schedule's run and a sensor's run of the
same asset wait for the same slot; the priorities are tags of the asset jobs the triggers launch. No
dagster.yaml we ship names a class of ours (a stock webserver and daemon must load them). The runs'
behaviour under these limits is freshidx_tests/defs/test_limits_e2e.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from freshidx.defs.shared.lanes import POOL_DELTA, POOL_HEAVY
from freshidx.settings import Settings

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from freshidx.definitions import build_definitions

    store = tmp_path_factory.mktemp("store")
    # Loading a repository resolves the current instance (defs state): give it one of its own.
    with dg.instance_for_test():
        yield build_definitions(Settings.from_env({}, store=f"file://{store}")).get_repository_def()


@pytest.mark.parametrize(("asset", "pool"), [
    ("delta_index", POOL_DELTA), ("full_index", POOL_HEAVY), ("ads_hourly", POOL_HEAVY),
    ("delta_compaction", POOL_HEAVY)])
def test_each_build_takes_its_pool(repo: Any, asset: str, pool: str) -> None:
    assert repo.asset_graph.get(dg.AssetKey(asset)).pools == {pool}


@pytest.mark.parametrize(("job", "priority"), [
    ("delta_index_job", "10"), ("delta_continuous", "10"), ("full_index_job", "6"), ("ads_hourly_job", "5"),
    ("delta_compaction_job", "3")])
def test_the_asset_jobs_carry_their_priority(repo: Any, job: str, priority: str) -> None:
    assert repo.get_job(job).tags["dagster/priority"] == priority


@pytest.mark.parametrize(("trigger", "job"), [
    ("delta_index_sensor", "delta_index_job"), ("ads_hourly_sensor", "ads_hourly_job"),
    ("freshidx_sla_sensor", "full_index_job"), ("delta_compaction_sensor", "delta_compaction_job"),
    ("delta_continuous_watchdog", "delta_continuous")])
def test_every_sensor_launches_its_job(repo: Any, trigger: str, job: str) -> None:
    assert repo.get_sensor_def(trigger).job_name == job


def test_the_schedule_launches_the_full_index_job(repo: Any) -> None:
    assert repo.get_schedule_def("full_index_schedule").job_name == "full_index_job"


def test_no_run_request_tags_a_limit_of_its_own(repo: Any) -> None:
    # Limits that rode on tags only our triggers set are gone: nothing may rely on them again.
    for job in ("delta_index_job", "full_index_job", "ads_hourly_job", "delta_compaction_job", "delta_continuous"):
        tags = repo.get_job(job).tags
        assert "freshidx/weight" not in tags and "freshidx/launch" not in tags


def _instance_configs() -> list[Path]:
    found = [REPO / "dagster.yaml", REPO / "freshidx" / "dagster_home" / "dagster.yaml"]
    for folder in ("docker", "freshidx_tests", "scripts"):
        found += sorted((REPO / folder).rglob("dagster*.yaml"))
    return found


def _classes(node: Any) -> list[str]:
    """Every ``module``/``class`` value in an instance config (configurable classes are named so)."""
    if isinstance(node, dict):
        out = [str(node[k]) for k in ("module", "class") if k in node]
        return out + [c for v in node.values() for c in _classes(v)]
    if isinstance(node, list):
        return [c for v in node for c in _classes(v)]
    return []


@pytest.mark.parametrize("path", _instance_configs(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_shipped_instance_config_names_a_class_of_ours(path: Path) -> None:
    config = yaml.safe_load(path.read_text()) or {}
    assert not [c for c in _classes(config) if c.startswith("freshidx") or "Freshidx" in c]
    runs = (config.get("concurrency") or {}).get("runs") or {}
    keys = {limit.get("key") for limit in runs.get("tag_concurrency_limits") or []}
    assert not {k for k in keys if str(k).startswith("freshidx/")}, "limits belong on the definitions (pools)"


def test_the_shipped_instance_gives_every_pool_one_slot_per_run() -> None:
    pools = yaml.safe_load((REPO / "dagster.yaml").read_text())["concurrency"]["pools"]
    assert pools == {"default_limit": 1, "granularity": "run"}
    with dg.instance_for_test(overrides={"concurrency": {"pools": pools}}) as instance:
        config = instance.get_concurrency_config().pool_config
        assert config.default_pool_limit == 1 and config.pool_granularity.value == "run"
