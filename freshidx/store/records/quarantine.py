"""Quarantine records (``quarantine/<source>/<partition>/…``), written by Spark tasks: one JSON line per
record that could not be indexed (or per reported copy of a version conflict), and the marker saying
that a raw file's invalid records are all in the quarantine."""

from __future__ import annotations

import json
from typing import Any

from pydantic.dataclasses import dataclass

from freshidx.store.records.base import CONFIG, Record, version_field

#: Keys a line carries only when they say something (a line stays as small as the raw line it keeps).
_OPTIONAL = ("raw_base64", "detail", "ad_id", "version")


@dataclass(frozen=True, eq=False, config=CONFIG)
class QuarantineLine(Record):
    """One quarantined record: the raw line (``raw``; ``raw_base64``: its bytes when they were not
    UTF-8) and why; a version-conflict copy also names its ``(ad_id, version)``."""

    KIND = "quarantine line"

    file: str  # raw object key
    line: int  # 1-based; 0: the whole object (its copy sits under objects/)
    raw: str | None
    reason: str
    raw_base64: str | None = None
    detail: str | None = None
    ad_id: str | None = None
    version: int | None = None
    format_version: int = version_field()

    def to_json(self) -> dict[str, Any]:
        body = super().to_json()
        return {k: v for k, v in body.items() if v is not None or k not in _OPTIONAL}

    def jsonl(self) -> bytes:
        return (json.dumps(self.to_json(), ensure_ascii=False) + "\n").encode("utf-8")


@dataclass(frozen=True, eq=False, config=CONFIG)
class QuarantineDone(Record):
    """``…/_done/<digest>.done``: the invalid records of raw object ``file`` are in ``quarantine``."""

    KIND = "quarantine marker"

    file: str
    run_id: str
    quarantine: str
    format_version: int = version_field()

    def data(self) -> bytes:
        return json.dumps(self.to_json()).encode()
