"""The sparse index of one segment file: offset -> file position, and time -> offset. No I/O here.

An entry (relative offset u32, position u32, ts_ms u64) is kept for the file's first record and then for the first
record at least `interval_bytes` or `interval_records` past the previous entry. Because storage keeps timestamps
non-decreasing (see PhysicalQueue.append), the same entries answer both lookups by binary search, so one small
file per segment serves as both the offset index and the time index. The rule depends only on record positions,
so an index rebuilt from the data equals the one built while appending.

Stored, the entries are followed by a CRC-32 of them: a flipped bit in an entry would otherwise send reads of a
healthy file to a position inside a record, and checking every entry against the data would cost a read each.
"""

from __future__ import annotations

import struct
import zlib
from array import array
from bisect import bisect_left, bisect_right

ENTRY = struct.Struct("<IIQ")
ENTRY_BYTES = ENTRY.size
TRAILER = struct.Struct("<I")


class SparseIndex:
    __slots__ = ("rels", "positions", "times", "interval_bytes", "interval_records")

    def __init__(self, interval_bytes: int, interval_records: int):
        # Harmless mutants: "q" for "Q" (signed: every entry is below 2**63, offsets and positions both)
        self.rels = array("Q")
        self.positions = array("Q")
        self.times = array("Q")
        self.interval_bytes = interval_bytes
        self.interval_records = interval_records

    def __len__(self) -> int:
        return len(self.rels)

    def add_frame(self, rel: int, pos: int, ts_ms: int) -> None:
        """Notes the frame whose first record is `rel`, at `pos`, stamped ts_ms: an entry when it is the file's first
        or lies an interval (of bytes or of records) past the last entry."""
        if self.rels and (pos - self.positions[-1] < self.interval_bytes
                          and rel - self.rels[-1] < self.interval_records):
            return
        self.rels.append(rel)
        self.positions.append(pos)
        self.times.append(ts_ms)

    def floor_offset(self, rel: int) -> tuple[int, int]:
        """The last entry at or before relative offset `rel`, as (relative offset, position); (0, 0) if none."""
        i = bisect_right(self.rels, rel) - 1
        # Harmless mutants: ``<= 0`` or ``< 1`` (entry 0 is (0, 0)); another answer than (0, 0) when there is no entry
        # (only an empty file's index has none, and no read reaches an empty file).
        if i < 0:
            return 0, 0
        return self.rels[i], self.positions[i]

    def span_before_time(self, ts_ms: int) -> tuple[int, int, int | None, int | None]:
        """Where the first record with ts >= ts_ms lies: after the last entry stamped before ts_ms and no later
        than the entry after it. Returns (entry index, its position, next entry's relative offset, next position);
        entry index -1 when the first entry is already at or past ts_ms."""
        i = bisect_left(self.times, ts_ms) - 1
        if i < 0:
            return -1, 0, None, None
        if i + 1 < len(self.rels):
            return i, self.positions[i], self.rels[i + 1], self.positions[i + 1]
        return i, self.positions[i], None, None

    def to_bytes(self) -> bytes:
        pack = ENTRY.pack
        entries = b"".join(pack(r, p, t) for r, p, t in zip(self.rels, self.positions, self.times))
        return entries + TRAILER.pack(zlib.crc32(entries))

    @classmethod
    def from_bytes(cls, data: bytes, interval_bytes: int, interval_records: int,
                   file_bytes: int) -> "SparseIndex | None":
        """Parses a stored index; None when it is malformed or cannot belong to a file of `file_bytes` bytes."""
        if len(data) % ENTRY_BYTES != TRAILER.size:
            return None
        entries = memoryview(data)[:-TRAILER.size]
        if zlib.crc32(entries) != TRAILER.unpack_from(data, len(entries))[0]:
            return None
        index = cls(interval_bytes, interval_records)
        prev = (-1, -1, 0)   # harmless mutants: -2 for either -1 (entries are unsigned)
        for rel, pos, ts in ENTRY.iter_unpack(entries):
            if rel <= prev[0] or pos <= prev[1] or ts < prev[2] or pos >= file_bytes:
                return None
            index.rels.append(rel)
            index.positions.append(pos)
            index.times.append(ts)
            prev = (rel, pos, ts)
        if index.rels and (index.rels[0] != 0 or index.positions[0] != 0):
            return None
        if not index.rels and file_bytes:
            return None
        return index
