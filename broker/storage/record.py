"""Record framing: how one record lies in a segment file. No I/O here.

    length  u32  payload bytes
    crc     u32  CRC-32 (zlib) of everything after it: offset, ts_ms and payload
    offset  u64  physical offset of this record
    ts_ms   u64  append time in milliseconds
    payload      `length` opaque bytes

All little-endian. The offset is stored in every record so that a scan can tell a stale or misplaced record
from the expected one, and the CRC covers it so that a torn or rotten header is caught like a torn payload.
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple, Sequence

from . import limits
from .errors import InvalidArgument

HEADER = struct.Struct("<IIQQ")
HEADER_BYTES = HEADER.size
_CRC_FROM = 8  # the CRC covers the header from the offset field on
_LENGTH_CRC = struct.Struct("<II")   # the header up to _CRC_FROM
_OFFSET_TS = struct.Struct("<QQ")    # the rest of it, which the CRC covers

assert _LENGTH_CRC.size == _CRC_FROM and _CRC_FROM + _OFFSET_TS.size == HEADER_BYTES

assert HEADER_BYTES == limits.RECORD_HEADER_BYTES

# Why parse() stopped.
STOP_LIMIT = 0  # a record or byte budget was reached
STOP_SHORT = 1  # the buffer ends before the next whole record
STOP_BAD = 2    # the next record is invalid: length out of bounds, wrong offset or CRC mismatch


class Record(NamedTuple):
    offset: int
    ts_ms: int
    payload: bytes


def encode_batch(payloads: Sequence[bytes], first_offset: int, ts_ms: int) -> tuple[bytes, list[int]]:
    """Frames a batch into one buffer (one write() for the whole batch) and returns it with each record's start.

    The caller has checked the batch's count and sizes; nothing is written here, so a type error leaves no trace.
    Each record's CRC runs over its offset and ts fields, then on over the payload where it lies: no copy of the
    payload into a frame before its CRC, and one join of all the parts at the end (a third less time holding the
    GIL per batch than packing into a preallocated buffer through memoryview slices)."""
    parts: list[bytes] = []
    add = parts.append
    pack_head = _LENGTH_CRC.pack
    pack_tail = _OFFSET_TS.pack
    crc32 = zlib.crc32
    starts = []
    pos = 0
    offset = first_offset
    for payload in payloads:
        if type(payload) is not bytes and not isinstance(payload, (bytes, bytearray)):
            raise InvalidArgument("payloads must be bytes", type=type(payload).__name__)
        tail = pack_tail(offset, ts_ms)
        add(pack_head(len(payload), crc32(payload, crc32(tail))))
        add(tail)
        add(payload)
        starts.append(pos)
        pos += HEADER_BYTES + len(payload)
        offset += 1
    return b"".join(parts), starts


def parse(buf: bytes, pos: int, offset: int, want_from: int, records_max: int, bytes_budget: int,
          out: list[Record]) -> tuple[int, int, int, int]:
    """Decodes whole records from buf[pos:], the first of which must carry `offset`.

    Records below `want_from` are checked and skipped; the others are appended to `out` until `out` holds
    `records_max` records or the next payload exceeds `bytes_budget` (unless `out` is still empty).
    Returns (position of the first record not taken, its offset, the remaining budget, STOP_*)."""
    view = memoryview(buf)
    size = len(buf)
    unpack = HEADER.unpack_from
    crc32 = zlib.crc32
    try:
        while True:
            if size - pos < HEADER_BYTES:
                return pos, offset, bytes_budget, STOP_SHORT
            length, crc, record_offset, ts_ms = unpack(buf, pos)
            if length > limits.RECORD_BYTES_MAX or record_offset != offset:
                return pos, offset, bytes_budget, STOP_BAD
            end = pos + HEADER_BYTES + length
            if end > size:
                return pos, offset, bytes_budget, STOP_SHORT
            if crc32(view[pos + _CRC_FROM:end]) != crc:
                return pos, offset, bytes_budget, STOP_BAD
            if offset >= want_from:
                if length > bytes_budget and out:
                    return pos, offset, bytes_budget, STOP_LIMIT
                out.append(Record(offset, ts_ms, buf[pos + HEADER_BYTES:end]))
                bytes_budget -= length
                if len(out) >= records_max:
                    return end, offset + 1, bytes_budget, STOP_LIMIT
            pos = end
            offset += 1
    finally:
        view.release()


def frame_bytes_at(buf: bytes, pos: int) -> int:
    """Bytes the record starting at buf[pos] occupies, as far as its header can tell (a header's worth if cut)."""
    if len(buf) - pos < HEADER_BYTES:
        return HEADER_BYTES
    length = HEADER.unpack_from(buf, pos)[0]
    return HEADER_BYTES + min(length, limits.RECORD_BYTES_MAX)
