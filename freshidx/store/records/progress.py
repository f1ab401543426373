"""Progress records: small objects overwritten in place (not history) that say where a consumer is.

* ``catchup/<asset>/STATE`` (compare-and-swap): the catch-up frontier and parked hours;
* ``continuous/<pipeline>/heartbeat.json``: what a continuous-mode run last reported;
* ``runtime/<name>.json``: where a local runtime keeps its host-local state for this store.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any

from pydantic.dataclasses import dataclass

from freshidx.store import ObjectStore, PreconditionFailed, layout
from freshidx.store.records.base import CONFIG, Record, version_field


@dataclass(eq=False, config=CONFIG)
class CatchupState(Record):
    """``catchup/<asset>/STATE``: every hour before ``frontier`` is processed or parked."""

    KIND = "catch-up state"

    frontier: str | None = None  # hour id: every hour before it is processed or parked
    parked: list[str] = field(default_factory=list)
    late_cursor: str | None = None  # hour id the late-data sweep continues after
    format_version: int = version_field()

    @classmethod
    def load(cls, store: ObjectStore, asset: str) -> tuple[CatchupState, str | None]:
        """The state and its ETag; an empty state (and None) when there is none yet."""
        state, etag = cls.read_if_exists(store, layout.catchup_state_key(asset))
        return (state if state is not None else cls()), etag

    def save(self, store: ObjectStore, asset: str, etag: str | None) -> bool:
        """Compare-and-swap against ``etag``; False: another evaluation moved it (the next tick recomputes)."""
        body = dataclasses.replace(self, parked=sorted(set(self.parked)))
        try:
            body.swap(store, layout.catchup_state_key(asset), etag)
        except PreconditionFailed:
            return False
        return True


@dataclass(frozen=True, eq=False, config=CONFIG)
class Heartbeat(Record):
    """``continuous/<pipeline>/heartbeat.json``: the live continuous run, as ``freshidx status`` shows it."""

    KIND = "heartbeat"

    run_id: str
    started_at: str
    last_tick: str
    planned_restart_at: str | None = None
    trigger_seconds: float | None = None
    max_rss_mb: int | None = None
    written_at: str | None = None  # None: an older heartbeat (its last tick is when it was written)
    ticks: int = 0
    micro_batches: int = 0
    published: int = 0
    last_action: str = ""
    last_version: str | None = None
    rss_mb: float | None = None
    ended: dict[str, Any] | None = None  # {"reason", "detail"} once the run ended
    format_version: int = version_field()

    def write(self, store: ObjectStore, pipeline: str) -> str:
        return self.put(store, layout.continuous_heartbeat_key(pipeline))

    @classmethod
    def latest(cls, store: ObjectStore, pipeline: str) -> Heartbeat | None:
        return cls.read_if_exists(store, layout.continuous_heartbeat_key(pipeline))[0]


@dataclass(frozen=True, eq=False, config=CONFIG)
class RuntimeRecord(Record):
    """``runtime/<name>.json``: the host-local state dir of a runtime started for this store."""

    KIND = "runtime record"

    state_dir: str
    hostname: str
    pid: int | None = None
    written_at: str | None = None
    format_version: int = version_field()

    def write(self, store: ObjectStore, name: str) -> str:
        return self.put(store, layout.runtime_record_key(name))

    @classmethod
    def of(cls, store: ObjectStore, name: str) -> RuntimeRecord | None:
        return cls.read_if_exists(store, layout.runtime_record_key(name))[0]
