"""The top ``k`` hits of one version set: a lazy k-way merge of every searched shard's hits in score
order, the kill-lists applied as hits are taken (:mod:`freshidx.serve.searcher` calls it on a pinned set).

Every shard's first list is fetched at once on ``pool`` when one is given: tantivy releases the GIL while it
scores, and scoring a shard's postings is nearly all of a query's time, so the shards share the cores.
"""

from __future__ import annotations

import heapq
from concurrent.futures import Executor
from typing import Any

import tantivy

from freshidx.serve.kill_list import KillLists
from freshidx.serve.versions import Hit, Shard, VersionSet

#: A shard's first list holds this many times k: the kill-lists and the ties at the k-th score take more than
#: k hits from a shard often enough that a second, longer search after the first costs more.
FIRST_LIST_FACTOR = 2


def search_set(snap: VersionSet, q: tantivy.Query, k: int, pool: Executor | None = None) -> list[Hit]:
    """Lazy k-way merge of per-shard top lists; stored docs are fetched only for hits we may return."""
    searched = [(index, version, sh, kill) for index, version, part, kill in snap.searched
                for sh in part.shards if sh.doc_count]
    limit = FIRST_LIST_FACTOR * k
    if pool is None or len(searched) < 2:
        firsts = [top_hits(sh, q, limit) for _, _, sh, _ in searched]
    else:
        firsts = list(pool.map(lambda s: top_hits(s[2], q, limit), searched))
    streams = [ShardStream(index, version, sh, q, kill, first, limit)
               for (index, version, sh, kill), first in zip(searched, firsts, strict=True)]
    heap: list[tuple[float, int, int]] = []
    for i, st in enumerate(streams):
        top = st.peek()
        if top is not None:
            heap.append((-top, i, st.pos))
    heapq.heapify(heap)
    out: list[Hit] = []

    def take_next() -> None:
        _, i, _ = heapq.heappop(heap)
        st = streams[i]
        hit = st.take()
        if hit is not None:
            out.append(hit)
        nxt = st.peek()
        if nxt is not None:
            heapq.heappush(heap, (-nxt, i, st.pos))

    while heap and len(out) < k:
        take_next()
    # Ties at the k-th score: take every hit with that score, so the cut by (score, ad_id) below does
    # not depend on shard order (results are reproducible across builds and stores).
    while heap and len(out) >= k and -heap[0][0] >= out[-1].score:
        take_next()
    out.sort(key=lambda h: (-h.score, h.ad_id))
    return out[:k]


def top_hits(shard: Shard, q: tantivy.Query, limit: int) -> list[tuple[float, Any]]:
    """The best ``limit`` (score, doc address) of one shard."""
    return list(shard.searcher.search(q, limit=limit, count=False).hits)


class ShardStream:
    """The hits of one shard in score order: ``first`` (its best ``limit``), then longer lists fetched as
    the kill-list and the merge eat into them."""

    def __init__(self, index: str, version: str, shard: Shard, q: tantivy.Query, kill: KillLists,
                 first: list[tuple[float, Any]], limit: int) -> None:
        self.index, self.version, self.shard, self.q, self.kill = index, version, shard, q, kill
        self.limit = limit
        self.pos = 0
        self.hits = first

    def peek(self) -> float | None:
        if self.pos >= len(self.hits) and len(self.hits) == self.limit:
            self.limit *= 4  # more may exist: fetch a longer list, keep our place
            self.hits = top_hits(self.shard, self.q, self.limit)
        if self.pos >= len(self.hits):
            return None
        return float(self.hits[self.pos][0])

    def take(self) -> Hit | None:
        score, addr = self.hits[self.pos]
        self.pos += 1
        doc = self.shard.searcher.doc(addr)
        ad_id = doc.get_first("ad_id")
        if ad_id in self.kill:
            return None
        return Hit(
            ad_id=str(ad_id), score=float(score), index=self.index, version=self.version,
            title=str(doc.get_first("title") or ""), product_id=str(doc.get_first("product_id") or ""),
            bid=float(doc.get_first("bid") or 0.0),
        )
