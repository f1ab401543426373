"""A string array's buffers as numpy views: its offsets and its UTF-8 bytes, without a copy.

For the vectorized readers of ids and texts (:mod:`freshidx.spark.object_lines`, :mod:`freshidx.spark.plain_lines`,
:mod:`freshidx.delta.executor.key_index`): value i is ``data[offsets[i]:offsets[i + 1]]``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["string_layout"]


def string_layout(texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The offsets (int32, ``len(texts) + 1`` of them, the array's own slice) and data bytes of a string array."""
    _, offsets, data = texts.buffers()
    return (np.frombuffer(offsets, np.int32, count=len(texts) + 1, offset=texts.offset * 4),
            np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8))
