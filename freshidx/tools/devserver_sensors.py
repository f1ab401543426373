"""Sensors through the webserver's GraphQL API: read, start and stop them like the UI's toggle, with
the waits a daemon's in-flight tick needs (mixed into :class:`freshidx.tools.devserver_graphql.WebserverClient`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import requests

from freshidx.tools.devserver_graphql_base import POLL_INTERVAL, DagsterDevError, WebserverBase, check_union
from freshidx.tools.devserver_graphql_documents import SENSOR_QUERY, START_SENSOR_MUTATION, STOP_SENSOR_MUTATION


class SensorCalls(WebserverBase):
    """Read, start and stop sensors of :attr:`location_name`."""

    def sensor_state(self, name: str, tick_limit: int = 10) -> dict[str, Any]:
        """``{name, id, selectorId, status, minIntervalSeconds, ticks: [...]}`` (newest tick first).

        ``id`` is the instigation-state id (what ``stopSensor`` takes); each tick has
        ``tickId status timestamp endTimestamp runIds runKeys skipReason error``.
        """
        variables = {"sensorSelector": self._sensor_selector(name), "tickLimit": tick_limit}
        data = self.graphql(SENSOR_QUERY, variables)
        return _flatten_sensor(check_union(data["sensorOrError"], "Sensor", f"sensor {name}"))

    def start_sensor(self, name: str, timeout: float = 120) -> dict[str, Any]:
        """Start (enable) a sensor; return its :meth:`sensor_state` once the status holds."""
        def start() -> None:
            variables = {"sensorSelector": self._sensor_selector(name), "tickLimit": 0}
            check_union(self.graphql(START_SENSOR_MUTATION, variables)["startSensor"], "Sensor",
                        f"start sensor {name}")

        return self._set_sensor_status(name, "RUNNING", start, timeout)

    def stop_sensor(self, name: str, timeout: float = 120, *, settle_with: str | None = None) -> dict[str, Any]:
        """Stop (disable) a sensor; return its :meth:`sensor_state` once the status holds.

        ``settle_with``: a sensor that ticks once per daemon loop (freshidx's ``freshidx_run_health_sensor``).
        The daemon reads which sensors run when a loop begins, so a loop already under way may still start a
        tick of the stopped sensor, and a freshidx delta tick then watches for new data for seconds. With
        ``settle_with``, return only once two of its ticks began after the stop (a loop that began after
        it) and the stopped sensor has no tick in flight: nothing written afterwards can reach it. A tick
        that read the sensor's state before the stop writes it back, RUNNING, as it begins (Dagster's
        ``mark_sensor_state_for_tick``): then the sensor is stopped again and the settling starts over."""
        def stop() -> None:
            state_id = self.sensor_state(name, tick_limit=0)["id"]
            check_union(self.graphql(STOP_SENSOR_MUTATION, {"id": state_id})["stopSensor"],
                        "StopSensorMutationResult", f"stop sensor {name}")

        stopped_at = time.time()
        state = self._set_sensor_status(name, "STOPPED", stop, timeout)
        if settle_with is None:
            return state
        deadline = time.monotonic() + timeout
        while True:
            loops = [t for t in self.sensor_state(settle_with, tick_limit=5)["ticks"]
                     if t["timestamp"] > stopped_at and t["status"] != "STARTED"]
            state = self.sensor_state(name, tick_limit=1)
            ticks = state["ticks"]
            in_flight = bool(ticks and ticks[0]["status"] == "STARTED")
            if state["status"] != "STOPPED" and not in_flight:
                stopped_at = time.time()
                self._set_sensor_status(name, "STOPPED", stop, max(1.0, deadline - time.monotonic()))
                continue
            if len(loops) >= 2 and not in_flight:
                return self.sensor_state(name)
            if time.monotonic() >= deadline:
                raise DagsterDevError(f"sensor {name} stopped, but no two daemon loops of {settle_with} "
                                      f"after it within {timeout}s")
            time.sleep(POLL_INTERVAL)

    def _set_sensor_status(self, name: str, want: str, mutate: Callable[[], None], timeout: float) -> dict[str, Any]:
        """Apply ``mutate`` until the sensor's status is ``want`` with no tick in flight: a tick that
        started before the mutation can write back the status it read (seen once on a loaded box). An
        HTTP 5xx is retried too: on PostgreSQL the stop mutation failed with 500 once right after start-up,
        while the daemon ran the sensor's first tick (likely both writing its state row)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                mutate()
            except requests.HTTPError as exc:
                status = exc.response.status_code if exc.response is not None else 0
                if status < 500 or time.monotonic() >= deadline:
                    raise
                time.sleep(POLL_INTERVAL)
                continue
            while (st := self.sensor_state(name, tick_limit=1))["ticks"] and st["ticks"][0]["status"] == "STARTED":
                if time.monotonic() >= deadline:
                    break
                time.sleep(POLL_INTERVAL)
            if st["status"] == want:
                return self.sensor_state(name)
            if time.monotonic() >= deadline:
                raise DagsterDevError(f"sensor {name} is {st['status']}, not {want}, after {timeout}s")

    def _sensor_selector(self, name: str) -> dict[str, str]:
        return {
            "repositoryLocationName": self.location_name,
            "repositoryName": self.repository_name,
            "sensorName": name,
        }


def _flatten_sensor(sensor: dict[str, Any]) -> dict[str, Any]:
    state = sensor.get("sensorState") or {}
    return {
        "name": sensor.get("name"),
        "id": state.get("id"),
        "selectorId": state.get("selectorId"),
        "status": state.get("status"),
        "minIntervalSeconds": sensor.get("minIntervalSeconds"),
        "ticks": state.get("ticks") or [],
    }
