"""Record payloads that depend only on their offset, so a reader can check any record it gets back (also imported by
the crash child of tests/test_storage.py), and frames built from broker/storage/record.py's documented layout.

The frame builders below are written from the layout's description (record.py's docstring: the header struct, a
CRC-32C of everything after the crc field), not with the storage code's own encoder, so that a test built on them
checks the layout itself and not the encoder against itself.
"""

from __future__ import annotations

import struct
from typing import Sequence

import google_crc32c

from broker.storage.record import HEADER, SIZE

# Where each header field starts, from the header's struct ("<IIQQIIQQQ": little-endian, so no padding). The mark is
# stored as (producer + 1, seq, logic offset), zeros when a frame has none.
HEADER_FIELDS = ("length", "crc", "offset", "ts_ms", "count", "tag", "producer1", "seq", "logic")
FIELD_AT = {name: struct.calcsize(HEADER.format[:1 + i]) for i, name in enumerate(HEADER_FIELDS)}
assert len(HEADER.format) == 1 + len(HEADER_FIELDS) and HEADER.format[0] == "<"


def payload(offset: int) -> bytes:
    return f"record-{offset}|".encode() * (1 + offset % 5)


def payloads(first: int, count: int) -> list[bytes]:
    """payload(first), payload(first + 1), ...: the records of a batch appended at `first`."""
    return [payload(first + i) for i in range(count)]


def framed_records(items: Sequence[bytes]) -> bytes:
    """Records as a frame holds them: each behind its u32 size."""
    return b"".join(SIZE.pack(len(p)) + p for p in items)


def frame_bytes(items: Sequence[bytes]) -> int:
    """Bytes a frame of these records occupies in a segment file: its header, then a size and the bytes of each."""
    return HEADER.size + sum(SIZE.size + len(p) for p in items)


def encode_frame(items: Sequence[bytes], first_offset: int, ts_ms: int, tag: int = 0, count: int | None = None,
                 records: bytes | None = None, mark: tuple[int, int, int] = (0, 0, 0)) -> bytes:
    """A whole frame as the layout describes it, with a valid CRC. `count` and `records` override what is derived
    from `items`, to build frames whose CRC is right but whose content is not (a zero count, say). `mark`: the
    header's last three fields as stored."""
    records = framed_records(items) if records is None else records
    count = len(items) if count is None else count
    unsigned = HEADER.pack(len(records), 0, first_offset, ts_ms, count, tag, *mark)
    crc = google_crc32c.value(unsigned[FIELD_AT["offset"]:] + records)   # the CRC covers the offset field on
    return HEADER.pack(len(records), crc, first_offset, ts_ms, count, tag, *mark) + records
