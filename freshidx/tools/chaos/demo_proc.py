"""``freshidx demo`` as the chaos bench runs it (:class:`DemoProcess`): started on the S3 store behind
the fault proxy, in its own session, with a ``FRESHIDX_DEMO_ID`` of the bench's, so that after the stop
every process of its tree can be looked for by that id (:mod:`freshidx.tools.demo_stop` marks its
children so); stopped as a user stops it (SIGTERM). Its output says what it restarted (:meth:`restarts`)
and its UI is asked whether it serves again after the kills (:meth:`ui_problem`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from freshidx.procs import kill_all, pid_alive, processes_with_env
from freshidx.spark_server.server_launch import PDEATHSIG_SHIM
from freshidx.tools.demo_stop import DEMO_ID_ENV
from freshidx.tools.demo_supervisor import RESTART_LINE
from freshidx.tools.devserver import free_port

LEFTOVER_GRACE_S = 30.0


class DemoProcess:
    def __init__(self, home: Path, store_env: dict[str, str], *, every: float, history_minutes: int, seed: int) -> None:
        self.home = home
        self.demo_id = f"chaos-{uuid.uuid4().hex[:12]}"
        self.log = home / "demo.out"
        home.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in (DEMO_ID_ENV, "DAGSTER_HOME")}
        env.update(store_env)
        env[DEMO_ID_ENV] = self.demo_id
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        # Through the death-signal shim: a bench that dies (SIGKILL, a test's timeout) takes its demo with it
        # (SIGTERM: the demo's own clean stop), as a supervisor takes its JVM.
        self.port = free_port()
        cmd = [sys.executable, "-I", "-S", "-c", PDEATHSIG_SHIM, str(os.getpid()),
               sys.executable, "-m", "freshidx.cli", "demo", "--home", str(home), "--port", str(self.port),
               "--spark-port", str(free_port()), "--every", str(every), "--history-minutes", str(history_minutes),
               "--seed", str(seed)]
        with open(self.log, "ab") as out:
            # Its own session: a Ctrl-C at the bench's terminal reaches the bench, which stops the demo.
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self._instance: Any = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def instance(self) -> Any:
        """The demo's Dagster instance (read-only use), opened on first use."""
        if self._instance is None:
            import dagster as dg

            self._instance = dg.DagsterInstance.from_config(str(self.home / "dagster_home"))
        return self._instance

    def tail(self, lines: int = 5) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def restarts(self) -> dict[str, int]:
        """How many times the demo restarted each child, as its output says."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return {}
        return dict(Counter(name for name, _how in RESTART_LINE.findall(text)))

    def outside(self) -> int:
        """Live processes carrying the demo's id outside its process tree (an orphan re-parented to init, not
        to the demo: out of what it supervises and stops)."""
        marked = processes_with_env(DEMO_ID_ENV, self.demo_id)
        try:  # read after: a process started in between is in it
            inside = {p.pid for p in psutil.Process(self.pid).children(recursive=True)} | {self.pid}
        except psutil.NoSuchProcess:
            return 0
        return sum(1 for pid in marked if pid not in inside and pid_alive(pid))

    def ui_problem(self) -> str | None:
        """None when the webserver answers, the code location is loaded and every required daemon is healthy;
        else what is not so."""
        from freshidx.tools.devserver_graphql import WebserverClient

        client = WebserverClient("127.0.0.1", self.port)
        try:
            if client.server_info_status() != 200:
                return "the webserver does not answer"
            pending = client.refresh_workspace()
            if pending:
                return f"code location not loaded: {', '.join(pending)}"
            unhealthy = client.unhealthy_daemons()
            return f"unhealthy daemons: {', '.join(unhealthy)}" if unhealthy else None
        except Exception as exc:  # reconnecting, a load error, an HTTP error: the caller asks again
            return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        finally:
            client.close()

    def stop(self, timeout_s: float) -> tuple[float | None, int]:
        """SIGTERM, as a user stops the demo; returns (seconds it took, None: it did not stop in time and was
        killed) and the processes carrying the demo's id left afterwards (ended then, and counted)."""
        if self._instance is not None:
            self._instance.dispose()
            self._instance = None
        t0 = time.monotonic()
        took: float | None = None
        if self.running():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
                took = round(time.monotonic() - t0, 1)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        else:
            took = 0.0
        return took, self._leftover()

    def _leftover(self) -> int:
        """Processes of the demo's tree still alive a short grace after it exited (then ended)."""
        deadline = time.monotonic() + LEFTOVER_GRACE_S
        left = processes_with_env(DEMO_ID_ENV, self.demo_id)
        while left and time.monotonic() < deadline:
            time.sleep(1.0)  # processes the demo just signalled may take a moment to go
            left = processes_with_env(DEMO_ID_ENV, self.demo_id)
        if left:
            kill_all(left)
        return len(left)
