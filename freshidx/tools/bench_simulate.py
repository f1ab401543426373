"""``freshidx bench simulate``: the commit protocol's deterministic simulation
(docs/architecture.md#deterministic-simulation).

Runs schedules ``seed .. seed + schedules - 1`` (:func:`freshidx.tools.simulation.world.run_schedule`), on
``--workers`` processes; prints schedules/s and every violation with the one command that reproduces it, and
on stderr, for a long run, how far it is and when it should end.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from freshidx.tools.simulation import seams, world

CHUNK = 200
#: Seconds between two progress lines of the command.
PROGRESS_EVERY = 30.0

Part = tuple[list[dict[str, Any]], list[str]]
#: The young generation's threshold while schedules run: a schedule allocates thousands of short-lived
#: containers and the default (700) ran a collection every few store calls.
GC_YOUNG = 20_000


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """Freeze what is long-lived (modules, the starting state) out of the collector and collect the young
    generation less often while schedules run; as before after."""
    world.prepare()
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(GC_YOUNG, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


def _run(seeds: range) -> Part:
    """Run ``seeds`` in this process: the violations found and each schedule's trace digest."""
    violations: list[dict[str, Any]] = []
    digests: list[str] = []
    with seams.installed(), _fewer_collections():
        for seed in seeds:
            r = world.run_schedule(seed)
            digests.append(r.digest)
            if r.violation is not None:
                violations.append({
                    "seed": seed, "invariant": r.violation.invariant, "detail": r.violation.detail,
                    "actors": r.actors, "outcomes": r.outcomes, "trace": r.short_trace(),
                    "reproduce": f"freshidx bench simulate --schedules 1 --seed {seed}"})
    return violations, digests


def _parts(chunks: list[range], workers: int) -> Iterator[Part]:
    """Each chunk's result, in order, from this process or a pool of ``workers``."""
    if workers <= 1 or len(chunks) <= 1:
        yield from map(_run, chunks)
        return
    # fork is cheap (the workers inherit the imported code) but unsafe beside other threads (a test
    # runner's): a fresh interpreter then.
    method = "fork" if threading.active_count() == 1 else "spawn"
    with multiprocessing.get_context(method).Pool(workers) as pool:
        yield from pool.imap(_run, chunks)


def simulate(schedules: int, seed: int, workers: int = 1,
             progress: Callable[[int, int, float], None] | None = None) -> dict[str, Any]:
    """Run the schedules; the result carries ``schedules``, ``violations``, ``seconds``, ``schedules_per_s``
    and ``digest`` (over every schedule's trace: the same seeds give the same digest). ``progress`` is told
    the schedules done, the violations found and the seconds spent after each chunk of them."""
    chunks = [range(s, min(s + CHUNK, seed + schedules)) for s in range(seed, seed + schedules, CHUNK)]
    t0 = time.perf_counter()
    parts: list[Part] = []
    done = found = 0
    for part in _parts(chunks, workers):
        parts.append(part)
        done, found = done + len(part[1]), found + len(part[0])
        if progress is not None:
            progress(done, found, time.perf_counter() - t0)
    seconds = time.perf_counter() - t0
    violations = [v for vs, _ in parts for v in vs]
    digests = [d for _, ds in parts for d in ds]
    return {"schedules": schedules, "seed": seed, "workers": workers, "seconds": round(seconds, 3),
            "schedules_per_s": round(schedules / seconds, 1) if seconds else None,
            "violations": violations, "digest": hashlib.sha256("".join(digests).encode()).hexdigest()[:16]}


def _reporter(schedules: int, every: float = PROGRESS_EVERY) -> Callable[[int, int, float], None]:
    """A progress line on stderr at most every ``every`` seconds: done, violations, rate, the projected end."""
    last = [0.0]

    def report(done: int, found: int, seconds: float) -> None:
        if seconds - last[0] >= every and done < schedules:
            last[0] = seconds
            rate = done / seconds
            print(f"{done}/{schedules} schedules in {seconds:.0f} s ({rate:.1f}/s), {found} violation(s) so far, "
                  f"about {(schedules - done) / rate:.0f} s to go", file=sys.stderr, flush=True)
    return report


def cmd_bench_simulate(*, schedules: int, seed: int, workers: int, as_json: bool) -> int:
    workers = workers or (os.cpu_count() or 1)
    r = simulate(schedules, seed, workers, progress=_reporter(schedules))
    if as_json:
        print(json.dumps(r))
    out = sys.stderr if as_json else sys.stdout
    print(f"{r['schedules']} schedules (seeds {seed}..{seed + schedules - 1}) on {workers} process(es) in "
          f"{r['seconds']} s: {r['schedules_per_s']} schedules/s; {len(r['violations'])} violation(s); "
          f"digest {r['digest']}", file=out)
    for v in r["violations"][:20]:
        print(f"seed {v['seed']}: {v['invariant']}: {v['detail']}", file=out)
        for line in v["trace"]:
            print(f"    {line}", file=out)
        print(f"  reproduce: {v['reproduce']}", file=out)
    return 1 if r["violations"] else 0
