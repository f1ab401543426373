"""``freshidx demo`` outlives a crash of any part of Dagster.

Starts the demo on a temp home and, once a delta is published:

1. SIGKILLs the webserver and holds its port, so every restart fails until the test lets go: a newer delta
   is published while the UI is down (the UI is not on the data path), the demo prints each restart with
   its exit status and count, and once the port is free the webserver answers again;
2. SIGKILLs the code server: the run workers it started are re-parented to the demo (a child subreaper),
   not to init, a newer delta is published, and the restarted code server is loaded by the webserver;
3. SIGTERMs the demo: it exits 0, its closing line counts the restarts, and no process carrying its
   ``FRESHIDX_DEMO_ID`` remains.

Beside it, fast: the back-off decisions, and a real subreaper adopting and reaping an orphan.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest
import requests

from freshidx import procs
from freshidx.publish.commit import read_pointer
from freshidx.store import StoreConfig, open_store
from freshidx.tools.demo_supervisor import RestartPolicy, RestartState, after_exit, describe_exit
from freshidx.tools.devserver import free_port
from freshidx.tools.devserver_graphql import CodeLocationLoadError, GraphQLError, WebserverClient
from freshidx_tests.support.polling import poll_until

FRESHIDX = Path(sys.executable).with_name("freshidx")


def _child(demo: int, marker: str) -> int:
    """The pid of the demo's direct child whose command line contains ``marker``."""
    found = [p.pid for p in psutil.Process(demo).children() if marker in procs.cmdline(p.pid)]
    assert len(found) == 1, [procs.cmdline(p.pid)[:120] for p in psutil.Process(demo).children()]
    return found[0]


def _descendants(pid: int) -> set[int]:
    return {p.pid for p in psutil.Process(pid).children(recursive=True)}


def _outside(demo: int, demo_id: str) -> list[str]:
    """Live processes carrying the demo's id that are neither the demo nor in its tree."""
    marked = procs.processes_with_env("FRESHIDX_DEMO_ID", demo_id)
    inside = _descendants(demo) | {demo}  # read after: a process started in between is in it
    return [f"{p}: {procs.cmdline(p)[:160]}" for p in marked if p not in inside and procs.pid_alive(p)]


def _answers(url: str) -> bool:
    try:
        return requests.get(f"{url}/server_info", timeout=5).status_code == 200
    except requests.RequestException:
        return False


def _location_loaded(client: WebserverClient) -> bool:
    try:
        return client.refresh_workspace() == []
    except (requests.RequestException, CodeLocationLoadError, GraphQLError):  # reconnecting meanwhile
        return False


def _hold(port: int) -> socket.socket | None:
    """Listen on ``port`` so the restarted webserver cannot bind it; None while the killed one still holds it."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # connections of the killed one in TIME_WAIT
    try:
        holder.bind(("127.0.0.1", port))
    except OSError:
        holder.close()
        return None
    holder.listen()
    return holder


def _webserver_restarts(text: str) -> list[tuple[str, int]]:
    """(exit status, restart number) of every webserver restart line the demo printed."""
    return [(how, int(n)) for how, n in re.findall(r"webserver exited \((.+?)\) after \d+s; restart #(\d+) in", text)]


def test_backoff_doubles_to_the_cap_and_starts_over_after_a_stable_run() -> None:
    policy = RestartPolicy(first_s=1, factor=2, cap_s=30, stable_s=60)
    state, delays = RestartState(), []
    for _ in range(7):  # quick crashes
        state, delay = after_exit(state, policy, uptime_s=5)
        delays.append(delay)
    assert delays == [1, 2, 4, 8, 16, 30, 30]
    state, delay = after_exit(state, policy, uptime_s=600)  # it stayed up: a first crash again
    assert (state.restarts, state.quick_crashes, delay) == (8, 1, 1)
    assert describe_exit(-9) == "signal 9 (SIGKILL)" and describe_exit(3) == "exit 3"


_ORPHAN_SCRIPT = """
import json, pathlib, subprocess, sys, time
from freshidx.tools.demo_supervisor import Supervisor, stop_children
events = []
sup = Supervisor(lambda kind, text, **f: events.append(kind))
ORPHAN_MAKER = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3)'])"
# First start: a child that starts a grandchild and exits at once (the grandchild is orphaned); its
# restart: a child that stays.
child = sup.add("parent", lambda restarts: subprocess.Popen(
    [sys.executable, "-c", ORPHAN_MAKER if restarts == 0 else "import time; time.sleep(600)"],
    start_new_session=True), log=pathlib.Path("/dev/null"))  # as the demo's children: stopped by group
deadline = time.monotonic() + 120
while time.monotonic() < deadline and not ("adopted" in events and not sup.adopted and child.running):
    sup.poll()
    time.sleep(0.1)
stop_children([child], 10)
print(json.dumps({"subreaper": sup.subreaper, "events": events, "left": sorted(sup.adopted)}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child subreapers are Linux's")
def test_an_orphan_is_adopted_reported_and_reaped() -> None:
    done = subprocess.run([sys.executable, "-c", _ORPHAN_SCRIPT], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["subreaper"] is True
    assert result["events"].count("restart") == 1  # the parent's exit, then its restart stayed up
    assert result["events"].count("adopted") == 1
    assert result["left"] == []  # the orphan exited and was reaped


@pytest.mark.slow
def test_the_demo_restarts_what_crashes_and_keeps_publishing(tmp_path: Path) -> None:
    demo_id = uuid.uuid4().hex
    home = tmp_path / "demo"
    store = open_store(StoreConfig(uri=(tmp_path / "store").as_uri()))
    out_path = tmp_path / "demo.out"
    port = free_port()
    env = {**os.environ, "FRESHIDX_DEMO_ID": demo_id, "PYSPARK_PYTHON": sys.executable,
           "FRESHIDX_CLOSE_GRACE_SECONDS": "0"}
    for var in ("DAGSTER_HOME", "SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "FRESHIDX_DELTA_MODE"):
        env.pop(var, None)
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(
            [str(FRESHIDX), "demo", "--store", (tmp_path / "store").as_uri(), "--home", str(home), "--port", str(port),
             "--spark-port", str(free_port()), "--every", "10", "--history-minutes", "10", "--duration", "1200"],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def text() -> str:
        return out_path.read_text()

    def delta_seq() -> int:
        pointer, _ = read_pointer(store, "delta")
        return -1 if pointer is None else pointer.seq

    try:
        poll_until(lambda: proc.poll() is not None or "Dagster UI:" in text(), timeout=400, interval=0.5,
                   what="the demo's UI to be ready")
        assert proc.poll() is None, text()[-3000:]
        url = f"http://127.0.0.1:{port}"
        poll_until(lambda: delta_seq() >= 0, timeout=400, interval=0.5, what="a first delta publication")

        # 1. the webserver dies and cannot come back while the test holds its port
        os.kill(_child(proc.pid, "dagster_webserver"), signal.SIGKILL)
        holder = poll_until(lambda: _hold(port), timeout=60, interval=0.05, what="the killed webserver's port")
        try:
            seq = delta_seq()
            poll_until(lambda: delta_seq() > seq, timeout=300, interval=0.5, what="a delta while the UI is down")
            poll_until(lambda: len(_webserver_restarts(text())) >= 2, timeout=180, interval=0.5,
                       what="a second webserver restart (the first restarted one could not bind)")
            assert not _answers(url)  # the test's socket never answers HTTP: the newer delta came without the UI
        finally:
            holder.close()
        poll_until(lambda: _answers(url), timeout=300, interval=1, what="the restarted webserver to answer")
        restarts = _webserver_restarts(text())
        assert restarts[0] == ("signal 9 (SIGKILL)", 1), text()[-3000:]
        assert [n for _, n in restarts] == list(range(1, len(restarts) + 1))

        # 2. the code server dies: its run workers stay in the demo's tree and keep publishing
        code_server = _child(proc.pid, "code-server start")
        workers = _descendants(code_server)
        assert workers, "the continuous run's worker runs under the code server"
        os.kill(code_server, signal.SIGKILL)
        poll_until(lambda: "code-server exited (signal 9 (SIGKILL))" in text(), timeout=120, interval=0.5,
                   what="the code server's restart line")
        left = [p for p in workers if procs.pid_alive(p)]
        assert left and set(left) <= _descendants(proc.pid), "the code server's run workers left the demo's tree"
        seq = delta_seq()
        poll_until(lambda: delta_seq() > seq, timeout=300, interval=0.5, what="a delta after the code server died")
        poll_until(lambda: _location_loaded(WebserverClient("127.0.0.1", port)), timeout=300, interval=1,
                   what="the restarted code server loaded by the webserver")
        assert _outside(proc.pid, demo_id) == []

        # 3. a clean stop leaves nothing
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(300)
        print(text()[-4000:])
        assert rc == 0, text()[-3000:]
        stopped = [line for line in text().splitlines() if "stopped:" in line]
        assert stopped and "webserver" in stopped[-1] and "code-server" in stopped[-1], stopped
        assert procs.processes_with_env("FRESHIDX_DEMO_ID", demo_id) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        procs.kill_all(procs.processes_with_env("FRESHIDX_DEMO_ID", demo_id))
