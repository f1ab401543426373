"""One chaos run (:func:`run_chaos`): moto, the fault proxy, ``freshidx demo`` on them, seeded SIGKILLs of
its parts, then settle, stop and check. The phases:

1. start: moto on a free loopback port, the fault proxy in front of it, the demo using the proxy as its
   S3 endpoint; wait for the first delta publication;
2. kills: for ``minutes``, a SIGKILL every ``kill_min``-``kill_max`` s (:class:`~.kill_plan.KillPlan`) of a
   part found in the demo's tree (:mod:`~.targets`); the delta pointer is polled all along
   (:class:`~.pointer_watch.PointerWatch`);
3. settle: the generator is paused (SIGSTOP: the demo's supervisor would restart one that exits) and the
   bench waits until the newest partition is published; then until the UI serves again (webserver, code
   location, daemons);
4. stop: SIGTERM to the demo (it must exit 0), then the processes left (:class:`~.demo_proc.DemoProcess`);
5. checks, on the store as moto holds it: every raw partition explained by the ledger, the served
   documents against the oracle (:mod:`~.oracle`), the pointer's moves and a restart printed for every
   kill of a supervised part (:mod:`~.verdict`).
"""

from __future__ import annotations

import contextlib
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from freshidx.procs import sigterm_as_interrupt
from freshidx.store import ObjectStore, StoreConfig, open_store
from freshidx.store.partitions import PartitionId
from freshidx.tools.chaos import oracle, targets
from freshidx.tools.chaos.demo_proc import DemoProcess
from freshidx.tools.chaos.fault_proxy import FaultProxy, FaultRates
from freshidx.tools.chaos.kill_plan import GENERATOR, TARGETS, KillPlan, kill_times
from freshidx.tools.chaos.pointer_watch import PointerWatch, looping_run_id, source_partition, wait_until
from freshidx.tools.chaos.s3_server import MotoServer
from freshidx.tools.chaos.verdict import Kill, recoveries, summarize, unrestarted

Log = Callable[[str], None]


@dataclass(frozen=True)
class ChaosOptions:
    minutes: float = 15.0
    seed: int = 0
    every: float = 6.0
    kill_min: float = 30.0
    kill_max: float = 90.0
    rates: FaultRates = field(default_factory=FaultRates)
    targets: tuple[str, ...] = TARGETS
    history_minutes: int = 30
    start_timeout_s: float = 900.0
    ui_timeout_s: float = 300.0
    settle_timeout_s: float = 900.0
    stop_timeout_s: float = 600.0
    workdir: str | None = None
    keep: bool = False


@dataclass
class Phases:
    """What the run saw before the checks."""

    kills: list[Kill] = field(default_factory=list)
    newest: PartitionId | None = None
    settle_s: float | None = None
    outside: int = 0  # the most processes of the demo's seen outside its tree (before each kill)
    errors: list[str] = field(default_factory=list)


def run_chaos(opts: ChaosOptions, log: Log) -> dict[str, Any]:
    """Run it; returns :func:`~.verdict.summarize`'s result."""
    work = Path(opts.workdir or tempfile.mkdtemp(prefix="freshidx-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()

    def clock() -> float:
        return time.monotonic() - t0

    try:
        with sigterm_as_interrupt(), MotoServer(work / "moto.log") as moto, \
                FaultProxy(moto.endpoint, opts.rates, opts.seed) as proxy:
            config = moto.config(moto.endpoint)
            direct = open_store(config)
            log(f"moto {moto.endpoint}, fault proxy {proxy.endpoint}, store {moto.uri()}, work dir {work}")
            demo = DemoProcess(work / "demo", moto.env(proxy.endpoint), every=opts.every,
                               history_minutes=opts.history_minutes, seed=opts.seed)
            phases = Phases()
            with PointerWatch(direct, clock) as watch:
                try:
                    _phases(opts, demo, direct, watch, clock, log, phases)
                finally:
                    log("stopping the demo (SIGTERM) …")
                    stop_s, leftover = demo.stop(opts.stop_timeout_s)
                obs = watch.observations()
            log(f"demo stopped in {stop_s} s, {leftover} process(es) left; checking …")
            checks = _checks(direct, config, phases, log)
            recoveries(phases.kills, obs)
            extra = {"minutes": opts.minutes, "seed": opts.seed, "every_s": opts.every,
                     "kill_every_s": [opts.kill_min, opts.kill_max], "settle_s": phases.settle_s,
                     "stop_s": stop_s, "faults": proxy.counts(), "pointer_read_errors": watch.read_errors,
                     "errors": [*phases.errors, *checks.pop("errors")], "work_dir": str(work), **checks}
            if stop_s is None:
                extra["errors"].append(f"the demo did not stop within {opts.stop_timeout_s:g} s of SIGTERM")
            elif demo.proc.returncode != 0:
                extra["errors"].append(f"the demo exited with {demo.proc.returncode} on SIGTERM: {demo.tail(3)}")
            extra["restarts"] = demo.restarts()
            counts = {**checks, "leftover": leftover, "outside": phases.outside,
                      "unrestarted": unrestarted(phases.kills, extra["restarts"])}
            return summarize(kills=phases.kills, obs=obs, counts=counts, extra=extra)
    finally:
        if not opts.keep and opts.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


def _phases(opts: ChaosOptions, demo: DemoProcess, direct: ObjectStore, watch: PointerWatch,
            clock: Callable[[], float], log: Log, out: Phases) -> None:
    errors = out.errors
    log(f"waiting for the first delta publication (at most {opts.start_timeout_s:g} s) …")
    if not wait_until(lambda: watch.latest() is not None or not demo.running(), opts.start_timeout_s):
        errors.append(f"no delta published within {opts.start_timeout_s:g} s of the start")
        return
    if not demo.running():
        errors.append(f"the demo exited with {demo.proc.returncode}: {demo.tail(3)}")
        return
    log(f"first delta at {clock():.0f} s; {opts.minutes:g} min of kills every {opts.kill_min:g}-{opts.kill_max:g} s")
    _kill_phase(opts, demo, direct, clock, log, out)
    if not demo.running():
        errors.append(f"the demo exited during the kills with {demo.proc.returncode}: {demo.tail(3)}")
        return
    out.newest, out.settle_s = _settle(opts, demo, direct, watch, log)
    if out.settle_s is None:
        errors.append(f"the newest partition {out.newest.path if out.newest else '?'} was not published within "
                      f"{opts.settle_timeout_s:g} s after the last kill")
    log(f"waiting for the UI to serve again (at most {opts.ui_timeout_s:g} s) …")
    problem = _wait_for_ui(demo, opts.ui_timeout_s)
    if problem is not None:
        errors.append(f"the UI did not serve again within {opts.ui_timeout_s:g} s after the kills: {problem}")


def _kill_phase(opts: ChaosOptions, demo: DemoProcess, direct: ObjectStore, clock: Callable[[], float], log: Log,
                out: Phases) -> None:
    kills = out.kills
    plan = KillPlan(opts.seed, opts.kill_min, opts.kill_max, opts.targets)
    pick = random.Random(opts.seed + 2)  # which pid, when a kind has several
    start = clock()
    for offset in kill_times(plan, opts.minutes * 60):
        if not _sleep_until(start + offset, clock, demo):
            return
        out.outside = max(out.outside, demo.outside())  # what the kill before left, given its time to settle
        found = targets.find_targets(demo.pid, demo.instance(), looping_run_id(direct))
        target = plan.choose([k for k, pids in found.items() if pids])
        if target is None:
            kills.append(Kill(round(clock(), 2), "none", None))
            continue
        pid = pick.choice(sorted(found[target]))
        killed = targets.kill(pid)
        kills.append(Kill(round(clock(), 2), target, pid if killed else None))
        log(f"  {clock():7.1f} s  SIGKILL {target} (pid {pid}){'' if killed else ': already gone'}")
    if _sleep_until(start + opts.minutes * 60, clock, demo):
        out.outside = max(out.outside, demo.outside())


def _sleep_until(at: float, clock: Callable[[], float], demo: DemoProcess) -> bool:
    """Wait until the bench's clock reads ``at``; False if the demo exited meanwhile."""
    while clock() < at:
        if not demo.running():
            return False
        time.sleep(min(1.0, max(0.0, at - clock())))  # the schedule's wait, checking the demo each second
    return demo.running()


def _settle(opts: ChaosOptions, demo: DemoProcess, direct: ObjectStore, watch: PointerWatch,
            log: Log) -> tuple[PartitionId | None, float | None]:
    """Pause the generator, then wait until the newest partition is published: (newest, seconds or None)."""
    from freshidx.settings import Settings
    from freshidx.trigger.listing import newest_partition

    if not wait_until(lambda: _pause_generator(demo), 120):
        log("  could not pause the generator (none running); settling on what is there")
    newest, _ = newest_partition(direct, Settings.from_env(store=direct.uri).source)
    log(f"generator paused; settling until {newest.path if newest else '-'} is published "
        f"(at most {opts.settle_timeout_s:g} s) …")
    t0 = time.monotonic()

    def published() -> bool:
        at = watch.source_partition()
        return newest is None or (at is not None and at >= newest)

    if wait_until(published, opts.settle_timeout_s):
        return newest, round(time.monotonic() - t0, 1)
    return newest, None


def _wait_for_ui(demo: DemoProcess, timeout_s: float) -> str | None:
    """Poll the demo's UI until it serves (None) or ``timeout_s`` passed (the last problem seen)."""
    deadline = time.monotonic() + timeout_s
    while (problem := demo.ui_problem()) is not None and time.monotonic() < deadline:
        time.sleep(2.0)  # polling interval: a restarted webserver or code server takes seconds to serve
    return problem


def _pause_generator(demo: DemoProcess) -> bool:
    pids = targets.find_targets(demo.pid, demo.instance(), None).get(GENERATOR, [])
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).suspend()
    return bool(pids)


def _checks(direct: ObjectStore, config: StoreConfig, phases: Phases, log: Log) -> dict[str, Any]:
    """Ledger, oracle and served documents, on the store as it is after the stop."""
    from freshidx.settings import Settings
    from freshidx.trigger.ledger import explained, unexplained

    source = Settings.from_env(store=direct.uri).source
    watermark = source_partition(direct)
    until = watermark if watermark is not None else phases.newest
    if until is None:
        return {"lost": 0, "wrong": 0, "unexplained": 0, "errors": ["nothing was published"]}
    last = max(until, phases.newest) if phases.newest is not None else until
    raw = oracle.raw_records(direct, config, source, last)
    not_explained = unexplained(explained(direct, "delta", None, None), raw.partitions)
    served, versions = oracle.served_docs(direct)
    covered = [r for r in raw.records if r["partition"] <= until.path]
    cmp = oracle.compare(served, oracle.oracle(covered), raw.uncertain_ads)
    log(f"oracle: {cmp.expected} active ads from {len(covered)} valid records in {len(raw.partitions)} "
        f"partitions; served {cmp.served} documents ({versions})")
    return {"lost": len(cmp.lost), "wrong": len(cmp.wrong), "unexplained": len(not_explained),
            "lost_ads": cmp.lost[:20], "wrong_ads": cmp.wrong[:20],
            "unexplained_partitions": [p.path for p in not_explained][:20],
            "partitions": len(raw.partitions), "watermark": until.path, "served_docs": cmp.served,
            "oracle_docs": cmp.expected, "uncertain_lines": raw.uncertain_lines, "invalid_lines": raw.invalid_lines,
            "served_versions": versions, "errors": []}


