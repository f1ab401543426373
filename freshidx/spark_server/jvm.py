"""The JDK's ``jcmd`` and what the supervisor measures with it: the JVM's heap.

**Heap measurement.** ``jcmd <pid> GC.heap_info`` gives the used heap, ``jcmd <pid> VM.flags`` the
``MaxHeapSize`` (both ~0.3 s of CPU: the supervisor samples every ``heap_check_interval_s``, not every
health check). A sample over the threshold is confirmed by the supervisor with ``jcmd <pid> GC.run``
(a full GC) and sampled again, so garbage waiting for collection never triggers a restart: only a live
set over the threshold does. Without ``jcmd`` (a JRE without the JDK tools) the fallback is the
process RSS against ``-Xmx`` (``source: "rss"``), which over-counts (metaspace, code cache, threads)
and so restarts earlier.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from freshidx import procs

#: One line per heap part: G1 prints one ("garbage-first heap total …K, used …K"), the generational
#: collectors one per generation (Serial: "def new generation" + "tenured generation"; Parallel:
#: "PSYoungGen" + "ParOldGen"), so the heap used is the sum over every match.
_HEAP_USED_RE = re.compile(r"\btotal (\d+)K, used (\d+)K")
_MAX_HEAP_RE = re.compile(r"-XX:MaxHeapSize=(\d+)")


def jcmd() -> str | None:
    """Path of the JDK's ``jcmd`` (``$JAVA_HOME`` first, as the JVM itself is found), None on a JRE."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "jcmd").exists():
        return str(Path(java_home) / "bin" / "jcmd")
    return shutil.which("jcmd")


@dataclass
class MemorySample:
    """One heap sample of a JVM (bytes); ``fraction`` is what the planned-heap restart compares."""

    heap_used_bytes: int | None
    heap_max_bytes: int | None
    rss_bytes: int | None
    source: str  # "jcmd" | "rss"

    @property
    def fraction(self) -> float | None:
        if not self.heap_max_bytes:
            return None
        used = self.heap_used_bytes if self.source == "jcmd" else self.rss_bytes
        return None if used is None else used / self.heap_max_bytes


def run_jcmd(
    pid: int, *command: str, timeout: float = 20.0, cancel: Callable[[], bool] | None = None
) -> str | None:
    """``jcmd <pid> <command…>``'s output, or None if it failed, timed out or ``cancel()`` said stop."""
    exe = jcmd()
    if exe is None:
        return None
    try:
        proc = subprocess.Popen([exe, str(pid), *command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    except OSError:
        return None
    deadline = time.monotonic() + timeout
    while True:  # polled, so a stop request does not wait for a CDS dump (10-50 s)
        try:
            out, _ = proc.communicate(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline or (cancel is not None and cancel()):
                proc.kill()
                proc.communicate()
                return None
    return out if proc.returncode == 0 else None


def heap_used_bytes(heap_info: str) -> int | None:
    """The heap used according to ``jcmd <pid> GC.heap_info``: every part's "used" (young and old
    generations for Serial and Parallel GC, the one G1 heap), or None when nothing matched (e.g. ZGC)."""
    parts = _HEAP_USED_RE.findall(heap_info)
    return sum(int(used) for _, used in parts) * 1024 if parts else None


def sample_memory(pid: int, xmx_bytes: int, max_heap_cache: dict[int, int] | None = None) -> MemorySample:
    """Heap used / max of JVM ``pid`` via ``jcmd``; falls back to RSS vs ``xmx_bytes``."""
    rss = procs.rss_bytes(pid)
    out = run_jcmd(pid, "GC.heap_info")
    used = heap_used_bytes(out or "")
    if used is not None:
        heap_max: int | None = (max_heap_cache or {}).get(pid)
        if heap_max is None:
            flags = run_jcmd(pid, "VM.flags")
            mm = _MAX_HEAP_RE.search(flags or "")
            heap_max = int(mm.group(1)) if mm else xmx_bytes
            if max_heap_cache is not None:
                max_heap_cache[pid] = heap_max
        return MemorySample(used, heap_max, rss, "jcmd")
    return MemorySample(None, xmx_bytes, rss, "rss")
