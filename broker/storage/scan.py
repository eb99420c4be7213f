"""Scanning a segment file record by record: recovery of the last file and rebuilding or extending an index."""

from __future__ import annotations

import os
from typing import NamedTuple

from . import limits
from .index import SparseIndex
from .record import HEADER_BYTES, STOP_BAD, STOP_SHORT, Record, frame_bytes_at, parse

_UNBOUNDED = 2**63


class ScanResult(NamedTuple):
    end_pos: int            # position just after the last whole valid record
    end_offset: int         # offset the next record would carry
    last_ts: int | None     # timestamp of the last valid record seen by this scan
    whole: bool             # True when valid records fill the file exactly up to `file_bytes`


def scan(fd: int, file_bytes: int, index: SparseIndex, base: int, start_pos: int = 0,
         start_offset: int | None = None) -> ScanResult:
    """Checks every record from start_pos on (length, offset, CRC), feeding each one to `index`.

    Stops at the first record that is cut short by the end of the file or invalid; never raises on content."""
    pos = start_pos
    offset = base if start_offset is None else start_offset
    last_ts = None
    want = limits.SCAN_CHUNK_BYTES
    while pos < file_bytes:
        buf = os.pread(fd, min(want, file_bytes - pos), pos)
        if not buf:
            break
        records: list[Record] = []
        used, offset, _, stop = parse(buf, 0, offset, 0, _UNBOUNDED, _UNBOUNDED, records)
        if records:
            _feed(index, records, base, pos)
            last_ts = records[-1].ts_ms
        pos += used
        if stop == STOP_BAD:
            break
        if stop == STOP_SHORT and used == 0:
            need = frame_bytes_at(buf, 0)
            if need <= len(buf) or pos + need > file_bytes:
                break  # a torn record at the end of the file
            want = max(need, limits.SCAN_CHUNK_BYTES)
        else:
            want = limits.SCAN_CHUNK_BYTES
    return ScanResult(pos, offset, last_ts, pos == file_bytes)


def _feed(index: SparseIndex, records: list[Record], base: int, chunk_pos: int) -> None:
    # Group runs of equal timestamps so the index sees them exactly as the appends that wrote them.
    starts: list[int] = []
    run_ts = records[0].ts_ms
    run_rel = records[0].offset - base
    pos = chunk_pos
    for record in records:
        if record.ts_ms != run_ts:
            index.add_batch(run_rel, starts, 0, run_ts)
            starts = []
            run_ts, run_rel = record.ts_ms, record.offset - base
        starts.append(pos)
        pos += HEADER_BYTES + len(record.payload)
    index.add_batch(run_rel, starts, 0, run_ts)
