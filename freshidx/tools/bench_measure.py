"""The ``freshidx bench freshness`` driver: per mode, ``dagster dev`` on a seeded local store,
a warm-up, then partitions dropped one at a time and each one's events observed (the measurement
is described in :mod:`freshidx.tools.bench_freshness`; one partition's, per delta mode, in
:mod:`freshidx.tools.bench_sensor_mode` and :mod:`freshidx.tools.bench_continuous`)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from freshidx.store.partitions import PartitionId
from freshidx.tools.bench_common import (
    DELTA_MODES,
    MODES,
    SOURCE,
    WINDOW_MINUTES,
    ConnectServer,
    Deadline,
    Visibility,
    generator_config_for,
    log,
    pick_probe,
    session_file_rss_bytes,
    session_pss_bytes,
    session_usage,
)
from freshidx.tools.bench_memory import SessionPeak
from freshidx.tools.bench_report import (
    CONTINUOUS_STAGES,
    continuous_goals,
    goal_verdict,
    mode_summary,
)
from freshidx.tools.bench_seed import seed_history
from freshidx.tools.bench_sensor_mode import log_sample, measure_partition
from freshidx.tools.bench_wait import in_flight_runs, warm_up
from freshidx.tools.generate import GeneratorConfig

_SCHEDULE_QUERY = """
query FreshidxBenchSchedule($selector: ScheduleSelector!) {
  scheduleOrError(scheduleSelector: $selector) {
    __typename
    ... on Schedule { name scheduleState { id status } }
  }
}
"""

_STOP_SCHEDULE = """
mutation FreshidxBenchStopSchedule($id: String!) {
  stopRunningSchedule(id: $id) {
    __typename
    ... on ScheduleStateResult { scheduleState { id status } }
    ... on PythonError { message }
  }
}
"""


def _stop_schedule(dev: Any, name: str) -> str:
    """Stop a running schedule (best effort); returns its status afterwards or the error."""
    try:
        selector = {"repositoryLocationName": dev.location_name, "repositoryName": dev.repository_name,
                    "scheduleName": name}
        sched = dev.graphql(_SCHEDULE_QUERY, {"selector": selector})["scheduleOrError"]
        state = (sched or {}).get("scheduleState") or {}
        if not state.get("id"):
            return f"not found ({(sched or {}).get('__typename')})"
        if state.get("status") != "RUNNING":
            return str(state.get("status"))
        res = dev.graphql(_STOP_SCHEDULE, {"id": state["id"]})["stopRunningSchedule"]
        return str(((res or {}).get("scheduleState") or {}).get("status") or res)
    except Exception as exc:  # measurement goes on; reported in the result
        return f"error: {exc}"


def _stop_sensor(dev: Any, name: str) -> str:
    """Stop a running sensor (best effort); returns its status afterwards, or why not."""
    try:
        status = dev.sensor_state(name, tick_limit=0).get("status")
    except Exception as exc:  # not in this code location
        return f"not found ({type(exc).__name__})"
    if status != "RUNNING":
        return str(status)
    try:
        return str(dev.stop_sensor(name).get("status"))
    except Exception as exc:  # measurement goes on; reported in the result
        return f"error: {exc}"[:300]


def dev_env(uri: str, server: ConnectServer | None, window_minutes: int, delta_mode: str) -> dict[str, str]:
    return {"FRESHIDX_DELTA_MODE": delta_mode,
        "FRESHIDX_STORE": uri, "FRESHIDX_S3_ENDPOINT_URL": "", "FRESHIDX_SOURCE": SOURCE,
        "FRESHIDX_WINDOW_MINUTES": str(window_minutes), "PYSPARK_PYTHON": sys.executable,
        "FRESHIDX_SPARK_REMOTE": server.url if server else "",
        "FRESHIDX_SPARK_SERVER_STATE": str(server.state_dir) if server else "",
        "FRESHIDX_CATCHUP_AUTOSTART": "false",
    }


def start_dev(mode: str, dev: Any, server: ConnectServer | None, out: dict[str, Any], full_warmup: bool) -> None:
    """Start ``dagster dev`` (and wait for the Connect server meanwhile); stop what would interfere."""
    t0 = time.monotonic()
    dev.start()
    if server is not None:
        # The URL is fixed before the JVM is up: dagster dev starts meanwhile, and a run that
        # comes first waits for its lease.
        out["phase"] = "spark server start"
        server.wait_up()
        log(f"Spark Connect server up after {server.ready_s} s ({server.timings})")
    out["phase"] = "dagster dev start"
    dev.wait_ready(timeout=300)
    out["dagster_ready_s"] = round(time.monotonic() - t0, 1)
    out["full_index_schedule"] = _stop_schedule(dev, "full_index_schedule")
    # The hourly catch-up (ads_hourly) would build every hour of the seeded history on the same
    # Spark while we measure the delta path: off (env at load, and stopped here if it runs).
    out["ads_hourly_sensor"] = _stop_sensor(dev, "ads_hourly_sensor")
    log(f"{mode}: dagster dev ready in {out['dagster_ready_s']} s on {dev.url} "
        f"(full_index_schedule {out['full_index_schedule']}, ads_hourly_sensor {out['ads_hourly_sensor']}); "
        f"warming up: first delta" + (" + full index" if full_warmup else ""))


def _measure_all(
    mode: str, dev: Any, instance: Any, store: Any, vis: Visibility, cfg: GeneratorConfig, *, partitions: int,
    timeout_s: float, max_delay_s: float, rng: random.Random, seed: int, loads: list[float],
    measure: Any = measure_partition, log_sample: Any = log_sample,
) -> list[dict[str, Any]]:
    """Drop ``partitions`` new partitions one at a time (each after a random pause) and measure each."""
    samples: list[dict[str, Any]] = []
    last = max(PartitionId.from_datetime(dt.datetime.now(dt.UTC)), _newest(store))
    for i in range(partitions):
        now_p = PartitionId.from_datetime(dt.datetime.now(dt.UTC))
        partition = max(now_p, PartitionId(last.at + dt.timedelta(minutes=1)))
        last = partition
        probe = pick_probe(cfg, partition, seed)
        delay = rng.uniform(0.0, max_delay_s)
        time.sleep(delay)
        load = round(os.getloadavg()[0], 2)
        loads.append(load)
        s = measure(dev, instance, store, vis, cfg, partition, probe, timeout_s)
        s.update(delay_before_drop_s=round(delay, 3), load_avg_1m=load)
        samples.append(s)
        if s["error"]:
            # The sensor retries a failed partition (attempt N+1): let that settle first, so the
            # next sample does not start behind someone else's run.
            time.sleep(6.0)
            settle = Deadline(timeout_s)
            while in_flight_runs(instance) and not settle.passed() and dev.is_running:
                time.sleep(1.0)
        log_sample(mode, i, partitions, partition, s)
    return samples


def _run_mode(
    mode: str, *, root: Path, seed_raw: Path, cfg: GeneratorConfig, partitions: int, timeout_s: float,
    max_delay_s: float, rng: random.Random, server: ConnectServer | None, seed: int, window_minutes: int,
    full_warmup: bool = True, delta_mode: str = "sensor", measure_cfg: GeneratorConfig | None = None,
    window_docs: int = 0,
) -> dict[str, Any]:
    """One mode (``local``/``connect``) × one delta mode: a ``dagster dev`` of its own on a copy of the seeded
    store, warmed up, then ``partitions`` partitions measured. Failures end up in ``out["error"]``."""
    from freshidx.store import StoreConfig, open_store
    from freshidx.tools.devserver import DagsterDev, packaged_dagster_yaml, prepare_home

    out: dict[str, Any] = {"mode": mode, "delta_mode": delta_mode, "partitions": partitions, "phase": "setup"}
    mdir = root / (mode if delta_mode == "sensor" else f"{mode}-{delta_mode}")
    label = mode if delta_mode == "sensor" else f"{mode}/{delta_mode}"
    store_dir = mdir / "store"
    shutil.copytree(seed_raw, store_dir / "raw")
    uri = store_dir.as_uri()
    store = open_store(StoreConfig(uri=uri))
    out["spark"] = server.url if server else "local[2] (a SparkSession per run)"
    home = prepare_home(mdir / "dagster_home", packaged_dagster_yaml())
    dev = DagsterDev(home=home, module="freshidx.definitions", env=dev_env(uri, server, window_minutes, delta_mode),
                     log_path=mdir / "dagster-dev.log")
    continuous = delta_mode == "continuous"
    loads: list[float] = []
    peak = None if server is None else SessionPeak(lambda: server.state().get("pid"),
                                                   lambda: str(out["phase"])).start()
    try:
        t0 = time.monotonic()
        start_dev(label, dev, server, out, full_warmup)
        _warm_up_and_measure(label, dev, home, store, mdir / "cache", out, t0=t0, timeout_s=timeout_s,
                             full_warmup=full_warmup, continuous=continuous, loads=loads,
                             cfg=measure_cfg or cfg, partitions=partitions, max_delay_s=max_delay_s, rng=rng,
                             seed=seed)
        out["phase"] = "done"
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        log(f"{label}: FAILED during {out['phase']}: {out['error']}")
    finally:
        if loads:
            out["load_avg_range"] = [min(loads), max(loads)]
        if peak is not None:
            out["session_rss_peak"] = peak.stop()
        dev.stop()
    if mode == "connect" and "error" not in out:
        out["goal"] = goal_verdict(out, *(continuous_goals(window_docs) if continuous else ()))
    return out


def _warm_up_and_measure(
    label: str, dev: Any, home: Path, store: Any, cache: Path, out: dict[str, Any], *, t0: float,
    timeout_s: float, full_warmup: bool, continuous: bool, loads: list[float], cfg: GeneratorConfig,
    partitions: int, max_delay_s: float, rng: random.Random, seed: int,
) -> None:
    """On a started ``dagster dev``: the warm-up, then every partition measured, and the mode's summary in
    ``out``. Continuous mode measures each partition's micro-batch in the long-lived run instead of a run."""
    import dagster as dg

    extra: dict[str, Any] = {}
    if continuous:  # the same loop; the partition's micro-batch in the long-lived run
        from freshidx.tools.bench_continuous import log_sample as log_batch
        from freshidx.tools.bench_continuous import measure_partition as measure_batch

        extra = {"measure": measure_batch, "log_sample": log_batch}
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        out["phase"] = "warm-up"
        delta, full = warm_up(dev, instance, store, timeout_s, full_warmup)
        out["warmup_s"] = round(time.monotonic() - t0, 1)
        out["delta_docs"] = delta.doc_count
        out["full_docs"] = full.doc_count if full else None
        vis = Visibility(store, cache)
        out["searchable_method"] = vis.method
        log(f"{label}: warm-up done after {out['warmup_s']} s: delta {delta.doc_count} docs, full "
            f"{out['full_docs']} docs; measuring {partitions} partitions")
        out["phase"] = "measure"
        try:
            samples = _measure_all(label, dev, instance, store, vis, cfg, partitions=partitions,
                                   timeout_s=timeout_s, max_delay_s=max_delay_s, rng=rng, seed=seed, loads=loads,
                                   **extra)
        finally:
            vis.close()
        out["samples"] = samples
        out["searchable_method"] = vis.method
        if vis.error and vis.method != "searcher":
            out["searcher_error"] = vis.error
        out.update(mode_summary(samples, CONTINUOUS_STAGES) if continuous else mode_summary(samples))
    finally:
        with contextlib.suppress(Exception):
            instance.dispose()


def server_snapshot(srv: ConnectServer) -> dict[str, Any]:
    st = srv.state()
    pid = st.get("pid")
    session_rss, procs = session_usage(pid) if isinstance(pid, int) else (None, 0)
    return {"ready_s": srv.ready_s, "start_timings": srv.timings, "restarts": st.get("restarts"),
            "heap_used_bytes": st.get("heap_used_bytes"), "rss_bytes": st.get("rss_bytes"),
            "session_rss_bytes": session_rss, "session_processes": procs,
            "session_pss_bytes": session_pss_bytes(pid) if isinstance(pid, int) else None,
            "session_file_rss_bytes": session_file_rss_bytes(pid) if isinstance(pid, int) else None,
            "last_restart_reason": st.get("last_restart_reason")}


def _newest(store: Any) -> PartitionId:
    from freshidx.trigger.listing import newest_partition

    found, _ = newest_partition(store, SOURCE)
    if found is None:
        raise RuntimeError("no seeded partition in the store")
    return found


def bench_freshness(
    partitions: int = 8, window_docs: int = 100_000, *, modes: Sequence[str] = MODES, seed: int = 0,
    max_delay_s: float = 5.0, timeout_s: float = 300.0, workdir: str | None = None, keep: bool = False,
    driver_memory: str = "2g", window_minutes: int = WINDOW_MINUTES, health_timeout_s: float = 15.0,
    health_failures: int = 3, full_warmup: bool = True, delta_modes: Sequence[str] = DELTA_MODES,
    changes: int | None = None,
) -> dict[str, Any]:
    """Run the freshness benchmark (module docstring) for ``modes``; returns the JSON-able result.

    ``changes``: records per measured partition (default: the window's own rate, ``window_docs`` spread
    over a partition every 5 minutes, so 10x the window means 10x the change per partition).

    ``full_warmup=False`` measures as soon as the first delta is published, without waiting for the
    SLA sensor's first full index (which then may run during the measurement: smoke tests only).

    ``health_timeout_s`` / ``health_failures`` configure the Connect supervisor's health check (its
    defaults: 15 s, 3 in a row); its ``SELECT 1`` probe needs a free task slot, so a long build on a
    saturated ``local[2]`` server can fail it and get the server restarted mid-run.
    """
    _check_arguments(modes, delta_modes, partitions)
    root = Path(workdir or tempfile.mkdtemp(prefix="freshidx-bench-freshness-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    cfg = generator_config_for(window_docs, seed, window_minutes)
    # The window's own rate by default; a fixed size shows what the window's size alone costs.
    measure_cfg = cfg if changes is None else dataclasses.replace(cfg, changes_per_partition=changes)
    result: dict[str, Any] = {"config": {
        "partitions": partitions, "window_docs": window_docs, "modes": list(modes), "seed": seed,
        "max_delay_s": max_delay_s, "timeout_s": timeout_s, "window_minutes": window_minutes,
        **_setup_config(cfg, measure_cfg, root),
        "spark_server_health": {"timeout_s": health_timeout_s, "failures": health_failures},
        "full_warmup": full_warmup, "delta_modes": list(delta_modes),
        "continuous_trigger_seconds": float(os.environ.get("FRESHIDX_CONTINUOUS_TRIGGER_SECONDS") or 0.5),
    }}
    server: ConnectServer | None = None
    try:
        if "connect" in modes:
            server = ConnectServer(root / "spark-server", driver_memory=driver_memory,
                                   health_timeout_s=health_timeout_s, health_failures=health_failures)
            server.start_async()  # JVM start-up overlaps the seeding below
            log(f"starting Spark Connect server on {server.url} (state {server.state_dir})")
        _seed(root / "seed", cfg, window_minutes, result["config"])
        run = functools.partial(_run_mode, root=root, seed_raw=root / "seed" / "raw", cfg=cfg, partitions=partitions,
                                timeout_s=timeout_s, max_delay_s=max_delay_s, rng=random.Random(seed), seed=seed,
                                window_minutes=window_minutes, full_warmup=full_warmup, measure_cfg=measure_cfg,
                                window_docs=window_docs)
        for mode in modes:
            # connect: _run_mode waits for the server after starting dagster dev (the starts overlap)
            srv = server if mode == "connect" else None
            assert srv is not None or mode != "connect"
            _run_delta_modes(result, mode, srv, delta_modes, run)
            if srv is not None and srv.ready_s is not None:
                log("stopping the Spark Connect server before the next mode")
                srv.stop()
                server = None
        return result
    finally:
        if server is not None:
            server.stop()
        if not keep and workdir is None:
            shutil.rmtree(root, ignore_errors=True)


def _check_arguments(modes: Sequence[str], delta_modes: Sequence[str], partitions: int) -> None:
    for m in modes:
        if m not in MODES:
            raise ValueError(f"unknown mode {m!r} (choose from {', '.join(MODES)})")
    if not delta_modes or any(d not in DELTA_MODES for d in delta_modes):
        raise ValueError(f"delta modes are a subset of {', '.join(DELTA_MODES)}, got {list(delta_modes)}")
    if partitions < 1:
        raise ValueError("partitions must be >= 1")


def _seed(seed_dir: Path, cfg: GeneratorConfig, window_minutes: int, config: dict[str, Any]) -> None:
    """The history every mode starts from (copied per mode), its size and cost recorded in ``config``."""
    log(f"seeding a {window_minutes} min window: {window_minutes // 5} partitions × "
        f"{cfg.changes_per_partition} changes over {cfg.ads} ads")
    records, seed_s = seed_history(seed_dir, cfg, dt.datetime.now(dt.UTC), window_minutes, progress=log)
    config["seed_records"] = records
    config["seed_seconds"] = seed_s
    log(f"seeded {records} records in {seed_s} s")


def _setup_config(cfg: GeneratorConfig, measure_cfg: GeneratorConfig, root: Path) -> dict[str, Any]:
    """The result's account of the generator, the instance and the machine."""
    from freshidx.tools.devserver import packaged_dagster_yaml

    return {
        "generator": {"ads": cfg.ads, "products": cfg.products, "changes_per_partition": cfg.changes_per_partition,
                      "measured_changes_per_partition": measure_cfg.changes_per_partition},
        "dagster_yaml": str(packaged_dagster_yaml()), "cores": os.cpu_count(), "workdir": str(root),
        "percentiles": "linear interpolation",
    }


def _run_delta_modes(result: dict[str, Any], mode: str, srv: ConnectServer | None, delta_modes: Sequence[str],
                     run: Callable[..., dict[str, Any]]) -> None:
    """``mode`` measured in every delta mode: sensor mode's result under ``result[mode]`` (the top-level keys,
    as before), continuous mode's under ``result["continuous"][mode]``."""
    for delta_mode in delta_modes:
        r = run(mode, server=srv, delta_mode=delta_mode)
        (result if delta_mode == "sensor" else result.setdefault(delta_mode, {}))[mode] = r
        if srv is not None and srv.ready_s is not None:
            r["spark_server"] = server_snapshot(srv)
