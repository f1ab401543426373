"""The continuous loop's idle work: keep the Python workers alive and the next micro-batch's state decoded
(:mod:`freshidx.delta.executor.warm_state`; when, :class:`freshidx.trigger.continuous_rules.Warmth`)."""

from __future__ import annotations

import datetime as dt

import dagster as dg

from freshidx.defs.shared.resources import ObjectStoreResource, SparkResource
from freshidx.delta.executor.warm_state import warm_state
from freshidx.delta.serving_state import state_layers
from freshidx.publish.commit import read_pointer
from freshidx.settings import Settings
from freshidx.store import ObjectStore
from freshidx.trigger.continuous_rules import WARM_BUDGET, Warmth
from freshidx.trigger.latest_only import PIPELINE


def keep_warm(context: dg.OpExecutionContext, st: ObjectStore, store: ObjectStoreResource, spark: SparkResource,
              settings: Settings, warmth: Warmth, now: dt.datetime, *, published: bool) -> None:
    """On an idle tick: when due, decode the state the next micro-batch reads in every worker slot. Never
    fails the loop (a failed warm-up costs the next micro-batch the decoding, nothing else)."""
    if not settings.continuous_keep_warm or not warmth.look_due(now, published):
        return
    warmth.checked_at = now
    try:
        full, _ = read_pointer(st, "full")
        delta, _ = read_pointer(st, PIPELINE)
        state = (full.version if full else "", delta.version if delta else None)
        if not warmth.warm_due(now, state):
            return
        found = state_layers(st)
        if found is None:
            return
        with spark.session(keep_as=PIPELINE) as session:
            result = warm_state(session, store.store_config(), found[1], tasks=settings.delta_segment_shards,
                                cache_bytes=settings.delta_state_cache_bytes,
                                disk_bytes=settings.delta_state_disk_bytes,
                                budget_s=WARM_BUDGET.total_seconds())
    except Exception as exc:
        context.log.warning(f"warming the workers for the next micro-batch failed ({exc}); it decodes its state itself")
        return
    warmth.warmed(now, found[0], complete=result.complete)
    if result.decoded:
        rest = "" if result.complete else " (the rest on the next idle tick)"
        context.log.info(f"warm state: {result.files} state files, {result.decoded} parts decoded in "
                         f"{result.seconds:.2f} s{rest}")
