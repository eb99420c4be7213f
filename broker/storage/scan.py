"""Scanning a segment file frame by frame: recovery of the last file and rebuilding or extending an index."""

from __future__ import annotations

import os
from collections import deque
from typing import NamedTuple

from . import limits
from .index import SparseIndex
from .record import STOP_BAD, ProducerMark, frame_at, frame_bytes_at, mark_at

# (physical offset, records, mark) of a frame that names its producer's batch
Marked = tuple[int, int, ProducerMark]


class ScanResult(NamedTuple):
    end_pos: int            # position just after the last whole valid frame
    end_offset: int         # offset the next record would carry
    last_ts: int | None     # timestamp of the last valid frame seen by this scan
    whole: bool             # True when valid frames fill the file exactly up to `file_bytes`


def scan(fd: int, file_bytes: int, index: SparseIndex, base: int, start_pos: int = 0,
         start_offset: int | None = None, marks: deque[Marked] | None = None) -> ScanResult:
    """Checks every frame from start_pos on (length, offset, count, CRC), feeding each one to `index`, and each
    one's producer mark to ``marks`` (a bounded deque keeps the last ones).

    Stops at the first frame that is cut short by the end of the file or invalid; never raises on content."""
    pos = start_pos
    offset = base if start_offset is None else start_offset
    last_ts = None
    want = limits.SCAN_CHUNK_BYTES
    # Harmless mutants: ``file_bytes + pos`` in the pread, and ``return`` for the ``break`` after it (every caller's
    # file_bytes is the file's size by fstat, and no file of a queue shrinks under its open: a read past file_bytes
    # brings no more, and an empty one never comes).
    while pos < file_bytes:
        buf = os.pread(fd, min(want, file_bytes - pos), pos)
        if not buf:
            break
        used = 0
        while True:
            status, count, ts_ms, _tag, end = frame_at(buf, used, offset)
            # Harmless mutants: ``> 0``, ``>= 1`` (frame_at answers -1, STOP_SHORT or STOP_BAD: never 0)
            if status >= 0:
                break
            index.add_frame(offset - base, pos + used, ts_ms)
            if marks is not None and (mark := mark_at(buf, used)) is not None:
                marks.append((offset, count, mark))
            last_ts = ts_ms
            offset += count
            used = end
        pos += used
        if status == STOP_BAD:
            break
        if used == 0:
            need = frame_bytes_at(buf, 0)
            # Harmless mutant: ``need < len(buf)`` (frame_at answered STOP_SHORT at 0: need is more than buf holds)
            if need <= len(buf) or pos + need > file_bytes:
                break  # a torn frame at the end of the file
            want = max(need, limits.SCAN_CHUNK_BYTES)
        else:
            want = limits.SCAN_CHUNK_BYTES
    return ScanResult(pos, offset, last_ts, pos == file_bytes)
