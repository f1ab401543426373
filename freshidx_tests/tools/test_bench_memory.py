"""The bench's sampler of the Connect session's memory keeps the highest summed RSS and the phase then."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from freshidx.tools.bench_memory import SessionPeak
from freshidx.tools.bench_report import _mode_headers

MIB = 1 << 20
#: A session leader that holds 96 MiB (touched) until told, then frees it and waits to be told to exit.
HOLDER = (
    "import sys\n"
    "block = bytearray(96 << 20)\n"
    "block[::4096] = b'x' * len(block[::4096])\n"
    "print('holding', flush=True)\n"
    "sys.stdin.readline()\n"
    "del block\n"
    "print('freed', flush=True)\n"
    "sys.stdin.readline()\n"
)

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="session ids and /proc are Linux's")


@linux_only
def test_the_highest_sample_and_its_phase_are_kept_after_the_memory_is_freed() -> None:
    child = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, start_new_session=True)
    try:
        phase = ["warm-up"]
        peak = SessionPeak(lambda: child.pid, lambda: phase[0])
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "holding"
        peak.sample()
        child.stdin.write("free\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "freed"
        phase[0] = "measure"
        peak.sample()
        result = peak.stop()
    finally:
        child.kill()
        child.wait()
    assert result is not None
    assert result["bytes"] >= 96 * MIB and result["processes"] == 1
    assert result["phase"] == "warm-up" and result["samples"] == 2


@linux_only
def test_the_thread_samples_until_stopped_and_no_session_gives_no_peak() -> None:
    child = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, start_new_session=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "holding"
        peak = SessionPeak(lambda: child.pid, lambda: "measure", interval_s=0.01).start()
        deadline = time.monotonic() + 120
        while peak._samples < 3 and time.monotonic() < deadline:  # polled: the thread's own pace
            time.sleep(0.01)
        result = peak.stop()
    finally:
        child.kill()
        child.wait()
    assert result is not None and result["samples"] >= 3 and result["bytes"] >= 96 * MIB
    assert SessionPeak(lambda: None, lambda: "setup").start().stop() is None


def test_the_report_prints_the_highest_session_memory() -> None:
    mode = {"mode": "connect", "spark": "sc://x", "completed": 1, "partitions": 1,
            "spark_server": {"ready_s": 1.0, "session_rss_bytes": 2 << 30},
            "session_rss_peak": {"bytes": 5 << 30, "processes": 6, "phase": "measure", "samples": 9}}
    lines = _mode_headers({"connect": mode}, ["connect"])
    assert any("session RSS at its highest (sampled every second): 5120 MiB in 6 processes, during the measure"
               in line for line in lines), lines
