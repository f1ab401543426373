"""The upstream simulator's records: what a minute partition of ad-change JSON lines contains
(:mod:`freshidx.tools.generate` writes them into the object store).

Each partition lands at ``raw/<source>/year=YYYY/month=MM/day=DD/hour=HH/minute=mm/part-NNNNN.jsonl``
(one ``put`` per file, so every file is atomic; a multi-file partition appears file by file, as real
upstream jobs do).

The content of a partition is a pure function of ``(config, partition time)``: the random stream is
``random.Random(f"{seed}:{partition.compact}")`` and per-ad attributes (product, campaign, base
title: :mod:`freshidx.tools.generator_ads`) come from hashes of the ad id and the seed. A restarted
generator therefore rewrites a partition byte for byte, and versions need no state: ``version =
partition_ms * 1000 + sequence`` (partitions are 60 000 ms apart, so sequences never collide with the
next partition's versions).

What a partition contains (see :class:`PartitionWritten` for the counts returned):

* valid records following :mod:`freshidx.raw_record` (``updated_at`` inside the partition's minute,
  bid in [0.05, 20.0] with two decimals, mostly ``active``, some ``paused`` / ``deleted``);
* malformed lines (``malformed_rate``), each with exactly one defect: truncated JSON, a missing or
  null required field, a status outside ``STATUSES``, a negative or non-numeric bid, or an
  unparseable ``updated_at``;
* duplicates (``duplicate_rate``): an exact second copy of a valid line somewhere else in the
  partition (possibly another file of it);
* bursts (``burst_probability``): five times the changes, split over several files.

Lines of a partition are shuffled, so file order is not version order.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from freshidx.raw_record import (
    REASON_BAD_BID,
    REASON_BAD_STATUS,
    REASON_BAD_TIMESTAMP,
    REASON_MALFORMED_JSON,
    REASON_MISSING_FIELD,
    REQUIRED_FIELDS,
    STATUSES,
)
from freshidx.store import layout
from freshidx.store.partitions import PartitionId
from freshidx.tools.generator_ads import (
    ADJECTIVES,
    BRANDS,
    NOUNS,
    QUALIFIERS,
    VOCABULARY,
    AdProfile,
    ad_id,
    random_title,
    stable_profile,
)

# The vocabulary and the ads' stable attributes are defined in generator_ads; callers use them here.
__all__ = [
    "ADJECTIVES",
    "BRANDS",
    "NOUNS",
    "QUALIFIERS",
    "REQUIRED_FIELDS",
    "SOURCE_RE",
    "VOCABULARY",
    "AdProfile",
    "GeneratorConfig",
    "PartitionWritten",
    "ad_id",
    "ad_profile",
    "partition_base_version",
    "partition_keys",
    "partition_records",
    "split_lines",
]

SOURCE_RE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_MAX_IDS = 1_000_000_000
_MAX_CHANGES = 1_000_000  # with the 5x burst and duplicates, sequences stay far below 60 000 000
_BURST_FACTOR = 5
_MIN_BID, _MAX_BID = 0.05, 20.0

# Defects of malformed lines. Each value is chosen so that every strict reading of raw_record.py
# rejects it (no case/whitespace variants of statuses, no "NaN"/"Infinity" strings for bids,
# no almost-ISO timestamps that a lenient parser could accept, no empty strings that a reader
# could take for a missing field).
_BAD_STATUSES = ("archived", "enabled", "pending_review", "activ", "removed", "live")
_BAD_BIDS: tuple[Any, ...] = (-0.5, -1.25, -12.0, -0.01, "twelve", "n/a", "1,50", "free")
_BAD_TIMESTAMPS = (
    "yesterday",
    "not-a-timestamp",
    "2026-13-01T00:00:00.000Z",
    "2026-11-21T25:61:00.000Z",
    "2026-02-30T10:00:00.000Z",
    "21/11/2026 14:05",
)
if set(_BAD_STATUSES) & set(STATUSES) or not {"active", "paused", "deleted"} <= set(STATUSES):
    raise ImportError("freshidx.raw_record.STATUSES changed: update the generator's statuses")
_DEFECTS = ("truncated_json", "missing_field", "bad_status", "bad_bid", "bad_updated_at")


# ---------------------------------------------------------------------------------------------
# Configuration and results
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GeneratorConfig:
    """What the simulated upstream writes. Every field is validated; errors name the field."""

    source: str = "ad_updates"
    seed: int = 0
    ads: int = 5000
    products: int = 800
    campaigns: int = 120
    changes_per_partition: int = 200
    malformed_rate: float = 0.01
    duplicate_rate: float = 0.02
    delete_rate: float = 0.02
    pause_rate: float = 0.04
    burst_probability: float = 0.1
    files_per_partition: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not SOURCE_RE.match(self.source):
            raise ValueError(
                f"GeneratorConfig.source must match {SOURCE_RE.pattern} (it becomes a key segment), "
                f"got {self.source!r}"
            )
        _check_int("seed", self.seed)
        # Ids are drawn from these ranges (nothing is kept per id): a 100M-document window is in range.
        _check_int("ads", self.ads, 1, _MAX_IDS)
        _check_int("products", self.products, 1, _MAX_IDS)
        _check_int("campaigns", self.campaigns, 1, _MAX_IDS)
        _check_int("changes_per_partition", self.changes_per_partition, 1, _MAX_CHANGES)
        _check_int("files_per_partition", self.files_per_partition, 1, 10_000)
        for name in ("malformed_rate", "duplicate_rate", "delete_rate", "pause_rate", "burst_probability"):
            _check_rate(name, getattr(self, name))
        if self.delete_rate + self.pause_rate > 1.0:
            raise ValueError(
                "GeneratorConfig.delete_rate + GeneratorConfig.pause_rate must be <= 1, "
                f"got {self.delete_rate} + {self.pause_rate}"
            )


def _check_int(name: str, value: object, lo: int | None = None, hi: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"GeneratorConfig.{name} must be an int, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ValueError(f"GeneratorConfig.{name} must be in [{lo}, {hi}], got {value!r}")


def _check_rate(name: str, value: object) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"GeneratorConfig.{name} must be a number in [0, 1], got {value!r}")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"GeneratorConfig.{name} must be in [0, 1], got {value!r}")


@dataclass
class PartitionWritten:
    """What one partition holds. Counts are by construction and are exact:

    * ``records`` = lines written = ``valid + malformed``;
    * ``valid`` counts every line a strict validator accepts, *including* the duplicate copies;
      ``duplicates`` is how many of those are extra copies, so ``unique`` = ``valid - duplicates``
      distinct valid records;
    * ``deletes`` counts distinct valid records with status ``deleted``;
    * ``reasons`` counts malformed lines by quarantine reason (``freshidx.raw_record.REASON_*``, missing
      fields as ``missing_field:<field>``); it sums to ``malformed``;
    * ``ad_ids`` is the sorted list of ad ids that have at least one valid record.
    """

    partition: PartitionId
    keys: list[str]
    records: int
    valid: int
    malformed: int
    duplicates: int
    deletes: int
    burst: bool
    ad_ids: list[str]
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def unique(self) -> int:
        return self.valid - self.duplicates

    def to_json(self) -> dict[str, Any]:
        """The summary printed by ``freshidx generate --json`` (ad ids left out: they are many)."""
        return {
            "partition": self.partition.path,
            "at": self.partition.at.isoformat().replace("+00:00", "Z"),
            "keys": list(self.keys),
            "records": self.records,
            "valid": self.valid,
            "malformed": self.malformed,
            "duplicates": self.duplicates,
            "deletes": self.deletes,
            "burst": self.burst,
            "reasons": dict(sorted(self.reasons.items())),
        }


def ad_profile(cfg: GeneratorConfig, ad: int) -> AdProfile:
    """Stable attributes of ad number ``ad``; several ads share a product (``ads / products`` each)."""
    return stable_profile(cfg.seed, cfg.products, cfg.campaigns, ad)


# ---------------------------------------------------------------------------------------------
# One partition
# ---------------------------------------------------------------------------------------------


def _minute_prefix(partition: PartitionId) -> str:
    return partition.at.strftime("%Y-%m-%dT%H:%M:")


def _dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False)


def _pick_ad(rng: random.Random, cfg: GeneratorConfig) -> int:
    # A few hot ads change often (several versions of one ad inside a partition), the rest uniformly.
    hot = max(1, cfg.ads // 50)
    if rng.random() < 0.25:
        return rng.randrange(hot)
    return rng.randrange(cfg.ads)


def _bid(rng: random.Random) -> float:
    value = math.exp(rng.uniform(math.log(_MIN_BID), math.log(_MAX_BID)))
    return min(_MAX_BID, max(_MIN_BID, round(value, 2)))


def _record(
    rng: random.Random, cfg: GeneratorConfig, partition: PartitionId, seq: int, offset_ms: int
) -> dict[str, Any]:
    ad = _pick_ad(rng, cfg)
    profile = ad_profile(cfg, ad)
    brand, noun = profile.brand, profile.noun
    title = profile.base_title if rng.random() < 0.4 else random_title(rng, brand, noun, profile.qualifier)
    r = rng.random()
    if r < cfg.delete_rate:
        status = "deleted"
    elif r < cfg.delete_rate + cfg.pause_rate:
        status = "paused"
    else:
        status = "active"
    record: dict[str, Any] = {
        "ad_id": ad_id(ad),
        "campaign_id": f"camp-{profile.campaign:04d}",
        "product_id": f"prod-{profile.product:05d}",
        "title": title,
    }
    if rng.random() < 0.98:  # keywords are optional in raw_record.py; a few records leave them out
        keywords = [brand, noun]
        extra = [w for w in rng.sample(VOCABULARY, 6) if w not in keywords]
        keywords.extend(extra[: rng.randint(0, 3)])
        record["keywords"] = keywords
    record["bid"] = _bid(rng)
    record["status"] = status
    # offset_ms < 60 000: the time stays inside the partition's minute
    record["updated_at"] = f"{_minute_prefix(partition)}{offset_ms // 1000:02d}.{offset_ms % 1000:03d}Z"
    record["version"] = partition_base_version(partition) + seq
    return record


def partition_base_version(partition: PartitionId) -> int:
    """Smallest version a record of ``partition`` can carry: the partition time in ms times 1000."""
    return int(partition.at.timestamp()) * 1000 * 1000


def _malform(rng: random.Random, record: dict[str, Any]) -> tuple[str, str]:
    """One line with exactly one defect, and the quarantine reason a strict validator gives it."""
    defect = rng.choice(_DEFECTS)
    bad = dict(record)
    if defect == "truncated_json":
        text = _dumps(record)
        # Any proper prefix of a JSON object is invalid JSON; keep at least two characters so the
        # line is never blank (blank lines are skipped by some readers instead of rejected).
        return text[: rng.randrange(2, len(text) - 1)].rstrip(), REASON_MALFORMED_JSON
    if defect == "missing_field":
        name = "ad_id" if rng.random() < 0.5 else rng.choice(REQUIRED_FIELDS)
        if rng.random() < 0.75:
            del bad[name]
        else:
            bad[name] = None
        return _dumps(bad), f"{REASON_MISSING_FIELD}:{name}"
    if defect == "bad_status":
        bad["status"] = rng.choice(_BAD_STATUSES)
        return _dumps(bad), REASON_BAD_STATUS
    if defect == "bad_bid":
        bad["bid"] = rng.choice(_BAD_BIDS)
        return _dumps(bad), REASON_BAD_BID
    bad["updated_at"] = rng.choice(_BAD_TIMESTAMPS)
    return _dumps(bad), REASON_BAD_TIMESTAMP


def partition_keys(cfg: GeneratorConfig, partition: PartitionId, files: int) -> list[str]:
    prefix = layout.raw_partition_prefix(cfg.source, partition)
    return [f"{prefix}part-{i:05d}.jsonl" for i in range(files)]


def split_lines(lines: Sequence[str], files: int) -> list[list[str]]:
    """Contiguous, non-empty chunks of ``lines`` (sizes differ by at most one) — how files are cut."""
    files = max(1, min(files, len(lines)))
    size, extra = divmod(len(lines), files)
    out: list[list[str]] = []
    start = 0
    for i in range(files):
        end = start + size + (1 if i < extra else 0)
        out.append(list(lines[start:end]))
        start = end
    return out


def partition_records(cfg: GeneratorConfig, partition: PartitionId) -> tuple[list[str], PartitionWritten]:
    """All lines of ``partition`` (in file order) and their counts; ``keys`` are the files to write.

    Pure and deterministic in ``(cfg, partition)``; :func:`write_partition` cuts the lines into
    ``len(keys)`` files with :func:`split_lines`.
    """
    rng = random.Random(f"{cfg.seed}:{partition.compact}")
    burst = rng.random() < cfg.burst_probability
    n = cfg.changes_per_partition * (_BURST_FACTOR if burst else 1)
    files = max(cfg.files_per_partition, rng.randint(2, 5)) if burst else cfg.files_per_partition

    offsets = sorted(rng.randrange(60_000) for _ in range(n))  # later sequence => later updated_at
    lines: list[str] = []
    valid_lines: list[str] = []
    reasons: Counter[str] = Counter()
    deletes = 0
    ad_ids: set[str] = set()
    for seq, offset_ms in enumerate(offsets):
        record = _record(rng, cfg, partition, seq, offset_ms)
        if rng.random() < cfg.malformed_rate:
            line, reason = _malform(rng, record)
            reasons[reason] += 1
            lines.append(line)
            continue
        line = _dumps(record)
        lines.append(line)
        valid_lines.append(line)
        ad_ids.add(record["ad_id"])
        deletes += record["status"] == "deleted"
    rng.shuffle(lines)  # parallel upstream writers: file order is not version order

    duplicates = 0
    for line in valid_lines:
        if rng.random() < cfg.duplicate_rate:
            lines.insert(rng.randrange(len(lines) + 1), line)
            duplicates += 1

    files = max(1, min(files, len(lines)))
    malformed = sum(reasons.values())
    stats = PartitionWritten(
        partition=partition,
        keys=partition_keys(cfg, partition, files),
        records=len(lines),
        valid=len(valid_lines) + duplicates,
        malformed=malformed,
        duplicates=duplicates,
        deletes=deletes,
        burst=burst,
        ad_ids=sorted(ad_ids),
        reasons=dict(reasons),
    )
    return lines, stats
