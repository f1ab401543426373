"""Where a reader's refresh spends its time: the parts of ``published → searchable`` that are the reader's
(pointer reads, manifests, download and verification, tantivy open, kill-list load), recorded by
:class:`freshidx.serve.searcher.Searcher` for each refresh that swaps in new versions."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Literal

Step = Literal["pointers_s", "manifests_s", "download_s", "open_s", "kill_list_s"]


@dataclass
class RefreshTimings:
    """Seconds per step of one refresh; ``download_s`` includes the size and sha256 checks. A downloaded
    delta shard's kill-list is decoded on the fetching thread beside the other files: ``kill_list_s`` then
    runs inside ``download_s``'s wall time, not after it."""

    pointers_s: float = 0.0
    manifests_s: float = 0.0
    download_s: float = 0.0
    open_s: float = 0.0
    kill_list_s: float = 0.0
    total_s: float = 0.0
    downloaded_bytes: int = 0
    parts_loaded: int = 0

    @contextlib.contextmanager
    def timed(self, step: Step) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, step, getattr(self, step) + time.perf_counter() - t0)

    def as_dict(self) -> dict[str, float | int]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}
