"""A physical queue: one directory of segment files holding records at contiguous physical offsets.

Thread-safe: appends run in worker threads while reads, retention and flushes come from the event loop or other
threads, so every public method holds the queue's own lock while it touches files, the index or the dirty state.
Without it a read could pread a descriptor a roll or retention just closed, and a flush could mark clean records
appended while it fsynced. The lock is per queue, so different queues still write and fsync in parallel.
Nothing here runs in the background; the owner drives flushing and retention with maybe_flush and apply_retention,
and with flush policy "group" the syncs too (pending_sync, synced: broker/group_commit.py).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import threading
import time
from bisect import bisect_right
from typing import NamedTuple, Sequence

from . import files, limits
from .config import FLUSH_FSYNC, FLUSH_GROUP, QueueConfig
from .errors import (BatchTooLarge, CorruptData, CorruptQueue, InvalidArgument, OffsetOutOfRange, QueueClosed,
                     QueueExists, QueueFailed, RecordTooLarge)
from .handles import HandlePool
from .record import (HEADER_BYTES, SIZE_BYTES, ProducerMark, Record, Run, check_records, frame_header, pack_records,
                     records_of)
from .segment import Segment

CREATING_PREFIX = ".creating-"
# Handles for a queue opened on its own, without a store's shared pool.
OWN_READ_HANDLES_MAX = 16


class PendingSync(NamedTuple):
    """What a group commit's sync will cover of one queue: its records written before the sync began."""
    end_offset: int


class PhysicalQueue:
    def __init__(self, path: str, config: QueueConfig, pool: HandlePool, own_pool: bool, segments: list[Segment]):
        """Use create() or open()."""
        self.path = path
        self.config = config
        self._pool = pool
        # Harmless mutant: None (each segment's close releases its own descriptor: close_all finds the pool empty)
        self._own_pool = own_pool
        self._segments = segments
        self._bases = [s.base for s in segments]
        self._last_ts = next((s.last_ts for s in reversed(segments) if s.last_ts is not None), 0)
        self._fsync_each = config.flush_policy == FLUSH_FSYNC
        self._group = config.flush_policy == FLUSH_GROUP
        self._dirty_since_ms: int | None = None
        self._flushed_offset = segments[-1].end_offset
        self._closed = False   # harmless mutants: None for either False (read as truth values only)
        self._failed = False
        self._lock = threading.Lock()

    # Lifecycle.

    @classmethod
    def create(cls, path: str, start_offset: int = 0, config: QueueConfig | None = None,
               pool: HandlePool | None = None) -> "PhysicalQueue":
        """Creates the directory with its first, empty segment, atomically: a crash leaves no half-made queue."""
        _check_int("start_offset", start_offset, 0, limits.OFFSET_MAX)
        path = os.path.abspath(path)
        if os.path.lexists(path):
            raise QueueExists("queue directory already exists", path=path)
        parent = os.path.dirname(path)
        # Harmless mutants: the token's length (9 bytes, or token_hex's default); O_EXCL and O_CLOEXEC lost from the
        # file's flags (the directory is new, and the descriptor is closed at once).
        tmp = os.path.join(parent, CREATING_PREFIX + secrets.token_hex(8))
        os.mkdir(tmp)
        try:
            os.close(os.open(os.path.join(tmp, files.log_name(start_offset)),
                             os.O_WRONLY | os.O_CREAT | os.O_EXCL | files.O_CLOEXEC, 0o644))
            files.sync_dir(tmp)
            os.rename(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        files.sync_dir(parent)
        return cls.open(path, config, pool)

    @classmethod
    def open(cls, path: str, config: QueueConfig | None = None, pool: HandlePool | None = None) -> "PhysicalQueue":
        """Opens a queue directory, recovering its last file unless the queue was closed cleanly."""
        config = QueueConfig() if config is None else config
        path = os.path.abspath(path)
        bases = _tidy(path)
        clean_bytes = _take_clean_marker(path, bases[-1])
        handles = HandlePool(OWN_READ_HANDLES_MAX) if pool is None else pool
        segments: list[Segment] = []
        try:
            for base, next_base in zip(bases, bases[1:]):
                segments.append(Segment.open_sealed(path, base, next_base, config, handles))
            segments.append(Segment.open_active(path, bases[-1], config, handles, clean_bytes))
        except BaseException:
            for segment in segments:
                segment.close()
            if pool is None:
                handles.close_all()
            raise
        return cls(path, config, handles, pool is None, segments)   # Harmless mutant: None (see __init__)

    def close(self) -> None:
        """Syncs, stores the active index and marks the queue clean, so the next open skips the recovery scan."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        active = self._segments[-1]
        try:
            if not self._failed:
                active.sync()
                self._flushed_offset = active.end_offset
                active.write_index()
                marker = {"base": active.base, "file_bytes": active.file_bytes}
                files.write_atomic(os.path.join(self.path, files.CLEAN_MARKER), json.dumps(marker).encode())
                files.sync_dir(self.path)
        finally:
            for segment in self._segments:
                segment.close()
            if self._own_pool:
                self._pool.close_all()

    def __enter__(self) -> "PhysicalQueue":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # State.

    def take_recovered_marks(self) -> list[tuple[int, int, ProducerMark]]:
        """Once: (physical offset, records, mark) of the last marked frames of the active file, when this open had
        to recover it (the queue was not closed cleanly); else nothing."""
        active = self._segments[-1]
        marks, active.recovered_marks = active.recovered_marks, []
        return marks

    # The two bounds are read without the lock: an append holds it through its fsync, and the event loop asks for
    # them on every heartbeat and pull. Each is one read of a list item and an int, atomic under the GIL, and both
    # only move forward (a roll appends a segment starting at the old end; retention drops the first base).
    @property
    def min_offset(self) -> int:
        return self._bases[0]

    @property
    def max_offset(self) -> int:
        """The exclusive end of what reads return. With flush policy "group" that is the end of the last sync: a
        record a crash could still take back is never read, or its offset could later name another record. With
        the other policies it is next_offset."""
        return self._readable_end()

    @property
    def next_offset(self) -> int:
        """The offset the next record will get: the exclusive end of what was written, synced or not."""
        return self._max_offset()

    def _max_offset(self) -> int:
        return self._segments[-1].end_offset

    def _readable_end(self) -> int:
        return self._flushed_offset if self._group else self._max_offset()

    @property
    def flushed_offset(self) -> int:
        """Records below this offset are on disk (fsynced); with flush policy "fsync" it equals max_offset."""
        with self._lock:
            return self._flushed_offset

    @property
    def last_ts_ms(self) -> int:
        with self._lock:
            return self._last_ts

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return self._size_bytes()

    def _size_bytes(self) -> int:
        return sum(s.file_bytes for s in self._segments)

    @property
    def segment_count(self) -> int:
        with self._lock:
            return len(self._segments)

    # Lock-free on purpose: one flag read is atomic, and callers use these as hints (the methods check them under
    # the lock), so a health probe never waits behind an fsync.
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def failed(self) -> bool:
        return self._failed

    # Writing.

    def append(self, payloads: Sequence[bytes], ts_ms: int, tag: int = 0) -> int:
        """Appends a batch at offsets first, first + 1, ... as one frame and returns first. With flush policy "fsync"
        the batch is on disk when this returns. Timestamps are kept non-decreasing: a ts_ms below the last one is
        stored as the last one, so that lookups by time stay binary searches when the clock steps back. `tag` is
        kept with the frame and handed back with every run read from it (record.py)."""
        if not isinstance(payloads, (list, tuple)):
            raise InvalidArgument("payloads must be a list of bytes", type=type(payloads).__name__)
        count = len(payloads)
        _check_count(count)
        try:
            longest, total = max(map(len, payloads)), sum(map(len, payloads))
        except TypeError:
            raise InvalidArgument("payloads must be a list of bytes") from None
        if longest > limits.RECORD_BYTES_MAX:
            raise RecordTooLarge(f"a record holds at most {limits.RECORD_BYTES_MAX} bytes", record_bytes=longest)
        _check_batch_bytes(total)
        return self._checked_append(pack_records(payloads), count, ts_ms, tag)

    def append_records(self, records: bytes, count: int, ts_ms: int, tag: int = 0, checked: bool = False,
                       mark: ProducerMark | None = None) -> int:
        """append() of `count` records already framed as a frame holds them (size u32, bytes; a ``wire.batch`` SEND
        batch's records are): written as they are, no copy per record. ``checked``: the caller has walked them
        already as ``record.check_records`` does (``wire.batch.check_send`` does more), so they are not walked
        again; a frame's CRC guards the disk, not its writer's bugs. ``mark``: the idempotent producer's batch the
        records are, kept in the frame's header (record.py) and handed back by a recovery scan
        (``take_recovered_marks``)."""
        _check_framed(records, count, checked)   # harmless mutant: None for checked (falsy as False)
        return self._checked_append(records, count, ts_ms, tag, mark)

    def try_append_records(self, records: bytes, count: int, ts_ms: int, tag: int = 0,
                           checked: bool = False, mark: ProducerMark | None = None) -> int | None:
        """append_records() if it can run without waiting, else None and nothing done: the queue's lock is held
        elsewhere (a read, a sync's bookkeeping), or the append would roll to a new file or sync (flush policy
        "fsync"), which waits for the disk. For a caller that must not block, the broker's event loop with flush
        policy "group": the write itself lands in the page cache. On None, call append_records on a thread."""
        _check_framed(records, count, checked)   # harmless mutant: None for checked (falsy as False)
        _check_append_args(ts_ms, tag)
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._fsync_each or self.would_roll(len(records)):
                return None
            return self._append(records, count, ts_ms, tag, mark)
        finally:
            self._lock.release()

    def would_roll(self, records_bytes: int) -> bool:
        """Whether an append of ``records_bytes`` of records would seal the active file (and sync it) first."""
        end_pos = self._segments[-1].end_pos
        return bool(end_pos) and end_pos + HEADER_BYTES + records_bytes > self.config.segment_bytes_max

    def _checked_append(self, records: bytes, count: int, ts_ms: int, tag: int,
                        mark: ProducerMark | None = None) -> int:
        _check_append_args(ts_ms, tag)
        with self._lock:
            return self._append(records, count, ts_ms, tag, mark)

    def _append(self, records: bytes, count: int, ts_ms: int, tag: int, mark: ProducerMark | None = None) -> int:
        self._check_writable()
        active = self._segments[-1]
        first = active.end_offset
        if first + count > limits.OFFSET_MAX:
            raise InvalidArgument("the queue has run out of offsets", max_offset=first)
        ts = ts_ms if ts_ms > self._last_ts else self._last_ts   # harmless mutant: >= (equal either way)
        if self.would_roll(len(records)):
            active = self._roll()
        header = frame_header(records, count, first, ts, tag, mark)
        try:
            active.append(header, records, ts, count)
        except QueueFailed:
            self._failed = True
            raise
        self._last_ts = ts
        if self._fsync_each:
            self._sync()
        elif self._dirty_since_ms is None:
            self._dirty_since_ms = ts_ms
        return first

    def maybe_flush(self, now_ms: int) -> bool:
        """With flush policy "interval": fsyncs once the oldest unflushed append has waited flush_interval_ms
        (or the clock stepped back). Returns whether it synced. A periodic tick: a closed or failed queue has
        nothing to flush, so it returns False rather than raising (the tick may race a delete or a failure)."""
        with self._lock:
            since = self._dirty_since_ms
            if (self._closed or self._failed or since is None
                    or since <= now_ms < since + self.config.flush_interval_ms):
                return False
            self._sync()
            return True

    def flush(self) -> None:
        with self._lock:
            self._check_writable()
            if self._dirty_since_ms is not None:
                self._sync()

    # Group commit (flush policy "group"): the owner takes pending_sync() of every queue a sync will cover, syncs
    # them together (one syncfs of their file system), and hands each back to synced(), or calls sync_failed().

    def pending_sync(self) -> PendingSync | None:
        """What a sync starting now would make durable; None when there is nothing to sync (or the queue is closed
        or failed: a close syncs, a failed queue's unsynced records are never acknowledged)."""
        with self._lock:
            if self._closed or self._failed or self._flushed_offset == self._max_offset():
                return None
            return PendingSync(self._segments[-1].end_offset)

    def synced(self, pending: PendingSync) -> None:
        """A sync that began after pending_sync() returned `pending` has returned: readers may see its records."""
        with self._lock:
            # Harmless mutant: ``<`` for ``<=`` goes on with an end already flushed, which sets the same offset and
            # clears a dirty time every sync that reached it cleared already.
            if pending.end_offset <= self._flushed_offset:
                return   # a roll, close or flush synced past it meanwhile
            self._flushed_offset = pending.end_offset
            if pending.end_offset == self._max_offset():
                self._dirty_since_ms = None

    def sync_failed(self) -> None:
        """A sync covering this queue failed: the kernel may have dropped its dirty pages, so nothing unsynced can
        be trusted (as after a failed fsync, _sync)."""
        with self._lock:
            self._failed = True

    def _sync(self) -> None:
        active = self._segments[-1]
        # An fsync covers what was written before it started, so that is all it may mark clean.
        end = active.end_offset
        started = time.perf_counter()
        try:
            active.sync()
        except OSError as err:
            # After a failed fsync the kernel may have dropped the dirty pages: nothing unflushed can be trusted.
            self._failed = True
            raise QueueFailed("fsync failed; reopen the queue to recover", path=active.path) from err
        if self.config.observe_sync_s is not None:
            self.config.observe_sync_s(time.perf_counter() - started)
        self._flushed_offset = end
        if end == active.end_offset:
            self._dirty_since_ms = None

    def _roll(self) -> Segment:
        old = self._segments[-1]
        try:
            old.seal()
            new = Segment.create(self.path, old.end_offset, self.config, self._pool)
            files.sync_dir(self.path)
        except OSError as err:
            self._failed = True
            raise QueueFailed("rolling to a new segment file failed; reopen the queue", path=self.path) from err
        self._segments.append(new)
        self._bases.append(new.base)
        self._flushed_offset = old.end_offset
        return new

    # Reading.

    def read(self, offset: int, max_records: int = limits.READ_RECORDS_DEFAULT,
             max_bytes: int = limits.READ_BYTES_DEFAULT) -> list[Record]:
        """Records from `offset` on, at most max_records of them and max_bytes of payload (but at least one record
        when offset < max_offset). Empty at or past max_offset; OffsetOutOfRange below min_offset."""
        return [r for run in self.read_runs(offset, max_records, max_bytes) for r in records_of(run)]

    def read_runs(self, offset: int, max_records: int = limits.READ_RECORDS_DEFAULT,
                  max_bytes: int = limits.READ_BYTES_DEFAULT, written: bool = False) -> list[Run]:
        """read() as runs of records still framed as stored, one or more per frame read (record.py). ``written``:
        up to next_offset, synced or not (a leader's copies only: see broker/replication/source.py)."""
        _check_read_args(offset, max_records, max_bytes)
        with self._lock:
            return self._read(offset, max_records, max_bytes, written=written)

    def try_read_runs(self, offset: int, max_records: int = limits.READ_RECORDS_DEFAULT,
                      max_bytes: int = limits.READ_BYTES_DEFAULT, written: bool = False) -> list[Run] | None:
        """read_runs() if it can run without waiting, else None: the queue's lock is held elsewhere (an append
        on a thread, a sync's bookkeeping), a page is not in the page cache (it would wait for the disk), or a
        chunk is longer than limits.CACHED_READ_CHUNK_BYTES_MAX. For the broker's event loop, where a pull of
        cached records costs a fifth less than a hand-off to a thread and back. On None, call read_runs on a
        thread."""
        _check_read_args(offset, max_records, max_bytes)
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self._read(offset, max_records, max_bytes, cached_only=True, written=written)
        except files.WouldWait:
            return None
        finally:
            self._lock.release()

    def _read(self, offset: int, max_records: int, max_bytes: int, *, cached_only: bool = False,
              written: bool) -> list[Run]:
        self._check_open()
        end = self._max_offset() if written else self._readable_end()
        if offset < self._bases[0]:
            raise OffsetOutOfRange("offset is below the first kept record", offset=offset,
                                   min_offset=self._bases[0], max_offset=end)
        if offset >= end:
            return []
        out: list[Run] = []
        i = bisect_right(self._bases, offset) - 1
        budget = max_bytes
        left = min(max_records, end - offset)   # a sync covers whole appends, so the end is a frame's end
        while True:
            segment = self._segments[i]
            if offset >= segment.end_offset:
                # Only a damaged sealed file ends before the next file begins; the active one ends at max_offset.
                if out:
                    return out
                raise CorruptData("records are missing from a damaged segment file", offset=offset,
                                  next_offset=self._bases[i + 1])
            taken, budget = segment.read(offset, left, budget, out, cached_only)
            left -= taken
            offset = out[-1].offset + out[-1].count
            # Harmless mutants: ``and`` for either of the first two ``or``, ``i - 1`` for ``i + 1`` (each test guards
            # what the others cover: a read stops inside a file only for its budget, where offset < end_offset <= the
            # next base; one that reaches the last file's end has taken all it may, left 0; a pass with left 0 reads
            # nothing).
            if (not left or offset < segment.end_offset or i + 1 == len(self._segments)
                    or self._bases[i + 1] != offset):
                return out
            i += 1

    def offset_for_time(self, ts_ms: int) -> int:
        """The first offset stamped at or after ts_ms; max_offset when every record is older."""
        _check_int("ts_ms", ts_ms, -limits.TS_MS_MAX, limits.TS_MS_MAX)
        with self._lock:
            self._check_open()
            return min(self._offset_for_time(ts_ms), self._readable_end())

    def _offset_for_time(self, ts_ms: int) -> int:
        for segment in self._segments:
            found = segment.offset_for_time(ts_ms)
            if found is not None:
                return found
        return self._max_offset()

    # Deleting.

    def truncate_before(self, offset: int) -> int:
        """Deletes every file whose records all lie below `offset` and returns how many; min_offset moves to the
        first kept file. The active file counts too: when offset == max_offset it is sealed first and deleted."""
        _check_int("offset", offset, 0, limits.OFFSET_MAX)
        with self._lock:
            self._check_writable()
            return self._truncate_before(offset)

    def _truncate_before(self, offset: int) -> int:
        end = self._max_offset()
        if offset > end:
            raise OffsetOutOfRange("cannot truncate past the end of the queue", offset=offset,
                                   min_offset=self._bases[0], max_offset=end)
        if offset == end and self._segments[-1].end_pos:
            self._roll()
        count = 0
        while count < len(self._segments) - 1 and self._bases[count + 1] <= offset:
            count += 1
        if count:
            doomed = self._segments[:count]
            del self._segments[:count]
            del self._bases[:count]
            for segment in doomed:
                segment.delete()
            files.sync_dir(self.path)
        return count

    def apply_retention(self, now_ms: int) -> int:
        """Deletes whole files past retention_ms (every record older) or beyond retention_bytes (oldest first).
        A periodic tick: a closed or failed queue is left alone and counts 0 (the tick may race a delete)."""
        with self._lock:
            if self._closed or self._failed:
                return 0
            deleted = 0   # harmless mutant: ``=`` for the ``+=`` below (the first count added to 0)
            if self.config.retention_ms is not None:
                deleted += self._truncate_before(self._offset_for_time(now_ms - self.config.retention_ms))
            if self.config.retention_bytes is not None:
                total, count = self._size_bytes(), 0
                while count < len(self._segments) - 1 and total > self.config.retention_bytes:
                    total -= self._segments[count].file_bytes
                    count += 1
                if count:
                    deleted += self._truncate_before(self._bases[count])
            return deleted

    # Guards.

    def _check_open(self) -> None:
        if self._closed:
            raise QueueClosed("queue is closed", path=self.path)

    def _check_writable(self) -> None:
        self._check_open()
        if self._failed:
            raise QueueFailed("a write or fsync failed earlier; reopen the queue to recover", path=self.path)


def _tidy(path: str) -> list[int]:
    """The bases of the segment files, oldest first, after removing leftovers of interrupted steps."""
    try:
        names = os.listdir(path)
    except (FileNotFoundError, NotADirectoryError) as err:
        raise CorruptQueue("queue directory is missing or not a directory", path=path) from err
    bases = sorted(b for b in map(files.parse_log_name, names) if b is not None and b <= limits.OFFSET_MAX)
    if not bases:
        raise CorruptQueue("queue directory holds no segment file", path=path)
    kept = set(bases)
    for name in names:
        index_base = files.parse_index_name(name)
        if name.endswith(files.TMP_SUFFIX) or (index_base is not None and index_base not in kept):
            files.remove_if_exists(os.path.join(path, name))
    return bases


def _take_clean_marker(path: str, active_base: int) -> int | None:
    """The active file's size at a clean close, if the marker says so. The marker is removed, durably, before
    anything is written, so a crash from here on can never be mistaken for a clean close."""
    marker_path = os.path.join(path, files.CLEAN_MARKER)
    data = files.read_file(marker_path)
    if data is None:
        return None
    files.remove_if_exists(marker_path)
    files.sync_dir(path)
    try:
        marker = json.loads(data)
        base, file_bytes = marker["base"], marker["file_bytes"]
    except (ValueError, TypeError, KeyError):
        return None
    if type(base) is not int or type(file_bytes) is not int or base != active_base:
        return None
    return file_bytes


def _check_framed(records: bytes, count: int, checked: bool) -> None:
    _check_count(count)
    if type(records) is not bytes:
        raise InvalidArgument("records must be bytes", type=type(records).__name__)
    _check_batch_bytes(len(records) - SIZE_BYTES * count)
    if not checked:
        check_records(records, count)


def _check_read_args(offset: int, max_records: int, max_bytes: int) -> None:
    _check_int("offset", offset, 0, limits.OFFSET_MAX)
    _check_int("max_records", max_records, 1, limits.READ_RECORDS_MAX)
    _check_int("max_bytes", max_bytes, 1, limits.READ_BYTES_MAX)


def _check_append_args(ts_ms: int, tag: int) -> None:
    _check_int("ts_ms", ts_ms, 0, limits.TS_MS_MAX)
    _check_int("tag", tag, 0, 2**32 - 1)


def _check_count(count: int) -> None:
    if not 0 < count <= limits.BATCH_RECORDS_MAX:
        raise BatchTooLarge(f"a batch holds 1 to {limits.BATCH_RECORDS_MAX} records", records=count)


def _check_batch_bytes(total: int) -> None:
    if total > limits.BATCH_BYTES_MAX:
        raise BatchTooLarge(f"a batch holds at most {limits.BATCH_BYTES_MAX} bytes", batch_bytes=total)


def _check_int(name: str, value: object, low: int, high: int) -> None:
    if type(value) is not int or not low <= value <= high:
        raise InvalidArgument(f"{name} must be an integer in [{low}, {high}]", **{name: value})
