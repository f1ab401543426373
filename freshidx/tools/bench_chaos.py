"""``freshidx bench chaos``: the main job (``freshidx demo``, continuous mode) on the S3 protocol behind a
fault proxy, with a SIGKILL of one of its parts every 30-90 s; each kill's recovery, and correctness
at the end.

    freshidx bench chaos [--minutes 15] [--seed N] [--every 6] [--kill-every 30 90] [--fault-rate 0.05]
                         [--drop-rate 0.01] [--lost-rate 0.01] [--delay-rate 0.02] [--delay-s 2]
                         [--targets continuous-worker,run-worker,...] [--json]

The store is a real moto S3 server on a free loopback port; the demo's processes use a seeded fault
proxy in front of it as their S3 endpoint (:mod:`freshidx.tools.chaos.fault_proxy`: 500/503 answers,
connections dropped before forwarding, responses lost after forwarding, 2 s delays). The targets
(:mod:`freshidx.tools.chaos.kill_plan`): the continuous run's worker, another run's worker, the Spark
Connect JVM, the dagster daemon, the webserver, the code server, the generator.

A kill's **recovery** is the seconds from the kill to the next publication of a newer delta (the pointer
polled a few times a second, directly on moto); the **baseline** is the gap between two publications with
no kill between them. After the last kill the generator is paused and the bench waits until the newest
partition is published, then stops the demo (SIGTERM) and checks (``--json`` keys, each must be 0):

* ``lost``: documents the oracle (latest version per ad over every raw record, active ads only) has and
  the index does not serve; ``wrong``: served documents that differ from it or should not be there;
* ``backwards``: readings of the pointer older than an earlier one;
* ``unexplained``: raw partitions without a final ledger decision (or parked, or in a recorded gap);
* ``unrestarted``: kills of a part the demo supervises (daemon, webserver, code server, generator) with no
  restart line in its output;
* ``outside``: the most processes carrying the demo's id seen outside its process tree (looked for before
  each kill);
* ``leftover``: processes of the demo's tree alive after its stop.

Before the stop the UI must serve again (webserver, code location loaded, daemons healthy) and the demo
must exit 0 on SIGTERM; otherwise the run fails with that in ``errors``.

``recovery_s`` has ``run`` (run-worker kills: the continuous one and others), ``jvm`` and ``all``, each
``{n, p50, p95, max}``, and ``by_target``; ``recoveries`` every value per target. Exit 1 when a check
fails or a phase did not complete (``errors``). Numbers otherwise: nothing asserts on timings. The run
takes the start-up (a few minutes on a loaded box), ``--minutes``, the settling and the stop.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from freshidx.cli.base import LazyCommand, Parsed, json_option
from freshidx.tools.chaos.verdict import CHECKS

TARGET_NAMES = ("continuous-worker", "run-worker", "spark-jvm", "daemon", "webserver", "code-server", "generator")


def _targets(text: str) -> tuple[str, ...]:
    chosen = tuple(t.strip() for t in text.split(",") if t.strip())
    if not chosen or any(t not in TARGET_NAMES for t in chosen):
        raise ValueError(f"targets are a comma-separated subset of {','.join(TARGET_NAMES)}, got {text!r}")
    return chosen


def _opt(*decls: str, **kw: Any) -> click.Option:
    return click.Option(list(decls), **kw)


def _rate(name: str, default: float, what: str) -> click.Option:
    return _opt(name, type=click.FloatRange(0.0, 1.0), default=default, show_default=True,
                help=f"share of S3 requests {what}")


chaos = LazyCommand(
    "chaos", "freshidx.tools.bench_chaos:cmd_bench_chaos",
    _opt("--minutes", type=click.FloatRange(min=0.5), default=15.0, show_default=True,
         help="minutes of kills (after the first publication; settling and the stop come on top)"),
    _opt("--seed", type=int, default=0, show_default=True, help="kills, faults and the generator's data"),
    _opt("--every", type=click.FloatRange(min=1.0), default=6.0, show_default=True,
         help="seconds between the generator's partitions"),
    _opt("--kill-every", type=(click.FloatRange(min=1.0), click.FloatRange(min=1.0)), default=(30.0, 90.0),
         show_default=True, metavar="MIN MAX", help="seconds between two kills, drawn uniformly"),
    _rate("--fault-rate", 0.05, "answered 500 or 503"),
    _rate("--drop-rate", 0.01, "whose connection is closed before forwarding"),
    _rate("--lost-rate", 0.01, "forwarded, then the connection closed without an answer"),
    _rate("--delay-rate", 0.02, "delayed by --delay-s"),
    _opt("--delay-s", type=click.FloatRange(min=0.0), default=2.0, show_default=True),
    _opt("--targets", type=Parsed("TARGETS", _targets), default=",".join(TARGET_NAMES),
         help=f"what may be killed, comma-separated (default all: {','.join(TARGET_NAMES)})"),
    _opt("--history-minutes", type=click.IntRange(min=0), default=30, show_default=True,
         help="back-dated history the generator seeds"),
    _opt("--settle-timeout", type=click.FloatRange(min=1.0), default=900.0, show_default=True,
         help="seconds to wait after the last kill for the newest partition to be published"),
    _opt("--workdir", help="keep everything here (default: a temp dir, deleted at the end unless --keep)"),
    _opt("--keep", is_flag=True, help="do not delete the temp dir"),
    json_option("print the result as JSON on stdout (progress and table on stderr)"),
    help="the demo (continuous mode) on moto S3 behind a fault proxy, with a SIGKILL of one of its parts every "
         "30-90 s: each kill's recovery (kill -> next newer delta), and at the end lost/wrong documents against "
         "an oracle, pointer moves back, partitions the ledger does not explain, processes left",
)


def cmd_bench_chaos(*, minutes: float, seed: int, every: float, kill_every: tuple[float, float], fault_rate: float,
                    drop_rate: float, lost_rate: float, delay_rate: float, delay_s: float, targets: tuple[str, ...],
                    history_minutes: int, settle_timeout: float, workdir: str | None, keep: bool,
                    as_json: bool) -> int:
    import importlib.util

    from freshidx.tools.chaos.fault_proxy import FaultRates
    from freshidx.tools.chaos.run import ChaosOptions, run_chaos

    if importlib.util.find_spec("moto") is None:
        print("freshidx bench chaos: needs the moto S3 server (pip install 'freshidx[test]')", file=sys.stderr)
        return 2
    try:
        rates = FaultRates(fault_rate, drop_rate, lost_rate, delay_rate, delay_s)
        if kill_every[0] > kill_every[1]:
            raise ValueError(f"--kill-every MIN MAX: MIN must be <= MAX, got {kill_every[0]:g} {kill_every[1]:g}")
    except ValueError as exc:
        print(f"freshidx bench chaos: {exc}", file=sys.stderr)
        return 2
    opts = ChaosOptions(minutes=minutes, seed=seed, every=every, kill_min=kill_every[0], kill_max=kill_every[1],
                        rates=rates, targets=targets, history_minutes=history_minutes,
                        settle_timeout_s=settle_timeout, workdir=workdir, keep=keep)
    out = sys.stderr if as_json else sys.stdout

    def log(line: str) -> None:
        print(line, file=out, flush=True)

    try:
        result = run_chaos(opts, log)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: run_chaos has stopped the demo and its servers
        print("freshidx bench chaos: interrupted; the demo was stopped, no result", file=sys.stderr)
        return 130
    print(render(result), file=out, flush=True)
    if as_json:
        print(json.dumps(result, default=str))
    return 1 if result["failed"] else 0


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def render(r: dict[str, Any]) -> str:
    """The kills table and the summary."""
    lines = [f"{'time s':>8}  {'target':<18} {'pid':>8}  {'recovery s':>10}"]
    for k in r["kills"]:
        rec = "-" if k["pid"] is None else _fmt(k["recovery_s"]) if k["recovery_s"] is not None else "none"
        lines.append(f"{k['t']:>8.1f}  {k['target']:<18} {_fmt(k['pid']):>8}  {rec:>10}")
    rs = r["recovery_s"]
    for name in ("run", "jvm", "all"):
        s = rs[name]
        lines.append(f"recovery {name:<4} n {s['n']:>3}  p50 {_fmt(s['p50']):>7}  p95 {_fmt(s['p95']):>7}  "
                     f"max {_fmt(s['max']):>7}")
    b = r["baseline_gap_s"]
    lines.append(f"baseline gap between publications (no kill between): n {b['n']}  p50 {_fmt(b['p50'])}  "
                 f"p95 {_fmt(b['p95'])}  max {_fmt(b['max'])}")
    lines.append(f"publications {r['publications']}, partitions {r.get('partitions', '-')}, faults {r['faults']}")
    lines.append(f"settled in {_fmt(r['settle_s'])} s, stopped in {_fmt(r['stop_s'])} s")
    restarts = r.get("restarts") or {}
    lines.append("restarts the demo printed: " + (", ".join(f"{k} {v}" for k, v in sorted(restarts.items())) or "none"))
    lines.append("checks: " + ", ".join(f"{c} {r[c]}" for c in CHECKS))
    lines.append("PASS" if not r["failed"] else "FAIL: " + "; ".join(r["failed"]))
    return "\n".join(lines)
