"""The top ``k`` hits of one version set: a lazy k-way merge of every searched shard's hits in score
order, the kill-lists applied as hits are taken (:mod:`freshidx.serve.searcher` calls it on a pinned set)."""

from __future__ import annotations

import heapq
from typing import Any

import tantivy

from freshidx.serve.versions import Hit, KillLists, Shard, VersionSet


def search_set(snap: VersionSet, q: tantivy.Query, k: int) -> list[Hit]:
    """Lazy k-way merge of per-shard top lists; stored docs are fetched only for hits we may return."""
    streams: list[ShardStream] = []
    for index, version, part, kill in snap.searched:
        for sh in part.shards:
            if sh.doc_count:
                streams.append(ShardStream(index, version, sh, q, k, kill))
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


class ShardStream:
    """The hits of one shard in score order, fetched ``limit`` at a time (growing if the kill-list
    eats into them)."""

    def __init__(self, index: str, version: str, shard: Shard, q: tantivy.Query, k: int,
                 kill: KillLists) -> None:
        self.index, self.version, self.shard, self.q, self.kill = index, version, shard, q, kill
        self.limit = k
        self.pos = 0
        self.hits = self._run()

    def _run(self) -> list[tuple[float, Any]]:
        return list(self.shard.searcher.search(self.q, limit=self.limit, count=False).hits)

    def peek(self) -> float | None:
        if self.pos >= len(self.hits) and len(self.hits) == self.limit:
            self.limit *= 4  # more may exist: fetch a longer list, keep our place
            self.hits = self._run()
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
