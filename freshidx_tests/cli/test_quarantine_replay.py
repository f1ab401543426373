"""The quarantine keeps rejected input exactly, and a fixed replay publishes it (the input contract).

A line that is not valid UTF-8 goes to the quarantine with its original bytes (``raw_base64``);
``freshidx quarantine export`` gives them back byte for byte; after a fix, ``freshidx quarantine
replay`` uploads them as new raw input and the next delta publishes the record. A Parquet object
dropped into a raw partition is quarantined as ONE object with reason ``unsupported_format`` (JSON
lines, optionally gzip, is the contract) and does not fail the run.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq

from freshidx.cli import main as cli
from freshidx.cli.quarantine import entries
from freshidx.publish.commit import read_pointer
from freshidx.serve.searcher import Searcher
from freshidx.store import StoreConfig, layout
from freshidx_tests.support.harness import Harness, at

LATIN1_TITLE = "caf\xe9 zeppelin"  # written by a broken upstream as Latin-1, not UTF-8


def good(ad: str, minutes: int, title: str) -> bytes:
    return json.dumps({"ad_id": ad, "campaign_id": "c", "product_id": f"p-{ad}", "title": title,
                       "keywords": ["k"], "bid": 1.0, "status": "active",
                       "updated_at": at(minutes).at.strftime("%Y-%m-%dT%H:%M:%S.000Z"), "version": 1}).encode()


def test_non_utf8_line_survives_quarantine_and_replays(tmp_path: Path, spark: Any, capsys: Any,
                                                       s3_store_config: StoreConfig) -> None:
    """On moto S3 (the CLI reaches S3 through the harness's environment)."""
    cfg = s3_store_config
    bad_line = good("ad-bin", 0, "PLACEHOLDER").replace(b"PLACEHOLDER", LATIN1_TITLE.encode("latin-1"))
    prefix = layout.raw_partition_prefix("ad_updates", at(0))
    with dg.instance_for_test() as instance:
        h = Harness(cfg, instance)
        try:
            lines = [good("ad-a", 0, "anchor one"), bad_line, good("ad-b", 0, "anchor two")]
            h.store.put(prefix + "part-00000.jsonl", b"".join(x + b"\n" for x in lines))
            table = pa.table({"ad_id": ["ad-pq"], "title": ["parquet row"]})
            sink = io.BytesIO()
            pq.write_table(table, sink)
            h.store.put(prefix + "part-00001.parquet", sink.getvalue())
            assert h.run(h.tick().run_requests[0]).success  # the Parquet object does not fail the run

            got = list(entries(h.store, "ad_updates"))
            reasons = sorted(e["reason"] for _, e in got)
            assert reasons == ["bad_encoding", "unsupported_format"]
            (enc,) = [e for _, e in got if e["reason"] == "bad_encoding"]
            assert "\ufffd" in enc["raw"]  # readable text ...
            (obj,) = [e for _, e in got if e["reason"] == "unsupported_format"]
            assert obj["file"] == prefix + "part-00001.parquet" and obj["line"] == 0
            assert "Parquet" in obj["detail"] and "JSON lines" in obj["detail"]
            copies = [o.key for o in h.store.iter_objects("quarantine/") if "/objects/" in o.key]
            assert [h.store.get(k).data for k in copies] == [sink.getvalue()]  # the object itself is kept

            exported = tmp_path / "bad.jsonl"
            store = ["--store", cfg.uri]
            assert cli(["quarantine", "export", "--partition", at(0).path, "--out", str(exported), *store]) == 0
            assert exported.read_bytes() == bad_line + b"\n"  # ... and the bytes, exactly as upstream wrote them

            fixed = tmp_path / "fixed.jsonl"
            fixed.write_bytes(exported.read_bytes().decode("latin-1").encode("utf-8"))  # the operator's fix
            capsys.readouterr()
            assert cli(["quarantine", "replay", str(fixed), "--json", *store]) == 0
            replayed = json.loads(capsys.readouterr().out)
            assert replayed["lines"] == 1 and h.store.get(replayed["key"]).data == fixed.read_bytes()

            assert h.run(h.tick().run_requests[0]).success
            pointer, _ = read_pointer(h.store, "delta")
            assert pointer is not None and pointer.source_partition == replayed["partition"]
            s = Searcher(h.store, tmp_path / "cache")
            s.refresh()
            hits = [(x.ad_id, x.title) for x in s.search("zeppelin", k=10)]
            assert hits == [("ad-bin", LATIN1_TITLE)]
        finally:
            h.close()


def test_unreadable_object_never_blocks_the_indexes(tmp_path: Path, spark: Any, s3_store_config: StoreConfig
                                                    ) -> None:
    """A truncated gzip and a plain file named .gz in the history: delta and full both publish from
    everything else, the bad object is counted, the mis-named plain file is read. Local store and moto S3."""
    import gzip

    cfg = s3_store_config
    with dg.instance_for_test() as instance:
        h = Harness(cfg, instance)
        try:
            for m, ad in ((0, "ad-a"), (5, "ad-b")):
                h.store.put(layout.raw_partition_prefix("ad_updates", at(m)) + "part-00000.jsonl",
                            good(ad, m, f"anchor {ad}") + b"\n")
            broken = gzip.compress(b"".join(good(f"ad-t{i}", 5, "lost") + b"\n" for i in range(2000)))
            h.store.put(layout.raw_partition_prefix("ad_updates", at(5)) + "part-00001.jsonl.gz",
                        broken[: len(broken) // 2])
            h.store.put(layout.raw_partition_prefix("ad_updates", at(5)) + "part-00002.jsonl.gz",
                        good("ad-plain", 5, "anchor misnamed") + b"\n")
            delta = h.run(h.tick().run_requests[0])
            full = h.run(dg.RunRequest(asset_selection=[dg.AssetKey("full_index")]))
            assert delta.success and full.success
            s = Searcher(h.store, tmp_path / "cache")
            s.refresh()
            assert sorted(x.ad_id for x in s.search("anchor", k=10)) == ["ad-a", "ad-b", "ad-plain"]
            assert s.search("lost", k=10) == []
            for index in ("full", "delta"):
                pointer, _ = read_pointer(h.store, index)
                assert pointer is not None
                manifest = h.store.get_json(layout.manifest_key(index, pointer.version))[0]
                assert manifest["doc_count"] == 3
                assert manifest["invalid"]["reasons"] == {"unreadable_object": 1}
        finally:
            h.close()
