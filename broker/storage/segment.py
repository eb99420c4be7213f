"""One segment: a data file of frames (record.py) named by its first offset, and its sparse index file.

The last segment of a queue is active: it holds a read-write descriptor and is appended to; its index lives in
memory and is written out when it is sealed or the queue closes cleanly. Every other segment is sealed: read-only,
read through the shared HandlePool, its index file written once and rebuilt from the data whenever it looks wrong.
"""

from __future__ import annotations

import errno
import os
from collections import deque
from bisect import bisect_right
from contextlib import contextmanager
from typing import Iterator

from runtime import power_loss

from . import files, limits
from .config import QueueConfig
from .errors import CorruptData, QueueFailed
from .handles import HandlePool
from .index import ENTRY_BYTES, TRAILER, SparseIndex
from .record import HEADER_BYTES, SIZE_BYTES, STOP_BAD, STOP_LIMIT, Run, frame_at, frame_bytes_at, parse
from .scan import Marked, ScanResult, scan


class Segment:
    __slots__ = ("base", "path", "index_path", "index", "end_offset", "end_pos", "file_bytes", "last_ts",
                 "fd", "_pool", "_hint_offset", "_hint_pos", "recovered_marks")

    def __init__(self, directory: str, base: int, index: SparseIndex, pool: HandlePool):
        self.base = base
        self.path = os.path.join(directory, files.log_name(base))
        self.index_path = os.path.join(directory, files.index_name(base))
        self.index = index
        self.end_offset = base      # offset after the last readable record
        self.end_pos = 0            # file position after the last readable record
        self.file_bytes = 0         # size of the data file, counted by retention
        self.last_ts: int | None = None
        self.fd: int | None = None  # read-write descriptor while active
        self._pool = pool
        # Where the previous read stopped, so that a consumer reading on sequentially skips the index lookup.
        # Harmless mutants: -2, and another first position (no offset is below base >= 0, so read()'s test of the
        # hint fails at its first comparison until a read sets both).
        self._hint_offset = -1
        self._hint_pos = 0
        # The producer marks of the last frames a recovery scan walked (an active file not closed cleanly)
        self.recovered_marks: list[Marked] = []

    @property
    def first_ts(self) -> int | None:
        return self.index.times[0] if len(self.index) else None

    # Opening.

    @classmethod
    def create(cls, directory: str, base: int, config: QueueConfig, pool: HandlePool) -> "Segment":
        """A new, empty, active segment; the caller syncs the directory."""
        segment = cls(directory, base, _new_index(config), pool)
        segment.fd = os.open(segment.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | files.O_CLOEXEC, 0o644)
        power_loss.created(segment.path)
        return segment

    @classmethod
    def open_active(cls, directory: str, base: int, config: QueueConfig, pool: HandlePool,
                    clean_bytes: int | None) -> "Segment":
        """The last file of a queue. Unless it was closed cleanly at `clean_bytes` and its index still fits, every
        record is checked and the file is cut after the last whole valid one: a torn or corrupt tail is dropped."""
        segment = cls(directory, base, _new_index(config), pool)
        segment.fd = os.open(segment.path, os.O_RDWR | files.O_CLOEXEC)
        try:
            file_bytes = os.fstat(segment.fd).st_size
            result = segment._load_index(config, file_bytes) if clean_bytes == file_bytes else None
            if result is None:
                segment.index = _new_index(config)
                marks: deque[Marked] = deque(maxlen=limits.RECOVERED_MARKS_MAX)
                result = scan(segment.fd, file_bytes, segment.index, base, marks=marks)
                segment.recovered_marks = list(marks)
                if not result.whole:
                    os.ftruncate(segment.fd, result.end_pos)
            if result.end_pos:
                # Whatever a crashed predecessor left in the page cache becomes durable before it is served.
                files.sync_data(segment.fd)
        except BaseException:
            os.close(segment.fd)
            raise
        segment._take(result, result.end_pos)
        return segment

    @classmethod
    def open_sealed(cls, directory: str, base: int, next_base: int, config: QueueConfig,
                    pool: HandlePool) -> "Segment":
        """A file before the last one. Sealed files were synced with their index, so a bad index is rebuilt from
        the data, and damaged data is never cut: its unreadable range is reported to readers as CorruptData."""
        segment = cls(directory, base, _new_index(config), pool)   # harmless mutant: None (replaced before any use)
        with segment._reading() as fd:
            file_bytes = os.fstat(fd).st_size
            result = segment._load_index(config, file_bytes)
            if result is None:
                segment.index = _new_index(config)
                result = scan(fd, file_bytes, segment.index, base)
                segment._write_index_quietly()
        segment._take(result, file_bytes)
        # Offsets belong to the next file from its base on, whatever this one holds past it.
        segment.end_offset = min(segment.end_offset, next_base)
        return segment

    def _load_index(self, config: QueueConfig, file_bytes: int) -> ScanResult | None:
        """Loads the index file and checks the data after its last entry. None when a full scan is needed."""
        # Harmless mutants: the size bound moved by a byte, a trailer or an entry (``>=``, ``- TRAILER.size``, ``/``,
        # ``+ 2``): a valid index has at most one entry a frame, fewer than file_bytes // HEADER_BYTES, so every one
        # passes either way (tests/test_storage_index_file.py reads the largest); the bound only keeps junk from
        # being read whole. The empty index's ``whole`` (True): no caller reads it from here.
        try:
            if os.stat(self.index_path).st_size > (file_bytes // HEADER_BYTES + 1) * ENTRY_BYTES + TRAILER.size:
                return None
        except FileNotFoundError:
            return None
        data = files.read_file(self.index_path)
        index = None if data is None else SparseIndex.from_bytes(
            data, config.index_interval_bytes, config.index_interval_records, file_bytes)
        if index is None:
            return None
        if not len(index):
            return ScanResult(0, self.base, None, True)
        entries = len(index)
        with self._reading() as fd:
            result = scan(fd, file_bytes, index, self.base, index.positions[-1], self.base + index.rels[-1])
        if not result.whole:
            return None
        self.index = index
        if len(index) != entries:
            self._write_index_quietly()  # the stored index was short: keep the extended one
        return result

    def _take(self, result: ScanResult, file_bytes: int) -> None:
        self.end_offset = result.end_offset
        self.end_pos = result.end_pos
        self.file_bytes = file_bytes
        self.last_ts = result.last_ts

    # Writing (active segment only).

    def append(self, header: bytes, records: bytes, ts_ms: int, count: int) -> None:
        """Writes one frame at the end. On failure the file is cut back, so a failed append leaves nothing."""
        pos = self.end_pos
        size = len(header) + len(records)
        try:
            done = os.pwritev(self.fd, (header, records), pos)
            # A short write: the rest from one joined buffer (harmless mutant: ``<=``, whose loop then writes nothing)
            if done < size:
                rest = memoryview(header + records)
                try:
                    while done < size:
                        written = os.pwrite(self.fd, rest[done:], pos + done)
                        if not written:
                            raise OSError(errno.ENOSPC, "write made no progress", self.path)
                        done += written
                finally:
                    rest.release()
        except OSError:
            self._undo(pos)
            raise
        self.index.add_frame(self.end_offset - self.base, pos, ts_ms)
        self.end_pos = self.file_bytes = pos + size
        self.end_offset += count
        self.last_ts = ts_ms

    def _undo(self, pos: int) -> None:
        try:
            os.ftruncate(self.fd, pos)
        except OSError as err:
            raise QueueFailed("a failed write could not be undone", path=self.path, position=pos) from err

    def sync(self) -> None:
        files.sync_data(self.fd)

    def write_index(self) -> None:
        files.write_atomic(self.index_path, self.index.to_bytes())

    def _write_index_quietly(self) -> None:
        # A sealed index is only a cache of the data: failing to store it costs a rescan next time, nothing more.
        try:
            self.write_index()
        except OSError:
            pass

    def seal(self) -> None:
        """Makes the data and the index durable and gives up the write descriptor."""
        self.sync()
        self.write_index()
        os.close(self.fd)
        self.fd = None

    # Reading.

    # Harmless mutant: cached_only's default True (the one caller, PhysicalQueue._read, always passes it).
    def read(self, offset: int, records_max: int, bytes_budget: int, out: list[Run],
             cached_only: bool = False) -> tuple[int, int]:
        """Appends runs of records from `offset` on (base <= offset < end_offset) to `out`; returns (records taken,
        the remaining budget). ``cached_only``: files.WouldWait rather than wait for the disk or copy a chunk past
        limits.CACHED_READ_CHUNK_BYTES_MAX (`out` then holds part of the read: the caller drops it).

        A frame that fails its check ends the read; it raises CorruptData only when nothing was taken yet, so a
        reader always gets every good record before the damage and then learns where to resume."""
        rel, pos = self.index.floor_offset(offset - self.base)
        cursor = self.base + rel
        # Harmless mutants: ``cursor < hint`` and ``hint_pos > pos`` (at equality the hint and the index entry are one
        # place). The clamp of records_max below is not one: a sealed file may hold records past the next file's base
        # (open_sealed), which only the clamp keeps from readers (tests/test_storage_store_edges.py).
        if cursor <= self._hint_offset <= offset and self._hint_pos >= pos:
            cursor, pos = self._hint_offset, self._hint_pos   # reading on from where the last read stopped
        records_max = min(records_max, self.end_offset - offset)
        with self._reading() as fd:
            return self._read_from(fd, offset, cursor, pos, records_max, bytes_budget, out, cached_only)

    def _read_from(self, fd: int, offset: int, cursor: int, pos: int, records_max: int, bytes_budget: int,
                   out: list[Run], cached_only: bool) -> tuple[int, int]:
        # Harmless mutants (tests/test_storage_read_chunks.py counts this loop's preads; these change none): ``need``
        # starting at 1 (a chunk is never under READ_CHUNK_BYTES_MIN); ``taken <= records_max``, ``pos <= end_pos``
        # or ``or`` in the loop's test (parse stops with STOP_LIMIT at records_max, and read() never asks past the
        # file's last record, so records_max is reached at end_pos at the latest); the
        # ``need`` after a chunk parsed to its end (``used <= len(buf)``, ``or True``, ``else 1``: frame_bytes_at of an
        # empty rest is a header, never past end_pos unless pos is there, when the loop ends anyway); ``>=`` for ``>``
        # against CACHED_READ_CHUNK_BYTES_MAX (a chunk of exactly that size waits for the disk instead: the same
        # answer, later).
        need = 0
        taken = 0
        while pos < self.end_pos and taken < records_max:
            want = self._chunk_bytes(pos, need, records_max - taken, bytes_budget, cursor < offset)
            if not cached_only:
                buf = os.pread(fd, want, pos)
            elif want > limits.CACHED_READ_CHUNK_BYTES_MAX:
                raise files.WouldWait
            else:
                buf = files.pread_cached(fd, want, pos)
            if len(buf) < want:
                raise CorruptData("segment file shrank under the reader", offset=cursor, next_offset=None)
            used, cursor, got, bytes_budget, stop = parse(buf, 0, cursor, offset, records_max - taken,
                                                          bytes_budget, out)
            taken += got
            pos += used
            if stop == STOP_LIMIT:
                break
            need = frame_bytes_at(buf, used) if used < len(buf) else 0
            if stop == STOP_BAD or pos + need > self.end_pos:
                if out:   # records of this read, or of an earlier file of the same read
                    break
                raise CorruptData("a record failed its check on read", offset=max(cursor, offset),
                                  next_offset=self._resume_after(max(cursor, offset)))
        self._hint_offset, self._hint_pos = cursor, pos
        return taken, bytes_budget

    @contextmanager
    def _reading(self) -> Iterator[int]:
        """The active file's own descriptor, or a sealed file's descriptor leased from the shared pool."""
        if self.fd is not None:
            yield self.fd
        else:
            with self._pool.lease(self.path) as fd:
                yield fd

    def _chunk_bytes(self, pos: int, need: int, records_left: int, bytes_budget: int, skipping: bool) -> int:
        """How much to pread: the records and bytes still wanted, guessed from this file's mean record size (a short
        guess costs one more pread, a long one a useless copy), plus one frame header, plus one index interval when
        the read starts at an index entry before the wanted offset; bounded both ways, and never less than the next
        whole frame."""
        # Harmless mutant: ``max(2, ...)`` (with one record the guess covers the file's end, where the chunk is cut)
        mean_record = self.end_pos // max(1, self.end_offset - self.base) + 1
        ahead = min(records_left * SIZE_BYTES + bytes_budget, (records_left + 1) * mean_record) + HEADER_BYTES
        if skipping:
            ahead += self.index.interval_bytes
        ahead = min(max(ahead, limits.READ_CHUNK_BYTES_MIN), limits.READ_CHUNK_BYTES_MAX)
        return min(self.end_pos - pos, max(need, ahead))

    def _resume_after(self, offset: int) -> int:
        """Where reading can go on past a bad record: the next indexed record, which starts a whole frame."""
        i = bisect_right(self.index.rels, offset - self.base)
        return self.base + self.index.rels[i] if i < len(self.index) else self.end_offset

    def offset_for_time(self, ts_ms: int) -> int | None:
        """First offset in this segment stamped at or after ts_ms; None when every record is older. Only the records
        it serves count: a sealed file's records from the next file's base on (open_sealed) are not this segment's."""
        if self.last_ts is None or self.last_ts < ts_ms:
            return None
        i, pos, next_rel, next_pos = self.index.span_before_time(ts_ms)
        if i < 0:
            return self.base
        # Harmless mutant: stop at end_pos always (the answer lies before next_pos; the rest is read for nothing)
        stop = self.end_pos if next_pos is None else next_pos
        with self._reading() as fd:
            # Harmless mutant: reading past stop (``stop + pos``) only brings more frames; the first stamped at
            # or after ts_ms still comes first, no later than the next entry's.
            buf = os.pread(fd, stop - pos, pos)
        at, offset = 0, self.base + self.index.rels[i]
        while True:
            status, count, frame_ts, _tag, end = frame_at(buf, at, offset)
            # Harmless mutant: ``> 0`` or ``>= 1`` (frame_at answers -1, STOP_SHORT or STOP_BAD, never 0)
            if status >= 0:
                found = None if next_rel is None else self.base + next_rel
                break
            if frame_ts >= ts_ms:
                found = offset
                break
            at, offset = end, offset + count
        return found if found is not None and found < self.end_offset else None

    # Closing.

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None   # harmless mutant: "" (a segment is closed once, by its queue's close or delete)
        self._pool.release(self.path)

    def delete(self) -> None:
        """Removes the data file first: a crash in between leaves an orphan index, which opening removes."""
        self.close()
        files.remove_if_exists(self.path)
        files.remove_if_exists(self.index_path)


def _new_index(config: QueueConfig) -> SparseIndex:
    return SparseIndex(config.index_interval_bytes, config.index_interval_records)
