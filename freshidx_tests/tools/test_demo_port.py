"""``freshidx demo --port P`` with P taken: one line naming the setting, exit code 2, nothing started."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

FRESHIDX = Path(sys.executable).with_name("freshidx")


def test_a_taken_ui_port_is_named_and_nothing_starts(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "FRESHIDX_STORE")}
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run([str(FRESHIDX), "demo", "--home", str(tmp_path / "demo"), "--port", str(port)],
                              capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [f"--port {port}: 127.0.0.1:{port} is already in use"]
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "demo" / "spark-server").exists() and not (tmp_path / "demo" / "generator.log").exists()
