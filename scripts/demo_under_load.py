"""The README's main command on a loaded box: N CPU hogs, then ``bash scripts/demo.sh``; counts the delta
publications the demo prints within a window after the UI is ready.

    .venv/bin/python scripts/demo_under_load.py [--hogs 4] [--window 360] [--home DIR]

Prints every demo line with the seconds since the UI was ready, then a summary; exit 0 when at least
``--want`` delta publications were printed inside the window. Tooling, not a test (~10 min).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HOG = "import time\nend = time.monotonic() + {limit}\nwhile time.monotonic() < end:\n    pass\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hogs", type=int, default=4)
    ap.add_argument("--window", type=float, default=360.0, help="seconds after the UI is ready")
    ap.add_argument("--want", type=int, default=3, help="delta publications wanted inside the window")
    ap.add_argument("--home", default=None)
    args = ap.parse_args()
    # Stopped with SIGINT or SIGTERM (also when started in the background, where SIGINT is ignored):
    # the finally below still ends the hogs and stops the demo cleanly.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    home = Path(args.home or tempfile.mkdtemp(prefix="freshidx-load-")).resolve()
    hogs = [subprocess.Popen([sys.executable, "-c", HOG.format(limit=3600)]) for _ in range(args.hogs)]
    t0 = time.monotonic()
    sys.path.insert(0, str(REPO))
    from freshidx_tests.conftest import free_port

    cmd = ["bash", str(REPO / "scripts" / "demo.sh"), "--home", str(home), "--port", str(free_port()),
           "--spark-port", str(free_port())]
    demo = subprocess.Popen(cmd,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    ready: list[float] = []
    delta: list[float] = []
    assert demo.stdout is not None

    def read() -> None:
        for line in demo.stdout:  # type: ignore[union-attr]
            now = time.monotonic()
            if "Dagster UI:" in line and not ready:
                ready.append(now)
            rel = f"{now - ready[0]:7.1f}s" if ready else f"(-{now - t0:6.1f}s)"
            print(f"{rel} | {line.rstrip()}", flush=True)
            if ready and "] delta v" in line:
                delta.append(now - ready[0])

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline and (not ready or time.monotonic() - ready[0] < args.window):
            if demo.poll() is not None:
                break
            time.sleep(1)
    finally:
        for h in hogs:
            h.kill()
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGINT)
        demo.wait(300)
        reader.join(10)
    inside = [t for t in delta if t <= args.window]
    print(f"summary: hogs {args.hogs}, UI ready after {ready[0] - t0:.0f}s" if ready else "summary: UI never ready")
    print(f"summary: delta publications within {args.window:.0f}s of the UI: {len(inside)} at "
          + ", ".join(f"{t:.0f}s" for t in inside))
    return 0 if len(inside) >= args.want else 1


if __name__ == "__main__":
    sys.exit(main())
