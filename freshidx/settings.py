"""One typed settings object for every entry point (CLI, ``dagster dev``, ``dagster asset materialize``).

Values come from ``FRESHIDX_*`` environment variables with defaults for the embedded setup. A bad
value fails at load with a message naming both the field and the variable, e.g.::

    SettingsError: FRESHIDX_WINDOW_MINUTES (window_minutes): Input should be greater than 0 [got '-5']
"""

from __future__ import annotations

import datetime as dt
import os
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from freshidx.store import StoreConfig, normalize_uri

DEFAULT_HOME = ".freshidx"


READINESS_POLICIES = ("visible", "marker", "quiet_period", "manifest")
OVERLAP_POLICIES = ("serialize", "skip", "queue")


def parse_readiness(text: str) -> tuple[str, dict[str, str]]:
    """``"marker"`` or ``"quiet_period,ad_updates=manifest"`` → (default policy, per-source policies)."""
    default = "visible"
    per_source: dict[str, str] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        src, eq, policy = item.rpartition("=")
        if policy not in READINESS_POLICIES:
            raise ValueError(f"unknown readiness policy {policy!r} (one of {', '.join(READINESS_POLICIES)})")
        if eq and not re.match(r"^[a-z][a-z0-9_]{0,62}$", src):
            raise ValueError(f"bad source name {src!r} in readiness")
        if eq:
            per_source[src] = policy
        else:
            default = policy
    return default, per_source


class SettingsError(ValueError):
    """A configuration value is invalid; the message names the field and its variable."""


def default_store_uri() -> str:
    return normalize_uri(os.path.join(os.getcwd(), DEFAULT_HOME, "store"))


class Settings(BaseModel):
    """freshidx configuration. Field ``x`` is read from ``FRESHIDX_X``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    store: str = Field(default_factory=default_store_uri, description="file:///abs/path or s3://bucket/prefix")
    s3_endpoint_url: str | None = Field(None, description="custom S3 endpoint (moto, MinIO, …)")
    source: str = Field("ad_updates", pattern=r"^[a-z][a-z0-9_]{0,62}$", description="raw source name")
    window_minutes: int = Field(300, gt=0, le=7 * 24 * 60, description="delta window length")
    sensor_interval_seconds: int = Field(5, ge=1, le=3600, description="delta sensor tick interval")
    max_scan_hours: int = Field(
        0, ge=0, le=24 * 31,
        description="hours of listing the sensor may scan behind the newest partition (0 = window + 1 h)",
    )
    max_attempts: int = Field(3, ge=1, le=100, description="runs per partition before it is parked")
    delta_shards: int = Field(2, ge=1, le=4096, description="output shards of the delta index")
    full_shards: int = Field(2, ge=1, le=4096, description="output shards of the full index")
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
    sla_interval_seconds: int = Field(30, ge=1, le=3600, description="SLA sensor tick interval")
    spark_remote: str | None = Field(None, description="Spark Connect URL sc://host:port; unset = local")
    spark_master: str = Field("local[2]", description="master for local mode")
    spark_server_state: str | None = Field(
        None, description="state dir of a supervised `freshidx spark-server` (runs take leases from it)")
    partitions_start: str = Field("2026-01-01", description="first hourly Dagster partition (YYYY-MM-DD)")
    keep_versions: int = Field(5, ge=1, le=1000, description="published versions never garbage-collected")
    # Catch-up consumer (ads_hourly): every closed hour exactly once (DESIGN §7).
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

    @field_validator("spark_master")
    @classmethod
    def _master(cls, v: str) -> str:
        if not re.match(r"^(local(\[(\*|\d+)(,\d+)?\])?|spark://.+|yarn|k8s://.+)$", v):
            raise ValueError(f"not a Spark master URL: {v!r}")
        return v

    @field_validator("partitions_start")
    @classmethod
    def _start(cls, v: str) -> str:
        dt.date.fromisoformat(v)
        return v

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

    @field_validator("s3_endpoint_url")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v in (None, ""):
            return None
        if not re.match(r"^https?://[^/]+/?$", v):
            raise ValueError(f"must look like http(s)://host:port, got {v!r}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
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
    def scan_hours(self) -> int:
        return self.max_scan_hours or (self.window_minutes + 59) // 60 + 1

    def readiness_for(self, source: str) -> str:
        """The readiness policy of ``source`` (a per-source entry wins over the default)."""
        default, per_source = parse_readiness(self.readiness)
        return per_source.get(source, default)

    def store_config(self) -> StoreConfig:
        env = dict(os.environ)
        if self.s3_endpoint_url:
            env["FRESHIDX_S3_ENDPOINT_URL"] = self.s3_endpoint_url
        return StoreConfig.from_env(self.store, env)

    @classmethod
    def env_name(cls, field: str) -> str:
        return f"FRESHIDX_{field.upper()}"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> Settings:
        """Load from ``FRESHIDX_*`` variables; ``overrides`` win. Raises :class:`SettingsError`."""
        e = os.environ if env is None else env
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            raw = e.get(cls.env_name(name))
            if raw is not None and raw != "":
                values[name] = raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls(**values)
        except ValidationError as exc:
            raise SettingsError(_describe(exc, values)) from None


def _describe(exc: ValidationError, values: dict[str, Any]) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "settings"
        field = loc.split(".")[0]
        where = f"{Settings.env_name(field)} ({field})" if field in Settings.model_fields else loc
        got = f" [got {values[field]!r}]" if field in values else ""
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: {msg}{got}")
    return "invalid freshidx settings: " + "; ".join(lines)
