"""``freshidx search QUERY [--k N] [--json] [--store URI] [--cache DIR]`` (serving: :mod:`freshidx.serve.searcher`).

Imports no Spark: the search path is the store, the manifests and tantivy.
"""

from __future__ import annotations

import io
import json
import os
import sys

import click

from freshidx.cli.base import LazyCommand, json_option, open_command_store, store_option


def default_cache_dir(store_uri: str) -> str:
    """The shard cache without ``--cache``: ``<temp dir>/freshidx-<uid>/search-cache/<hash of the store URI>``.

    Searching only reads: it creates nothing in the working directory (nor the store). Per store, so two
    stores never evict each other's shards; per user, in a directory only the user may enter (one that
    another user made first is not trusted: a fresh temp dir then)."""
    import hashlib
    import stat
    import tempfile

    base = os.path.join(tempfile.gettempdir(), f"freshidx-{os.getuid()}")
    os.makedirs(base, mode=0o700, exist_ok=True)
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        base = tempfile.mkdtemp(prefix="freshidx-search-")
    return os.path.join(base, "search-cache", hashlib.sha256(store_uri.encode()).hexdigest()[:16])


def cmd_search(*, query: str, k: int, as_json: bool, store: str | None, cache: str | None) -> int:
    from freshidx.serve.searcher import NOTHING_PUBLISHED_EXIT, Searcher, ServingError

    _, st = open_command_store(store, reads_only=True)
    try:
        searcher = Searcher(st, cache or default_cache_dir(st.uri))
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
    click.Option(["--cache"], help="local shard cache (default: one per store under the temp dir, "
                 "<tmp>/freshidx-<uid>/search-cache/)"),
    short_help="query the published full + delta indexes",
    help="query the published full + delta indexes\n\n"
    "QUERY: tantivy query syntax over title and keywords; invalid syntax falls back to words",
)
