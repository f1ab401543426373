"""An object's bytes as numbered lines in Arrow record batches (:data:`ARROW_SCHEMA`), the way
:mod:`freshidx.spark.raw_source` describes them: 1-based physical line numbers (blank lines skipped but
counted), one trailing ``\\r`` dropped, a UTF-8 byte-order mark at the start of the object dropped, a line
that is not valid UTF-8 decoded with replacements, flagged ``bad_encoding`` and kept byte for byte in
``original``.

A block of whole lines is split, checked and turned into columns by Arrow at once (:func:`_block_batches`);
only a block holding a line that is not valid UTF-8 is read line by line in Python (:func:`_per_line`),
the reference ``freshidx_tests/spark/test_object_lines.py`` compares both with.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from freshidx.spark.string_buffers import string_layout

# Exactly what Spark expects back from a Python data source or mapInArrow (string, not large_string).
ARROW_SCHEMA = pa.schema(
    [
        pa.field("partition", pa.string()),
        pa.field("file", pa.string()),
        pa.field("line", pa.int64()),
        pa.field("raw", pa.string()),
        pa.field("bad_encoding", pa.bool_()),
        pa.field("original", pa.binary()),
        pa.field("object_error", pa.string()),
    ]
)

BATCH_ROWS = 8192
READ_CHUNK_BYTES = 4 * 1024 * 1024
BOM = b"\xef\xbb\xbf"
#: ASCII whitespace as ``bytes.strip()`` knows it: a line of only these is blank.
_SPACE = frozenset(b" \t\n\r\x0b\x0c")
_SPACE_BYTES = np.zeros(256, bool)
_SPACE_BYTES[list(_SPACE)] = True


def line_batches(stream: Any, head: bytes, key: str, partition_path: str, batch_rows: int = BATCH_ROWS,
                 chunk_bytes: int = READ_CHUNK_BYTES) -> Iterator[pa.RecordBatch]:
    """The non-blank lines of ``head`` followed by the rest of the binary ``stream``, in batches of at
    most ``batch_rows`` rows, read ``chunk_bytes`` at a time."""
    before = 0  # lines of the object before the block
    rest = b""
    chunk = head
    while True:
        if not chunk:
            chunk = stream.read(chunk_bytes)
            if not chunk:
                break
        data, chunk = rest + chunk, b""
        cut = data.rfind(b"\n")
        if cut < 0:
            rest = data
            continue
        rest = data[cut + 1:]
        yield from _block_batches(data[:cut], before, key, partition_path, batch_rows)
        before += data.count(b"\n", 0, cut) + 1
    if rest:
        yield from _block_batches(rest, before, key, partition_path, batch_rows)


def _block_batches(block: bytes, before: int, key: str, partition_path: str,
                   batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The lines of ``block`` (whole lines, the object's lines ``before + 1 ...``)."""
    body = block[len(BOM):] if before == 0 and block.startswith(BOM) else block
    lines = pc.split_pattern(pa.array([body], pa.binary()), "\n").values
    try:
        texts = lines.cast(pa.string())  # validates the UTF-8 of every line at once
    except pa.ArrowInvalid:
        yield from _per_line(((before + n, line) for n, line in enumerate(block.split(b"\n"), start=1)),
                             key, partition_path, batch_rows)
        return
    numbers = np.arange(before + 1, before + 1 + len(texts), dtype=np.int64)
    texts, keep = _trimmed(texts)
    if keep is not None:
        texts, numbers = texts.filter(pa.array(keep)), numbers[keep]
    n = len(texts)
    columns = [pa.repeat(pa.scalar(partition_path, pa.string()), n), pa.repeat(pa.scalar(key, pa.string()), n),
               pa.array(numbers, pa.int64()), texts, pa.repeat(pa.scalar(False), n), pa.nulls(n, pa.binary()),
               pa.nulls(n, pa.string())]
    whole = pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
    for start in range(0, n, batch_rows):
        yield whole.slice(start, batch_rows)


def _trimmed(texts: pa.Array) -> tuple[pa.Array, np.ndarray | None]:
    """``texts`` less one trailing ``\\r`` each, and which are not blank (``None``: all of them)."""
    offsets, data = string_layout(texts)
    lengths = np.diff(offsets)
    last = np.zeros(len(texts), np.uint8)
    last[lengths > 0] = data[offsets[1:][lengths > 0] - 1]
    cr = last == 0x0D
    if cr.any():  # rare: CRLF files
        texts = pc.if_else(pa.array(cr), pc.utf8_slice_codeunits(texts, 0, -1), texts)
        offsets, data = string_layout(texts)
        lengths = np.diff(offsets)
    # A line whose first byte is not whitespace is not blank; the few others are settled one by one.
    first = np.zeros(len(texts), np.uint8)
    first[lengths > 0] = data[offsets[:-1][lengths > 0]]
    maybe = np.flatnonzero((lengths == 0) | _SPACE_BYTES[first])
    if len(maybe) == 0:
        return texts, None
    keep = np.ones(len(texts), bool)
    for i in maybe:
        keep[i] = bool(texts[int(i)].as_py().encode().strip())
    return texts, keep


def _per_line(numbered: Iterable[tuple[int, bytes]], key: str, partition_path: str,
              batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The lines of ``numbered`` (``(line number, bytes)``) one by one: for a block with a line that is not
    valid UTF-8."""
    lines: list[int] = []
    raws: list[str] = []
    bad: list[bool] = []
    originals: list[bytes | None] = []

    def flush() -> pa.RecordBatch:
        n = len(lines)
        batch = pa.RecordBatch.from_arrays(
            [pa.array([partition_path] * n, pa.string()), pa.array([key] * n, pa.string()),
             pa.array(lines, pa.int64()), pa.array(raws, pa.string()), pa.array(bad, pa.bool_()),
             pa.array(originals, pa.binary()), pa.nulls(n, pa.string())],
            schema=ARROW_SCHEMA,
        )
        lines.clear()
        raws.clear()
        bad.clear()
        originals.clear()
        return batch

    for number, data in numbered:
        if number == 1 and data.startswith(BOM):
            data = data[len(BOM):]
        if data.endswith(b"\r"):
            data = data[:-1]
        if not data.strip():
            continue
        try:
            text, is_bad, original = data.decode("utf-8"), False, None
        except UnicodeDecodeError:
            text, is_bad, original = data.decode("utf-8", errors="replace"), True, data
        lines.append(number)
        raws.append(text)
        bad.append(is_bad)
        originals.append(original)
        if len(lines) >= batch_rows:
            yield flush()
    if lines:
        yield flush()
