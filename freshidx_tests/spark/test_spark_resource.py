"""``SparkResource``: dagster-pyspark's ``LazyPySparkResource`` with freshidx's ways to a session.

``spark_config`` (also ``FRESHIDX_SPARK_CONF``) reaches a real local session over the local defaults; a
cluster's driver gets none of the local-mode tuning; and a deployment without a supervised server (a
cluster, a Connect server of its own) imports nothing of ``freshidx.spark_server`` (checked in child
processes, for a clean module table, against a real standalone master and the suite's Connect server).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import requests

from freshidx.definitions import build_resources
from freshidx.defs.shared.resources import SparkResource
from freshidx.settings import Settings, SettingsError
from freshidx.spark.session import (
    LOCAL_DEFAULTS,
    LOCAL_TUNING,
    REQUIRED_CONF,
    WORKER_ARROW_POOL,
    WORKER_ENV_CONF,
    conf_strings,
    driver_conf,
    local_master_threads,
)
from freshidx_tests.support.cluster_fixture import StandaloneCluster
from freshidx_tests.support.polling import poll_until

REPO = Path(__file__).resolve().parents[2]
MARKER = "spark.freshidx.test.marker"


def test_spark_conf_from_the_environment_reaches_a_local_session(monkeypatch: pytest.MonkeyPatch, spark: Any,
                                                                 tmp_path: Path) -> None:
    conf = {MARKER: "from-env", "spark.sql.shuffle.partitions": "3"}
    monkeypatch.setenv("FRESHIDX_SPARK_CONF", json.dumps(conf))
    resource = build_resources(Settings.from_env(store=str(tmp_path / "store")))["spark"]
    assert isinstance(resource, SparkResource) and resource.spark_config == conf
    try:
        session = resource.spark_session  # dagster-pyspark's accessor, freshidx's session
        assert session is resource.get_session("delta")
        assert {key: session.conf.get(key) for key in conf} == conf  # over the local defaults
        for key in ("spark.sql.session.timeZone", "spark.sql.json.enablePartialResults", "spark.ui.enabled",
                    "spark.driver.memory", "spark.driver.host"):
            assert session.conf.get(key) == LOCAL_DEFAULTS[key], key
        meta = resource.spark_metadata()
        assert meta["spark_app_id"].value == session.sparkContext.applicationId
        assert "spark_ui" not in meta  # local mode runs without the UI
        resource.discard()
        assert resource.get_session() is session  # a local session stays: it is the process's
    finally:  # the suite's shared session
        spark.conf.set("spark.sql.shuffle.partitions", LOCAL_DEFAULTS["spark.sql.shuffle.partitions"])
        spark.conf.unset(MARKER)


@pytest.mark.parametrize("value", ["{not json", '["spark.a"]', '{"spark.sql.shuffle.partitions": 8}', '"x"'])
def test_a_bad_spark_conf_is_a_settings_error_naming_the_variable(value: str) -> None:
    with pytest.raises(SettingsError, match="FRESHIDX_SPARK_CONF"):
        Settings.from_env({"FRESHIDX_SPARK_CONF": value})


@pytest.mark.parametrize("master", ["spark://10.0.0.5:7077", "spark://127.0.0.1:7077", "spark://a:7077,b:7077"])
def test_a_cluster_driver_gets_no_local_mode_tuning(master: str) -> None:
    env = {"SPARK_LOCAL_HOSTNAME": "driver.example", "SPARK_LOCAL_IP": "10.0.0.9"}
    conf = driver_conf(master, {"spark.executor.memory": "2g"}, env)
    assert not set(conf) & set(LOCAL_TUNING), sorted(set(conf) & set(LOCAL_TUNING))
    assert set(conf) == {*REQUIRED_CONF, *WORKER_ENV_CONF, "spark.driver.host", "spark.driver.bindAddress",
                         "spark.executor.memory"}
    assert REQUIRED_CONF.items() <= conf.items()
    loopback = "127.0.0.1" in master
    assert conf["spark.driver.host"] == ("127.0.0.1" if loopback else "driver.example")
    assert conf["spark.driver.bindAddress"] == ("127.0.0.1" if loopback else "10.0.0.9")


@pytest.mark.parametrize(("master", "threads"), [
    ("local", 1), ("local[2]", 2), ("local[2,4]", 2), ("local[16, 3]", 16), ("local[*]", None),
    ("local[*,4]", None), ("spark://127.0.0.1:7077", None), ("k8s://https://api:6443", None), ("yarn", None)])
def test_the_task_threads_of_a_local_master(master: str, threads: int | None) -> None:
    assert local_master_threads(master) == threads


def test_local_mode_lays_spark_config_over_the_local_defaults() -> None:
    assert driver_conf("local[2]") == LOCAL_DEFAULTS
    assert LOCAL_TUNING.items() <= LOCAL_DEFAULTS.items() and REQUIRED_CONF.items() <= LOCAL_DEFAULTS.items()
    assert driver_conf("local[2]", {"spark.sql.shuffle.partitions": "8"}) == {
        **LOCAL_DEFAULTS, "spark.sql.shuffle.partitions": "8"}


def test_a_local_sessions_python_workers_take_arrow_memory_from_the_worker_pool(spark: Any) -> None:
    def pool(batches):  # type: ignore[no-untyped-def]  # nested: pickled by value
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"pool": [pa.default_memory_pool().backend_name]})

    assert spark.range(0, 1, 1, 1).mapInArrow(pool, "pool string").collect()[0]["pool"] == WORKER_ARROW_POOL


def test_spark_config_is_flattened_as_dagster_pyspark_accepts_it() -> None:
    nested = {"spark": {"executor": {"memory": "2g"}, "ui": {"enabled": True}}, "spark.sql.shuffle.partitions": 8}
    assert conf_strings(nested) == {"spark.executor.memory": "2g", "spark.ui.enabled": "true",
                                    "spark.sql.shuffle.partitions": "8"}


# A run process of a deployment without a supervised server: one session, its metadata, its module table.
_PROBE = """
import json, sys
from freshidx.defs.shared.resources import SparkResource
resource = SparkResource(**json.loads(sys.argv[1]))
session = resource.get_session(keep_as="delta")
out = {"meta": {k: str(v.value) for k, v in resource.spark_metadata().items()},
       "conf": {k: session.conf.get(k, None) for k in json.loads(sys.argv[2])}}
if resource.remote:
    out["one"] = session.sql("SELECT 1 AS one").collect()[0]["one"]
resource.discard()
out["server_ops"] = sorted(m for m in sys.modules if m.startswith("freshidx.spark_server"))
print("PROBE " + json.dumps(out))
"""


def probe(config: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    env["PYSPARK_PYTHON"] = sys.executable
    proc = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(config), json.dumps(keys)], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=420)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("PROBE ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return dict(json.loads(lines[-1].removeprefix("PROBE ")))


def master_alive(cluster: StandaloneCluster) -> bool:
    assert cluster.master is not None
    if cluster.master.proc.poll() is not None:
        raise RuntimeError(f"master exited; see {cluster.workdir}/master.log")
    try:
        return cluster.master.json().get("status") == "ALIVE"
    except (requests.RequestException, ValueError):
        return False  # web UI not up yet


@pytest.mark.timeout(900)
def test_a_cluster_driver_imports_no_server_ops_and_runs_with_spark_defaults(tmp_path: Path) -> None:
    cluster = StandaloneCluster(tmp_path / "cluster", workers=0)  # the driver registers; no job runs
    try:
        cluster.start()
        poll_until(lambda: master_alive(cluster), timeout=300, interval=0.5, what=f"master at {cluster.url}")
        out = probe({"master": cluster.url, "spark_config": {MARKER: "cluster", "spark.ui.port": "0"}},
                    ["spark.sql.session.timeZone", MARKER, *LOCAL_TUNING])
    finally:
        cluster.stop()
    assert out["server_ops"] == []
    conf = out["conf"]
    assert (conf["spark.sql.session.timeZone"], conf[MARKER]) == ("UTC", "cluster")
    # None of local mode's tuning (a value of ours would show, also inside Spark's own Java options):
    # Spark's and the cluster's defaults apply.
    assert not {k for k, v in LOCAL_TUNING.items() if v in (conf[k] or "")}, conf
    assert conf["spark.sql.shuffle.partitions"] is None and conf["spark.ui.enabled"] is None, conf
    assert out["meta"]["spark_app_id"].startswith("app-"), out  # the id the master gave the application
    assert out["meta"]["spark_ui"].startswith("http://"), out  # Spark's default: the driver's UI is on


@pytest.mark.timeout(900)
def test_a_connect_client_without_a_state_dir_imports_no_server_ops(shared_spark_connect: dict[str, str]) -> None:
    out = probe({"remote": shared_spark_connect["FRESHIDX_SPARK_REMOTE"], "spark_config": {MARKER: "connect"}},
                ["spark.sql.session.timeZone", MARKER])
    assert out["server_ops"] == []
    assert out["one"] == 1
    assert out["conf"] == {"spark.sql.session.timeZone": "UTC", MARKER: "connect"}
    assert out["meta"]["spark_app_id"].startswith("local-"), out  # the server's application (local master)
    # The suite's server picks a free UI port, which its confs do not say; only its state file does.
    assert "spark_ui" not in out["meta"], out
