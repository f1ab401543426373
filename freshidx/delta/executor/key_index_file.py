"""A state file's key index kept on the executor's local disk beside its mapped copy, memory-mapped by every
Python worker (docs/architecture.md#state-as-built).

Built from a ten-million-document state, the key indexes weigh ~850 MiB: kept decoded in each worker they
took most of its budget, and once the kept segments' indexes pushed the total past it, every micro-batch
rebuilt them all (seconds of hashing and sorting). Written once per machine and mapped, they cost each
worker nothing but the pages its lookups touch, which the page cache shares.

Format: ``MAGIC``, the header's length (8 bytes, little endian), a JSON header (row group sizes, flags, and
each array's dtype, length and offset), then each array, 64-byte aligned. A file appears only complete
(written aside, then renamed into place); one that does not parse is rebuilt.
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from freshidx.delta.executor.key_index import LAYOUT, KeyIndex

MAGIC = b"FXKEYS01"
#: The key file of a copy ``<name>.arrow`` is ``<name>.arrow.keys<LAYOUT>``: another layout is another file.
SUFFIX = f".keys{LAYOUT}"
_ALIGN = 64
_ARRAYS = tuple(f.name for f in dataclasses.fields(KeyIndex) if f.name not in
                ("row_group_sizes", "ads_unique", "products_unique", "mapped"))


def key_file(copy: Path) -> Path:
    return copy.with_name(copy.name + SUFFIX)


def save(index: KeyIndex, path: Path) -> None:
    """Write ``index`` to ``path`` (aside, then renamed into place)."""
    arrays: dict[str, np.ndarray] = {n: np.ascontiguousarray(a) for n in _ARRAYS
                                     if (a := getattr(index, n)) is not None}
    fields: dict[str, Any] = {}
    offset = 0
    for name, a in arrays.items():
        offset = -(-offset // _ALIGN) * _ALIGN
        fields[name] = {"dtype": a.dtype.str, "length": len(a), "offset": offset}
        offset += a.nbytes
    header = json.dumps({"row_group_sizes": [int(n) for n in index.row_group_sizes], "ads_unique": index.ads_unique,
                         "products_unique": index.products_unique, "fields": fields}).encode()
    start = -(-(len(MAGIC) + 8 + len(header)) // _ALIGN) * _ALIGN
    part = path.with_name(f".{path.name}.{uuid.uuid4().hex}.part")
    try:
        with open(part, "wb") as out:
            out.write(MAGIC + len(header).to_bytes(8, "little") + header)
            for name, a in arrays.items():
                out.seek(start + fields[name]["offset"])
                out.write(a.tobytes())
            out.truncate(start + offset)
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)


def load(path: Path) -> KeyIndex:
    """The index ``path`` holds, its arrays mapped (they stay valid after the file is deleted); ValueError if
    ``path`` is not a whole key index."""
    try:
        return _load(path)
    except (TypeError, KeyError, json.JSONDecodeError) as e:  # cut short, or not ours
        raise ValueError(f"{path}: not a key index ({e})") from e


def _load(path: Path) -> KeyIndex:
    os.utime(path)  # used now: the last to go (file_cache.evict)
    data = np.memmap(path, np.uint8, "r")
    if bytes(data[: len(MAGIC)]) != MAGIC:
        raise ValueError(f"{path}: not a key index")
    length = int.from_bytes(bytes(data[len(MAGIC): len(MAGIC) + 8]), "little")
    header = json.loads(bytes(data[len(MAGIC) + 8: len(MAGIC) + 8 + length]))
    start = -(-(len(MAGIC) + 8 + length) // _ALIGN) * _ALIGN
    arrays = {}
    for name, f in header["fields"].items():
        dtype = np.dtype(f["dtype"])
        begin = start + int(f["offset"])
        arrays[name] = np.ndarray((int(f["length"]),), dtype, data, begin) if f["length"] else np.zeros(0, dtype)
    return KeyIndex(row_group_sizes=header["row_group_sizes"], ads_unique=header["ads_unique"],
                    products_unique=header["products_unique"], mapped=True, **arrays)
