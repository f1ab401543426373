"""An object's lines read in Arrow blocks answer as the rule read line by line (byte-order mark, CRLF, blank
and whitespace-only lines, bad UTF-8, no final newline, lines across read chunks)."""

from __future__ import annotations

import io
import random

import pyarrow as pa
import pytest

from freshidx.spark.object_lines import ARROW_SCHEMA, BOM, line_batches


def _by_the_rule(data: bytes) -> list[tuple[int, str, bool, bytes | None]]:
    """The documented reading, one physical line at a time (``raw_source``'s module docstring)."""
    out = []
    pieces = data.split(b"\n")
    if pieces and pieces[-1] == b"":
        pieces.pop()  # the newline ends the last line; it does not start another
    for number, line in enumerate(pieces, start=1):
        if number == 1 and line.startswith(BOM):
            line = line[len(BOM):]
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line.strip():
            continue
        try:
            out.append((number, line.decode("utf-8"), False, None))
        except UnicodeDecodeError:
            out.append((number, line.decode("utf-8", errors="replace"), True, line))
    return out


def _read(data: bytes, head: int, chunk: int, batch_rows: int) -> list[tuple[int, str, bool, bytes | None]]:
    stream = io.BytesIO(data[head:])
    batches = list(line_batches(stream, data[:head], "k", "p", batch_rows=batch_rows, chunk_bytes=chunk))
    assert all(b.schema == ARROW_SCHEMA and 0 < b.num_rows <= batch_rows for b in batches)
    table = pa.Table.from_batches(batches, schema=ARROW_SCHEMA)
    assert set(table.column("partition").to_pylist()) <= {"p"} and set(table.column("file").to_pylist()) <= {"k"}
    assert table.column("object_error").null_count == table.num_rows
    return list(zip(table.column("line").to_pylist(), table.column("raw").to_pylist(),
                    table.column("bad_encoding").to_pylist(), table.column("original").to_pylist(), strict=True))


_PIECES = [b'{"ad_id":"a1"}', b"", b" ", b"\t \x0b\x0c", b"\r", b"\r\r", b"x\r", b"x\r\r", b" x ", BOM, BOM + b"y",
           BOM + BOM, b"\xff\xfe", b"caf\xc3\xa9", b"\xc3", b"\xe2\x82\xac\r", b"\x00", b"\xc2\xa0", b"\x85"]


@pytest.mark.parametrize("seed", range(40))
def test_blocks_read_as_the_rule(seed: int) -> None:
    rng = random.Random(seed)
    lines = [b"".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(0, 30))]
    data = b"\n".join(lines) + rng.choice([b"", b"\n", b"\r\n", b"\n\n"])
    if rng.random() < 0.3:
        data = BOM + data
    head, chunk, batch_rows = rng.randint(0, 8), rng.choice([1, 2, 5, 64, 1 << 20]), rng.choice([1, 3, 8192])
    assert _read(data, min(head, len(data)), chunk, batch_rows) == _by_the_rule(data)


def test_a_block_of_good_lines_and_a_block_with_a_bad_one() -> None:
    """Only the block holding the bad line is read line by line; the numbers run on across blocks."""
    good = b"".join(b'{"n":%d}\n' % i for i in range(50))
    data = good + b"\xff\n" + good
    assert _read(data, 0, len(good), 8192) == _by_the_rule(data)
    assert [n for n, _, bad, _ in _read(data, 0, len(good), 8192) if bad] == [51]


def test_empty_and_blank_objects() -> None:
    assert _read(b"", 0, 4, 10) == []
    assert _read(b"\n\n \r\n", 0, 4, 10) == []
    assert _read(BOM, 0, 4, 10) == []
    assert _read(b"x", 0, 4, 10) == [(1, "x", False, None)]
