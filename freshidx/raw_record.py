"""The raw ad-change record as upstream writes it (one JSON object per line).

This module is the single source of truth for field names, types and allowed values; the
generator writes it, the Spark transforms parse and validate against it.
"""

from __future__ import annotations

# field -> (Spark SQL type, required)
RAW_FIELDS: dict[str, tuple[str, bool]] = {
    "ad_id": ("string", True),
    "campaign_id": ("string", True),
    "product_id": ("string", True),
    "title": ("string", True),
    "keywords": ("array<string>", False),
    "bid": ("double", True),
    "status": ("string", True),
    "updated_at": ("string", True),  # ISO-8601 UTC, e.g. 2026-11-21T14:05:07.123Z
    "version": ("long", True),
}

#: Fields a valid record must carry (not null), in :data:`RAW_FIELDS` order; the ids among them must not be blank.
REQUIRED_FIELDS: tuple[str, ...] = tuple(name for name, (_, required) in RAW_FIELDS.items() if required)
ID_FIELDS: tuple[str, ...] = ("ad_id", "campaign_id", "product_id")

STATUSES = ("active", "paused", "deleted")
ACTIVE = "active"
MAX_TITLE_CHARS = 1000
MAX_BID = 1_000_000.0

# Reasons a record is quarantined (stable strings: they are counted and shown in the UI).
REASON_MALFORMED_JSON = "malformed_json"
REASON_MISSING_FIELD = "missing_field"  # suffixed with ":<field>"
REASON_BAD_STATUS = "bad_status"
REASON_BAD_BID = "bad_bid"
REASON_BAD_TIMESTAMP = "bad_updated_at"
REASON_BAD_VERSION = "bad_version"
REASON_TOO_LONG = "title_too_long"
REASON_BAD_ENCODING = "bad_encoding"
REASON_FUTURE_TIMESTAMP = "future_timestamp"

#: How far ``updated_at`` may lie after the minute of the partition holding the record (upstream clocks
#: drift a little; a record cannot have been changed an hour after it was written). Setting:
#: ``FRESHIDX_MAX_FUTURE_SKEW_SECONDS``.
DEFAULT_MAX_FUTURE_SKEW_SECONDS = 3600


def raw_ddl() -> str:
    """DDL string of the raw record schema (for ``from_json``)."""
    return ", ".join(f"{name} {typ}" for name, (typ, _) in RAW_FIELDS.items())
