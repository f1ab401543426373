"""What both end-to-end benchmarks share: their constants, the seeded data and the probe a
measurement searches for, and a supervised Spark Connect server in a background thread."""

from __future__ import annotations

import datetime as dt
import json
import math
import random
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from freshidx.raw_record import STATUSES
from freshidx.store.partitions import PartitionId
from freshidx.tools.generator import GeneratorConfig, partition_records

MODES = ("connect", "local")
DELTA_MODES = ("sensor", "continuous")  # FRESHIDX_DELTA_MODE
WINDOW_MINUTES = 300
SOURCE = "ad_updates"
POLL_S = 0.2  # measurement resolution
DEFAULT_CDS_DIR = Path(tempfile.gettempdir()) / "freshidx-bench-cds"
_TITLE_WORD = re.compile(r"^[a-z0-9]+$")
_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
_AD_IN_LINE = re.compile(r'"ad_id":"([^"]+)"')


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def passed(self) -> bool:
        return time.monotonic() >= self.end


# ============================================================================== data


def generator_config_for(window_docs: int, seed: int = 0, window_minutes: int = WINDOW_MINUTES) -> GeneratorConfig:
    """A generator config whose history (one partition every 5 min over the window) holds ~``window_docs``
    distinct ads.

    ``ads`` = 1.25 × D; 25 % of the changes go to the 2 % hot ads, the rest uniformly, so the distinct
    ads seen after T valid changes are ``hot + (ads − hot)(1 − exp(−0.75 T / ads))``; solve for T.
    Bursts are disabled: every partition is one file, so "arrival" is one atomic put.
    """
    if window_docs < 10:
        raise ValueError(f"window_docs must be >= 10, got {window_docs}")
    ads = max(20, round(window_docs * 1.25))
    hot = max(1, ads // 50)
    frac = min(0.999, max(0.0, (window_docs - hot) / (ads - hot)))
    total_valid = -math.log(1.0 - frac) * ads / 0.75
    partitions = max(1, window_minutes // 5)
    malformed = 0.01
    changes = max(1, math.ceil(total_valid / (partitions * (1 - malformed))))
    return GeneratorConfig(source=SOURCE, seed=seed, ads=ads, products=max(10, ads // 8),
                           changes_per_partition=changes, malformed_rate=malformed, burst_probability=0.0)


@dataclass(frozen=True)
class Probe:
    """A document of one partition that its delta version must serve."""

    ad_id: str
    title: str
    word: str
    version: int

    @property
    def query(self) -> str:
        return f'+title:{self.word} +ad_id:"{self.ad_id}"'


def looks_valid(r: Any) -> bool:
    if not isinstance(r, dict):
        return False
    for name in ("ad_id", "campaign_id", "product_id", "title", "bid", "status", "updated_at", "version"):
        if r.get(name) is None:
            return False
    bid = r["bid"]
    return (
        r["status"] in STATUSES and isinstance(bid, int | float) and not isinstance(bid, bool) and bid >= 0
        and isinstance(r["updated_at"], str) and _is_timestamp(r["updated_at"])
        and isinstance(r["version"], int) and isinstance(r["title"], str)
    )


def _is_timestamp(text: str) -> bool:
    """The shape *and* a real instant: ``2026-11-21T25:61:00.000Z`` has the shape and is quarantined."""
    if not _TIMESTAMP.match(text):
        return False
    try:
        dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ")
    except ValueError:
        return False
    return True


def pick_probe(cfg: GeneratorConfig, partition: PartitionId, seed: int = 0) -> Probe | None:
    """An ad whose newest record is in ``partition``, active and beyond doubt valid.

    Any ad that appears in a line failing the (strict) check is avoided altogether, so a
    disagreement between this check and the pipeline's validation can never pick a rejected record.
    """
    lines, _ = partition_records(cfg, partition)
    tainted: set[str] = set()
    latest: dict[str, dict[str, Any]] = {}
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            r = None
        if not looks_valid(r):
            tainted.update(_AD_IN_LINE.findall(line))
            if isinstance(r, dict) and isinstance(r.get("ad_id"), str):
                tainted.add(r["ad_id"])
            continue
        assert isinstance(r, dict)
        have = latest.get(r["ad_id"])
        if have is None or r["version"] > have["version"]:
            latest[r["ad_id"]] = r
    candidates = []
    for ad, r in sorted(latest.items()):
        if ad in tainted or r["status"] != "active":
            continue
        words = [w for w in r["title"].split() if _TITLE_WORD.match(w)]
        if words:
            candidates.append(Probe(ad, r["title"], max(words, key=len), int(r["version"])))
    if not candidates:
        return None
    return random.Random(f"{seed}:{partition.compact}").choice(candidates)


# ============================================================================== searchable


class Visibility:
    """Decides when a delta version is searchable: the real Searcher, kept current by a
    :class:`~freshidx.serve.follow.PointerFollower` (as a serving application would run it), if it works;
    else the fallback. A version is searchable from the moment the follower swapped it in."""

    def __init__(self, store: Any, cache_dir: Path) -> None:
        self.store = store
        self.method = "searcher"
        self.error: str | None = None
        self.searcher: Any = None
        self.follower: Any = None
        # delta version -> (wall time the refresh that swapped it in started, its RefreshTimings)
        self.swaps: dict[str, tuple[float, Any]] = {}
        try:
            from freshidx.serve.follow import PointerFollower
            from freshidx.serve.searcher import Searcher

            self.searcher = Searcher(store, cache_dir)
            self.follower = PointerFollower(self.searcher, on_swap=self._swapped).start()
        except Exception as exc:
            self._fall_back(exc)

    def close(self) -> None:
        if self.follower is not None:
            self.follower.stop()

    def _swapped(self, version_set: Any, timings: Any, started: float) -> None:
        if version_set.delta is not None:
            self.swaps.setdefault(version_set.delta.version, (started, timings))

    def parts(self, published: float | None, version: str | None) -> dict[str, float | int] | None:
        """Where ``published → searchable`` went: the wait until the refresh that swapped ``version`` in
        started (the follower's pointer poll), and that refresh's steps."""
        if published is None or version not in self.swaps:
            return None
        started, timings = self.swaps[version]
        steps = timings.as_dict()
        steps.pop("total_s")
        return {"wait_s": round(started - published, 4), **steps}

    def _fall_back(self, exc: BaseException) -> None:
        self.close()
        self.method = "pointer+manifest"
        self.error = f"{type(exc).__name__}: {exc}"[:500]
        self.searcher = None
        log(f"Searcher unavailable ({self.error}); searchable = pointer covers P and its manifest lists shards")

    def searchable_at(self, version: str, probe: Probe | None) -> float | None:
        """When ``version`` became searchable (serves ``probe``), or None if it is not yet."""
        if self.searcher is not None and probe is not None:
            failed = self.follower.last_error
            if type(failed).__name__ == "ServingError" and version not in self.swaps:
                self._fall_back(failed)  # the version cannot be served at all
                return self.searchable_at(version, probe)
            self.error = None if failed is None else f"{type(failed).__name__}: {failed}"[:500]
            if version not in self.swaps:
                return None
            started, timings = self.swaps[version]
            hits = self.searcher.search(probe.query, 5)
            if any(h.ad_id == probe.ad_id and h.index == "delta" and h.version in self.swaps for h in hits):
                return started + timings.total_s
            return None
        from freshidx.publish.commit import read_manifest

        try:
            return time.time() if read_manifest(self.store, "delta", version).get("shards") else None
        except Exception:
            return None


# ============================================================================== Connect server


class ConnectServer:
    """A :class:`SparkConnectSupervisor` on a free loopback port, supervised in a background thread."""

    def __init__(self, state_dir: Path, *, restart_every_s: float = 24 * 3600.0, driver_memory: str = "2g",
                 heap_check_interval_s: float = 30.0, max_heap_fraction: float = 0.85,
                 cds_dir: Path | None = DEFAULT_CDS_DIR, health_timeout_s: float = 15.0,
                 health_failures: int = 3) -> None:
        from freshidx.spark_server.server_config import ServerConfig
        from freshidx.spark_server.supervisor import SparkConnectSupervisor
        from freshidx.tools.devserver import free_port

        self.config = ServerConfig(
            port=free_port(), state_dir=state_dir, restart_every_s=restart_every_s, driver_memory=driver_memory,
            heap_check_interval_s=heap_check_interval_s, max_heap_fraction=max_heap_fraction,
            drain_timeout_s=120.0, cds_dir=cds_dir, health_timeout_s=health_timeout_s,
            health_failures=health_failures,
        )
        self.supervisor = SparkConnectSupervisor(self.config)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_error: BaseException | None = None
        self._started = threading.Event()
        self.ready_s: float | None = None
        self.timings: dict[str, Any] = {}

    @property
    def url(self) -> str:
        return self.config.url

    @property
    def state_dir(self) -> Path:
        return self.config.state_dir

    def start_async(self) -> None:
        """Start (in the background thread) and keep supervising; :meth:`wait_up` waits for it."""

        def body() -> None:
            t0 = time.monotonic()
            try:
                self.timings = self.supervisor.start()
                self.ready_s = round(time.monotonic() - t0, 1)
            except BaseException as exc:  # reported by wait_up
                self._start_error = exc
                return
            finally:
                self._started.set()
            self.supervisor.run_forever(self._stop)

        self._thread = threading.Thread(target=body, name="freshidx-bench-spark-server", daemon=True)
        self._thread.start()

    def wait_up(self, timeout_s: float = 600.0) -> None:
        if not self._started.wait(timeout_s):
            raise TimeoutError(f"Spark Connect server not up after {timeout_s:.0f}s (log {self.state_dir}/server.log)")
        if self._start_error is not None:
            raise RuntimeError(f"Spark Connect server failed to start: {self._start_error}") from self._start_error

    def state(self) -> dict[str, Any]:
        from freshidx.spark_server.server_state import read_state

        return read_state(self.state_dir) or {}

    def stop(self) -> None:
        """Stop supervising and stop the server; a second call does nothing."""
        if self._stop.is_set():
            return
        self._stop.set()
        self.supervisor.stop()
        if self._thread is not None:
            self._thread.join(60)


def session_pss_bytes(sid: int) -> int | None:
    """Summed proportional set size of session ``sid``: a page the pyspark daemon's forked workers share
    counts once, split between them, where summed RSS counts it in each of them."""
    from freshidx.procs import pss_bytes

    return _summed(sid, pss_bytes)


def session_file_rss_bytes(sid: int) -> int | None:
    """Summed file-backed RSS of session ``sid``: the mapped state copies and key indexes (page cache pages,
    shared between the workers that touched them), the JVM's jars and the like."""
    from freshidx.procs import file_rss_bytes

    return _summed(sid, file_rss_bytes)


def _summed(sid: int, measure: Callable[[int], int | None]) -> int | None:
    """``measure`` summed over the live processes of session ``sid``; None if it answered for none."""
    from freshidx.procs import session_members

    values = [v for v in (measure(p) for p in session_members(sid)) if v is not None]
    return sum(values) if values else None


def session_usage(sid: int) -> tuple[int | None, int]:
    """(summed RSS, process count) of the live processes in session ``sid``: the JVM and its Python
    worker daemons (which Spark Connect starts per client session and does not reap, SPARK-54055)."""
    from freshidx.procs import rss_bytes, session_members

    rss = [r for r in (rss_bytes(p) for p in session_members(sid)) if r is not None]
    return (sum(rss) if rss else None), len(rss)
