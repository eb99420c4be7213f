"""Stator's own Raft journal: pysyncobj's log entries, term, vote and commit index, checksummed, in segment files
synced on demand.

pysyncobj's FileJournal keeps no checksum, writes through an mmap it never syncs and compacts by clearing the file
and appending the kept entries again in place, so a kill during a compaction leaves a cut log. StatorJournal has the
interface SyncObj calls (``pysyncobj.journal.Journal``) and these rules:

- every record carries two CRCs and start-up checks every byte of every live segment; what fails is refused by name
  (JournalDamaged), except a torn tail of the last segment (an incomplete last record, never synced, so never
  acknowledged), which is truncated away and logged;
- ``add`` only appends to the last segment (a write to the page cache, into space allocated ahead: see
  ALLOCATE_AHEAD_BYTES); ``sync`` makes every change since the previous sync durable with one fdatasync (group
  commit: the caller decides when, e.g. before acknowledging entries), and one directory fsync first when a segment
  was created or deleted since;
- the log is a sequence of segment files (etcd's WAL): dropping a prefix (compaction) writes the new first index to
  the state file and unlinks the segments wholly below it, dropping everything (``clear``) moves the state file's
  first segment past every existing one. No record is ever copied: a compaction costs the same whatever the size of
  the log (rewriting the kept tail, as an earlier build did, took 150-290 ms of the tick with megabyte
  entries, long enough to miss heartbeats);
- term and vote are on disk before ``setCurrentTerm`` returns; the commit index is saved lazily (once a second).

Files in the node's journal directory (which may hold other files too), all integers little-endian, every CRC
zlib's CRC-32.

``raft.log.<seq>``, the segments: seq a 16-digit zero-padded decimal counter (``raft.log.0000000000000001``), one
more for each new segment. Those from the state file's ``first_segment`` on are live: no gap in their seqs, they
hold the log in order, a record's index following the previous record's across segment boundaries. Each::

    offset  size  field
    0       16    magic: b"STATOR-RAFT-LOG" padded with one NUL byte
    16      4     u32 format version (1); bytes 0-24 keep this layout in every version, so any version is named
    20      4     u32 CRC of bytes 0-20
    24      ...   records, one after the other, nothing between them

    record at r (command of n bytes, 28 + n bytes in all):
    r+0     4     u32 header CRC: CRC of bytes r+4 .. r+24 (length, index, term)
    r+4     4     u32 n, the command's length, at most RECORD_BYTES_MAX
    r+8     8     u64 Raft index: the previous record's + 1 (the previous segment's last, for a segment's first)
    r+16    8     u64 Raft term: never less than the previous record's
    r+24    n     the command, pysyncobj's bytes verbatim
    r+24+n  4     u32 record CRC: CRC of bytes r+0 .. r+24+n (every byte of the record before it)

A record goes to the last segment; one that would take it past SEGMENT_BYTES_MAX goes to a new segment instead (a
record bigger than that goes whole into a segment of its own). The full segment is cut to its records (the space
allocated ahead goes) and synced before the next one is created, so every segment but the last ends with its last
record, whole on disk, and only the last can have a torn tail (or a torn header: its creation never synced). The
last segment's records end where the rest of the file reads as zeros: the space allocated ahead that no append
reached yet (a valid record header is never all zeros: its CRC covers an index of at least 1).

The header CRC is checked first and alone: a damaged length field is then told apart from a record the file ends in
the middle of (a torn write), which a single CRC over the whole record could not do, since the length says where
that CRC is. The two CRCs sit at the record's two ends, so a piece of a record cut off by a sector boundary at
either end holds CRC bytes, which read as zeros only by chance (see TORN_ZEROS_MIN_BYTES).

``raft.state``, one line, replaced whole (written to ``raft.state.writing``, synced, renamed, directory synced)::

    STATOR-RAFT-STATE <version> <CRC, 8 lowercase hex digits> <JSON>\\n
    JSON = {"current_term": int, "voted_for": str | int | null, "commit_index": int,
            "first_segment": int, "first_index": int | null, "founding_voter": bool}

where the CRC is over every byte before it and the JSON (``STATOR-RAFT-STATE 3 `` + JSON). ``first_segment`` is the
seq of the first live segment: every segment below it is dead (left over by a crash, deleted at start-up).
``first_index`` is the index of the first live entry, set by a compaction: the records below it in the first live
segment are dead (checked, not loaded); null means every record of the live segments is live (a journal never
compacted, or emptied by ``clear`` since, after which the log may start at any index). ``founding_voter``: this disk
counted itself a voter at the cluster's first start (meta/raft/roles.py ``decide``), set once, never cleared. A
missing state file means pysyncobj's defaults (term 0, no vote, commit index 1), first segment 1 and no first index.

What each change writes, in this order, and what a crash (a power loss included) leaves:

- ``add``: an append to the last segment; ``sync``: the directory fsync if segments were created or deleted, then
  one fdatasync of the last segment. Unsynced: a torn tail of the last segment, truncated at start-up. Start-up
  cuts the last segment to its records in any case (nothing past them was ever synced as data), and appends
  allocate space ahead again.
- a new segment: fdatasync of the full one (and of the directory, if that one's name is not yet durable), create
  the next, append its header; its name and header are durable with the next ``sync``. A crash before leaves no
  segment, or an empty one, or one with a torn header: the last segment, repaired at start-up.
- ``deleteEntriesTo`` (compaction): ``sync`` (the new first entry must be on disk before the state names it), the
  state file with the new first_index and first_segment; durable on return. Then the dead segments are unlinked on
  a thread of their own (after a gradual shrink: OsJournalIO.remove_dead), with no fsync: one that a crash leaves,
  whole or shrunk, is below first_segment, never read, deleted at the next start.
- ``clear``: the state file with first_segment one past the last segment and first_index null (from here every
  existing segment is dead; durable on return), then that segment is created (if a crash loses it, start-up
  creates it) and the others unlinked as a compaction's.
- ``deleteEntriesFrom`` (a log conflict): the unlinks of the segments after the one holding the entry, the last
  first, then the ftruncate of that one, on the calling thread; durable with the next ``sync``, whose directory
  fsync comes before its fdatasync. A crash before leaves a prefix of the log before the truncation (the unlinks go
  before the truncation and ext4 commits them in that order, so no dropped entry reappears after a kept one), or the
  truncated log.

A torn tail, the one thing start-up repairs (ftruncate + fsync, logged as ``raft_journal_torn_tail_truncated``), is
the last segment ending in its last record: fewer bytes left than a record header; or a header whose CRC holds and
whose record runs past the end; or a record reaching the end of the file that fails its CRC and has a 512-byte
sector (of at least TORN_ZEROS_MIN_BYTES inside the record) reading as zeros, what a power loss leaves where the file
grew but the blocks were never written (etcd's WAL ``isTornEntry``); a header that fails its CRC counts when that
zeroed sector holds a part of the header itself. A last segment whose file header is torn (shorter than a header
and a beginning of one, or its 24 first bytes zeros) is rewritten to an empty segment. Anything else is
JournalDamaged, in any segment that is not the last a torn tail too: a record after a damaged one is never dropped.
"""

from __future__ import annotations

import abc
import bisect
import concurrent.futures
import ctypes
import dataclasses
import json
import os
import struct
import time
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import structlog
from pysyncobj.journal import Journal

from runtime import libc, power_loss

from .membership import MEMBERSHIP_COMMAND, MembershipTrail

log = structlog.get_logger("meta.raft.journal")

JOURNAL_FILE = "raft.log"             # the segments' name prefix: raft.log.<seq>; alone, an earlier build's log
STATE_FILE = "raft.state"
SEGMENT_SEQ_DIGITS = 16
COMPACTING_SUFFIX = ".compacting"     # an earlier build's log rewrite: a leftover is removed at start-up
STATE_WRITING_SUFFIX = ".writing"     # the state file being written; renamed over raft.state only once whole and synced

FORMAT_NAME = "STATOR-RAFT-LOG"
FORMAT_MAGIC = FORMAT_NAME.encode().ljust(16, b"\0")
FORMAT_VERSION = 1                    # the segment header and record layout, unchanged since the single-file build
STATE_FORMAT_NAME = "STATOR-RAFT-STATE"
STATE_FORMAT_VERSION = 3              # 2: first_segment and first_index; 3: founding_voter
PYSYNCOBJ_MAGIC = b"PYSYNCOBJ"        # how pysyncobj's own journal (FileJournal) begins

RECORD_BYTES_MAX = 64 * 1024 * 1024   # most command bytes one record may hold; a header claiming more is damaged
# Where a segment ends: big enough that a new one (a file create, and a sync of the full one) is rare, small enough
# that a compaction frees disk soon after pysyncobj's snapshot passes a segment.
SEGMENT_BYTES_MAX = 64 * 1024 * 1024
STATE_BYTES_MAX = 64 * 1024           # a state file is under 200 bytes; a bigger one is not ours
SECTOR_BYTES = 512                    # the unit a torn write leaves zeroed (etcd's WAL minSectorSize)
# A piece of a record shorter than a CRC proves nothing when it reads as zeros: at a record's edges such a piece
# holds CRC bytes only, and one CRC byte is zero by chance once in 256.
TORN_ZEROS_MIN_BYTES = 4
COMPACTION_WRITE_BYTES = 1 << 20      # write_durably hands the kernel about this much per write call
# Appends go into space allocated ahead of them, this much at a time (etcd's WAL allocates its 64 MB segments
# whole). An fdatasync after an append that grew the file also writes the new size through ext4's journal, which
# every file of the file system shares: three nodes syncing at once queued behind each other's journal commits
# (one follower's sync took 720 us where the other two took 215 and 418, in a trace of one write). Measured on the
# machine of issue 38, three processes each appending 300 bytes and syncing: median sync 240-255 us growing the
# file, 130-193 us into allocated space; one writer against a 3-node cluster, five pairs of runs out of six faster
# (+6 to +35% writes/s).
ALLOCATE_AHEAD_BYTES = 4 * 1024 * 1024
# The leader has the disk start writing its tick's entries before it sends them, and syncs after (start_writeback):
# the disk works while the messages are encoded and sent. Measured on the machine of issue 38, three processes each
# appending 300 bytes, working 100 us, then syncing: append to synced 215-252 us, 186-198 us with the writeback
# started right after the append (its fdatasync 113-147 us, 61-75 us); with 30 us of work 5-15 us less, with none
# no gain (the call itself costs ~15 us): hence the leader only, whose sends come between, and only lightly loaded
# (meta/raft/node.py _send_new_entries). Toggled every 0.5 s inside one cluster: one writer's p50 1.265 / 1.302 ms
# and 1.851 / 1.875 ms (on / off).
SYNC_FILE_RANGE_WRITE = 2   # <linux/fs.h>
_sync_file_range = libc.function("sync_file_range", [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint])
ZEROS_SCAN_BYTES = 64 * 1024          # the last segment's trailing zeros are found reading back this much at a time
# A dead segment is shrunk this much at a time, with this pause between, before it is unlinked (see remove_dead).
DEAD_SHRINK_BYTES = 4 * 1024 * 1024
DEAD_SHRINK_PAUSE_S = 0.005

# zlib.crc32 (CRC-32/ISO-HDLC): in the standard library, C speed (GB/s, the GIL released on big buffers), and its
# 32 bits catch every burst error up to 32 bits and all but 1 in 4 billion others; CRC-32C would need a third-party
# module for no gain a journal of this size needs.
_crc32 = zlib.crc32
_FILE_HEADER = struct.Struct("<16sII")  # magic, version, CRC
_HEAD = struct.Struct("<IIQQ")          # header CRC, command length, index, term
_FIELDS = struct.Struct("<IQQ")         # what the header CRC covers
_CRC = struct.Struct("<I")
FILE_HEADER_BYTES = _FILE_HEADER.size   # 24
RECORD_HEAD_BYTES = _HEAD.size          # 24
RECORD_OVERHEAD_BYTES = RECORD_HEAD_BYTES + _CRC.size  # 28
_PYSYNCOBJ_VERSION_AT = 24              # pysyncobj's header: name (24 bytes), version string (8), format (u32)

Entry = tuple[bytes, int, int]          # (command, index, term), what pysyncobj reads from its journal

REJOIN_ADVICE = ("this node cannot trust its raft log: stop it, move its data directory aside and restart it, so it "
                 "rejoins the cluster from a peer")


_MEMBERSHIP_BYTE = bytes([MEMBERSHIP_COMMAND])


class JournalDamaged(RuntimeError):
    """A journal segment, the state file or the set of segments fails a check; str() is one line naming the file (the
    directory when segments are missing), the place and what to do."""

    def __init__(self, path: str, offset: int | None, record_number: int | None, why: str):
        # Harmless mutants: None for any of these args (unpickling calls __init__ with them, then puts the
        # attributes back from the instance's __dict__, so str() reads the same after a round trip).
        super().__init__(path, offset, record_number, why)
        self.path = path
        self.offset = offset
        self.record_number = record_number   # counted from 1, the first record after the file header
        self.why = why

    def __str__(self) -> str:
        where = "" if self.offset is None else f" at byte {self.offset}"
        if self.record_number is not None:
            where += f" (record {self.record_number})"
        return f"{self.path}: damaged{where}: {self.why}; {REJOIN_ADVICE}"


class JournalFormatError(JournalDamaged):
    """The file is not of the format and version this code reads (pysyncobj's own journal, a newer Stator...)."""

    def __init__(self, path: str, found: str, reads: str):
        # Harmless mutant: None for the why (only JournalDamaged.__str__ reads it, and this class has its own).
        super().__init__(path, 0, None, f"found {found}, this code reads {reads}")
        self.args = (path, found, reads)   # what pickling passes back to __init__
        self.found = found
        self.reads = reads

    def __str__(self) -> str:
        return f"{self.path}: found {self.found}, this code reads {self.reads} only; {REJOIN_ADVICE}"


# -- I/O -------------------------------------------------------------------------------------------------------
class JournalIO(abc.ABC):
    """Every file operation of the journal, so that a test can change what a crash loses (see journal_io)."""

    @abc.abstractmethod
    def make_directory(self, path: str) -> None: ...

    @abc.abstractmethod
    def list_directory(self, path: str) -> list[str]:
        """The names in directory ``path``; none if there is no such directory."""

    @abc.abstractmethod
    def read(self, path: str) -> bytes | None:
        """The whole file, None if there is none."""

    @abc.abstractmethod
    def write_durably(self, path: str, chunks: Iterable[bytes], tmp_path: str) -> None:
        """Replace ``path`` by ``chunks``: write ``tmp_path``, sync it, rename it over ``path``, sync the directory.
        A crash leaves the old file or the new one (and perhaps ``tmp_path``), never a part."""

    @abc.abstractmethod
    def remove(self, path: str) -> bool:
        """Delete ``path``; False if there was none. Durable with the next ``sync_directory``."""

    def remove_dead(self, path: str) -> bool:
        """``remove`` for a file nothing reads again, called on a thread of its own: as slowly as is kind to the
        other writers of the disk. False if there was none."""
        return self.remove(path)

    @abc.abstractmethod
    def create(self, path: str) -> int:
        """A handle that appends to ``path``, a new empty file (an error if there is one); its name is durable with
        the next ``sync_directory``, its bytes with the next ``sync`` of the handle."""

    @abc.abstractmethod
    def open_append(self, path: str) -> int:
        """A handle that appends to ``path`` at its end (the journal truncates it to its records first: past them
        may be space allocated ahead)."""

    @abc.abstractmethod
    def append(self, handle: int, data: bytes) -> None: ...

    @abc.abstractmethod
    def truncate(self, handle: int, size: int) -> None:
        """Cut the file to ``size`` bytes; durable with the next ``sync``."""

    def trim(self, handle: int, end: int) -> bool:
        """The records of the file end at ``end``: drop what follows them (space allocated ahead), durable with the
        next ``sync``; True if anything was dropped. Nothing to do for a file that grows with each append."""
        return False

    @abc.abstractmethod
    def sync(self, handle: int) -> None:
        """Make every append and truncation through ``handle`` durable."""

    def start_writeback(self, handle: int) -> bool:
        """Have the disk start on what was appended through ``handle``, without waiting: the ``sync`` that follows
        waits for less. Nothing is durable by it (only ``sync`` says so); True if a writeback was started."""
        return False

    @abc.abstractmethod
    def sync_directory(self, path: str) -> None:
        """Make every create and remove in directory ``path`` durable."""

    @abc.abstractmethod
    def close(self, handle: int) -> None: ...


@dataclass(slots=True)
class _OpenSegment:
    end: int          # where the appends so far end: the next one's offset
    allocated: int    # the file's size: past ``end``, space allocated ahead (zeros)


class OsJournalIO(JournalIO):
    """Plain system calls: an append is in the page cache (it survives the process, not a power loss) until synced;
    a create or remove is in the kernel's directory (likewise) until the directory is synced. Appends write at the
    end of what was appended, into space allocated ``allocate_ahead_bytes`` at a time (0: the file grows with each
    append); a handle from ``open_append`` appends at the file's size until a ``truncate`` says where its data ends."""

    def __init__(self, allocate_ahead_bytes: int | None = None):
        self._ahead = ALLOCATE_AHEAD_BYTES if allocate_ahead_bytes is None else allocate_ahead_bytes
        self._open: dict[int, _OpenSegment] = {}

    def make_directory(self, path: str) -> None:
        if not os.path.isdir(path):
            # Harmless mutants: exist_ok left out or False (it matters only if another process makes the directory
            # between the check and the call; a file or dangling link there is refused either way).
            os.makedirs(path, exist_ok=True)
            _fsync_directory(os.path.dirname(os.path.abspath(path)))

    def list_directory(self, path: str) -> list[str]:
        try:
            return os.listdir(path)
        except FileNotFoundError:
            return []

    def read(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def write_durably(self, path: str, chunks: Iterable[bytes], tmp_path: str) -> None:
        fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            offset = 0
            for piece in _batched(chunks, COMPACTION_WRITE_BYTES):
                _pwrite_all(fd, piece, offset)
                offset += len(piece)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp_path, path)
        # The rename is in the directory, not in the file: without this a power loss may bring the old name back.
        _fsync_directory(os.path.dirname(os.path.abspath(path)))
        power_loss.synced_whole(path)

    def remove(self, path: str) -> bool:
        try:
            os.remove(path)
        except FileNotFoundError:
            return False
        power_loss.removed(path)
        return True

    def remove_dead(self, path: str) -> bool:
        # Freeing a file's blocks on ext4 mounted with discard trims them in the journal commit, which every
        # fdatasync of the tick then waits for: unlinking two 64 MiB segments at once held a concurrent
        # fdatasync for 100-145 ms; shrinking them 4 MiB at a time, 5 ms apart, for 15 ms at most.
        try:
            fd = os.open(path, os.O_WRONLY)
        except FileNotFoundError:
            return False
        try:
            size = os.fstat(fd).st_size
            while size > DEAD_SHRINK_BYTES:
                size -= DEAD_SHRINK_BYTES
                os.ftruncate(fd, size)
                time.sleep(DEAD_SHRINK_PAUSE_S)
        finally:
            os.close(fd)
        return self.remove(path)

    def create(self, path: str) -> int:
        # O_EXCL: a segment is never created over a file, so a bug can cost an error, never a segment's records.
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        power_loss.created(path)
        self._open[handle] = _OpenSegment(0, 0)
        return handle

    def open_append(self, path: str) -> int:
        handle = os.open(path, os.O_WRONLY)
        size = os.fstat(handle).st_size
        self._open[handle] = _OpenSegment(size, size)
        return handle

    def append(self, handle: int, data: bytes) -> None:
        segment = self._open[handle]
        end = segment.end + len(data)
        if end > segment.allocated and self._ahead:
            self._allocate(handle, segment, end)
        _pwrite_all(handle, data, segment.end)
        segment.end = end

    def _allocate(self, handle: int, segment: _OpenSegment, end: int) -> None:
        size = -(-end // self._ahead) * self._ahead   # whole steps: the next append past them allocates the next
        try:
            os.posix_fallocate(handle, segment.allocated, size - segment.allocated)
        except OSError as e:
            # No room for the space ahead: the appends grow the file themselves (and fail on their own if the disk
            # is full); tried again a step further on, not at every append.
            log.warning("raft_journal_allocate_ahead_failed", error=repr(e), size=size)
        else:
            power_loss.allocated(handle, size)
        segment.allocated = size

    def truncate(self, handle: int, size: int) -> None:
        os.ftruncate(handle, size)
        segment = self._open[handle]
        if segment.allocated > size:
            power_loss.allocated(handle, 0)
        segment.end = segment.allocated = size

    def trim(self, handle: int, end: int) -> bool:
        if self._open[handle].allocated <= end:
            return False
        self.truncate(handle, end)
        return True

    def sync(self, handle: int) -> None:
        # fdatasync, not fsync: the size change is included (the data needs it), timestamps are not worth a second
        # write. os.fdatasync releases the GIL, so the node's other threads run while the disk works. The power-loss
        # ledger (tests only) records what the sync made durable: the appends, not the space allocated ahead.
        power_loss.sync_fd(handle, written=self._open[handle].end)

    def start_writeback(self, handle: int) -> bool:
        # sync_file_range(WRITE) over the whole file: only its dirty pages are written (the page cache finds them by
        # their tags, not by walking the space allocated ahead). An error is left for the sync to report.
        return _sync_file_range is not None and _sync_file_range(handle, 0, 0, SYNC_FILE_RANGE_WRITE) == 0

    def sync_directory(self, path: str) -> None:
        _fsync_directory(path)

    def close(self, handle: int) -> None:
        self._open.pop(handle, None)
        os.close(handle)


@dataclass
class _Unsynced:
    start: int                 # the file offset ``data`` begins at
    cut: int | None = None     # the size to cut the file to before ``data`` is written, if a truncation went below
    data: bytearray = field(default_factory=bytearray)


class MemoryUntilSyncJournalIO(OsJournalIO):
    """Test mode: appends and truncations stay in this process's memory until ``sync``, so a SIGKILL loses exactly
    what a power loss would (the page cache included). Whole-file writes are synced anyway and go to the file.

    Creates and removes go to the directory at once, synced or not: a SIGKILL keeps them. A power loss may keep an
    unsynced create or remove or lose it; this mode plays the first outcome, and the journal's order of operations
    (module docstring) makes the second one safe too: a lost create loses a segment no sync covered, a lost unlink
    of a dead segment leaves a file start-up deletes, and the unlinks of a truncation are durable before its data."""

    def __init__(self) -> None:
        super().__init__(allocate_ahead_bytes=0)   # the appends reach the file at sync time only
        self._unsynced: dict[int, _Unsynced] = {}

    def create(self, path: str) -> int:
        handle = super().create(path)
        self._unsynced[handle] = _Unsynced(0)
        return handle

    def open_append(self, path: str) -> int:
        handle = super().open_append(path)
        self._unsynced[handle] = _Unsynced(self._open[handle].end)   # the file's size
        return handle

    def append(self, handle: int, data: bytes) -> None:
        pending = self._unsynced[handle]
        pending.data += data

    def truncate(self, handle: int, size: int) -> None:
        pending = self._unsynced[handle]
        # Harmless mutant: ``>`` (a cut to exactly ``start`` then takes the other branch: the same bytes on disk)
        if size >= pending.start:
            del pending.data[size - pending.start:]
        else:   # below what the file holds: cut the file at sync time, before the appends that follow this
            pending.cut = size
            pending.start = size
            pending.data.clear()

    def start_writeback(self, handle: int) -> bool:
        return False   # the appends are in this process's memory until the sync

    def sync(self, handle: int) -> None:
        pending = self._unsynced[handle]
        if pending.cut is not None:
            os.ftruncate(handle, pending.cut)
        _pwrite_all(handle, pending.data, pending.start)
        os.fdatasync(handle)
        pending.start += len(pending.data)
        pending.cut = None
        pending.data = bytearray()

    def close(self, handle: int) -> None:
        # Harmless mutants: pop(None, None) or no default (every handle is in the dict; a stale entry is
        # overwritten when the number is handed out again, by create or open_append).
        self._unsynced.pop(handle, None)   # what was never synced is lost, as in a power loss
        super().close(handle)


JOURNAL_IO_NAMES = ("os", "memory_until_sync")


def journal_io(name: str = "os") -> JournalIO:
    """The JournalIO called ``name``: "os" (production) or "memory_until_sync" (tests of what a crash loses)."""
    if name == "os":
        return OsJournalIO()
    if name == "memory_until_sync":
        return MemoryUntilSyncJournalIO()
    raise ValueError(f"unknown journal io {name!r}: use one of {', '.join(JOURNAL_IO_NAMES)}")


def _pwrite_all(fd: int, data: bytes | bytearray, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    power_loss.dir_synced(os.path.abspath(path))


def _batched(chunks: Iterable[bytes], size: int) -> Iterator[bytes]:
    """The chunks joined into pieces of about ``size`` bytes: one system call per piece, not per record."""
    batch: list[bytes] = []
    held = 0
    for chunk in chunks:
        batch.append(chunk)
        held += len(chunk)
        if held >= size:
            yield b"".join(batch)
            batch, held = [], 0
    if batch:
        yield b"".join(batch)


# -- format ----------------------------------------------------------------------------------------------------
def file_header() -> bytes:
    head = FORMAT_MAGIC + _CRC.pack(FORMAT_VERSION)
    return head + _CRC.pack(_crc32(head))


def encode_record(command: bytes, index: int, term: int) -> bytes:
    """One record (layout above). On the hot path (~1.5 us): the header CRC needs the packed fields first, then one
    pack of the header, one join, the command copied once."""
    length = len(command)
    head = _HEAD.pack(_crc32(_FIELDS.pack(length, index, term)), length, index, term)
    return b"".join((head, command, _CRC.pack(_crc32(command, _crc32(head)))))


def segment_name(seq: int) -> str:
    """The file name of segment ``seq``: raft.log.0000000000000001 for 1."""
    return f"{JOURNAL_FILE}.{seq:0{SEGMENT_SEQ_DIGITS}d}"


def _segment_seq(name: str) -> int | None:
    digits = name[len(JOURNAL_FILE) + 1:]
    if (name.startswith(JOURNAL_FILE + ".") and len(digits) == SEGMENT_SEQ_DIGITS and digits.isascii()
            and digits.isdigit()):
        return int(digits)
    return None


def _pysyncobj_journal(raw: bytes) -> str:
    found = "pysyncobj's own journal"
    if len(raw) >= _PYSYNCOBJ_VERSION_AT + 12:
        # Harmless mutants: "ASCII" (the same codec) and other bytes stripped with the zeros (pysyncobj's version
        # strings are digits and dots).
        written_by = raw[_PYSYNCOBJ_VERSION_AT:_PYSYNCOBJ_VERSION_AT + 8].rstrip(b"\0").decode("ascii", "replace")
        format_version = _CRC.unpack_from(raw, _PYSYNCOBJ_VERSION_AT + 8)[0]
        found += f" (format version {format_version}, pysyncobj {written_by})"
    return found


def _check_file_header(path: str, raw: bytes) -> None:
    reads = f"{FORMAT_NAME} version {FORMAT_VERSION}"
    if raw[:len(PYSYNCOBJ_MAGIC)] == PYSYNCOBJ_MAGIC:
        raise JournalFormatError(path, _pysyncobj_journal(raw), reads)
    if len(raw) < FILE_HEADER_BYTES:
        raise JournalDamaged(path, 0, None, f"the file is {len(raw)} bytes, shorter than its "
                                            f"{FILE_HEADER_BYTES}-byte header")
    magic, version, crc = _FILE_HEADER.unpack_from(raw)
    if magic != FORMAT_MAGIC:
        raise JournalFormatError(path, f"a file of another format (it begins {bytes(magic)!r})", reads)
    if _crc32(raw[:FILE_HEADER_BYTES - 4]) != crc:
        raise JournalDamaged(path, 0, None, "the file header fails its CRC")
    if version != FORMAT_VERSION:
        raise JournalFormatError(path, f"{FORMAT_NAME} version {version}", reads)


def _refuse_single_file(io: JournalIO, path: str) -> None:
    """``raft.log`` itself: an earlier build's one-file log (or pysyncobj's journal put there), never read: there is
    no conversion (no deployed clusters), the node rejoins from a peer."""
    raw = io.read(path) or b""   # Harmless mutant: other bytes (an empty file is "of another format" either way)
    if raw.startswith(PYSYNCOBJ_MAGIC):
        found = _pysyncobj_journal(raw)
    elif raw.startswith(FORMAT_MAGIC):
        found = "a single-file raft.log of an earlier build"
    else:
        found = "a single-file raft.log of another format"
    raise JournalFormatError(path, found, f"{FORMAT_NAME} version {FORMAT_VERSION} in segment files "
                                          f"{JOURNAL_FILE}.<seq>")


def _torn_file_header(raw: bytes) -> bool:
    """Whether a segment's file header is what a crash leaves of a creation no sync covered: nothing, a beginning of
    the header, or zeros where the file grew but its first block was never written. A flipped byte never is."""
    if not any(raw[:FILE_HEADER_BYTES]):
        return True
    return len(raw) < FILE_HEADER_BYTES and file_header().startswith(raw)


def _zeros_from(raw: bytes) -> int:
    """Where the zeros that run to the end of ``raw`` begin (its length if it does not end in a zero)."""
    end = len(raw)
    while end:
        start = max(0, end - ZEROS_SCAN_BYTES)
        kept = len(raw[start:end].rstrip(b"\0"))
        if kept:
            return start + kept
        end = start
    return 0


def _zeroed_sector(view: memoryview, start: int, end: int, before: int) -> bool:
    """Whether a piece of [start, end), split at the file's sector boundaries, that begins before ``before`` reads
    as zeros (and is long enough to mean it): what a power loss leaves where the file grew but the data blocks were
    never written (etcd's WAL ``isTornEntry``)."""
    at = start
    # Harmless mutant: ``at <= end`` (``before`` is never past ``end``: a header running past the end of the file is
    # a torn tail found before, so ``at < before`` ends the loop first).
    while at < end and at < before:
        stop = min(end, (at // SECTOR_BYTES + 1) * SECTOR_BYTES)
        if stop - at >= TORN_ZEROS_MIN_BYTES and not any(view[at:stop]):
            return True
        at = stop
    return False


@dataclass
class _Scan:
    end: int                          # where the last whole record ends; 0 when the file header is torn
    torn_bytes: int                   # bytes after ``end``: a torn tail (see _scan)
    last: tuple[int, int] | None      # (index, term) of the last record read, live or dead: the next must follow


def _scan(path: str, raw: bytes, entries: list[Entry], offsets: list[int], *, last_segment: bool,
          previous: tuple[int, int] | None, first_index: int | None) -> _Scan:
    """Every record of the segment file ``raw``, each checked, appended to ``entries`` (and its offset to
    ``offsets``) unless its index is below ``first_index`` (dead); JournalDamaged for the first that fails a check.
    ``previous`` is the (index, term) of the previous segment's last record, which the first one here must follow.

    Only a torn tail of the last segment is not an error (the record was never synced, so never acknowledged): the
    file ends in the middle of its last record, that is fewer bytes left than a record header, or a header whose CRC
    holds but whose record runs past the end, or a last record that fails its check and has a sector of zeros (a
    header that fails its CRC counts as a record running to the end of the file when its own sector is the zeroed
    one); or its file header is torn (see _torn_file_header). In the last segment the zeros that run to the end of
    the file count as its end: where they begin at a record's start, the records end (the space allocated ahead, no
    torn bytes); a record they cut is a torn tail. Anything after a damaged record is never dropped silently: a
    damaged record that is not the last is JournalDamaged, and so is any torn tail of a segment that is not the last
    (the journal syncs a segment whole before it starts the next)."""
    size = len(raw)
    # Harmless mutants: the ``last`` of a scan of the last segment (here and in ``tail``): _load reads it only as
    # the next segment's ``previous``, and there is none.
    if last_segment and _torn_file_header(raw):
        return _Scan(0, size, previous)
    _check_file_header(path, raw)
    view = memoryview(raw)
    add_entry, add_offset = entries.append, offsets.append
    unpack_head, unpack_crc = _HEAD.unpack_from, _CRC.unpack_from
    at = FILE_HEADER_BYTES
    number = 0
    chained = previous is not None
    # Harmless mutants: other defaults before a chain starts (its index is read only once chained; a term is never
    # negative), and below -2 for -1 (nor is an index).
    last_index, last_term = previous if previous is not None else (-1, -1)
    below = -1 if first_index is None else first_index   # indexes below it are dead: checked, not loaded

    def tail() -> _Scan:   # the torn tail of the last segment: never synced, so never acknowledged
        return _Scan(at, size - at, (last_index, last_term) if chained else None)

    def torn(why: str) -> _Scan:
        if not last_segment:
            raise damaged(f"{why}, and this is not the last segment (every other one was synced whole)")
        return tail()

    def damaged(why: str) -> JournalDamaged:
        if chained:
            before = "the record before it" if number > 1 else "the previous segment's last record"
            why += f" ({before} holds index {last_index}, term {last_term})"
        return JournalDamaged(path, at, number, why)

    # The last segment's records end where the zeros that run to the end of the file begin, if not before: the space
    # allocated ahead of its appends, and what a power loss zeroed of them. A valid header is never zeros (its CRC
    # covers an index of at least 1); a record that reaches into those zeros is cut there, as by the end of a file.
    zeros = _zeros_from(raw) if last_segment else size
    while at < size:
        if at >= zeros:
            return _Scan(at, 0, (last_index, last_term) if chained else None)
        number += 1
        if size - at < RECORD_HEAD_BYTES:
            return torn("the file ends inside a record header")
        head_crc, length, index, term = unpack_head(raw, at)
        if _crc32(view[at + 4:at + RECORD_HEAD_BYTES]) != head_crc:
            if last_segment and (zeros < at + RECORD_HEAD_BYTES
                                 or _zeroed_sector(view, at, size, at + RECORD_HEAD_BYTES)):
                return tail()
            raise damaged("the record header fails its CRC")
        if length > RECORD_BYTES_MAX:
            raise damaged(f"the record header claims {length} command bytes, more than RECORD_BYTES_MAX "
                          f"({RECORD_BYTES_MAX})")
        crc_at = at + RECORD_HEAD_BYTES + length
        end = crc_at + 4
        if end > size:
            return torn("the record runs past the end of the file")
        if _crc32(view[at:crc_at]) != unpack_crc(raw, crc_at)[0]:
            # The last record (the rest of the file, or zeros after it) with a sector of its own zeroed, or cut by
            # the zeros that run to the end of the file, as a record the end of a file cuts (which is torn however
            # little of it is lost: a whole record's CRC ending in zeros fails only if damaged besides)
            if last_segment and zeros <= end and (zeros < end or _zeroed_sector(view, at, end, end)):
                return tail()
            raise damaged("the record fails its CRC")
        if chained and index != last_index + 1:
            raise damaged(f"it holds index {index}, which does not follow the previous record's")
        if term < last_term:
            raise damaged(f"it holds term {term}, less than the previous record's")
        if index >= below:
            add_entry((bytes(view[at + RECORD_HEAD_BYTES:crc_at]), index, term))
            add_offset(at)
        last_index, last_term, chained = index, term, True
        at = end
    # Harmless mutant: ``(chained) or True`` (a segment holding no record is the last one: a new segment is begun only
    # for a record, so its ``last`` is never read).
    return _Scan(at, 0, (last_index, last_term) if chained else None)


@dataclass(frozen=True)
class RaftState:
    current_term: int = 0
    voted_for: str | int | None = None
    commit_index: int = 1      # pysyncobj's default when it never saved one
    first_segment: int = 1     # the seq of the first live segment (a new journal's first is 1)
    first_index: int | None = None   # the first live entry's index after a compaction; None: every record is live
    founding_voter: bool = False     # a voter at the cluster's first start, on this disk (never cleared)


def encode_state(state: RaftState) -> bytes:
    # Harmless mutants: ensure_ascii left out, False or None (a node id out of ASCII would be UTF-8 instead of
    # escaped, which json.loads reads back the same; the CRC covers whichever bytes were written).
    body = json.dumps({"current_term": state.current_term, "voted_for": state.voted_for,
                       "commit_index": state.commit_index, "first_segment": state.first_segment,
                       "first_index": state.first_index, "founding_voter": state.founding_voter},
                      separators=(",", ":"), ensure_ascii=True).encode()
    covered = f"{STATE_FORMAT_NAME} {STATE_FORMAT_VERSION} ".encode()
    return covered + f"{_crc32(body, _crc32(covered)):08x} ".encode() + body + b"\n"


_STATE_FIELDS = {"current_term", "voted_for", "commit_index", "first_segment", "first_index", "founding_voter"}


def _decode_state(path: str, raw: bytes) -> RaftState:
    def damaged(why: str) -> JournalDamaged:
        return JournalDamaged(path, None, None, f"the raft state file {why}")

    if len(raw) > STATE_BYTES_MAX or not raw.endswith(b"\n") or raw.count(b"\n") != 1:
        raise damaged(f"is not one line of at most {STATE_BYTES_MAX} bytes")
    parts = raw[:-1].split(b" ", 3)
    if len(parts) != 4 or parts[0] != STATE_FORMAT_NAME.encode():
        raise damaged(f"does not begin with {STATE_FORMAT_NAME}")
    _name, version, crc, body = parts
    if not (version.isdigit() and len(version) <= 9) or len(crc) != 8 or crc.strip(b"0123456789abcdef"):
        raise damaged("has no version and CRC after its name")
    if _crc32(body, _crc32(b"%s %s " % (parts[0], version))) != int(crc, 16):
        raise damaged("fails its CRC")
    if int(version) != STATE_FORMAT_VERSION:
        raise JournalFormatError(path, f"{STATE_FORMAT_NAME} version {int(version)}",
                                 f"{STATE_FORMAT_NAME} version {STATE_FORMAT_VERSION}")
    try:
        doc = json.loads(body)
    except ValueError:
        raise damaged("holds no JSON after its CRC") from None
    if not isinstance(doc, dict) or set(doc) != _STATE_FIELDS:
        raise damaged("does not hold exactly current_term, voted_for, commit_index, first_segment, first_index and "
                      "founding_voter")
    term, voted, commit = doc["current_term"], doc["voted_for"], doc["commit_index"]
    if not (_is_count(term) and _is_count(commit) and (voted is None or isinstance(voted, str) or _is_count(voted))):
        raise damaged("holds a term, vote or commit index of the wrong type")
    first_segment, first_index = doc["first_segment"], doc["first_index"]
    if not (_is_count(first_segment) and first_segment >= 1 and (first_index is None or _is_count(first_index))):
        raise damaged("holds a first segment or first index of the wrong type")
    founding_voter = doc["founding_voter"]
    if not isinstance(founding_voter, bool):
        raise damaged("holds a founding_voter that is not true or false")
    return RaftState(term, voted, commit, first_segment, first_index, founding_voter)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _read_state(io: JournalIO, path: str) -> RaftState:
    raw = io.read(path)
    return RaftState() if raw is None else _decode_state(path, raw)


# -- the segments ----------------------------------------------------------------------------------------------
@dataclass
class _Listing:
    segments: list[tuple[int, str]]   # every raft.log.<seq> of the directory: (seq, path), by seq
    leftovers: list[str]              # temporary files of a write a crash cut short
    single_file: str | None           # raft.log itself: an earlier build's log
    state: bool                       # whether raft.state is there


def _list_journal(io: JournalIO, directory: str) -> _Listing:
    segments: list[tuple[int, str]] = []
    leftovers: list[str] = []
    single_file = None
    state = False   # Harmless mutant: None (read only as true or false)
    for name in io.list_directory(directory):
        path = os.path.join(directory, name)
        if name == JOURNAL_FILE:
            single_file = path
        elif name == STATE_FILE:
            state = True
        elif (seq := _segment_seq(name)) is not None:
            segments.append((seq, path))
        elif name == STATE_FILE + STATE_WRITING_SUFFIX or (
                name.startswith(JOURNAL_FILE + ".") and name.endswith((COMPACTING_SUFFIX, STATE_WRITING_SUFFIX))):
            leftovers.append(path)
    segments.sort()
    leftovers.sort()
    return _Listing(segments, leftovers, single_file, state)


@dataclass
class _Segment:
    seq: int
    path: str
    start: int     # the list position of its first live entry (where its entries would begin, if it holds none)


@dataclass
class _Loaded:
    state: RaftState
    segments: list[_Segment]          # the live ones, in order; none after a clear() a crash cut short
    dead: list[str]                   # segments below the state's first_segment
    entries: list[Entry]
    offsets: list[int]                # each entry's record's offset in its segment
    end: int                          # where the last segment's last whole record ends; 0: its header is torn
    torn_bytes: int                   # the last segment's bytes after ``end``


def _load(io: JournalIO, directory: str, listing: _Listing) -> _Loaded:
    """The journal in ``directory``, every live record checked (rules in the module docstring); changes nothing."""
    if listing.single_file is not None:
        _refuse_single_file(io, listing.single_file)
    state = _read_state(io, os.path.join(directory, STATE_FILE))
    dead = [path for seq, path in listing.segments if seq < state.first_segment]
    live = [(seq, path) for seq, path in listing.segments if seq >= state.first_segment]
    expected = state.first_segment
    for k, (seq, path) in enumerate(live):
        if seq != expected:
            where = (f"the live segments begin at {os.path.basename(path)} (the state file's first segment is "
                     f"{state.first_segment})" if k == 0 else
                     f"between {os.path.basename(live[k - 1][1])} and {os.path.basename(path)}")
            raise JournalDamaged(directory, None, None, f"segment {segment_name(expected)} is missing: {where}")
        expected += 1
    entries: list[Entry] = []
    offsets: list[int] = []
    segments: list[_Segment] = []
    previous: tuple[int, int] | None = None
    end = torn_bytes = 0
    for k, (seq, path) in enumerate(live):
        raw = io.read(path)
        if raw is None:
            raise JournalDamaged(directory, None, None, f"segment {os.path.basename(path)} vanished while it was read")
        segments.append(_Segment(seq, path, len(entries)))
        scan = _scan(path, raw, entries, offsets, last_segment=k == len(live) - 1, previous=previous,
                     first_index=state.first_index)
        del raw
        previous, end, torn_bytes = scan.last, scan.end, scan.torn_bytes
    if state.first_index is not None and (not entries or entries[0][1] != state.first_index):
        found = f"begin at index {entries[0][1]}" if entries else "hold no entry from it on"
        raise JournalDamaged(directory, None, None, f"the state file says the log begins at index "
                                                    f"{state.first_index}, but the live segments' records {found}")
    return _Loaded(state, segments, dead, entries, offsets, end, torn_bytes)


# -- the journal -----------------------------------------------------------------------------------------------
class StatorJournal(Journal):
    """pysyncobj's journal interface over the segments and raft.state in ``directory`` (layout and rules above).

    The entries live in memory as pysyncobj's tuples, so reads never touch the disk. Not thread-safe: one thread
    (pysyncobj's tick thread) calls every method; the fdatasync of ``sync`` releases the GIL for the others.
    ``segment_bytes_max`` is for tests, which want many segments out of a few records."""

    def __init__(self, directory: str, io: JournalIO | None = None, *, segment_bytes_max: int = SEGMENT_BYTES_MAX):
        if segment_bytes_max <= FILE_HEADER_BYTES:
            raise ValueError(f"segment_bytes_max {segment_bytes_max} leaves no room after the file header")
        self.directory = directory
        self.state_path = os.path.join(directory, STATE_FILE)
        self._io = io if io is not None else OsJournalIO()
        self._segment_bytes_max = segment_bytes_max
        self._io.make_directory(directory)
        listing = _list_journal(self._io, directory)
        loaded = _load(self._io, directory, listing)   # refuses before anything is changed
        for path in listing.leftovers:
            # Never renamed in, so never part of the journal: a write the process did not live to finish.
            if self._io.remove(path) and not path.endswith(STATE_WRITING_SUFFIX):
                log.info("raft_journal_unfinished_write_removed", path=path)
        if loaded.dead:
            # Below the state file's first segment: dropped by a compaction or clear() whose unlinks a crash cut.
            for path in loaded.dead:
                self._io.remove(path)
            log.info("raft_journal_dead_segments_removed", paths=loaded.dead)
        self._segments = loaded.segments
        self._entries = loaded.entries
        self._offsets = loaded.offsets
        if not self._segments:
            # A new journal, or a clear() a crash stopped before it created its segment: an empty one, synced now.
            path = os.path.join(directory, segment_name(loaded.state.first_segment))
            self._handle = self._io.create(path)
            self._io.append(self._handle, file_header())
            self._io.sync(self._handle)
            self._io.sync_directory(directory)
            # Harmless mutant: start 1 (a segment's start is looked up only for positions >= 1: see deleteEntriesTo)
            self._segments = [_Segment(loaded.state.first_segment, path, 0)]
            self._end = FILE_HEADER_BYTES
        else:
            last = self._segments[-1]
            self._handle = self._io.open_append(last.path)
            self._end = loaded.end
            if loaded.end < FILE_HEADER_BYTES or loaded.torn_bytes:
                # Harmless mutant: ``<=`` in the test below (a segment holding its header and a torn record only
                # is then cut to nothing and given its header again: the same bytes)
                if loaded.end < FILE_HEADER_BYTES:   # a creation no sync covered: nothing in it was acknowledged
                    self._io.truncate(self._handle, 0)
                    self._io.append(self._handle, file_header())
                    self._end = FILE_HEADER_BYTES
                else:
                    self._io.truncate(self._handle, loaded.end)
                self._io.sync(self._handle)
                self._io.sync_directory(directory)
                log.warning("raft_journal_torn_tail_truncated", path=last.path, offset=loaded.end,
                            bytes_dropped=loaded.torn_bytes, last_index=self.last_index)
            else:
                # Past its records: zeros of the space allocated ahead (appends allocate it again). Unsynced, and
                # needs no sync: whether the cut or the zeros are on disk, the records end here.
                self._io.trim(self._handle, loaded.end)
        self._state = self._saved_state = loaded.state
        # Kept apart from _state and folded into it when the state is written: it moves at nearly every tick, and a
        # dataclasses.replace per move was ~2% of a leader's CPU at one writer.
        self._commit_index = loaded.state.commit_index
        # The membership entries of the log, kept current as it changes (meta/raft/membership.py).
        self.membership = MembershipTrail()
        for command, idx, _term in self._entries:
            if command[:1] == _MEMBERSHIP_BYTE:
                self.membership.appended(idx, command)
        # Its thread starts at the first dead segment (see _unlink_dead). Harmless mutants: another pool size or
        # thread name (dead segments unlinked in any order: one a crash leaves is below the state file's first
        # segment, removed at the next start).
        self._unlinker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="raft-journal-unlink")
        self._unlinks: list[concurrent.futures.Future[None]] = []
        # Harmless mutants: None for False below (as falsy), and a directory dirty from the start (one directory
        # sync more, at the first sync).
        self._closed = False
        self._directory_dirty = False         # a segment created or removed since the last sync
        self.dirty = False                    # anything not durable yet: appends, truncations, the directory
        self.synced_index = self.last_index   # what start-up read is on disk
        self.syncs = 0
        self.writebacks = 0   # writebacks started ahead of a sync (start_writeback)
        self.state_writes = 0
        self.compactions = 0                  # deleteEntriesTo calls that dropped entries, and clear() calls

    # -- entries -------------------------------------------------------------------------------------------------
    def add(self, command: bytes, idx: int, term: int) -> None:
        # Harmless mutant: always converted (bytes() of bytes is the same value)
        if type(command) is not bytes:
            command = bytes(command)
        if self._entries:
            _, last_index, last_term = self._entries[-1]
            # Refused here rather than written: start-up would refuse the whole journal for it.
            if idx != last_index + 1 or term < last_term:
                raise ValueError(f"raft journal {self.directory}: entry (index {idx}, term {term}) does not follow "
                                 f"the last one (index {last_index}, term {last_term})")
        if len(command) > RECORD_BYTES_MAX:
            raise ValueError(f"raft journal {self.directory}: a command of {len(command)} bytes is more than "
                             f"RECORD_BYTES_MAX ({RECORD_BYTES_MAX})")
        record = encode_record(command, idx, term)
        if self._end > FILE_HEADER_BYTES and self._end + len(record) > self._segment_bytes_max:
            self._next_segment()
        try:
            self._io.append(self._handle, record)
        except OSError:
            # A part may have been written (disk full): cut it, or the next record would follow a torn one.
            try:
                self._io.truncate(self._handle, self._end)
            except OSError:
                pass
            raise
        self._entries.append((command, idx, term))
        self._offsets.append(self._end)
        self._end += len(record)
        self.dirty = True
        if command[:1] == _MEMBERSHIP_BYTE:
            self.membership.appended(idx, command)

    def _next_segment(self) -> None:
        # The full segment goes to disk whole first (its name too, if no sync covered it yet): then only the last
        # segment can ever be torn, and a torn or damaged segment anywhere else is damage, refused. In a group
        # commit this sync only does early what the next one would do. It ends with its last record: the space
        # allocated ahead goes first.
        if self._io.trim(self._handle, self._end):
            self.dirty = True
        self._sync_files()
        seq = self._segments[-1].seq + 1
        path = os.path.join(self.directory, segment_name(seq))
        handle = self._io.create(path)
        try:
            self._io.append(handle, file_header())
        except OSError:
            self._io.close(handle)
            self._io.remove(path)
            raise
        self._io.close(self._handle)
        self._handle = handle
        self._segments.append(_Segment(seq, path, len(self._entries)))
        self._end = FILE_HEADER_BYTES
        self._directory_dirty = self.dirty = True   # the name and header: durable with the next sync

    def _segment_at(self, position: int) -> int:
        """The number (in self._segments) of the segment holding the entry at list position ``position``."""
        return bisect.bisect_right([s.start for s in self._segments], position) - 1

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        """Drop the entries at list positions >= ``entryFrom`` (a log conflict); durable with the next sync. Dropping
        them all is a ``clear`` (durable at once): the log may then go on from any index."""
        start = slice(entryFrom, None).indices(len(self._entries))[0]
        if start >= len(self._entries):
            return
        self.membership.truncated_from(self._entries[start][1])
        if start == 0:
            # The state file's first index may name a dropped entry, and what follows may start anywhere.
            self._clear()
            return
        kept = self._segment_at(start)
        # The later segments go first, the last first, then the truncation: a crash in between leaves a prefix of
        # the log as it was, never a dropped entry after a kept one (sync() makes the unlinks durable before it
        # syncs the truncation, for the same reason).
        for number in range(len(self._segments) - 1, kept, -1):
            if number == len(self._segments) - 1:
                self._io.close(self._handle)
            self._io.remove(self._segments[number].path)
            self._directory_dirty = True
        if kept < len(self._segments) - 1:
            del self._segments[kept + 1:]
            self._handle = self._io.open_append(self._segments[kept].path)
        self._end = self._offsets[start]
        self._io.truncate(self._handle, self._end)
        del self._entries[start:]
        del self._offsets[start:]
        self.dirty = True
        self.synced_index = min(self.synced_index, self.last_index)

    def deleteEntriesTo(self, entryTo: int) -> None:
        """Drop the entries at list positions < ``entryTo`` (compaction), durable on return: a sync, the state file,
        then the unlinks of the dead segments in the background. No record is read or written, whatever the size of
        the log. Dropping them all is a ``clear``."""
        start = slice(entryTo, None).indices(len(self._entries))[0]
        if start == 0:
            return
        if start >= len(self._entries):
            self.clear()
            return
        # The new first entry must be on disk before the state file names it (and the kept ones stay durable on
        # return, as they always were): a sync of what was appended since the last one, as a group commit does.
        self.sync()
        first = self._segment_at(start)
        dead = self._segments[:first]
        state = dataclasses.replace(self._state, first_segment=self._segments[first].seq,
                                    first_index=self._entries[start][1], commit_index=self._commit_index)
        self._write_state(state)   # the compaction is durable from here: the dead segments are dead
        self._state = state
        self.membership.compacted_before(self._entries[start][1])
        del self._entries[:start]
        del self._offsets[:start]
        del self._segments[:first]
        for segment in self._segments:
            # Harmless mutant: max(1, ...) (the first segment's start is looked up only for positions >= 1: a
            # compaction drops at least one entry, and a truncation to position 0 is a clear)
            segment.start = max(0, segment.start - start)
        self._unlink_dead([segment.path for segment in dead])
        self.compactions += 1

    def clear(self) -> None:
        """Drop every entry, durable on return: the state file moves past every segment, which go."""
        self._clear()
        self.compactions += 1

    def _clear(self) -> None:
        seq = self._segments[-1].seq + 1
        state = dataclasses.replace(self._state, first_segment=seq, first_index=None, commit_index=self._commit_index)
        self._write_state(state)   # from here every existing segment is dead
        self._state = state
        self._io.close(self._handle)   # what was not synced in it goes with the rest
        path = os.path.join(self.directory, segment_name(seq))
        # Its creation and header are durable with the next sync; a crash before loses nothing (start-up creates
        # segment first_segment when it is missing) or leaves a torn header in the last segment (repaired).
        self._handle = self._io.create(path)
        self._io.append(self._handle, file_header())
        dead, self._segments = self._segments, [_Segment(seq, path, 0)]   # Harmless mutant: start 1 (as in __init__)
        self._unlink_dead([segment.path for segment in dead])
        self._entries = []
        self._offsets = []
        self._end = FILE_HEADER_BYTES
        self._directory_dirty = self.dirty = True
        self.synced_index = 0
        self.membership.cleared()

    def _unlink_dead(self, paths: list[str]) -> None:
        # On a thread of their own, not pysyncobj's tick thread: unlinking a synced 64 MiB file took 100-120 ms on
        # ext4 mounted with discard (the blocks are trimmed before unlink returns), as long as the rewrite segments
        # replaced (etcd's WAL purges its files in the background too), and gently (OsJournalIO.remove_dead).
        # Nothing waits for them: the state file already says they are dead (never read again, whatever is left of
        # them), and one left by a crash is deleted at the next start. No fsync either.
        self._unlinks = [future for future in self._unlinks if not future.done()]
        self._unlinks += [self._unlinker.submit(self._unlink, path) for path in paths]

    def _unlink(self, path: str) -> None:
        try:
            self._io.remove_dead(path)
        except Exception as e:   # a thread of its own: nobody else would hear of it
            log.warning("raft_journal_dead_segment_unlink_failed", path=path, error=repr(e))

    def wait_for_unlinks(self, timeout: float | None = None) -> bool:
        """Wait until the unlinks of the segments compaction and ``clear`` dropped are done (they run on a thread
        of their own); False if some still run after ``timeout`` seconds. ``_destroy`` waits for them."""
        return not concurrent.futures.wait(self._unlinks, timeout).not_done

    def __getitem__(self, item: int | slice) -> Entry | list[Entry]:
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def last_index(self) -> int:
        return self._entries[-1][1] if self._entries else 0

    # -- durability ----------------------------------------------------------------------------------------------
    def sync(self) -> bool:
        """Make every append, truncation, segment creation and removal since the last sync durable, with one
        fdatasync (after one directory fsync, if a segment was created or removed); True if it synced."""
        if not self._sync_files():
            return False
        self.syncs += 1
        return True

    def start_writeback(self) -> bool:
        """Have the disk start on the appends since the last sync, which ``sync`` then makes durable sooner
        (JournalIO.start_writeback); True if a writeback was started."""
        if not self.dirty or not self._io.start_writeback(self._handle):
            return False
        self.writebacks += 1
        return True

    def _sync_files(self) -> bool:
        if not self.dirty:
            return False
        if self._directory_dirty:
            # First: the unlinks of a truncation must be durable before the truncated segment's new records are (see
            # deleteEntriesFrom), and a new segment's name before anything in it is acknowledged.
            self._io.sync_directory(self.directory)
            self._directory_dirty = False   # Harmless mutants: None for False, here and below (read as falsy only)
        self._io.sync(self._handle)
        self.dirty = False
        self.synced_index = self.last_index
        return True

    def flush(self) -> bool:
        return self.sync()

    def _destroy(self) -> None:
        if self._closed:
            return
        self.sync()   # a clean stop keeps every entry
        self._save_state()
        self._io.close(self._handle)
        self._unlinker.shutdown(wait=True)   # and leaves no dead segment
        self._closed = True

    # -- term, vote, commit index --------------------------------------------------------------------------------
    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:
        """Durable on return: Raft needs term and vote on disk before any message reflecting them is sent."""
        if not (votedForNodeId is None or isinstance(votedForNodeId, (str, int))):
            raise TypeError(f"raft journal {self.directory}: a vote for {type(votedForNodeId).__name__} cannot be "
                            "stored, only a node id (str or int) or None")
        self._state = dataclasses.replace(self._state, current_term=term, voted_for=votedForNodeId,
                                          commit_index=self._commit_index)
        self._save_state()

    def getCurrentTerm(self) -> int:
        return self._state.current_term

    def getVotedForNodeId(self) -> Any:
        return self._state.voted_for

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        # Memory only: Raft's safety never rests on the commit index surviving (pysyncobj saves it lazily too).
        self._commit_index = raftCommitIndex

    def getRaftCommitIndex(self) -> int:
        return self._commit_index

    @property
    def founding_voter(self) -> bool:
        return self._state.founding_voter

    def mark_founding_voter(self) -> None:
        """Durable on return: this disk counts itself a voter at the cluster's first start, from now on and after
        any restart, until a membership entry names the members (meta/raft/roles.py ``decide``)."""
        if not self._state.founding_voter:
            self._state = dataclasses.replace(self._state, founding_voter=True, commit_index=self._commit_index)
            self._save_state()

    def onOneSecondTimer(self) -> None:
        self._save_state()

    def _save_state(self) -> None:
        if self._state.commit_index != self._commit_index:
            self._state = dataclasses.replace(self._state, commit_index=self._commit_index)
        if self._state != self._saved_state:
            self._write_state(self._state)

    def _write_state(self, state: RaftState) -> None:
        self._io.write_durably(self.state_path, (encode_state(state),), self.state_path + STATE_WRITING_SUFFIX)
        self._saved_state = state
        self.state_writes += 1


# -- offline reading -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JournalContents:
    entries: list[Entry]
    current_term: int
    voted_for: str | int | None
    commit_index: int
    torn_bytes: int = 0    # a torn tail the writer would truncate at start-up; its record is not in ``entries``


def journal_exists(directory: str, io: JournalIO | None = None) -> bool:
    """Whether ``directory`` holds a raft journal (a segment, the state file, or an earlier build's raft.log): what
    callers checked with os.path.exists(os.path.join(directory, JOURNAL_FILE)) when the log was one file."""
    listing = _list_journal(io if io is not None else OsJournalIO(), directory)
    return bool(listing.segments or listing.state or listing.single_file)


def journal_files(directory: str, io: JournalIO | None = None) -> list[str]:
    """The paths of the journal's live segments in order, then the state file's if there is one: what a copy of the
    journal needs (dead segments and temporary files left out). JournalFormatError for an earlier build's raft.log,
    JournalDamaged for a damaged state file."""
    io = io if io is not None else OsJournalIO()
    listing = _list_journal(io, directory)
    if listing.single_file is not None:
        _refuse_single_file(io, listing.single_file)
    state_path = os.path.join(directory, STATE_FILE)
    first = _read_state(io, state_path).first_segment
    return [path for seq, path in listing.segments if seq >= first] + ([state_path] if listing.state else [])


def read_journal(directory: str, io: JournalIO | None = None) -> JournalContents:
    """What the journal in ``directory`` holds, checked as start-up checks it, for tools that must not open it for
    writing: nothing is repaired or removed. FileNotFoundError if there is no journal (see journal_exists)."""
    io = io if io is not None else OsJournalIO()
    listing = _list_journal(io, directory)
    if not (listing.segments or listing.state or listing.single_file):
        raise FileNotFoundError(f"{os.path.join(directory, JOURNAL_FILE)}.<seq>: no raft journal")
    loaded = _load(io, directory, listing)
    state = loaded.state
    return JournalContents(loaded.entries, state.current_term, state.voted_for, state.commit_index, loaded.torn_bytes)
