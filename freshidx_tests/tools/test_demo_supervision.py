"""``freshidx demo``'s supervision of its children, without a demo: the back-off decisions, and a real
child subreaper adopting and reaping an orphan.

The demo end to end (every part SIGKILLed, a restart line per kill, the UI serving again, no process outside
the demo's tree, a clean stop that leaves nothing) is ``freshidx bench chaos``, run for 5 minutes by
``test_bench_chaos.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from freshidx.tools.demo_supervisor import RestartPolicy, RestartState, after_exit, describe_exit


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
