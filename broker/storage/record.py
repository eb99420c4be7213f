"""Frame layout: how one appended batch lies in a segment file. No I/O here.

Each append writes one frame, as Kafka's log holds a producer's record batch and not its records one by one:

    length  u32  bytes of the records that follow the header
    crc     u32  CRC-32C of everything after it: offset, ts_ms, count, tag and the records
    offset  u64  physical offset of the frame's first record; the others follow it one by one
    ts_ms   u64  append time of every record of the frame, in milliseconds
    count   u32  records in the frame, at least 1
    tag     u32  the owner's: storage keeps it with the frame and hands it back (the broker says which form its
                 records are in)
    mark    3 x u64  the owner's too (``ProducerMark``): the idempotent producer whose batch the frame holds, its
                 batch number and the logic offset of its first record, or zeros; handed back by a recovery scan,
                 so a batch whose records outlived a crash is known by its producer even when the broker's own
                 account of it did not (broker/producer_journal.py)
    records      `count` times: size u32, then `size` opaque bytes

All little-endian. The records are laid out as a ``wire.batch`` SEND batch lays out its own, so a broker appends a
producer's records as they came: its work per batch is a header and one CRC, none per record. The offset is stored so
that a scan can tell a stale or misplaced frame from the expected one, and the CRC covers it so that a torn or rotten
header is caught like torn records.

A read hands back ``Run``s: the records a reader wanted of one frame, still framed (``records_of`` takes them apart),
so that a reader that forwards them as they are (a binary pull) does no work per record either.
"""

from __future__ import annotations

import struct
from typing import NamedTuple, Sequence

import google_crc32c

from . import limits
from .errors import InvalidArgument, RecordTooLarge

HEADER = struct.Struct("<IIQQIIQQQ")
HEADER_BYTES = HEADER.size
_CRC_FROM = 8                         # the CRC covers the header from the offset field on
_COVERED = struct.Struct("<QQIIQQQ")  # offset, ts_ms, count, tag, mark: the header fields the CRC covers
_MARK = struct.Struct("<QQQ")
_MARK_AT = HEADER_BYTES - _MARK.size
SIZE = struct.Struct("<I")
SIZE_BYTES = SIZE.size

assert HEADER_BYTES == limits.FRAME_HEADER_BYTES and SIZE_BYTES == limits.RECORD_SIZE_BYTES
assert _CRC_FROM + _COVERED.size == HEADER_BYTES

# Why a parse stopped.
STOP_LIMIT = 0  # a record or byte budget was reached
STOP_SHORT = 1  # the buffer ends before the next whole frame
STOP_BAD = 2    # the next frame is invalid: a length or count out of bounds, the wrong offset or a CRC mismatch


class Record(NamedTuple):
    offset: int
    ts_ms: int
    payload: bytes


class ProducerMark(NamedTuple):
    """Which idempotent producer's batch a frame holds: stored as ``producer + 1`` (0: none, and 0 is an id a
    producer may draw), ``seq`` and the logic offset of the frame's first record (storage knows no logic offsets)."""
    producer: int
    seq: int
    logic: int


class Run(NamedTuple):
    """Records `offset` .. `offset + count - 1` of one frame, framed as stored (size u32, bytes)."""
    offset: int
    ts_ms: int
    count: int
    tag: int
    records: bytes

    @property
    def payload_bytes(self) -> int:
        return len(self.records) - SIZE_BYTES * self.count


def crc(data) -> int:
    """CRC-32C: the CPU's own instruction through google-crc32c, a tenth of zlib's CRC-32 on a batch."""
    # Harmless mutant: any change here (no broker code calls crc(); frame_header and frame_at call google_crc32c).
    return google_crc32c.value(data)


def pack_records(payloads: Sequence[bytes]) -> bytes:
    """Payloads framed as a frame's records. The caller has checked their types and sizes."""
    pack = SIZE.pack
    parts: list[bytes] = []
    add = parts.append
    for payload in payloads:
        # Harmless mutant: ``type(None) is not bytes`` (the first test is a shortcut for the common case).
        if type(payload) is not bytes and not isinstance(payload, (bytes, bytearray)):
            raise InvalidArgument("payloads must be bytes", type=type(payload).__name__)
        add(pack(len(payload)))
        add(payload)
    return b"".join(parts)


def frame_header(records: bytes, count: int, first_offset: int, ts_ms: int, tag: int,
                 mark: ProducerMark | None = None) -> bytes:
    """The header of a frame of `count` records (as pack_records lays them out) at `first_offset`."""
    m = (mark.producer + 1, mark.seq, mark.logic) if mark is not None else (0, 0, 0)
    covered = _COVERED.pack(first_offset, ts_ms, count, tag, *m)
    return HEADER.pack(len(records), google_crc32c.extend(google_crc32c.value(covered), records),
                       first_offset, ts_ms, count, tag, *m)


def mark_at(buf: bytes, pos: int) -> ProducerMark | None:
    """The mark of the whole, valid frame at buf[pos] (``frame_at`` checked it), or None when it has none."""
    producer1, seq, logic = _MARK.unpack_from(buf, pos + _MARK_AT)
    return ProducerMark(producer1 - 1, seq, logic) if producer1 else None


def check_records(records: bytes, count: int) -> None:
    """Refuses `records` unless they are exactly `count` sized records (what an append of prebuilt records must be),
    none past limits.RECORD_BYTES_MAX."""
    pos, end = 0, len(records)
    unpack = SIZE.unpack_from
    try:
        for _ in range(count):
            (size,) = unpack(records, pos)
            if size > limits.RECORD_BYTES_MAX:
                raise RecordTooLarge(f"a record holds at most {limits.RECORD_BYTES_MAX} bytes", record_bytes=size)
            pos += SIZE_BYTES + size
    except struct.error:
        pos = end + 1   # harmless mutants: any position but end (None, end - 1, end + 2) refuses the same
    if pos != end:
        raise InvalidArgument(f"records must be {count} records, each behind its u32 size, and nothing else")


def records_of(run: Run) -> list[Record]:
    """The run's records, each with its offset and the frame's time."""
    out: list[Record] = []
    buf, pos, offset, ts = run.records, 0, run.offset, run.ts_ms
    unpack = SIZE.unpack_from
    for _ in range(run.count):
        (size,) = unpack(buf, pos)
        pos += SIZE_BYTES
        out.append(Record(offset, ts, buf[pos:pos + size]))
        pos += size
        offset += 1
    return out


def frame_at(buf: bytes, pos: int, offset: int) -> tuple[int, int, int, int, int]:
    """The frame at buf[pos], which must start at `offset`: (STOP_* or -1 when whole and valid, count, ts_ms, tag,
    end position). Checks the bounds, the offset and the CRC; the records inside are the writer's."""
    # Harmless mutants: ``<=`` (a header alone is short of its frame, found below all the same); the fields after
    # STOP_SHORT or STOP_BAD, which no caller reads; -2 for -1 (callers test ``>= 0``).
    if len(buf) - pos < HEADER_BYTES:
        return STOP_SHORT, 0, 0, 0, 0
    length, said_crc, frame_offset, ts_ms, count, tag, _, _, _ = HEADER.unpack_from(buf, pos)
    if (length > limits.FRAME_BYTES_MAX or frame_offset != offset or not 0 < count <= limits.BATCH_RECORDS_MAX
            or length < SIZE_BYTES * count):
        return STOP_BAD, 0, 0, 0, 0
    end = pos + HEADER_BYTES + length
    if end > len(buf):
        return STOP_SHORT, 0, 0, 0, 0
    if google_crc32c.value(buf[pos + _CRC_FROM:end]) != said_crc:   # a slice: the C CRC takes only bytes
        return STOP_BAD, 0, 0, 0, 0
    return -1, count, ts_ms, tag, end


def parse(buf: bytes, pos: int, offset: int, want_from: int, records_max: int, bytes_budget: int,
          out: list[Run]) -> tuple[int, int, int, int, int]:
    """Takes records from the whole frames in buf[pos:], the first of which must start at `offset`.

    Records below `want_from` are skipped; the others are appended to `out` as runs until `records_max` records
    are taken or the next payload exceeds `bytes_budget` (unless `out` is still empty: a reader always gets a
    record). Returns (position of the frame holding the first record not taken, that frame's first offset, records
    taken, the remaining budget, STOP_*): a read that stops inside a frame resumes at the frame's start."""
    # Harmless mutants (each gives the same runs, stop and position): ``> 0`` or ``>= 1`` for ``>= 0`` (frame_at
    # answers -1, STOP_SHORT or STOP_BAD, never 0); ``<`` for ``<=`` against want_from (a frame ending there takes no
    # record and moves on) and ``>=`` for ``>`` (a skip of 0); ``skip != 0``, ``skip == 1`` or ``<`` against the
    # budget in the whole-frame test (the frame goes to _take_part, which takes the same records: the test is a
    # shortcut); ``taken > records_max`` (the next frame is taken from with want 0 and stops at its start).
    taken = 0
    while True:
        status, count, ts_ms, tag, end = frame_at(buf, pos, offset)
        if status >= 0:
            return pos, offset, taken, bytes_budget, status
        if offset + count <= want_from:
            pos, offset = end, offset + count
            continue
        start = pos + HEADER_BYTES
        skip = want_from - offset if want_from > offset else 0
        want = min(count - skip, records_max - taken)
        whole_payload = end - start - SIZE_BYTES * count
        if skip == 0 and want == count and whole_payload <= bytes_budget:
            out.append(Run(offset, ts_ms, count, tag, buf[start:end]))
            got, bytes_budget = count, bytes_budget - whole_payload
        else:
            got, bytes_budget = _take_part(buf, start, offset, skip, want, ts_ms, tag, bytes_budget, out)
        taken += got
        if skip + got < count:
            return pos, offset, taken, bytes_budget, STOP_LIMIT
        pos, offset = end, offset + count
        if taken >= records_max:
            return pos, offset, taken, bytes_budget, STOP_LIMIT


def _take_part(buf: bytes, start: int, offset: int, skip: int, want: int, ts_ms: int, tag: int,
               bytes_budget: int, out: list[Run]) -> tuple[int, int]:
    """Records skip .. skip + want - 1 of the frame whose records begin at buf[start], within the budget."""
    unpack = SIZE.unpack_from
    pos = start
    for _ in range(skip):
        pos += SIZE_BYTES + unpack(buf, pos)[0]
    first_pos = pos
    got = 0
    while got < want:
        (size,) = unpack(buf, pos)
        if size > bytes_budget and (out or got):
            break
        bytes_budget -= size
        pos += SIZE_BYTES + size
        got += 1
    if got:
        out.append(Run(offset + skip, ts_ms, got, tag, buf[first_pos:pos]))
    return got, bytes_budget


def frame_bytes_at(buf: bytes, pos: int) -> int:
    """Bytes the frame starting at buf[pos] occupies, as far as its header can tell (a header's worth if cut)."""
    if len(buf) - pos < HEADER_BYTES:
        return HEADER_BYTES
    length = HEADER.unpack_from(buf, pos)[0]
    return HEADER_BYTES + min(length, limits.FRAME_BYTES_MAX)
