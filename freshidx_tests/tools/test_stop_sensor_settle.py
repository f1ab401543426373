"""``stop_sensor(settle_with=...)`` when the daemon writes the stopped sensor's status back.

Dagster's sensor daemon reads a sensor's state when a tick begins and writes it back with the tick's
start time (``mark_sensor_state_for_tick``): a tick whose read came just before a stop and whose
write came after it sets the sensor RUNNING again. The settle must then stop it again, not return while the
sensor runs (a test writing data next would have it taken by the sensor: the likeliest cause of the
browser test's step 2 publishing from another run, once in a clean clone). Scripted against the webserver
client's two calls, as the daemon's code does it (dagster/_daemon/sensor.py, 1.13).
"""

from __future__ import annotations

import time
from typing import Any

from freshidx.tools.devserver_graphql import WebserverClient, poll_delays


class ScriptedWebserver(WebserverClient):
    """A sensor whose status a late tick writes back to RUNNING once, after the first stop."""

    def __init__(self) -> None:
        super().__init__("127.0.0.1", 9)
        self.status = "RUNNING"
        self.stops = 0
        self.reads = 0
        self.tick_status = "SKIPPED"
        self.loops: list[dict[str, Any]] = []

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        assert "stopSensor" in query, query  # the only mutation the settle sends
        self.stops += 1
        self.status = "STOPPED"
        return {"stopSensor": {"__typename": "StopSensorMutationResult", "instigationState": {"status": "STOPPED"}}}

    def sensor_state(self, name: str, tick_limit: int = 10) -> dict[str, Any]:
        if name == "run_health":  # one finished daemon-loop tick per read, always newer than the stop
            self.loops.insert(0, {"status": "SKIPPED", "timestamp": time.time() + 1})
            return {"name": name, "id": "h", "status": "RUNNING", "ticks": self.loops[:tick_limit]}
        self.reads += 1
        if self.stops == 1 and self.reads == 4:  # the late tick begins: RUNNING written back, tick STARTED
            self.status, self.tick_status = "RUNNING", "STARTED"
        elif self.tick_status == "STARTED" and self.reads == 6:  # ... and ends
            self.tick_status = "SKIPPED"
        return {"name": name, "id": "s", "status": self.status,
                "ticks": [{"status": self.tick_status, "timestamp": time.time()}][:tick_limit]}


def test_a_status_written_back_by_a_late_tick_is_stopped_again_before_the_settle_returns() -> None:
    web = ScriptedWebserver()
    state = web.stop_sensor("delta_index_sensor", timeout=30, settle_with="run_health")
    assert web.stops == 2, web.stops  # stopped again once the late tick had ended
    assert state["status"] == "STOPPED" and web.status == "STOPPED"
    assert state["ticks"][0]["status"] != "STARTED"


class ScriptedRun(WebserverClient):
    """A run that ends after a fixed number of status reads."""

    def __init__(self, reads_until_done: int) -> None:
        super().__init__("127.0.0.1", 9)
        self.left = reads_until_done
        self.reads = 0

    def run_status(self, run_id: str) -> str:
        self.reads += 1
        self.left -= 1
        return "SUCCESS" if self.left <= 0 else "STARTED"

    def check_alive(self) -> None:
        pass


def test_waiting_for_a_run_polls_quickly_first_then_at_most_once_a_second(monkeypatch: Any) -> None:
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    client = ScriptedRun(reads_until_done=12)
    assert client.wait_run("r", timeout=600) == "SUCCESS"
    assert client.reads == 12 and len(slept) == 11
    assert slept[0] <= 0.1 and slept == sorted(slept) and max(slept) == 1.0
    # A minute of waiting is ~65 reads, not 240 at the fixed interval.
    delays = poll_delays()
    waited, reads = 0.0, 0
    while waited < 60:
        waited += next(delays)
        reads += 1
    assert reads <= 70, reads
