"""What ``freshidx demo`` prints while it runs: every publication, the catch-up progress and every failed
run (:class:`Watcher`), as lines or JSON events (:class:`Printer`)."""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import dagster as dg

    from freshidx.store import ObjectStore


class Printer:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def event(self, kind: str, text: str, **fields: Any) -> None:
        if self.as_json:
            print(json.dumps({"event": kind, "at": time.strftime("%H:%M:%S"), **fields}, default=str), flush=True)
        else:
            print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


class Watcher:
    """Prints publications, catch-up progress and failed runs; a few small reads every poll."""

    def __init__(self, store: ObjectStore, source: str, instance: dg.DagsterInstance, out: Printer) -> None:
        self.store, self.source, self.instance, self.out = store, source, instance, out
        self.versions: dict[str, str | None] = {}
        self.partitions: dict[str, str | None] = {}
        self.frontier: tuple[str | None, tuple[str, ...]] | None = None
        self.failed_seen: set[str] = set()
        self.since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)

    def poll(self) -> None:
        for step in (self._publications, self._catchup, self._failures):
            try:
                step()
            except Exception as exc:  # a display glitch (store or SQLite busy) must not stop the demo
                print(f"  (watch: {type(exc).__name__}: {exc})", file=sys.stderr)

    def _publications(self) -> None:
        from freshidx.publish.commit import parse_iso, read_pointer, utcnow
        from freshidx.trigger.listing import newest_partition

        for index in ("delta", "full"):
            pointer, _ = read_pointer(self.store, index)
            if pointer is None or self.versions.get(index) == pointer.version:
                continue
            self.versions[index] = pointer.version
            lag = (utcnow() - parse_iso(pointer.position)).total_seconds()
            newest, _ = newest_partition(self.store, self.source)
            partition = pointer.source_partition or pointer.cutoff or pointer.position
            # only for a partition published for the first time (a compaction re-publishes the same one later)
            first = pointer.source_partition is not None and self.partitions.get(index) != pointer.source_partition
            self.partitions[index] = pointer.source_partition
            published = parse_iso(pointer.published_at)
            took = self._arrival_to_published(pointer.source_partition, published) if first else None
            self.out.event(
                "published", f"{index} v{pointer.seq} {pointer.version} → {partition}  docs {pointer.doc_count}"
                f"  lag {lag:.0f}s behind the partition's time"
                + (f", {took:.1f}s after its files arrived" if took is not None else "")
                + f"  (newest visible {newest.path if newest else None})",
                index=index, version=pointer.version, seq=pointer.seq, partition=partition,
                doc_count=pointer.doc_count, lag_seconds=round(lag, 1),
                arrival_to_published_seconds=None if took is None else round(took, 1),
                newest=newest.path if newest else None)

    def _arrival_to_published(self, partition: str | None, published: dt.datetime) -> float | None:
        """Seconds from the partition's last file landing to the publication: the freshness the pipeline
        adds. The lag from the partition's time also counts the upstream writer (the demo's generator writes
        minute M at M:55, so that lag never reads under ~60 s)."""
        from freshidx.store import layout
        from freshidx.store.partitions import PartitionId

        if partition is None:
            return None
        prefix = layout.raw_partition_prefix(self.source, PartitionId.parse(partition))
        times = [o.last_modified for o in self.store.iter_objects(prefix)]
        return (published - max(times)).total_seconds() if times else None

    def _catchup(self) -> None:
        from freshidx.catchup.planner import ASSET
        from freshidx.catchup.state import CatchupState

        state, etag = CatchupState.load(self.store, ASSET)
        now = (state.frontier, tuple(state.parked))
        if etag is None or now == self.frontier:
            return
        self.frontier = now
        self.out.event("catchup", f"ads_hourly: every hour before {state.frontier} processed"
                       + (f"; parked: {', '.join(state.parked)}" if state.parked else ""),
                       frontier=state.frontier, parked=state.parked)

    def _failures(self) -> None:
        import dagster as dg

        records = self.instance.get_run_records(
            dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE], updated_after=self.since), limit=20)
        for rec in reversed(records):
            run = rec.dagster_run
            if run.run_id in self.failed_seen or run.tags.get("freshidx/interrupted"):  # a stop is not news
                continue
            self.failed_seen.add(run.run_id)
            what = (run.tags.get("freshidx/pipeline") or ",".join(k.to_user_string() for k in run.asset_selection or ())
                    or run.job_name)
            where = run.tags.get("freshidx/source_partition") or run.tags.get("dagster/partition") or ""
            from freshidx.defs.runs.health import failure_reason

            reason = failure_reason(self.instance, run.run_id)
            self.out.event("run_failed", f"run {run.run_id[:8]} ({what} {where}) FAILED: {reason}".replace("  ", " "),
                           run_id=run.run_id, what=what, partition=where, reason=reason)

