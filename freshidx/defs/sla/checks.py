"""SLA asset checks and ``freshidx_sla_sensor``, which reports them and launches remediation.

The checks are real ``@asset_check`` definitions (so the UI lists them and can execute them on
demand); the sensor evaluates the same functions every tick and stores the results as runless
check evaluations when a state changes, after each new materialization of the checked asset (the
UI matches runless evaluations to the latest materialization by time, and would show "Not
Evaluated" until the next one) or after a run that skipped the checks (nothing new: the UI would
show "Skipped"), plus a periodic heartbeat, so there is no run per tick. Every tick
that launches nothing says why in its skip reason.
A coverage gap or a too-old full index launches one ``full_index`` run (idempotent via the
ledger and a run key; never while another ``full_index`` run is in flight).
"""
# No `from __future__ import annotations`: Dagster inspects these annotations.

import datetime as dt
import json

import dagster as dg
from dagster import DagsterRunStatus, RunsFilter

from freshidx.defs.full.assets import full_index_job
from freshidx.defs.runs.run_status import ENDED, IN_FLIGHT
from freshidx.defs.shared.assets import TAG_PIPELINE, TAG_TRIGGER
from freshidx.defs.shared.resources import FreshidxSettings, ObjectStoreResource
from freshidx.publish.commit import iso, utcnow
from freshidx.settings import Settings
from freshidx.sla import check_rules
from freshidx.store import layout
from freshidx.trigger import ledger, run_health
from freshidx.trigger.lifecycle import Decision, remediation_trigger_id

FULL_KEY = dg.AssetKey("full_index")
DELTA_KEY = dg.AssetKey("delta_index")
TAG_REMEDIATION = "freshidx/remediation_of"
#: The tag Dagster reads an event's data version from (the version a confirmation leaves unchanged).
DATA_VERSION_TAG = "dagster/data_version"
HEARTBEAT = dt.timedelta(minutes=10)
MAX_REMEDIATION_ATTEMPTS = 3


def consecutive_delta_failures(instance: dg.DagsterInstance, limit: int = 20) -> int:
    n = 0
    for r in instance.get_runs(RunsFilter(tags={TAG_PIPELINE: "delta"}), limit=limit):
        if r.status in IN_FLIGHT or run_health.is_interrupted(r.tags):  # a stop is not a failure
            continue
        if r.status != DagsterRunStatus.FAILURE:
            break
        n += 1
    return n


def _evaluation(o: check_rules.CheckOutcome) -> dg.AssetCheckEvaluation:
    return dg.AssetCheckEvaluation(
        asset_key=dg.AssetKey(o.asset), check_name=o.check, passed=o.passed,
        severity=dg.AssetCheckSeverity.ERROR if o.severity == "ERROR" else dg.AssetCheckSeverity.WARN,
        description=o.description, metadata=dict(o.metadata),
    )


def _make_check(asset: str, name: str) -> dg.AssetChecksDefinition:
    rule = {"run_failures": "delta_failures", "age": "full_age"}.get(name, name)
    fn = {f.__name__: f for f in check_rules.CHECKS}[rule]

    @dg.asset_check(asset=asset, name=name, description=check_rules.DESCRIPTIONS[name], blocking=False)
    def _check(context: dg.AssetCheckExecutionContext, store: ObjectStoreResource,
               freshidx: FreshidxSettings) -> dg.AssetCheckResult:
        settings = freshidx.settings(store.uri, store.endpoint_url)
        observed = check_rules.observe(store.open(), settings, utcnow(), consecutive_delta_failures(context.instance))
        o = fn(observed, settings)
        return dg.AssetCheckResult(
            passed=o.passed, description=o.description, metadata=dict(o.metadata),
            severity=dg.AssetCheckSeverity.ERROR if o.severity == "ERROR" else dg.AssetCheckSeverity.WARN,
        )

    return _check


def _latest_materialization(instance: dg.DagsterInstance, asset: str) -> dg.EventLogRecord | None:
    """The asset's latest materialization record (None: never materialized, e.g. external)."""
    records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset)), limit=1)
    return records.records[0] if records.records else None


def _confirmation(observed: check_rules.Observed, settings: Settings,
                  latest: dg.EventLogRecord | None) -> dg.AssetMaterialization | None:
    """A materialization of the serving delta, unchanged, while upstream is quiet (:func:`check_rules.still_current`);
    ``latest``: delta_index's latest materialization record."""
    last = dt.datetime.fromtimestamp(latest.timestamp, dt.UTC) if latest is not None else None
    why = check_rules.still_current(observed, settings, last)
    if why is None or observed.delta is None:
        return None
    return dg.AssetMaterialization(
        asset_key=DELTA_KEY, description=why,
        metadata={"confirmed_current": True, "version": observed.delta.version,
                  "source_partition": observed.delta.source_partition or ""},
        tags={DATA_VERSION_TAG: observed.delta.version})


def latest_check_runs(instance: dg.DagsterInstance, assets: list[str], limit: int = 25) -> dict[str, str | None]:
    """Per asset, the newest ended run that executed (or skipped) the asset's checks.

    A run of the asset includes its checks; when it materializes nothing ("nothing new"), their steps
    are skipped and the UI shows "Skipped" as the latest execution, hiding the runless evaluation. The
    sensor re-reports after such a run. Bounded: the newest ``limit`` ended runs, one query a tick."""
    out: dict[str, str | None] = dict.fromkeys(assets)
    keys = {dg.AssetKey(a): a for a in assets}
    for r in instance.get_runs(RunsFilter(statuses=ENDED), limit=limit):
        checks = r.asset_check_selection
        touched = ({keys[k] for k in (r.asset_selection or ()) if k in keys} if checks is None
                   else {keys[c.asset_key] for c in checks if c.asset_key in keys})
        for a in touched:
            if out[a] is None:
                out[a] = r.run_id
        if all(out.values()):
            break
    return out


def tick_summary(outcomes: list[check_rules.CheckOutcome], reported: int, changes: list[str],
                 remediation: str | None) -> str:
    """The skip reason of a tick that launches nothing: always says why, never Dagster's generic one."""
    failing = [f"{o.asset}.{o.check} {o.state}" for o in outcomes if not o.passed]
    head = remediation or ("no remediation needed" if not any(o.remediate for o in outcomes)
                           else "remediation not launched")
    checks = f"{len(failing)} of {len(outcomes)} checks failing" + (f" ({', '.join(failing)})" if failing else "")
    changed = f"; changed: {', '.join(changes)}" if changes else ""
    return f"{head}; {checks}; {reported} evaluation(s) reported{changed}"


def sla_checks() -> list[dg.AssetChecksDefinition]:
    return [_make_check(asset, name) for asset, names in check_rules.CHECK_NAMES.items() for name in names]


def make_sla_sensor(interval_seconds: int, autostart: bool = True) -> dg.SensorDefinition:
    @dg.sensor(
        name="freshidx_sla_sensor",
        job=full_index_job,
        minimum_interval_seconds=interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING if autostart else dg.DefaultSensorStatus.STOPPED,
        description="Data-aware SLA: lag, coverage, source silence, stuck publication, run failures. "
        "Reports asset check results and launches a full_index rebuild when coverage or full age fails.",
    )
    def freshidx_sla_sensor(
        context: dg.SensorEvaluationContext, store: ObjectStoreResource, freshidx: FreshidxSettings
    ) -> dg.SensorResult:
        settings = freshidx.settings(store.uri, store.endpoint_url)
        st = store.open()
        now = utcnow()
        observed = check_rules.observe(st, settings, now, consecutive_delta_failures(context.instance))
        outcomes = check_rules.evaluate(observed, settings)
        cursor = json.loads(context.cursor) if context.cursor else {}
        states: dict = cursor.get("states", {})
        records = {a: _latest_materialization(context.instance, a) for a in check_rules.CHECK_NAMES}
        latest = {a: r.storage_id if r is not None else None for a, r in records.items()}
        check_runs = latest_check_runs(context.instance, list(check_rules.CHECK_NAMES))
        events: list[dg.AssetCheckEvaluation | dg.AssetMaterialization] = []
        changes: list[str] = []
        for o in outcomes:
            key = f"{o.asset}.{o.check}"
            prev = states.get(key)
            changed = prev is not None and prev["state"] != o.state
            # The UI shows a check's evaluation only while it is newer than the asset's latest
            # materialization (runless evaluations are matched by time) and than the check's latest
            # execution in a run (skipped when the run materialized nothing): re-report after either.
            due = (prev is None or changed or prev.get("mat") != latest[o.asset]
                   or prev.get("run") != check_runs[o.asset]
                   or now - dt.datetime.fromisoformat(prev["at"]) >= HEARTBEAT)
            if due:
                events.append(_evaluation(o))
                if changed:
                    changes.append(f"{key} {prev['state']} → {o.state}")
                    ledger.record(st, layout.ledger_key("sla", now.strftime("%Y-%m-%d"),
                                                        f"{now:%Y%m%dT%H%M%S}-{o.check}-{o.state}"),
                                  ledger.Entry("sla", f"{o.check}-{o.state}", Decision.CHECK_STATE_CHANGED,
                                               f"{o.asset}.{o.check}: {prev['state']} → {o.state}: {o.description}",
                                               scope=o.asset))
                states[key] = {"state": o.state, "at": now.isoformat(), "mat": latest[o.asset],
                               "run": check_runs[o.asset]}
        cursor["states"] = states
        confirmation = _confirmation(observed, settings, records[DELTA_KEY.to_user_string()])
        events += [confirmation] if confirmation is not None else []

        requests: list[dg.RunRequest] = []
        reasons = [o for o in outcomes if o.remediate == "full_index"]
        skip = None
        if reasons:
            requests, skip = _remediation(context, st, observed, reasons, now)
        if not requests:
            skip = tick_summary(outcomes, len(events), changes, skip)
        return dg.SensorResult(run_requests=requests, asset_events=events, cursor=json.dumps(cursor),
                               skip_reason=None if requests else skip)

    return freshidx_sla_sensor


def _remediation(context: dg.SensorEvaluationContext, st, observed: check_rules.Observed,  # type: ignore[no-untyped-def]
                 reasons: list[check_rules.CheckOutcome], now: dt.datetime) -> tuple[list[dg.RunRequest], str | None]:
    # Queued ones count too (a schedule run waiting behind a heavy build): one full build at a time.
    # Tagged runs (schedule, remediation) by tag, however many other runs are queued; UI runs by scan.
    in_flight = list(context.instance.get_runs(RunsFilter(statuses=IN_FLIGHT, tags={TAG_PIPELINE: "full"}),
                                               limit=1))
    in_flight += [r for r in context.instance.get_runs(RunsFilter(statuses=IN_FLIGHT), limit=200)
                  if FULL_KEY in (r.asset_selection or ())]
    if in_flight:
        return [], f"full_index run {in_flight[0].run_id[:8]} is {in_flight[0].status.value}; not launching another"
    of = observed.full.version if observed.full else "none"
    previous = context.instance.get_runs(RunsFilter(tags={TAG_REMEDIATION: of}), limit=20)
    if any(r.status == DagsterRunStatus.SUCCESS for r in previous):
        return [], f"remediation for full version {of} already succeeded; waiting for its publication to show"
    attempt = len(previous) + 1  # numbering covers every run (run keys stay unique) ...
    failed = sum(1 for r in previous if not run_health.is_interrupted(r.tags))  # ... stops do not count
    if failed >= MAX_REMEDIATION_ATTEMPTS:
        return [], f"remediation for full version {of} failed {failed} times; not retrying"
    why = "; ".join(f"{o.asset}.{o.check}: {o.description}" for o in reasons)
    run_key = f"sla-full:{of}:a{attempt}"
    trigger_id = remediation_trigger_id(of, attempt)
    if not ledger.record(
        st, layout.ledger_key("sla", now.strftime("%Y-%m-%d"), trigger_id),
        ledger.Entry("sla", trigger_id, Decision.REMEDIATION_LAUNCHED, why,
                     scope=f"full_index after version {of}", run_key=run_key, attempt=attempt,
                     extra={"at": iso(now)}),
    ):
        return [], f"{run_key} already launched"
    # full_index_job: the heavy pool, and before catch-up in the queue (freshidx.defs.shared.lanes): a coverage
    # gap hides documents from readers, a catch-up backlog does not.
    return [dg.RunRequest(run_key=run_key, asset_selection=[FULL_KEY],
                          tags={TAG_TRIGGER: "sla_remediation", TAG_REMEDIATION: of})], None
