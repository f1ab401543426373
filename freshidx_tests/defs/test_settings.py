"""Settings are declared once: one pydantic-settings model, carried by the resources.

No Spark, no Dagster instance: the definitions are built and their resources inspected.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import dagster as dg
import pytest
from dagster_aws.s3 import S3Resource

from freshidx.definitions import build_definitions
from freshidx.defs.shared.resources import FreshidxSettings, ObjectStoreResource
from freshidx.settings import PipelineSettings, Settings, SettingsError
from freshidx.store import StoreConfig
from freshidx.store.local import LocalStore
from freshidx.store.s3_clients import _new_s3_client, s3_client


def test_env_is_read_with_the_prefix_and_an_explicit_env_replaces_os_environ(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRESHIDX_WINDOW_MINUTES", "120")
    monkeypatch.setenv("FRESHIDX_SPARK_REMOTE", "")  # empty = unset
    monkeypatch.setenv("FRESHIDX_CRASH_AT", "x")  # a FRESHIDX_* variable that is no setting is ignored
    s = Settings.from_env()
    assert (s.window_minutes, s.spark_remote) == (120, None)
    assert Settings.from_env({}).window_minutes == 300
    assert Settings.from_env({"FRESHIDX_WINDOW_MINUTES": "60"}, window_minutes=None).window_minutes == 60
    assert Settings.from_env({"FRESHIDX_WINDOW_MINUTES": "60"}, window_minutes=30).window_minutes == 30


def test_bad_values_name_the_variable_and_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRESHIDX_WINDOW_MINUTES", "-5")
    with pytest.raises(SettingsError, match=r"FRESHIDX_WINDOW_MINUTES \(window_minutes\): .* \[got '-5'\]"):
        Settings.from_env()
    with pytest.raises(SettingsError, match=r"FRESHIDX_STORE \(store\)"):
        Settings.from_env({"FRESHIDX_STORE": "ftp://x"})
    with pytest.raises(SettingsError, match=r"lag_warn_seconds must be below lag_fail_seconds"):
        Settings.from_env({}, lag_warn_seconds=5000)


def test_the_freshidx_resource_is_the_pipeline_settings_declared_once() -> None:
    assert issubclass(FreshidxSettings, PipelineSettings)
    # no field of its own: the config schema is PipelineSettings' fields, with their defaults
    own = {k for k in vars(FreshidxSettings).get("__annotations__", {}) if not k.startswith("_")}
    assert own == set()
    schema = FreshidxSettings.to_config_schema().as_field().config_type.fields  # type: ignore[attr-defined]
    assert set(schema) == set(PipelineSettings.model_fields)
    assert set(Settings.model_fields) - set(PipelineSettings.model_fields) == {
        "store", "s3_endpoint_url", "s3_first_try_seconds", "spark_remote", "spark_master", "spark_server_state",
        "spark_server_url", "spark_keep_sessions", "spark_conf"}
    # launchpad-style config is validated by the same rules
    with pytest.raises(Exception, match="window_minutes"):
        FreshidxSettings(window_minutes=-1)
    with pytest.raises(Exception, match="lag_warn_seconds must be below"):
        FreshidxSettings(lag_warn_seconds=5000)


def test_definitions_carry_the_settings_they_were_built_from(tmp_path: Path) -> None:
    settings = Settings.from_env({}, store=str(tmp_path / "s"), window_minutes=90, hourly_parts=3)
    resources = build_definitions(settings).resources
    store, freshidx = resources["store"], resources["freshidx"]
    assert isinstance(store, ObjectStoreResource) and isinstance(freshidx, FreshidxSettings)
    assert freshidx.settings(store.uri, store.endpoint_url) == settings
    # the local store needs no S3 settings
    assert store.endpoint_url is None
    assert isinstance(ObjectStoreResource(uri=(tmp_path / "t").as_uri()).open(), LocalStore)


@pytest.mark.parametrize("autostart", [True, False])
def test_autostart_settings_set_the_sensors_default_status(tmp_path: Path, autostart: bool) -> None:
    flag = str(autostart).lower()
    settings = Settings.from_env({"FRESHIDX_SLA_AUTOSTART": flag, "FRESHIDX_CATCHUP_AUTOSTART": flag},
                                 store=str(tmp_path / "s"))
    # the definitions' own sensor objects (what the daemon starts or leaves stopped), not a resolved repository
    status = {s.name: s.default_status for s in build_definitions(settings).sensors or []}
    want = dg.DefaultSensorStatus.RUNNING if autostart else dg.DefaultSensorStatus.STOPPED
    assert status["freshidx_sla_sensor"] == want and status["ads_hourly_sensor"] == want
    assert status["delta_index_sensor"] == dg.DefaultSensorStatus.RUNNING  # the freshness path always runs


def test_one_boto3_client_configuration() -> None:
    # the resource passes every S3Resource field by name
    assert set(inspect.signature(_new_s3_client).parameters) == set(S3Resource.model_fields)
    cfg = StoreConfig(uri="s3://b/p", endpoint_url="http://127.0.0.1:1", access_key_id="k", secret_access_key="s")
    cli = cfg.boto3_client()
    res = ObjectStoreResource(uri=cfg.uri, s3=S3Resource(endpoint_url=cfg.endpoint_url, aws_access_key_id="k",
                                                          aws_secret_access_key="s"))
    dagster = res.open().client  # type: ignore[attr-defined]
    for client in (cli, dagster):
        assert client.meta.endpoint_url == "http://127.0.0.1:1"
        assert client.meta.region_name == "us-east-1"
        assert client.meta.config.s3 == {"addressing_style": "path"}
        assert client.meta.config.retries["mode"] == "standard"
    assert cli.meta.config.retries == dagster.meta.config.retries
    assert res.store_config() == cfg
    # built once per configuration and process (~0.2 s of CPU each: every sensor tick paid it)
    assert cfg.boto3_client() is cli and dagster is cli  # the resource spells out the defaults
    other = StoreConfig(uri="s3://b/p", endpoint_url="http://127.0.0.1:2", access_key_id="k", secret_access_key="s")
    assert other.boto3_client() is not cli and other.boto3_client().meta.endpoint_url == "http://127.0.0.1:2"
    with pytest.raises(TypeError, match="no_such_field"):
        s3_client(no_such_field=1)
