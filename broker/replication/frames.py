"""The body of a fetch answer (``GET /v1/replica/{pq}``): the leader's runs of records, each as one header and its
records as storage keeps them (``storage.record``: size u32, then the bytes), so neither side does work per record.

    offset  u64  physical offset of the run's first record
    ts_ms   u64  the append time the leader stored (a copy keeps it)
    count   u32  records in the run, at least 1
    tag     u32  the records' form (broker/codec.py TAG_*)
    length  u32  bytes of records that follow

All little-endian; runs follow one another, in offset order.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from ..storage import Run

HEADER = struct.Struct("<QQIII")
CONTENT_TYPE = "application/x-stator-runs"
RUNS_BYTES_MAX = 8 * 1024 * 1024 + 64 * 1024   # a fetch's answer: the reader's 8 MiB and headers


class FramesError(ValueError):
    """A fetch answer that is not a sequence of whole runs."""


def encode(runs: Iterable[Run]) -> bytes:
    out = bytearray()
    for r in runs:
        out += HEADER.pack(r.offset, r.ts_ms, r.count, r.tag, len(r.records))
        out += r.records
    return bytes(out)


def decode(body: bytes) -> list[Run]:
    runs, pos = [], 0
    while pos < len(body):
        if len(body) - pos < HEADER.size:
            raise FramesError("a run's header is cut short")
        offset, ts_ms, count, tag, length = HEADER.unpack_from(body, pos)
        pos += HEADER.size
        if count < 1 or len(body) - pos < length:
            raise FramesError("a run is cut short or holds no record")
        runs.append(Run(offset, ts_ms, count, tag, body[pos:pos + length]))
        pos += length
    for a, b in zip(runs, runs[1:]):
        if b.offset != a.offset + a.count:
            raise FramesError("runs are not contiguous")
    return runs
