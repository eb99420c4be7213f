"""Stator's own Raft journal: pysyncobj's log entries, term, vote and commit index, checksummed and synced on demand.

pysyncobj's FileJournal keeps no checksum, writes through an mmap it never syncs and compacts by clearing the file
and appending the kept entries again in place, so a kill during a compaction leaves a cut log. StatorJournal has the
interface SyncObj calls (``pysyncobj.journal.Journal``) and these rules:

- every record carries two CRCs and start-up checks every byte of the file; what fails is refused by name
  (JournalDamaged), except a torn tail (an incomplete last record, never synced, so never acknowledged), which is
  truncated away and logged;
- ``add`` only appends (a write to the page cache); ``sync`` makes every append since the previous sync durable with
  one fdatasync (group commit: the caller decides when, e.g. before acknowledging entries);
- dropping a prefix (compaction) or everything (``clear``) never rewrites the file in place: the kept records go to a
  new file that is synced and renamed over the old one, so a kill at any moment leaves the old file or the new one;
- term and vote are on disk before ``setCurrentTerm`` returns; the commit index is saved lazily (once a second).

Two files in the node's journal directory, all integers little-endian, every CRC zlib's CRC-32.

``raft.log``::

    offset  size  field
    0       16    magic: b"STATOR-RAFT-LOG" padded with one NUL byte
    16      4     u32 format version (1); bytes 0-24 keep this layout in every version, so any version is named
    20      4     u32 CRC of bytes 0-20
    24      ...   records, one after the other, nothing between them

    record at r (command of n bytes, 28 + n bytes in all):
    r+0     4     u32 header CRC: CRC of bytes r+4 .. r+24 (length, index, term)
    r+4     4     u32 n, the command's length, at most RECORD_BYTES_MAX
    r+8     8     u64 Raft index: the previous record's + 1
    r+16    8     u64 Raft term: never less than the previous record's
    r+24    n     the command, pysyncobj's bytes verbatim
    r+24+n  4     u32 record CRC: CRC of bytes r+0 .. r+24+n (every byte of the record before it)

The header CRC is checked first and alone: a damaged length field is then told apart from a record the file ends in
the middle of (a torn write), which a single CRC over the whole record could not do, since the length says where
that CRC is. The two CRCs sit at the record's two ends, so a piece of a record cut off by a sector boundary at
either end holds CRC bytes, which read as zeros only by chance (see TORN_ZEROS_MIN_BYTES).

``raft.state``, one line, replaced whole (written to ``raft.state.writing``, synced, renamed)::

    STATOR-RAFT-STATE <version> <CRC, 8 lowercase hex digits> <JSON>\\n
    JSON = {"current_term": int, "voted_for": str | int | null, "commit_index": int}

where the CRC is over every byte before it and the JSON (``STATOR-RAFT-STATE 1 `` + JSON). A missing state file
means pysyncobj's defaults: term 0, no vote, commit index 1.

A torn tail, the one thing start-up repairs (ftruncate + fsync, logged as ``raft_journal_torn_tail_truncated``), is
the file ending in its last record: fewer bytes left than a record header; or a header whose CRC holds and whose
record runs past the end; or a record reaching the end of the file that fails its CRC and has a 512-byte sector (of
at least TORN_ZEROS_MIN_BYTES inside the record) reading as zeros, what a power loss leaves where the file grew but
the blocks were never written (etcd's WAL ``isTornEntry``); a header that fails its CRC counts when that zeroed
sector holds a part of the header itself. Anything else is JournalDamaged: a record after a damaged one is never
dropped.
"""

from __future__ import annotations

import abc
import json
import os
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import structlog
from pysyncobj.journal import Journal

log = structlog.get_logger("meta.raft.journal")

JOURNAL_FILE = "raft.log"
STATE_FILE = "raft.state"
COMPACTING_SUFFIX = ".compacting"     # the log being rewritten; renamed over raft.log only once whole and synced
STATE_WRITING_SUFFIX = ".writing"     # the state file being written, likewise

FORMAT_NAME = "STATOR-RAFT-LOG"
FORMAT_MAGIC = FORMAT_NAME.encode().ljust(16, b"\0")
FORMAT_VERSION = 1
STATE_FORMAT_NAME = "STATOR-RAFT-STATE"
STATE_FORMAT_VERSION = 1
PYSYNCOBJ_MAGIC = b"PYSYNCOBJ"        # how pysyncobj's own journal (FileJournal) begins

RECORD_BYTES_MAX = 64 * 1024 * 1024   # most command bytes one record may hold; a header claiming more is damaged
STATE_BYTES_MAX = 64 * 1024           # a state file is under 200 bytes; a bigger one is not ours
SECTOR_BYTES = 512                    # the unit a torn write leaves zeroed (etcd's WAL minSectorSize)
# A piece of a record shorter than a CRC proves nothing when it reads as zeros: at a record's edges such a piece
# holds CRC bytes only, and one CRC byte is zero by chance once in 256.
TORN_ZEROS_MIN_BYTES = 4
COMPACTION_WRITE_BYTES = 1 << 20      # a rewrite hands the kernel about this much per write call

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


class JournalDamaged(RuntimeError):
    """A journal or state file fails a check; str() is one line naming the file, the place and what to do."""

    def __init__(self, path: str, offset: int | None, record_number: int | None, why: str):
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
    def read(self, path: str) -> bytes | None:
        """The whole file, None if there is none."""

    @abc.abstractmethod
    def write_durably(self, path: str, chunks: Iterable[bytes], tmp_path: str) -> None:
        """Replace ``path`` by ``chunks``: write ``tmp_path``, sync it, rename it over ``path``, sync the directory.
        A crash leaves the old file or the new one (and perhaps ``tmp_path``), never a part."""

    @abc.abstractmethod
    def remove(self, path: str) -> bool:
        """Delete ``path``; False if there was none."""

    @abc.abstractmethod
    def open_append(self, path: str) -> int:
        """A handle that appends to ``path``."""

    @abc.abstractmethod
    def append(self, handle: int, data: bytes) -> None: ...

    @abc.abstractmethod
    def truncate(self, handle: int, size: int) -> None:
        """Cut the file to ``size`` bytes; durable with the next ``sync``."""

    @abc.abstractmethod
    def sync(self, handle: int) -> None:
        """Make every append and truncation through ``handle`` durable."""

    @abc.abstractmethod
    def close(self, handle: int) -> None: ...


class OsJournalIO(JournalIO):
    """Plain system calls: an append is in the page cache (it survives the process, not a power loss) until synced."""

    def make_directory(self, path: str) -> None:
        if not os.path.isdir(path):
            os.makedirs(path, exist_ok=True)
            _fsync_directory(os.path.dirname(os.path.abspath(path)))

    def read(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def write_durably(self, path: str, chunks: Iterable[bytes], tmp_path: str) -> None:
        fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for piece in _batched(chunks, COMPACTION_WRITE_BYTES):
                _write_all(fd, piece)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp_path, path)
        # The rename is in the directory, not in the file: without this a power loss may bring the old name back.
        _fsync_directory(os.path.dirname(os.path.abspath(path)))

    def remove(self, path: str) -> bool:
        try:
            os.remove(path)
            return True
        except FileNotFoundError:
            return False

    def open_append(self, path: str) -> int:
        return os.open(path, os.O_WRONLY | os.O_APPEND)

    def append(self, handle: int, data: bytes) -> None:
        _write_all(handle, data)

    def truncate(self, handle: int, size: int) -> None:
        os.ftruncate(handle, size)

    def sync(self, handle: int) -> None:
        # fdatasync, not fsync: the size change is included (the data needs it), timestamps are not worth a second
        # write. os.fdatasync releases the GIL, so the node's other threads run while the disk works.
        os.fdatasync(handle)

    def close(self, handle: int) -> None:
        os.close(handle)


@dataclass
class _Unsynced:
    start: int                 # the file offset ``data`` begins at
    cut: int | None = None     # the size to cut the file to before ``data`` is written, if a truncation went below
    data: bytearray = field(default_factory=bytearray)


class MemoryUntilSyncJournalIO(OsJournalIO):
    """Test mode: appends and truncations stay in this process's memory until ``sync``, so a SIGKILL loses exactly
    what a power loss would (the page cache included). Whole-file writes are synced anyway and go to the file."""

    def __init__(self) -> None:
        self._unsynced: dict[int, _Unsynced] = {}

    def open_append(self, path: str) -> int:
        handle = super().open_append(path)
        self._unsynced[handle] = _Unsynced(os.fstat(handle).st_size)
        return handle

    def append(self, handle: int, data: bytes) -> None:
        pending = self._unsynced[handle]
        pending.data += data

    def truncate(self, handle: int, size: int) -> None:
        pending = self._unsynced[handle]
        if size >= pending.start:
            del pending.data[size - pending.start:]
        else:   # below what the file holds: cut the file at sync time, before the appends that follow this
            pending.cut = size
            pending.start = size
            pending.data.clear()

    def sync(self, handle: int) -> None:
        pending = self._unsynced[handle]
        if pending.cut is not None:
            os.ftruncate(handle, pending.cut)
        _write_all(handle, pending.data)
        os.fdatasync(handle)
        pending.start += len(pending.data)
        pending.cut = None
        pending.data = bytearray()

    def close(self, handle: int) -> None:
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


def _write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


def _check_file_header(path: str, raw: bytes) -> None:
    if raw[:len(PYSYNCOBJ_MAGIC)] == PYSYNCOBJ_MAGIC:
        found = "pysyncobj's own journal"
        if len(raw) >= _PYSYNCOBJ_VERSION_AT + 12:
            written_by = raw[_PYSYNCOBJ_VERSION_AT:_PYSYNCOBJ_VERSION_AT + 8].rstrip(b"\0").decode("ascii", "replace")
            format_version = _CRC.unpack_from(raw, _PYSYNCOBJ_VERSION_AT + 8)[0]
            found += f" (format version {format_version}, pysyncobj {written_by})"
        raise JournalFormatError(path, found, f"{FORMAT_NAME} version {FORMAT_VERSION}")
    if len(raw) < FILE_HEADER_BYTES:
        raise JournalDamaged(path, 0, None, f"the file is {len(raw)} bytes, shorter than its "
                                            f"{FILE_HEADER_BYTES}-byte header")
    magic, version, crc = _FILE_HEADER.unpack_from(raw)
    if magic != FORMAT_MAGIC:
        raise JournalFormatError(path, f"a file of another format (it begins {bytes(magic)!r})",
                                 f"{FORMAT_NAME} version {FORMAT_VERSION}")
    if _crc32(raw[:FILE_HEADER_BYTES - 4]) != crc:
        raise JournalDamaged(path, 0, None, "the file header fails its CRC")
    if version != FORMAT_VERSION:
        raise JournalFormatError(path, f"{FORMAT_NAME} version {version}", f"{FORMAT_NAME} version {FORMAT_VERSION}")


def _zeroed_sector(view: memoryview, start: int, end: int, before: int) -> bool:
    """Whether a piece of [start, end), split at the file's sector boundaries, that begins before ``before`` reads
    as zeros (and is long enough to mean it): what a power loss leaves where the file grew but the data blocks were
    never written (etcd's WAL ``isTornEntry``)."""
    at = start
    while at < end and at < before:
        stop = min(end, (at // SECTOR_BYTES + 1) * SECTOR_BYTES)
        if stop - at >= TORN_ZEROS_MIN_BYTES and not any(view[at:stop]):
            return True
        at = stop
    return False


@dataclass
class _Scan:
    entries: list[Entry]
    offsets: list[int]     # the file offset of each entry's record
    end: int               # where the last whole record ends
    torn_bytes: int        # bytes after ``end``: a torn tail (see _scan)


def _scan(path: str, raw: bytes) -> _Scan:
    """Every record of the journal file ``raw``, each checked; JournalDamaged for the first that fails a check.

    Only a torn tail is not an error (the record was never synced, so never acknowledged): the file ends in the
    middle of its last record, that is fewer bytes left than a record header, or a header whose CRC holds but whose
    record runs past the end, or a last record that fails its check and has a sector of zeros (a header that fails
    its CRC counts as a record running to the end of the file when its own sector is the zeroed one). Anything
    after a damaged record is never dropped silently: a damaged record that is not the last is JournalDamaged."""
    _check_file_header(path, raw)
    size = len(raw)
    view = memoryview(raw)
    entries: list[Entry] = []
    offsets: list[int] = []
    add_entry, add_offset = entries.append, offsets.append
    unpack_head, unpack_crc = _HEAD.unpack_from, _CRC.unpack_from
    at = FILE_HEADER_BYTES
    number = 0
    last_index = last_term = -1

    def torn() -> _Scan:
        return _Scan(entries, offsets, at, size - at)

    def damaged(why: str) -> JournalDamaged:
        if entries:
            why += f" (the record before it holds index {last_index}, term {last_term})"
        return JournalDamaged(path, at, number, why)

    while at < size:
        number += 1
        if size - at < RECORD_HEAD_BYTES:
            return torn()
        head_crc, length, index, term = unpack_head(raw, at)
        if _crc32(view[at + 4:at + RECORD_HEAD_BYTES]) != head_crc:
            if _zeroed_sector(view, at, size, at + RECORD_HEAD_BYTES):
                return torn()
            raise damaged("the record header fails its CRC")
        if length > RECORD_BYTES_MAX:
            raise damaged(f"the record header claims {length} command bytes, more than RECORD_BYTES_MAX "
                          f"({RECORD_BYTES_MAX})")
        crc_at = at + RECORD_HEAD_BYTES + length
        end = crc_at + 4
        if end > size:
            return torn()
        if _crc32(view[at:crc_at]) != unpack_crc(raw, crc_at)[0]:
            if end == size and _zeroed_sector(view, at, size, size):
                return torn()
            raise damaged("the record fails its CRC")
        if entries and index != last_index + 1:
            raise damaged(f"it holds index {index}, which does not follow the previous record's")
        if term < last_term:
            raise damaged(f"it holds term {term}, less than the previous record's")
        add_entry((bytes(view[at + RECORD_HEAD_BYTES:crc_at]), index, term))
        add_offset(at)
        last_index, last_term = index, term
        at = end
    return _Scan(entries, offsets, at, 0)


@dataclass(frozen=True)
class RaftState:
    current_term: int = 0
    voted_for: str | int | None = None
    commit_index: int = 1      # pysyncobj's default when it never saved one


def encode_state(state: RaftState) -> bytes:
    body = json.dumps({"current_term": state.current_term, "voted_for": state.voted_for,
                       "commit_index": state.commit_index}, separators=(",", ":"), ensure_ascii=True).encode()
    covered = f"{STATE_FORMAT_NAME} {STATE_FORMAT_VERSION} ".encode()
    return covered + f"{_crc32(body, _crc32(covered)):08x} ".encode() + body + b"\n"


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
    if not isinstance(doc, dict) or set(doc) != {"current_term", "voted_for", "commit_index"}:
        raise damaged("does not hold exactly current_term, voted_for and commit_index")
    term, voted, commit = doc["current_term"], doc["voted_for"], doc["commit_index"]
    if not (_is_count(term) and _is_count(commit) and (voted is None or isinstance(voted, str) or _is_count(voted))):
        raise damaged("holds a term, vote or commit index of the wrong type")
    return RaftState(term, voted, commit)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _read_state(io: JournalIO, path: str) -> RaftState:
    raw = io.read(path)
    return RaftState() if raw is None else _decode_state(path, raw)


# -- the journal -----------------------------------------------------------------------------------------------
class StatorJournal(Journal):
    """pysyncobj's journal interface over raft.log and raft.state in ``directory`` (layout and rules above).

    The entries live in memory as pysyncobj's tuples, so reads never touch the disk. Not thread-safe: one thread
    (pysyncobj's tick thread) calls every method; the fdatasync of ``sync`` releases the GIL for the others."""

    def __init__(self, directory: str, io: JournalIO | None = None):
        self.directory = directory
        self.path = os.path.join(directory, JOURNAL_FILE)
        self.state_path = os.path.join(directory, STATE_FILE)
        self._io = io if io is not None else OsJournalIO()
        self._io.make_directory(directory)
        # Never renamed in, so never part of the journal: a rewrite the process did not live to finish.
        if self._io.remove(self.path + COMPACTING_SUFFIX):
            log.info("raft_journal_unfinished_rewrite_removed", path=self.path + COMPACTING_SUFFIX)
        self._io.remove(self.state_path + STATE_WRITING_SUFFIX)
        state = _read_state(self._io, self.state_path)
        raw = self._io.read(self.path)
        if raw is None:
            self._io.write_durably(self.path, (file_header(),), self.path + COMPACTING_SUFFIX)
            scan = _Scan([], [], FILE_HEADER_BYTES, 0)
        else:
            scan = _scan(self.path, raw)
            del raw
        self._handle = self._io.open_append(self.path)
        if scan.torn_bytes:
            self._io.truncate(self._handle, scan.end)
            self._io.sync(self._handle)
            log.warning("raft_journal_torn_tail_truncated", path=self.path, offset=scan.end,
                        bytes_dropped=scan.torn_bytes, last_index=scan.entries[-1][1] if scan.entries else 0)
        self._entries = scan.entries
        self._offsets = scan.offsets
        self._end = scan.end
        self._state = self._saved_state = state
        self._closed = False
        self.dirty = False
        self.synced_index = self.last_index   # what start-up read is on disk
        self.syncs = 0
        self.state_writes = 0
        self.compactions = 0                  # rewrites: deleteEntriesTo and clear

    # -- entries -------------------------------------------------------------------------------------------------
    def add(self, command: bytes, idx: int, term: int) -> None:
        if type(command) is not bytes:
            command = bytes(command)
        if self._entries:
            _, last_index, last_term = self._entries[-1]
            # Refused here rather than written: start-up would refuse the whole journal for it.
            if idx != last_index + 1 or term < last_term:
                raise ValueError(f"raft journal {self.path}: entry (index {idx}, term {term}) does not follow the "
                                 f"last one (index {last_index}, term {last_term})")
        if len(command) > RECORD_BYTES_MAX:
            raise ValueError(f"raft journal {self.path}: a command of {len(command)} bytes is more than "
                             f"RECORD_BYTES_MAX ({RECORD_BYTES_MAX})")
        record = encode_record(command, idx, term)
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

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        """Drop the entries at list positions >= ``entryFrom`` (a log conflict); durable with the next sync."""
        start = slice(entryFrom, None).indices(len(self._entries))[0]
        if start >= len(self._entries):
            return
        self._end = self._offsets[start]
        self._io.truncate(self._handle, self._end)
        del self._entries[start:]
        del self._offsets[start:]
        self.dirty = True
        self.synced_index = min(self.synced_index, self.last_index)

    def deleteEntriesTo(self, entryTo: int) -> None:
        """Drop the entries at list positions < ``entryTo`` (compaction): a new file, durable on return."""
        start = slice(entryTo, None).indices(len(self._entries))[0]
        if start > 0:
            self._rewrite(self._entries[start:])

    def clear(self) -> None:
        """Drop every entry: a new file, durable on return."""
        self._rewrite([])

    def _rewrite(self, kept: list[Entry]) -> None:
        offsets: list[int] = []
        end = FILE_HEADER_BYTES

        def records() -> Iterator[bytes]:
            nonlocal end
            yield file_header()
            for entry in kept:
                record = encode_record(*entry)
                offsets.append(end)
                end += len(record)
                yield record

        # Written from memory, not copied from the old file: the new file holds the unsynced appends too, and it is
        # synced, so after the rename everything kept is durable.
        self._io.write_durably(self.path, records(), self.path + COMPACTING_SUFFIX)
        self._io.close(self._handle)
        self._handle = self._io.open_append(self.path)
        self._entries = kept
        self._offsets = offsets
        self._end = end
        self.dirty = False
        self.synced_index = self.last_index
        self.compactions += 1

    def __getitem__(self, item: int | slice) -> Entry | list[Entry]:
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def last_index(self) -> int:
        return self._entries[-1][1] if self._entries else 0

    # -- durability ----------------------------------------------------------------------------------------------
    def sync(self) -> bool:
        """Make every append and truncation since the last sync durable, with one fdatasync; True if it synced."""
        if not self.dirty:
            return False
        self._io.sync(self._handle)
        self.dirty = False
        self.syncs += 1
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
        self._closed = True

    # -- term, vote, commit index --------------------------------------------------------------------------------
    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:
        """Durable on return: Raft needs term and vote on disk before any message reflecting them is sent."""
        if not (votedForNodeId is None or isinstance(votedForNodeId, (str, int))):
            raise TypeError(f"raft journal {self.path}: a vote for {type(votedForNodeId).__name__} cannot be stored, "
                            "only a node id (str or int) or None")
        self._state = RaftState(term, votedForNodeId, self._state.commit_index)
        self._save_state()

    def getCurrentTerm(self) -> int:
        return self._state.current_term

    def getVotedForNodeId(self) -> Any:
        return self._state.voted_for

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        # Memory only: Raft's safety never rests on the commit index surviving (pysyncobj saves it lazily too).
        if raftCommitIndex != self._state.commit_index:
            self._state = RaftState(self._state.current_term, self._state.voted_for, raftCommitIndex)

    def getRaftCommitIndex(self) -> int:
        return self._state.commit_index

    def onOneSecondTimer(self) -> None:
        self._save_state()

    def _save_state(self) -> None:
        if self._state == self._saved_state:
            return
        state = self._state
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


def read_journal(directory: str, io: JournalIO | None = None) -> JournalContents:
    """What the journal in ``directory`` holds, checked as start-up checks it, for tools that must not open it for
    writing: nothing is repaired or removed. FileNotFoundError if there is no journal file."""
    io = io if io is not None else OsJournalIO()
    path = os.path.join(directory, JOURNAL_FILE)
    raw = io.read(path)
    if raw is None:
        raise FileNotFoundError(f"{path}: no raft journal")
    scan = _scan(path, raw)
    del raw
    state = _read_state(io, os.path.join(directory, STATE_FILE))
    return JournalContents(scan.entries, state.current_term, state.voted_for, state.commit_index, scan.torn_bytes)

