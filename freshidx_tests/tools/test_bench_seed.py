"""The benches' seeded history: written in parallel, it is the history written one partition at a time."""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path

from freshidx.tools.bench_common import generator_config_for
from freshidx.tools.bench_seed import SeedProgress, seed_history
from freshidx.tools.generate import history_partitions

NOW = dt.datetime(2026, 12, 1, 12, 3, tzinfo=dt.UTC)


def _snapshot(root: Path) -> dict[str, tuple[str, float]]:
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime)
            for p in sorted(root.rglob("*"))
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)}


def test_parallel_seeding_writes_what_one_process_writes(tmp_path: Path) -> None:
    cfg = generator_config_for(2000)
    one, two = tmp_path / "one", tmp_path / "two"
    records_one, _ = seed_history(one, cfg, NOW, 60, workers=1)
    records_two, _ = seed_history(two, cfg, NOW, 60, workers=2)
    assert records_one == records_two > 0
    files = _snapshot(one)
    assert files == _snapshot(two)
    # one file per partition, stamped with its partition's time
    parts = history_partitions(NOW, dt.timedelta(minutes=60))
    assert len(files) == len(parts)
    assert sorted(mtime for _, mtime in files.values()) == [p.at.timestamp() for p in parts]


def test_progress_line_says_done_rate_and_time_left() -> None:
    line = SeedProgress(done=15, total=60, records=3_000_000, elapsed_s=100.0).line()
    assert line == "seeding: 15/60 partitions, 3,000,000 records, 30,000 records/s, about 300 s left"
    assert SeedProgress(0, 60, 0, 5.0).line().endswith("about ? left")


def test_warm_up_line_says_what_the_warm_up_waits_for() -> None:
    from freshidx.tools.bench_wait import warm_up_line

    line = warm_up_line(95.4, True, False, ["__ASSET_JOB SUCCESS", "full_index_job STARTED"], 1704.6)
    assert line == ("warming up for 95 s: delta published, full index not yet; runs in flight: "
                    "__ASSET_JOB SUCCESS, full_index_job STARTED; deadline in 1705 s")
