"""``freshidx search QUERY [--k N] [--json] [--store URI] [--cache DIR]`` (serving: :mod:`freshidx.serving`).

Imports no Spark: the search path is the store, the manifests and tantivy.
"""

from __future__ import annotations

import io
import json
import os
import sys

import click

from freshidx.cli.base import LazyCommand, json_option, store_option


def default_cache_dir() -> str:
    from freshidx.settings import DEFAULT_HOME

    return os.path.join(os.getcwd(), DEFAULT_HOME, "cache")


def cmd_search(*, query: str, k: int, as_json: bool, store: str | None, cache: str | None) -> int:
    from freshidx.serving import NOTHING_PUBLISHED_EXIT, Searcher, ServingError
    from freshidx.settings import Settings
    from freshidx.store import open_store

    settings = Settings.from_env(store=store)
    st = open_store(settings.store_config())
    try:
        searcher = Searcher(st, cache or default_cache_dir())
    except ServingError as exc:
        print(f"freshidx search: {exc}", file=sys.stderr)
        return 1
    with searcher.snapshot() as snap:
        v = snap.versions()
        # Which index can answer: an empty answer must say whether nothing matched or nothing is served.
        answering = [n for n, lv in (("full", snap.full), ("delta", snap.active_delta)) if lv is not None]
    note: str | None = None
    if not answering:
        note = (f"nothing published yet in {st.uri}: no delta or full index; "
                "is the demo/sensor running? (see `freshidx status`)")
    elif len(answering) == 1:
        other = "delta" if answering == ["full"] else "full"
        why = "is older than the full cutoff" if other == "delta" and v["delta"] else "is not published yet"
        note = f"only the {answering[0]} index answered (the {other} index {why})"
    hits = searcher.search(query, k) if answering else []
    code = 0 if answering else NOTHING_PUBLISHED_EXIT
    if as_json:
        print(json.dumps({"store": st.uri, "published": bool(answering), "answered_by": answering,
                          "versions": v, "note": note, "hits": [h.to_dict() for h in hits]}, indent=1))
        return code
    if not answering:
        print(f"freshidx search: {note}", file=sys.stderr)
        return code
    buf = io.StringIO()
    buf.write(f"full={v['full'] or '–'} delta={v['delta'] or '–'}  {len(hits)} hit(s)"
              + (f"  ({note})" if note else "") + "\n")
    for h in hits:
        buf.write(f"{h.score:8.3f}  {h.index:5}  {h.ad_id:<14} {h.product_id:<12} {h.bid:8.2f}  {h.title}\n")
    print(buf.getvalue(), end="")
    return code


search = LazyCommand(
    "search", cmd_search,
    click.Argument(["query"]),
    click.Option(["--k"], type=int, default=10, help="number of hits (default 10)"),
    json_option("one JSON object: hits, versions, answered_by, published (false: nothing published yet, exit 3)"),
    store_option(),
    click.Option(["--cache"], help="local shard cache (default ./.freshidx/cache)"),
    short_help="query the published full + delta indexes",
    help="query the published full + delta indexes\n\n"
    "QUERY: tantivy query syntax over title and keywords; invalid syntax falls back to words",
)
