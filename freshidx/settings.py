"""One typed settings model for every entry point (CLI, ``dagster dev``, ``dagster asset materialize``).

:class:`Settings` is a pydantic-settings model: field ``x`` is read from ``FRESHIDX_X``, with defaults
for the embedded setup. Each field is declared once, here. The fields a run reads (window, thresholds,
policies) are :class:`PipelineSettings`, which the Dagster ``freshidx`` resource inherits, so its config
schema and validation are these; the fields that say *where* (store, Spark) become the store and Spark
resources. A bad value fails at load with a message naming both the field and the variable, e.g.::

    SettingsError: FRESHIDX_WINDOW_MINUTES (window_minutes): Input should be greater than 0 [got '-5']
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import re
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Annotated, Any, Self

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from freshidx.settings_values import OVERLAP_POLICIES, parse_duration, parse_readiness
from freshidx.store import DEFAULT_FIRST_TRY_S, FIRST_TRY_ENV, StoreConfig, normalize_uri

DEFAULT_HOME = ".freshidx"


class SettingsError(ValueError):
    """A configuration value is invalid; the message names the field and its variable."""


def default_store_uri() -> str:
    return normalize_uri(os.path.join(os.getcwd(), DEFAULT_HOME, "store"))


class PipelineSettings(BaseModel):
    """What runs and sensors read: window, trigger intervals, thresholds, policies.

    The Dagster ``freshidx`` resource inherits these fields (config schema, defaults, validators),
    so they are declared once and checked the same way in ``FRESHIDX_*`` and in launchpad config.
    """

    source: str = Field("ad_updates", pattern=r"^[a-z][a-z0-9_]{0,62}$", description="raw source name")
    window_minutes: int = Field(300, gt=0, le=7 * 24 * 60, description="delta window length")
    sensor_interval_seconds: int = Field(5, ge=1, le=3600, description="delta sensor tick interval")
    max_scan_hours: int = Field(
        0, ge=0, le=24 * 31,
        description="hours of listing the sensor may scan behind the newest partition (0 = window + 1 h)",
    )
    max_attempts: int = Field(3, ge=1, le=100, description="runs per partition before it is parked")
    delta_shards: int = Field(2, ge=1, le=4096, description="output shards of the delta index")
    delta_build: str = Field(
        "incremental", pattern=r"^(incremental|window)$",
        description="delta micro-batches: incremental (append a segment of what changed) | window (rebuild "
        "the window every time)")
    delta_segment_shards: int = Field(
        4, ge=1, le=4096,
        description="at most this many output shards of one incremental segment, each built by its own task "
        "(the touched products of its part); how many a micro-batch uses follows what it reads "
        "(delta_segment_shard_mb), and never more than Spark's task slots where it says")
    delta_segment_shard_mb: float = Field(
        8.0, ge=0, le=1048576,
        description="MiB of raw input per segment shard: a micro-batch reading N MiB builds ceil(N / this) shards, "
        "at least 1 and at most delta_segment_shards; 0 = always delta_segment_shards")
    delta_state_cache_mb: int = Field(
        1024, ge=0, le=65536,
        description="per Python worker: MiB of decoded state files (immutable) kept for the next micro-batches "
        "(reused workers: a continuous run decodes only new segments); state read from the local copies "
        "(delta_state_disk_cache_mb) is mapped, not decoded, and takes almost none of it; 0 = off")
    delta_state_disk_cache_mb: int = Field(
        8192, ge=0, le=1048576,
        description="per executor machine: MiB of state files (immutable) and their key indexes kept on its local "
        "disk (TMPDIR) as uncompressed Arrow that its Python workers memory-map: a micro-batch takes its state rows "
        "from the page cache without decoding, and a new worker (after a killed task, a takeover) starts warm; "
        "size it for two full versions' state, the serving one and the next one's (docs/operations.md); "
        "0 = off (each worker decodes the stored Parquet and keeps it within delta_state_cache_mb)")
    delta_max_segments: int = Field(
        24, ge=1, le=1000,
        description="segments one delta version may hold before a micro-batch rebuilds the window instead")
    delta_compact_segments: int = Field(
        8, ge=2, le=1000,
        description="background compaction (delta_compaction) merges consecutive small segments when the "
        "serving delta holds more than this many (keep it below delta_max_segments)")
    full_shards: int = Field(2, ge=1, le=4096, description="output shards of the full index")
    full_raw_every: int = Field(
        8, ge=1, le=1000,
        description="every Nth full build in a row reads every raw partition again (the safety net); the others "
        "lay the delta's segments over the serving full version, one task per product bucket (1 = always raw)")
    full_reuse_deleted_share: float = Field(
        0.25, ge=0, le=1,
        description="a full build from state extends each serving shard's index, indexing again only the changed ads "
        "and the ads of products whose features changed, while the shard's deleted documents stay within this "
        "share of it; past it the shard is indexed whole (0 = always index every document)")
    delta_max_drop_fraction: float = Field(0.9, ge=0, le=1, description="refuse a delta that shrank more")
    full_max_drop_fraction: float = Field(0.5, ge=0, le=1, description="refuse a full index that shrank more")
    full_every_hours: int = Field(3, ge=1, le=24, description="full rebuild schedule (every N hours)")
    # SLA thresholds (seconds). Data lag = now - time of the partition the delta covers.
    lag_warn_seconds: int = Field(600, gt=0, description="delta data lag that warns")
    lag_fail_seconds: int = Field(1800, gt=0, description="delta data lag that fails")
    silence_warn_seconds: int = Field(900, gt=0, description="no new raw partition for this long warns")
    silence_fail_seconds: int = Field(3600, gt=0, description="no new raw partition for this long fails")
    stuck_seconds: int = Field(900, gt=0, description="newest visible partition this far ahead of the pointer")
    full_max_age_seconds: int = Field(6 * 3600, gt=0, description="full cutoff older than this is remediated")
    coverage_margin: float = Field(
        0.2, ge=0, lt=1,
        description="share of the delta window: once the full cutoff is this close to leaving the window, the SLA "
        "sensor rebuilds the full index ahead of it (0 = only once a gap opened)")
    sla_interval_seconds: int = Field(30, ge=1, le=3600, description="SLA sensor tick interval")
    sla_autostart: bool = Field(True, description="start freshidx_sla_sensor (checks and remediation) with the code "
                                "location (false: it can still be started from the UI)")
    partitions_start: str = Field(
        "2026-01-01",
        description="first hourly Dagster partition, UTC: a day (YYYY-MM-DD) or an hour (YYYY-MM-DDTHH:00)")
    keep_versions: int = Field(5, ge=1, le=1000, description="published versions never garbage-collected")
    # Catch-up consumer (ads_hourly): every closed hour exactly once (docs/architecture.md#catch-up-ads_hourly).
    readiness: str = Field(
        "visible",
        description="when an hour is closed: visible | marker | quiet_period | manifest, or per source "
        "'src=policy,src2=policy'",
    )
    quiet_seconds: int = Field(300, ge=0, le=7 * 24 * 3600, description="quiet_period: no new object for this long")
    close_grace_seconds: int = Field(60, ge=0, le=24 * 3600, description="visible: wait this long after the hour ends")
    hourly_max_hours_per_run: int = Field(4, ge=1, le=168, description="catch-up: at most this many hours per run")
    hourly_timeout_seconds: int = Field(1800, ge=1, description="catch-up: a run older than this is stuck")
    hourly_max_attempts: int = Field(3, ge=1, le=100, description="catch-up: runs per hour before it is parked")
    hourly_lookahead_hours: int = Field(72, ge=1, le=24 * 31, description="catch-up: hours examined per tick")
    hourly_late_lookback_hours: int = Field(24, ge=0, le=24 * 31, description="closed hours re-listed for late data")
    hourly_late_checks_per_tick: int = Field(2, ge=0, le=100, description="closed hours re-listed per tick")
    hourly_parts: int = Field(1, ge=1, le=256, description="Parquet files per hourly bucket")
    hourly_sensor_interval_seconds: int = Field(30, ge=1, le=3600, description="catch-up sensor tick interval")
    catchup_autostart: bool = Field(True, description="start the ads_hourly catch-up sensor with the code location "
                                    "(false: it can still be started from the UI)")
    max_future_skew_seconds: int = Field(
        3600, ge=0, le=7 * 24 * 3600,
        description="quarantine a record whose updated_at is this far after its partition's minute (future_timestamp)")
    delta_overlap: str = Field("serialize", description="a delta trigger while a run is in flight: "
                               "serialize|skip|queue")
    hourly_overlap: str = Field("serialize", description="a catch-up trigger while a run is in flight: "
                                "serialize (wait for the catch-up run; backfills run alongside) | skip (no "
                                "request while any ads_hourly run, backfills included, is in flight) | queue "
                                "(request now; dagster.yaml runs them one at a time)")
    # Continuous mode (docs/architecture.md#continuous-mode): one long-lived run evaluates the latest-only
    # rule every few seconds.
    delta_mode: str = Field(
        "sensor", pattern=r"^(sensor|continuous)$",
        description="how delta micro-batches are triggered: sensor (delta_index_sensor requests one run per "
        "micro-batch) | continuous (one long-lived delta_continuous run, started by its watchdog sensor)")
    continuous_trigger_seconds: float = Field(
        0.5, gt=0, le=3600, description="continuous mode: seconds between two evaluations of the latest-only rule "
        "(each lists the newest partitions and reads the pointer: a few store requests)")
    continuous_keep_warm: bool = Field(
        True, description="continuous mode: while idle, keep the Spark Python workers alive and the next "
        "micro-batch's state decoded in them (a small Spark job after each change, and every 30 s)")
    continuous_max_runtime: float = Field(
        24 * 3600.0, gt=0, le=31 * 24 * 3600,
        description="continuous mode: planned restart after this many seconds (also '90s', '30m', '24h', '1h30m')")
    continuous_max_rss_mb: int = Field(
        2048, ge=64, le=1024 * 1024,
        description="continuous mode: planned restart once the run process's resident memory passes this (MiB)")
    continuous_standby: bool = Field(
        True, description="continuous mode: keep a second, warmed-up delta_continuous run that takes over within "
        "a second when the active run's worker dies or the run ends (false = one run, restarted by the watchdog)")

    @field_validator("continuous_max_runtime", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> Any:
        return parse_duration(v) if isinstance(v, str) else v

    @field_validator("partitions_start")
    @classmethod
    def _start(cls, v: str) -> str:
        at = dt.datetime.fromisoformat(v)
        if at.tzinfo is not None or (at.minute, at.second, at.microsecond) != (0, 0, 0):
            raise ValueError("a day (YYYY-MM-DD) or a whole hour (YYYY-MM-DDTHH:00), UTC, without an offset")
        return v

    @property
    def partitions_start_at(self) -> dt.datetime:
        """The first hourly partition's start (UTC)."""
        return dt.datetime.fromisoformat(self.partitions_start).replace(tzinfo=dt.UTC)

    @field_validator("readiness")
    @classmethod
    def _readiness(cls, v: str) -> str:
        parse_readiness(v)
        return v

    @field_validator("delta_overlap", "hourly_overlap")
    @classmethod
    def _overlap(cls, v: str) -> str:
        if v not in OVERLAP_POLICIES:
            raise ValueError(f"must be one of {', '.join(OVERLAP_POLICIES)}, got {v!r}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.lag_warn_seconds >= self.lag_fail_seconds:
            raise ValueError("lag_warn_seconds must be below lag_fail_seconds")
        if self.silence_warn_seconds >= self.silence_fail_seconds:
            raise ValueError("silence_warn_seconds must be below silence_fail_seconds")
        if self.max_scan_hours and self.max_scan_hours * 60 < self.window_minutes:
            raise ValueError("max_scan_hours must cover window_minutes (or be 0 for automatic)")
        return self

    # ---- derived ----
    @property
    def window(self) -> dt.timedelta:
        return dt.timedelta(minutes=self.window_minutes)

    @property
    def delta_state_cache_bytes(self) -> int:
        return self.delta_state_cache_mb * 2**20

    @property
    def delta_state_disk_bytes(self) -> int:
        return self.delta_state_disk_cache_mb * 2**20

    @property
    def scan_hours(self) -> int:
        return self.max_scan_hours or (self.window_minutes + 59) // 60 + 1

    def readiness_for(self, source: str) -> str:
        """The readiness policy of ``source`` (a per-source entry wins over the default)."""
        default, per_source = parse_readiness(self.readiness)
        return per_source.get(source, default)


class Settings(PipelineSettings, BaseSettings):
    """freshidx configuration: :class:`PipelineSettings` plus where the store and Spark are.

    Field ``x`` is read from ``FRESHIDX_X`` (only from the environment: no .env file, no secrets dir).
    """

    model_config = SettingsConfigDict(env_prefix="FRESHIDX_", case_sensitive=False, env_ignore_empty=True,
                                      frozen=True, extra="forbid")

    store: str = Field(default_factory=default_store_uri, description="file:///abs/path or s3://bucket/prefix")
    s3_endpoint_url: str | None = Field(None, description="custom S3 endpoint (moto, MinIO, …)")
    s3_first_try_seconds: float = Field(
        DEFAULT_FIRST_TRY_S, ge=0, le=60,
        description="a driver's S3 read (GET, HEAD, LIST) not answered within this is asked again at once, then "
        "with the usual retries and timeouts (a stalled request costs this, not seconds); 0 = off")
    spark_remote: str | None = Field(None, description="Spark Connect URL sc://host:port; unset = local")
    spark_master: str = Field("local[2]", description="master for local mode")
    spark_server_state: str | None = Field(
        None, description="state dir of a supervised `freshidx spark-server` (runs take leases from it)")
    spark_server_url: str | None = Field(
        None, description="control endpoint http://host:port of a supervised `freshidx spark-server` "
                          "(--control-port): leases, kept sessions and status over the network; "
                          "replaces spark_server_state where runs share no filesystem with the server")
    spark_keep_sessions: bool = Field(
        True, description="delta runs attach to one Connect session the server keeps between runs (warm Python "
                          "workers and caches); needs spark_server_state; false = a new session per run")
    # NoDecode: parsed by _spark_conf, so that bad JSON is a settings error naming the variable.
    spark_conf: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict, description="Spark confs, a JSON object of strings (e.g. "
        '{"spark.executor.memory": "4g"}): the spark resource\'s spark_config; local mode lays them over its '
        "defaults, a cluster's driver and a Connect session get only these besides what freshidx needs")

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        environ = _ENVIRON.get()
        return init_settings, env_settings if environ is None else _MappingEnvSource(settings_cls, environ)

    @field_validator("store")
    @classmethod
    def _store(cls, v: str) -> str:
        v = normalize_uri(v)
        StoreConfig(uri=v)  # raises ValueError with a readable message
        return v

    @field_validator("spark_remote")
    @classmethod
    def _remote(cls, v: str | None) -> str | None:
        if v in (None, ""):
            return None
        if not re.match(r"^sc://[^/:]+:\d+(/.*)?$", v):
            raise ValueError(f"must look like sc://host:port, got {v!r}")
        return v

    @field_validator("spark_conf", mode="before")
    @classmethod
    def _spark_conf(cls, v: Any) -> Any:
        if isinstance(v, str):
            try:
                v = json.loads(v)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not JSON ({exc})") from None
        if not isinstance(v, Mapping) or not all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
            raise ValueError('must be a JSON object of strings, e.g. {"spark.executor.memory": "4g"}')
        return dict(v)

    @field_validator("spark_master")
    @classmethod
    def _master(cls, v: str) -> str:
        if not re.match(r"^(local(\[(\*|\d+)(,\d+)?\])?|spark://.+|yarn|k8s://.+)$", v):
            raise ValueError(f"not a Spark master URL: {v!r}")
        return v

    @field_validator("s3_endpoint_url", "spark_server_url")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v in (None, ""):
            return None
        if not re.match(r"^https?://[^/]+/?$", v):
            raise ValueError(f"must look like http(s)://host:port, got {v!r}")
        return v

    def store_config(self) -> StoreConfig:
        env = dict(os.environ)
        if self.s3_endpoint_url:
            env["FRESHIDX_S3_ENDPOINT_URL"] = self.s3_endpoint_url
        env.pop(FIRST_TRY_ENV, None)  # this field has read (and validated) it
        return dataclasses.replace(StoreConfig.from_env(self.store, env), first_try_seconds=self.s3_first_try_seconds)

    @classmethod
    def env_name(cls, field: str) -> str:
        return f"FRESHIDX_{field.upper()}"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Load from ``FRESHIDX_*`` variables (``os.environ``, or ``env`` if given; ``{}`` = defaults
        only); ``overrides`` that are not None win. Raises :class:`SettingsError`."""
        values = {k: v for k, v in overrides.items() if v is not None}
        _warn_removed(os.environ if env is None else env)
        try:
            with _environ(env):
                return cls(**values)
        except ValidationError as exc:
            raise SettingsError(_describe(exc)) from None

    def pipeline(self) -> dict[str, Any]:
        """The :class:`PipelineSettings` values (what the Dagster ``freshidx`` resource carries)."""
        return {name: getattr(self, name) for name in PipelineSettings.model_fields}


#: Variables of earlier releases that no longer do anything, and why.
REMOVED_VARIABLES = {
    "FRESHIDX_SENSOR_WAIT_SECONDS": "the delta sensor answers each tick at once; for second-level freshness "
    "run continuous mode (FRESHIDX_DELTA_MODE=continuous)",
    "FRESHIDX_SENSOR_POLL_SECONDS": "see FRESHIDX_SENSOR_WAIT_SECONDS",
}


def _warn_removed(env: Mapping[str, str]) -> None:
    for name, why in REMOVED_VARIABLES.items():
        if env.get(name):
            warnings.warn(f"{name} is ignored: {why}", FutureWarning, stacklevel=3)


# ``Settings.from_env(env)`` reads ``env`` instead of ``os.environ``; a context variable carries it
# to ``settings_customise_sources`` (a classmethod without per-call arguments), safely across threads.
_ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("freshidx_settings_environ", default=None)


@contextmanager
def _environ(env: Mapping[str, str] | None) -> Iterator[None]:
    token = _ENVIRON.set(env)
    try:
        yield
    finally:
        _ENVIRON.reset(token)


class _MappingEnvSource(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping instead of ``os.environ``."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        # Normalised as the source normalises os.environ (case-insensitive names, empty = unset).
        self.env_vars = {k.lower(): v for k, v in environ.items() if v != ""}


def _describe(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        field = str(err["loc"][0]) if err["loc"] else ""
        known = field in Settings.model_fields
        where = f"{Settings.env_name(field)} ({field})" if known else ".".join(map(str, err["loc"])) or "settings"
        got = f" [got {err['input']!r}]" if known else ""
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: {msg}{got}")
    return "invalid freshidx settings: " + "; ".join(lines)
