"""The warm spare's decisions (pure parts of :mod:`freshidx.spark_server.spare`) and the chaos bench's pick of
the serving JVM's supervisor option (:func:`freshidx.tools.chaos.targets.option_value`). No JVM."""

from __future__ import annotations

from pathlib import Path

from freshidx.spark_server.follow_server import url_moved
from freshidx.spark_server.server_config import ServerConfig
from freshidx.spark_server.spare import pick_port, pick_slot, spare_config, spare_dirs, start_due
from freshidx.tools.chaos.targets import option_value


def test_slot_is_one_no_keeper_holds(tmp_path: Path) -> None:
    a, b = spare_dirs(tmp_path)
    assert (a, b) == (tmp_path / "spare" / "a", tmp_path / "spare" / "b")
    assert pick_slot(tmp_path, set()) == a
    assert pick_slot(tmp_path, {a}) == b  # a promoted JVM still runs from a
    assert pick_slot(tmp_path, {a, b}) is None


def test_port_is_the_configured_one_only_when_free_and_not_serving() -> None:
    assert pick_port(15002, 15002, True) is None  # the serving JVM has it
    assert pick_port(15002, 40001, True) == 15002  # after a promotion: back to the configured port
    assert pick_port(15002, 40001, False) is None


def test_spare_config_differs_only_where_it_must(tmp_path: Path) -> None:
    cfg = ServerConfig(port=15002, state_dir=tmp_path, control_port=15003, spare=True, driver_memory="3g")
    sp = spare_config(cfg, tmp_path / "spare" / "a", 40001)
    assert (sp.port, sp.state_dir, sp.control_port, sp.spare, sp.cds_dump) == (40001, tmp_path / "spare" / "a", 0,
                                                                              False, False)
    assert sp.cds_dir == tmp_path / "cds" and sp.driver_memory == "3g" and sp.master == cfg.master
    assert sp.spark_conf()["spark.connect.grpc.binding.port"] == "40001"


def test_a_spare_starts_only_beside_a_serving_jvm_that_is_up() -> None:
    due = {"enabled": True, "serving_up": True, "stopping": False, "have_spare": False, "retry_at": 0.0, "now": 1.0}
    assert start_due(**due)
    for key, value in (("enabled", False), ("serving_up", False), ("stopping", True), ("have_spare", True),
                       ("retry_at", 5.0)):
        assert not start_due(**{**due, key: value}), key


def test_option_value() -> None:
    assert option_value(["python", "-m", "x", "--state-dir", "/s", "--spare"], "--state-dir") == "/s"
    assert option_value(["x", "--state-dir=/t"], "--state-dir") == "/t"
    assert option_value(["x", "--state-dir"], "--state-dir") is None
    assert option_value(["x"], "--state-dir") is None


def test_a_client_stops_retrying_only_once_the_server_is_up_elsewhere() -> None:
    url = "sc://127.0.0.1:15002"
    assert url_moved({"status": "up", "url": "sc://127.0.0.1:40001"}, url)
    assert not url_moved({"status": "up", "url": url}, url)
    assert not url_moved({"status": "restarting", "url": "sc://127.0.0.1:40001"}, url)  # not up yet: keep trying
    assert not url_moved(None, url) and not url_moved({"status": "up"}, url)
