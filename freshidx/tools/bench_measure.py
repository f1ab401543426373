"""The ``freshidx bench freshness`` driver: per mode, ``dagster dev`` on a seeded local store,
a warm-up, then partitions dropped one at a time and each one's events observed (the measurement
is described in :mod:`freshidx.tools.bench_freshness`)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from freshidx.store.partitions import PartitionId
from freshidx.tools.bench_common import (
    DELTA_MODES,
    MODES,
    POLL_S,
    SOURCE,
    WINDOW_MINUTES,
    ConnectServer,
    Deadline,
    Probe,
    Visibility,
    generator_config_for,
    log,
    pick_probe,
    seed_history,
    session_usage,
)
from freshidx.tools.bench_report import (
    CONTINUOUS_GOAL_MAX_S,
    CONTINUOUS_GOAL_P50_S,
    CONTINUOUS_STAGES,
    EVENTS,
    fmt,
    goal_verdict,
    mode_summary,
    sample_stages,
)
from freshidx.tools.bench_wait import iso_epoch, wait_searchable
from freshidx.tools.generate import GeneratorConfig, write_partition

_TAG_PARTITION = "freshidx/source_partition"


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


def _in_flight_runs(instance: Any) -> list[Any]:
    """Runs in flight, the long-lived continuous run (continuous mode) aside."""
    import dagster as dg

    from freshidx.trigger.continuous import JOB_NAME

    statuses = [dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTING,
                dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]
    return [r for r in instance.get_runs(dg.RunsFilter(statuses=statuses), limit=20) if r.job_name != JOB_NAME]


def _run_record_for(instance: Any, partition: PartitionId) -> Any | None:
    import dagster as dg

    records = instance.get_run_records(dg.RunsFilter(tags={_TAG_PARTITION: partition.path}), limit=5)
    return records[0] if records else None  # newest first


def _run_events(instance: Any, run_id: str) -> dict[str, float | None]:
    """run_created (first event), body_start / listed / built (log lines of the last attempt)."""
    out: dict[str, float | None] = {"run_created": None, "body_start": None, "listed": None, "built": None}
    logs = sorted(instance.all_logs(run_id), key=lambda e: e.timestamp)
    if logs:
        out["run_created"] = float(logs[0].timestamp)
    for e in logs:
        msg = e.user_message or ""
        if msg.startswith("building delta for"):
            out.update(body_start=float(e.timestamp), listed=None, built=None)  # a retry starts over
        elif msg.startswith("list_seconds:") and out["body_start"] is not None:
            out["listed"] = float(e.timestamp)
        elif msg.startswith("build_seconds:") and out["body_start"] is not None:
            out["built"] = float(e.timestamp)
    return out


def _noticed_time(run: Any) -> float | None:
    """When the delta sensor saw the partition (its run tag), epoch seconds."""
    from freshidx.defs.shared.assets import TAG_NOTICED

    text = run.tags.get(TAG_NOTICED)
    return iso_epoch(text) if text else None


def _build_stats(store: Any, version: str | None) -> dict[str, Any] | None:
    """The published version's own account of its build (manifest stats: Spark step seconds, segment
    task steps, segments) and the task attempts of its new segment (a retried task shows attempt 1)."""
    from freshidx.publish.commit import read_manifest

    if version is None:
        return None
    try:
        manifest = read_manifest(store, "delta", version)
    except Exception as exc:  # measurement goes on; reported in the result
        return {"error": f"{type(exc).__name__}: {exc}"}
    newest = (manifest.get("segments") or [{}])[-1]
    return {**{k: v for k, v in (manifest.get("stats") or {}).items() if isinstance(v, int | float)},
            "kind": newest.get("kind"), "attempts": [sh.get("attempt") for sh in newest.get("shards") or []]}


def _measure_partition(
    dev: Any, instance: Any, store: Any, vis: Visibility, cfg: GeneratorConfig, partition: PartitionId,
    probe: Probe | None, timeout_s: float,
) -> dict[str, Any]:
    sample: dict[str, Any] = {"partition": partition.path, "probe": probe.query if probe else None, "error": None}
    written = write_partition(store, cfg, partition)
    sample["records"] = written.records
    events: dict[str, float | None] = dict.fromkeys(EVENTS)
    events["arrival"] = time.time()

    def check(published: bool) -> str | None:
        rec = _run_record_for(instance, partition)
        if rec is not None and rec.dagster_run.status.value in ("FAILURE", "CANCELED") and not published:
            return f"run {rec.dagster_run.run_id} {rec.dagster_run.status.value}"
        return None if dev.is_running else "dagster dev exited"

    wait_searchable(store, vis, partition, probe, timeout_s, events, sample, check)
    # The run's own record: wait for it to end (the next partition must find no run in flight).
    end = Deadline(120)
    rec = None
    while not end.passed():
        rec = _run_record_for(instance, partition)
        if rec is not None and rec.dagster_run.is_finished:
            break
        time.sleep(POLL_S)
    if rec is not None:
        run_id = rec.dagster_run.run_id
        sample.update(run_id=run_id, run_status=rec.dagster_run.status.value)
        ev = _run_events(instance, run_id)
        if ev["run_created"] is None:  # no event yet: the run record (1 s resolution in SQLite)
            ev["run_created"] = rec.create_timestamp.timestamp()
        events.update(ev)
        events["run_start"] = float(rec.start_time) if rec.start_time else None
        sample["run_end"] = float(rec.end_time) if rec.end_time else None
        events["noticed"] = _noticed_time(rec.dagster_run)
    elif sample["error"] is None:
        sample["error"] = "no run found for the partition"
    sample["events"] = {k: (round(v, 3) if v is not None else None) for k, v in events.items()}
    sample["stages"] = sample_stages(events)
    sample["build"] = _build_stats(store, sample.get("version"))
    return sample


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


def warm_up(dev: Any, instance: Any, store: Any, timeout_s: float, full_warmup: bool) -> tuple[Any, Any]:
    """Wait until the first delta (and the first full index, if asked) is published and no run is in
    flight; returns the (delta, full) pointers."""
    import dagster as dg

    from freshidx.publish.commit import read_pointer

    warm = Deadline(max(900.0, timeout_s * 3))
    while True:
        delta, _ = read_pointer(store, "delta")
        full, _ = read_pointer(store, "full")
        busy = _in_flight_runs(instance)
        full_tried = not full_warmup or full is not None or any(
            dg.AssetKey("full_index") in (r.asset_selection or ()) for r in instance.get_runs(limit=20))
        if delta is not None and full_tried and not busy:
            return delta, full
        if not dev.is_running:
            raise RuntimeError(f"dagster dev exited during warm-up; see {dev.log_path}")
        if warm.passed():
            raise TimeoutError(f"warm-up not done: delta={delta is not None} full={full is not None} "
                               f"in flight={[r.run_id[:8] for r in busy]}; see {dev.log_path}")
        time.sleep(1.0)


def _log_sample(mode: str, i: int, partitions: int, partition: PartitionId, s: dict[str, Any]) -> None:
    st, ev = s["stages"], s["events"]
    log(f"{mode} {i + 1}/{partitions} {partition.path}: "
        + (f"ERROR {s['error']}" if s["error"] else
           f"published +{fmt(st['arrival_to_published'], 0)} s, searchable "
           f"+{fmt(st['arrival_to_searchable'], 0)} s (run created +{fmt(st['arrival_to_run_created'], 0)},"
           f" start +{fmt((ev['run_start'] or 0) - ev['arrival'], 0)},"
           f" spark job +{fmt((ev['body_start'] or 0) - ev['arrival'], 0)})"))


def _measure_all(
    mode: str, dev: Any, instance: Any, store: Any, vis: Visibility, cfg: GeneratorConfig, *, partitions: int,
    timeout_s: float, max_delay_s: float, rng: random.Random, seed: int, loads: list[float],
    measure: Any = _measure_partition, log_sample: Any = _log_sample,
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
            while _in_flight_runs(instance) and not settle.passed() and dev.is_running:
                time.sleep(1.0)
        log_sample(mode, i, partitions, partition, s)
    return samples


def _run_mode(
    mode: str, *, root: Path, seed_raw: Path, cfg: GeneratorConfig, partitions: int, timeout_s: float,
    max_delay_s: float, rng: random.Random, server: ConnectServer | None, seed: int, window_minutes: int,
    full_warmup: bool = True, delta_mode: str = "sensor", measure_cfg: GeneratorConfig | None = None,
) -> dict[str, Any]:
    import dagster as dg

    from freshidx.store import StoreConfig, open_store
    from freshidx.tools.devserver import DagsterDev, packaged_dagster_yaml, prepare_home

    out: dict[str, Any] = {"mode": mode, "delta_mode": delta_mode, "partitions": partitions, "phase": "setup"}
    mdir = root / (mode if delta_mode == "sensor" else f"{mode}-{delta_mode}")
    extra: dict[str, Any] = {}
    if delta_mode == "continuous":  # the same loop; the partition's micro-batch in the long-lived run
        from freshidx.tools.bench_continuous import log_sample, measure_partition

        extra = {"measure": measure_partition, "log_sample": log_sample}
    label = mode if delta_mode == "sensor" else f"{mode}/{delta_mode}"
    store_dir = mdir / "store"
    shutil.copytree(seed_raw, store_dir / "raw")
    uri = store_dir.as_uri()
    store = open_store(StoreConfig(uri=uri))
    out["spark"] = server.url if server else "local[2] (a SparkSession per run)"
    home = prepare_home(mdir / "dagster_home", packaged_dagster_yaml())
    dev = DagsterDev(home=home, module="freshidx.definitions", env=dev_env(uri, server, window_minutes, delta_mode),
                     log_path=mdir / "dagster-dev.log")
    instance: Any = None
    loads: list[float] = []
    try:
        t0 = time.monotonic()
        start_dev(label, dev, server, out, full_warmup)
        instance = dg.DagsterInstance.from_config(str(home))
        out["phase"] = "warm-up"
        delta, full = warm_up(dev, instance, store, timeout_s, full_warmup)
        out["warmup_s"] = round(time.monotonic() - t0, 1)
        out["delta_docs"] = delta.doc_count
        out["full_docs"] = full.doc_count if full else None
        vis = Visibility(store, mdir / "cache")
        out["searchable_method"] = vis.method
        log(f"{label}: warm-up done after {out['warmup_s']} s: delta {delta.doc_count} docs, full "
            f"{out['full_docs']} docs; measuring {partitions} partitions")
        out["phase"] = "measure"
        samples = _measure_all(label, dev, instance, store, vis, measure_cfg or cfg, partitions=partitions,
                               timeout_s=timeout_s,
                               max_delay_s=max_delay_s, rng=rng, seed=seed, loads=loads, **extra)
        out["samples"] = samples
        out["searchable_method"] = vis.method
        if vis.error and vis.method != "searcher":
            out["searcher_error"] = vis.error
        out.update(mode_summary(samples, CONTINUOUS_STAGES) if extra else mode_summary(samples))
        out["phase"] = "done"
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        log(f"{label}: FAILED during {out['phase']}: {out['error']}")
    finally:
        if loads:
            out["load_avg_range"] = [min(loads), max(loads)]
        if instance is not None:
            with contextlib.suppress(Exception):
                instance.dispose()
        dev.stop()
    if mode == "connect" and "error" not in out:
        out["goal"] = goal_verdict(out, *((CONTINUOUS_GOAL_P50_S, CONTINUOUS_GOAL_MAX_S) if extra else ()))
    return out


def server_snapshot(srv: ConnectServer) -> dict[str, Any]:
    st = srv.state()
    pid = st.get("pid")
    session_rss, procs = session_usage(pid) if isinstance(pid, int) else (None, 0)
    return {"ready_s": srv.ready_s, "start_timings": srv.timings, "restarts": st.get("restarts"),
            "heap_used_bytes": st.get("heap_used_bytes"), "rss_bytes": st.get("rss_bytes"),
            "session_rss_bytes": session_rss, "session_processes": procs,
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
    from freshidx.tools.devserver import packaged_dagster_yaml

    for m in modes:
        if m not in MODES:
            raise ValueError(f"unknown mode {m!r} (choose from {', '.join(MODES)})")
    if not delta_modes or any(d not in DELTA_MODES for d in delta_modes):
        raise ValueError(f"delta modes are a subset of {', '.join(DELTA_MODES)}, got {list(delta_modes)}")
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    root = Path(workdir or tempfile.mkdtemp(prefix="freshidx-bench-freshness-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    cfg = generator_config_for(window_docs, seed, window_minutes)
    # The window's own rate by default; a fixed size shows what the window's size alone costs.
    measure_cfg = cfg if changes is None else dataclasses.replace(cfg, changes_per_partition=changes)
    rng = random.Random(seed)
    result: dict[str, Any] = {"config": {
        "partitions": partitions, "window_docs": window_docs, "modes": list(modes), "seed": seed,
        "max_delay_s": max_delay_s, "timeout_s": timeout_s, "window_minutes": window_minutes,
        "generator": {"ads": cfg.ads, "products": cfg.products, "changes_per_partition": cfg.changes_per_partition,
                      "measured_changes_per_partition": measure_cfg.changes_per_partition},
        "dagster_yaml": str(packaged_dagster_yaml()), "cores": os.cpu_count(), "workdir": str(root),
        "percentiles": "linear interpolation",
        "spark_server_health": {"timeout_s": health_timeout_s, "failures": health_failures},
        "full_warmup": full_warmup, "delta_modes": list(delta_modes),
        "continuous_trigger_seconds": float(os.environ.get("FRESHIDX_CONTINUOUS_TRIGGER_SECONDS") or 1.0),
    }}
    server: ConnectServer | None = None
    try:
        if "connect" in modes:
            server = ConnectServer(root / "spark-server", driver_memory=driver_memory,
                                    health_timeout_s=health_timeout_s, health_failures=health_failures)
            server.start_async()  # JVM start-up overlaps the seeding below
            log(f"starting Spark Connect server on {server.url} (state {server.state_dir})")
        log(f"seeding a {window_minutes} min window: {window_minutes // 5} partitions × "
             f"{cfg.changes_per_partition} changes over {cfg.ads} ads")
        records, seed_s = seed_history(root / "seed", cfg, dt.datetime.now(dt.UTC), window_minutes)
        result["config"]["seed_records"] = records
        result["config"]["seed_seconds"] = seed_s
        log(f"seeded {records} records in {seed_s} s")
        for mode in modes:
            srv = None
            if mode == "connect":
                assert server is not None
                srv = server  # _run_mode waits for it after starting dagster dev (the starts overlap)
            for delta_mode in delta_modes:  # sensor: top-level keys (as before); continuous: result["continuous"]
                r = _run_mode(
                    mode, root=root, seed_raw=root / "seed" / "raw", cfg=cfg, partitions=partitions,
                    timeout_s=timeout_s, max_delay_s=max_delay_s, rng=rng, server=srv, seed=seed,
                    window_minutes=window_minutes, full_warmup=full_warmup, delta_mode=delta_mode,
                    measure_cfg=measure_cfg,
                )
                (result if delta_mode == "sensor" else result.setdefault(delta_mode, {}))[mode] = r
                if srv is not None and srv.ready_s is not None:
                    r["spark_server"] = server_snapshot(srv)
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


