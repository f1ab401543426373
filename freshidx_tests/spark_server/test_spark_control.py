"""The supervisor's control endpoint (freshidx.spark_server.control_server), against a real HTTP server
in this process, through the clients the runs use (acquire_lease, kept_session, server_status with an
``http://`` URL). No JVM: the supervisor's drain is exercised with a stand-in process as its "JVM".

* a lease is granted while the server is up and refused (the client waits, then fails in one line)
  while it drains; the drain waits for an endpoint lease exactly as for a lease file;
* a lease whose client stops renewing expires after the TTL; a held lease is renewed in the
  background and outlives several TTLs; a renewal of an unknown lease (a restarted supervisor) is refused;
* kept session ids round trip by name and code version;
* an unreachable endpoint is one line naming FRESHIDX_SPARK_SERVER_URL.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from freshidx.defs.shared.resources import SparkResource
from freshidx.serve.status import spark_server
from freshidx.spark_server import server_status
from freshidx.spark_server.control_client import DirectoryControl, EndpointControl
from freshidx.spark_server.control_server import ControlPlane, ControlServer
from freshidx.spark_server.kept_session import new_session_id, read_session_id
from freshidx.spark_server.lease import ServerUnavailable, acquire_lease
from freshidx.spark_server.server_config import ServerConfig
from freshidx.spark_server.supervisor import SparkConnectSupervisor
from freshidx_tests.conftest import free_port
from freshidx_tests.support.polling import poll_until


class _Plane:
    """A control plane over a state this test sets (the supervisor's part is tested below)."""

    def __init__(self, tmp: Path, ttl_s: float = 30.0) -> None:
        self.state: dict[str, Any] = {"status": "up", "url": "sc://127.0.0.1:15002", "pid": 4242}
        self.lock = threading.RLock()
        self.plane = ControlPlane(lambda: dict(self.state), lambda s: s.get("status") == "up", self.lock,
                                  DirectoryControl(tmp), ttl_s=ttl_s)
        self.server = ControlServer(self.plane, "127.0.0.1", 0).start()
        self.url = self.server.url


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[_Plane]:
    p = _Plane(tmp_path)
    yield p
    p.server.stop()


def test_lease_granted_while_up_and_refused_while_draining(plane: _Plane) -> None:
    assert server_status(plane.url) == "up"
    with acquire_lease(plane.url, "run-1", timeout_s=30) as lease:
        assert lease.url == "sc://127.0.0.1:15002" and lease.server_pid == 4242 and lease.lease_id
        assert [d["run_id"] for d in plane.plane.leases()] == ["run-1"]
        plane.state["status"] = "draining"
        with pytest.raises(ServerUnavailable, match=r"FRESHIDX_SPARK_SERVER_URL=http://.*status: draining"), \
                acquire_lease(plane.url, "late", timeout_s=0.5):
            pass
        assert [d["run_id"] for d in plane.plane.leases()] == ["run-1"]  # the refused one left nothing
    assert plane.plane.leases() == []
    status = EndpointControl(plane.url).state()
    assert status is not None and status["status"] == "draining" and status["supervisor_alive"] is True


#: Long enough that a renewal every third of it survives a loaded box (at 0.6 s, with the version lanes running
#: beside the suite, the renewing thread once stalled past the whole TTL), short enough to wait out a few.
LEASE_TTL_S = 3.0


def test_a_lease_not_renewed_expires_and_a_held_one_is_renewed(tmp_path: Path) -> None:
    p = _Plane(tmp_path, ttl_s=LEASE_TTL_S)
    try:
        control = EndpointControl(p.url)
        grant, _ = control.try_lease("abandoned")  # taken, never renewed: its client "died"
        assert grant is not None and grant.ttl_s == LEASE_TTL_S
        poll_until(lambda: not p.plane.leases(), timeout=60, interval=0.1, what="the abandoned lease to expire")
        assert control.renew(grant) is False  # 410: the client learns it is gone
        with acquire_lease(p.url, "held", timeout_s=30):
            t0 = time.monotonic()
            # several TTLs pass while the block runs: the background renewals keep it
            poll_until(lambda: time.monotonic() - t0 > 3 * LEASE_TTL_S, timeout=60, interval=0.1,
                       what="three TTLs")
            assert [d["run_id"] for d in p.plane.leases()] == ["held"]
        assert p.plane.leases() == []
    finally:
        p.server.stop()


def test_kept_session_round_trip(plane: _Plane, tmp_path: Path) -> None:
    assert read_session_id(plane.url, "delta", "c1") is None
    sid = new_session_id(plane.url, "delta", "c1")
    assert read_session_id(plane.url, "delta", "c1") == sid
    assert read_session_id(plane.url, "delta", "c2") is None  # other code: a new session is needed
    assert read_session_id(tmp_path, "delta", "c1") == sid  # the supervisor keeps it in its state dir
    status, doc = EndpointControl(plane.url).call("PUT", "/sessions/delta", {"session_id": "x"})
    assert status == 400 and "code" in doc["error"]
    assert EndpointControl(plane.url).call("GET", "/sessions/..%2Fetc")[0] == 404


def test_unreachable_endpoint_is_one_line_naming_the_setting() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ServerUnavailable) as info, acquire_lease(url, "run", timeout_s=0.3):
        pass
    message = str(info.value)
    assert "\n" not in message and f"FRESHIDX_SPARK_SERVER_URL={url}" in message and "unreachable" in message
    assert server_status(url) is None
    shown = spark_server(url)
    assert shown is not None and shown["running"] is False and "FRESHIDX_SPARK_SERVER_URL" in shown["note"]


def test_the_supervisors_drain_waits_for_an_endpoint_lease(tmp_path: Path) -> None:
    sup = SparkConnectSupervisor(ServerConfig(state_dir=tmp_path, port=free_port(), drain_timeout_s=600))
    # stands in for the JVM (its own session, as the supervisor starts one): only the drain is tested
    sup._proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        url = sup.serve_control(0)
        sup._take_lock()
        sup._update_state(status="up", url="sc://127.0.0.1:1", pid=sup._proc.pid, supervisor_pid=0)
        resource = SparkResource(remote="sc://127.0.0.1:1", server_url=url)
        with acquire_lease(url, "in-flight", timeout_s=30):
            drained: list[bool] = []
            drain = threading.Thread(target=lambda: drained.append(sup._drain("planned-manual")))
            drain.start()
            poll_until(lambda: sup.state().get("leases") == ["in-flight"], timeout=60, interval=0.05,
                       what="the drain to see the endpoint lease")
            assert resource.server_draining() is True
            with pytest.raises(ServerUnavailable, match="draining"), acquire_lease(url, "late", timeout_s=0.3):
                pass
            assert drain.is_alive() and not drained  # waiting for the lease, not timed out
        drain.join(timeout=60)
        assert drained == [True] and sup.held_leases() == []
    finally:
        sup.stop()
    assert sup._proc is None
