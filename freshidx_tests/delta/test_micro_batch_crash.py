"""A kill -9 of an incremental micro-batch at any step leaves the pointer, the segments and
the files consistent; the next micro-batch succeeds and incremental = rebuilt still holds.

The killed micro-batch is a real ``delta_index`` run in its own process (on the shared Spark Connect
server, so no JVM starts per kill), which dies with ``os._exit`` at each step: after listing (nothing
written), after the build (segment shards staged, no manifest), after the manifest (before the
compare-and-swap) and right after the swap (no history entry, no ledger entry).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import dagster as dg

from freshidx.publish import retention
from freshidx.publish.commit import read_manifest, read_pointer
from freshidx.serve.searcher import Searcher
from freshidx.store import StoreConfig, layout
from freshidx_tests.delta.test_incremental_equivalence import (
    WINDOW,
    WORDS,
    _batch,
    _micro_batch,
    _write,
    expected,
    first_full,
)
from freshidx_tests.support.harness import Harness, at

CRASH_POINTS = ("delta_listed", "delta_staged", "before_cas", "after_cas")
SETTINGS: dict[str, Any] = {"window_minutes": WINDOW, "full_max_age_seconds": 10**9}

KILLED_RUN = """
import json, sys
import dagster as dg
from freshidx.store import StoreConfig
from freshidx_tests.support.harness import Harness
cfg = StoreConfig(uri=sys.argv[1])
with dg.instance_for_test() as instance:
    h = Harness(cfg, instance, **json.loads(sys.argv[2]))
    h.run(dg.RunRequest(run_config={"ops": {"delta_index": {"config": {"source_partition": sys.argv[3]}}}},
                        asset_selection=[dg.AssetKey("delta_index")]))
print("survived")
"""


def _killed_run(cfg: StoreConfig, partition: str, crash_at: str, connect: dict[str, str]) -> None:
    env = {**os.environ, "FRESHIDX_CRASH_AT": crash_at}
    # The run leases the shared server like a Dagster run does: without a lease the supervisor's planned
    # restart (too many session processes) may stop the server under the run (a killed run's lease is
    # reaped by pid).
    overrides = {**SETTINGS, "spark_remote": connect["FRESHIDX_SPARK_REMOTE"],
                 "spark_server_state": connect["FRESHIDX_SPARK_SERVER_STATE"]}
    proc = subprocess.run([sys.executable, "-c", KILLED_RUN, cfg.uri, json.dumps(overrides), partition],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 86 and "survived" not in proc.stdout, (crash_at, proc.stdout[-2000:],
                                                                      proc.stderr[-4000:])


def _answers(s: Searcher) -> dict[str, set[str]]:
    s.refresh()
    return {w: {h.ad_id for h in s.search(w, k=1000)} for w in (*WORDS, "filler")}


def _want(sent: list[dict[str, Any]]) -> dict[str, set[str]]:
    return {w: expected(sent, w) for w in WORDS} | {"filler": {"filler"}}


def test_kill_9_at_every_step_of_a_micro_batch_leaves_a_consistent_index(
    tmp_path: Path, spark: Any, shared_spark_connect: dict[str, str]
) -> None:
    cfg = StoreConfig(uri=(tmp_path / "store").as_uri())
    rng = random.Random(31)
    sent: list[dict[str, Any]] = []
    with dg.instance_for_test() as instance:
        h = Harness(cfg, instance, **SETTINGS)
        try:
            minute = first_full(h, rng, sent, 25)
            sent += (b := _batch(rng, minute, sent, 25))
            _write(h, minute, b)
            minute += 5
            _micro_batch(h)  # the first delta (a window rebuild); the killed ones are incremental
            s = Searcher(h.store, tmp_path / "cache")
            assert _answers(s) == _want(sent)
            for crash_at in CRASH_POINTS:
                before, _ = read_pointer(h.store, "delta")
                assert before is not None
                sent += (b := _batch(rng, minute, sent, 25))
                _write(h, minute, b)
                _killed_run(cfg, at(minute).path, crash_at, shared_spark_connect)
                minute += 5
                after, _ = read_pointer(h.store, "delta")
                assert after is not None
                if crash_at == "after_cas":  # the swap landed: the new version serves, complete
                    assert after.seq == before.seq + 1 and after.source_partition == at(minute - 5).path
                    assert read_manifest(h.store, "delta", after.version)["inputs"]["build"] == "incremental"
                else:  # nothing was swapped: the previous version serves, untouched
                    assert after == before
                assert retention.missing_files(h.store, "delta", after.version) == []
                # What serves is right for the inputs it covers: everything, when the swap landed ...
                covered = sent if crash_at == "after_cas" else sent[:-len(b)]
                assert _answers(s) == _want(covered), crash_at
                # ... and the next micro-batch succeeds and catches up on everything.
                sent += (b := _batch(rng, minute, sent, 25))
                _write(h, minute, b)
                minute += 5
                _micro_batch(h)
                assert _answers(s) == _want(sent), f"after the kill at {crash_at}"
                pointer, _ = read_pointer(h.store, "delta")
                assert pointer is not None and pointer.seq == after.seq + 1
            # History is whole (the after_cas kill lost an entry; the next publisher healed it).
            seqs = [e["seq"] for e in (h.store.get_json(layout.history_key("delta", n))[0]
                                       for n in range(1, pointer.seq + 1))]
            assert seqs == list(range(1, pointer.seq + 1))
        finally:
            h.close()
