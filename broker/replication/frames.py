"""The binary messages of a replica stream and the body of a fetch answer (``POST /v1/replica``): for each physical
queue with records past the offset the follower stands at, the producers' batches the records belong to, then the
runs of records, each as one header and its records as storage keeps them (``storage.record``: size u32, then the
bytes), so neither side does work per record.

    per queue:
    name    u16 length, then the physical queue's name (UTF-8)
    end     u64  the sending broker's end of the queue (durable for a fetch; written, for a stream)
    batches u32  how many batch entries follow, each: producer u64, seq u64, first u64 (logic offset), count u32
    runs    u32  how many runs follow, each:
        offset  u64  physical offset of the run's first record
        ts_ms   u64  the append time the leader stored (a copy keeps it)
        count   u32  records in the run, at least 1
        tag     u32  the records' form (broker/codec.py TAG_*)
        length  u32  bytes of records that follow

All little-endian; a queue's runs follow one another, in offset order. Batches carry no gen: the physical queue
names it, and the follower knows it.

The follower's messages on a stream (``encode_positions``): where each copy it names stands on its side, binary too
(as JSON checked by the API's models, they cost a leader a tenth of its time on the stream at replicas=3):

    flags   u8   1: the message names every copy the follower takes from this broker (``full``), else 0
    count   u32  how many queues follow, at most POSITIONS_MAX, each:
        name    u16 length, then the physical queue's name (UTF-8, 1 to NAME_BYTES_MAX bytes)
        offset  u64  what the follower holds durably (its acknowledgement)
        next    u64  what it has written: where the leader's records go on from; at least ``offset``
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

from ..producers import Batch
from ..storage import Run

NAME = struct.Struct("<H")
END = struct.Struct("<Q")
COUNT = struct.Struct("<I")
BATCH = struct.Struct("<QQQI")
HEADER = struct.Struct("<QQIII")
BATCHES_MAX = 100_000
FLAGS = struct.Struct("<BI")
POSITION = struct.Struct("<QQ")
FULL = 1
POSITIONS_MAX = 20_000      # queues one stream names (more are not copied from that broker)
NAME_BYTES_MAX = 255
OFFSET_MAX = 2**62
POSITIONS_BYTES_MAX = FLAGS.size + POSITIONS_MAX * (NAME.size + NAME_BYTES_MAX + POSITION.size)   # 5.5 MB
CONTENT_TYPE = "application/x-stator-runs"
ANSWER_BYTES_MAX = 16 * 1024 * 1024 + 1024 * 1024   # the source's read budget and its headers


class FramesError(ValueError):
    """A fetch answer that is not a sequence of whole sections and runs."""


class Section(NamedTuple):
    physical_queue: str
    end: int
    batches: list[tuple[int, int, int, int]]   # (producer, seq, first, count): Batch without its gen
    runs: list[Run]


def encode(sections: Sequence[Section]) -> bytes:
    parts: list[bytes] = []   # joined once: the records (most of the bytes) are copied once, not per concatenation
    for s in sections:
        name = s.physical_queue.encode()
        parts += (NAME.pack(len(name)), name, END.pack(s.end), COUNT.pack(len(s.batches)))
        parts += (BATCH.pack(*b) for b in s.batches)
        parts.append(COUNT.pack(len(s.runs)))
        for r in s.runs:
            parts += (HEADER.pack(r.offset, r.ts_ms, r.count, r.tag, len(r.records)), r.records)
    return b"".join(parts)


def decode(body: bytes) -> list[Section]:
    sections, pos = [], 0

    def take(st: struct.Struct) -> tuple:
        nonlocal pos
        if len(body) - pos < st.size:
            raise FramesError("an answer cut short")
        values = st.unpack_from(body, pos)
        pos += st.size
        return values

    while pos < len(body):
        (n,) = take(NAME)
        if len(body) - pos < n:
            raise FramesError("a queue's name is cut short")
        name = body[pos:pos + n].decode()
        pos += n
        (end,) = take(END)
        (nb,) = take(COUNT)
        if nb > BATCHES_MAX:
            raise FramesError("too many batch entries")
        batches = [take(BATCH) for _ in range(nb)]
        (nr,) = take(COUNT)
        runs: list[Run] = []
        for _ in range(nr):
            offset, ts_ms, count, tag, length = take(HEADER)
            if count < 1 or len(body) - pos < length:
                raise FramesError("a run is cut short or holds no record")
            runs.append(Run(offset, ts_ms, count, tag, body[pos:pos + length]))
            pos += length
        for a, b in zip(runs, runs[1:]):
            if b.offset != a.offset + a.count:
                raise FramesError("runs are not contiguous")
        sections.append(Section(name, end, batches, runs))
    return sections


class Position(NamedTuple):
    physical_queue: str
    offset: int   # held durably by the follower
    next: int     # written by the follower


def encode_positions(positions: Sequence[Position], full: bool) -> bytes:
    parts = [FLAGS.pack(FULL if full else 0, len(positions))]
    for p in positions:
        name = p.physical_queue.encode()
        parts += (NAME.pack(len(name)), name, POSITION.pack(p.offset, p.next))
    return b"".join(parts)


def decode_positions(body: bytes) -> tuple[list[Position], bool]:
    """A follower's message: (the positions it names, ``full``). FramesError unless it is exactly one whole message
    within the bounds above."""
    if len(body) < FLAGS.size:
        raise FramesError("a positions message cut short")
    flags, count = FLAGS.unpack_from(body, 0)
    if flags not in (0, FULL) or count > POSITIONS_MAX:
        raise FramesError(f"positions: flags must be 0 or {FULL} and at most {POSITIONS_MAX} queues")
    pos, out = FLAGS.size, []
    for _ in range(count):
        if len(body) - pos < NAME.size:
            raise FramesError("a positions message cut short")
        (n,) = NAME.unpack_from(body, pos)
        pos += NAME.size
        if not 0 < n <= NAME_BYTES_MAX or len(body) - pos < n + POSITION.size:
            raise FramesError(f"a queue's name must hold 1 to {NAME_BYTES_MAX} bytes, then its offsets")
        try:
            name = body[pos:pos + n].decode()
        except UnicodeDecodeError:
            raise FramesError("a queue's name is not UTF-8") from None
        offset, written = POSITION.unpack_from(body, pos + n)
        pos += n + POSITION.size
        if not offset <= written <= OFFSET_MAX:
            raise FramesError(f"offset <= next <= {OFFSET_MAX}")
        out.append(Position(name, offset, written))
    if pos != len(body):
        raise FramesError("bytes after the last position")
    return out, flags == FULL


def with_gen(batches: list[tuple[int, int, int, int]], gen: int) -> list[Batch]:
    return [Batch(p, s, f, c, gen) for p, s, f, c in batches]
