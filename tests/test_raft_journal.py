"""meta/raft_journal.py on real files: round trips, truncation and compaction, what a crash keeps (SIGKILLed children,
with the page cache and with the power-loss simulation), torn tails, single-byte damage, pysyncobj on top."""

from __future__ import annotations

import os
import pickle
import random
import select
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from collections.abc import Iterable
from pathlib import Path

import pytest
import structlog
from pysyncobj import SyncObj, SyncObjConf, replicated
import pysyncobj.syncobj as pysyncobj_syncobj
from pysyncobj.journal import FileJournal

from meta import raft_journal as rj
from meta.raft_journal import (JOURNAL_FILE, STATE_FILE, JournalDamaged, JournalFormatError,
                               MemoryUntilSyncJournalIO, OsJournalIO, StatorJournal, journal_io, read_journal)
from ops.devcluster import free_base_port

REPO = Path(__file__).resolve().parent.parent
WAIT_S = 20.0


def entry(i: int, term: int = 1, size: int | None = None) -> tuple[bytes, int, int]:
    """A recognisable command for index ``i`` (never long runs of zeros: a zeroed sector must mean a torn write)."""
    unit = b"%08d;" % i
    size = 1 + i % 97 if size is None else size
    return (unit * (size // len(unit) + 1))[:size], i, term


def fill(journal: StatorJournal, entries: Iterable[tuple[bytes, int, int]]) -> None:
    for e in entries:
        journal.add(*e)


def log_bytes(directory: Path) -> bytes:
    return (directory / JOURNAL_FILE).read_bytes()


def run_child(script: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], cwd=REPO, env=_child_env(),
                          capture_output=True, timeout=60)


def _child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


# -- round trips -----------------------------------------------------------------------------------------------
def test_fresh_journal_has_pysyncobjs_defaults(tmp_path):
    j = StatorJournal(str(tmp_path / "new" / "dir"))
    assert (len(j), j.last_index, j.synced_index, j.dirty) == (0, 0, 0, False)
    assert (j.getCurrentTerm(), j.getVotedForNodeId(), j.getRaftCommitIndex()) == (0, None, 1)
    assert j[:] == [] and j.sync() is False
    j._destroy()
    assert log_bytes(tmp_path / "new" / "dir") == rj.file_header()
    assert not (tmp_path / "new" / "dir" / STATE_FILE).exists()   # nothing changed: nothing written


def test_round_trip_with_big_and_empty_commands(tmp_path):
    rng = random.Random(7)
    sizes = [0, 1, 100 * 1024, 2 * 1024 * 1024, 5]
    entries = [(rng.randbytes(size), 10 + n, 3 + n // 2) for n, size in enumerate(sizes)]
    j = StatorJournal(str(tmp_path))
    fill(j, entries)
    j.setCurrentTerm(5, "127.0.0.1:4000")
    j.setRaftCommitIndex(12)
    j._destroy()

    k = StatorJournal(str(tmp_path))
    assert k[:] == entries and len(k) == len(entries)
    assert all(type(e) is tuple for e in k[:])
    assert (k.getCurrentTerm(), k.getVotedForNodeId(), k.getRaftCommitIndex()) == (5, "127.0.0.1:4000", 12)
    assert k.synced_index == k.last_index == 14
    for item in (0, -1, 3, slice(1, 3), slice(-2, None), slice(None), slice(None, None, 2), slice(3, 99),
                 slice(99, None), slice(-99, 2)):
        assert k[item] == entries[item], item
    with pytest.raises(IndexError):
        k[len(entries)]
    contents = read_journal(str(tmp_path))
    assert contents.entries == entries and contents.torn_bytes == 0
    assert (contents.current_term, contents.voted_for, contents.commit_index) == (5, "127.0.0.1:4000", 12)
    k._destroy()


def test_truncation_compaction_and_clear_survive_reopen(tmp_path):
    d = str(tmp_path)
    j = StatorJournal(d)
    fill(j, (entry(i) for i in range(1, 31)))
    j.sync()
    j.deleteEntriesFrom(20)                      # a log conflict: positions >= 20, so indexes 21..30
    assert j.last_index == 20 and j.synced_index == 20 and j.dirty
    fill(j, (entry(i, term=2) for i in range(21, 26)))
    j._destroy()

    j = StatorJournal(d)
    expected = [entry(i) for i in range(1, 21)] + [entry(i, term=2) for i in range(21, 26)]
    assert j[:] == expected
    j.deleteEntriesTo(5)                         # compaction: drop positions < 5, indexes 1..5
    assert j[:] == expected[5:] and j.compactions == 1 and not j.dirty and j.synced_index == 25
    assert not (tmp_path / (JOURNAL_FILE + rj.COMPACTING_SUFFIX)).exists()
    fill(j, (entry(i, term=2) for i in range(26, 29)))
    j.deleteEntriesTo(0)                         # nothing to drop: no rewrite
    assert j.compactions == 1
    j._destroy()

    j = StatorJournal(d)
    expected = expected[5:] + [entry(i, term=2) for i in range(26, 29)]
    assert j[:] == expected and j[0][1] == 6
    j.clear()
    assert (len(j), j.last_index, j.synced_index) == (0, 0, 0)
    assert read_journal(d).entries == []         # clear() is durable at once (a second reader sees it)
    fill(j, [entry(100, term=7), entry(101, term=7)])   # after a clear the log may start anywhere (a snapshot)
    j._destroy()

    j = StatorJournal(d)
    assert j[:] == [entry(100, term=7), entry(101, term=7)]
    j.deleteEntriesTo(5)                         # past the end: everything goes
    j.deleteEntriesFrom(0)
    assert j[:] == []
    j._destroy()
    assert StatorJournal(d)[:] == [] and log_bytes(tmp_path) == rj.file_header()


def test_sync_and_state_bookkeeping(tmp_path):
    j = StatorJournal(str(tmp_path))
    fill(j, (entry(i) for i in range(1, 4)))
    assert j.dirty and j.synced_index == 0
    assert j.sync() is True and j.syncs == 1 and j.synced_index == 3 and not j.dirty
    assert j.flush() is False and j.syncs == 1           # nothing changed since
    j.add(*entry(4))
    assert j.flush() is True and j.syncs == 2

    j.setCurrentTerm(1, None)
    j.setCurrentTerm(1, None)                            # already on disk
    assert j.state_writes == 1
    j.setCurrentTerm(2, "b")
    assert j.state_writes == 2 and read_journal(str(tmp_path)).current_term == 2
    j.setRaftCommitIndex(3)
    assert j.getRaftCommitIndex() == 3 and j.state_writes == 2   # lazily: memory only
    assert read_journal(str(tmp_path)).commit_index == 1
    j.onOneSecondTimer()
    j.onOneSecondTimer()
    assert j.state_writes == 3 and read_journal(str(tmp_path)).commit_index == 3
    j.setRaftCommitIndex(4)
    j._destroy()                                         # saves the commit index too
    assert read_journal(str(tmp_path)).commit_index == 4
    assert (tmp_path / STATE_FILE).read_bytes().startswith(b"STATOR-RAFT-STATE 1 ")


def test_add_refuses_what_start_up_would_refuse(tmp_path):
    j = StatorJournal(str(tmp_path))
    fill(j, [entry(1, term=2), entry(2, term=2)])
    for bad in (entry(4, term=2), entry(2, term=2), entry(3, term=1)):
        with pytest.raises(ValueError, match="does not follow"):
            j.add(*bad)
    with pytest.raises(TypeError):
        j.setCurrentTerm(3, object())
    j.add(bytearray(b"ab"), 3, 2)                        # any bytes-like command is stored as bytes
    assert j[-1] == (b"ab", 3, 2)
    j._destroy()
    assert StatorJournal(str(tmp_path))[:] == [entry(1, term=2), entry(2, term=2), (b"ab", 3, 2)]


# -- crashes ---------------------------------------------------------------------------------------------------
class _Crash(Exception):
    pass


class CrashingIO(OsJournalIO):
    """Does the first ``steps`` steps of a durable replace of the journal file, then "crashes" (raises): what is on
    disk then is what a kill at that moment leaves (the page cache survives a kill)."""

    def __init__(self, steps: int):
        self.steps = steps

    def write_durably(self, path: str, chunks: Iterable[bytes], tmp_path: str) -> None:
        if not path.endswith(JOURNAL_FILE):
            return super().write_durably(path, chunks, tmp_path)
        data = b"".join(chunks)
        fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if self.steps == 0:                          # in the middle of writing the new file
                os.write(fd, data[:len(data) // 2])
                raise _Crash
            os.write(fd, data)
            if self.steps == 1:                          # written, not synced
                raise _Crash
            os.fsync(fd)
        finally:
            os.close(fd)
        if self.steps == 2:                              # synced, not renamed
            raise _Crash
        os.replace(tmp_path, path)
        raise _Crash                                     # renamed, directory not synced


@pytest.mark.parametrize("steps", [0, 1, 2, 3])
def test_compaction_crash_at_each_step_leaves_a_whole_log(tmp_path, steps):
    d = str(tmp_path)
    j = StatorJournal(d)
    fill(j, (entry(i) for i in range(1, 41)))
    j._destroy()
    j = StatorJournal(d, CrashingIO(steps))
    with pytest.raises(_Crash):
        j.deleteEntriesTo(25)
    j._io.close(j._handle)                               # the crashed process's descriptor
    leftover = tmp_path / (JOURNAL_FILE + rj.COMPACTING_SUFFIX)
    assert leftover.exists() == (steps < 3)
    with structlog.testing.capture_logs() as logs:
        k = StatorJournal(d)
    assert not leftover.exists()
    assert k[:] == [entry(i) for i in range(1 if steps < 3 else 26, 41)]
    assert [e["event"] for e in logs] == (["raft_journal_unfinished_rewrite_removed"] if steps < 3 else [])
    k._destroy()


KILL_DURING_COMPACTIONS = """
    import sys
    from meta.raft_journal import StatorJournal, journal_io
    j = StatorJournal(sys.argv[1], journal_io("memory_until_sync"))
    i = j.last_index
    while True:
        for _ in range(20):
            i += 1
            j.add((b"%08d" % i) * (1 + i % 64), i, i // 500)
        if i % 40 == 0:                           # every other step a compaction, which a kill may interrupt
            j.deleteEntriesTo(max(0, len(j) - 50))   # durable on return
        else:
            j.sync()
        print(j[0][1], j.last_index, flush=True)   # everything up to here is durable
"""


def test_sigkill_in_a_loop_of_compactions_and_appends(tmp_path):
    """A child appends, syncs and compacts without pause, with the power-loss IO; SIGKILLed at random moments, again
    and again on the same directory. Every time the log reopens whole, holding every entry the child reported
    durable, each one intact."""
    d = str(tmp_path)
    rng = random.Random(11)
    reported_last = 0
    for _round in range(4):
        child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(KILL_DURING_COMPACTIONS), d], cwd=REPO,
                                 env=_child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            ready, _, _ = select.select([child.stdout], [], [], WAIT_S)
            assert ready, "the child reported nothing"
            time.sleep(rng.uniform(0.02, 0.3))
        finally:
            child.send_signal(signal.SIGKILL)
            out, err = child.communicate(timeout=WAIT_S)
        assert child.returncode == -signal.SIGKILL, err.decode()
        lines = [line.split() for line in out.decode().splitlines()]
        reported = [(int(a), int(b)) for a, b in (line for line in lines if len(line) == 2)]
        assert reported
        first_reported, reported_last = reported[-1]
        k = StatorJournal(d)                             # checks every record, index order and terms
        assert not (tmp_path / (JOURNAL_FILE + rj.COMPACTING_SUFFIX)).exists()
        assert k[0][1] <= reported_last <= k.last_index, (k[0][1], reported_last, k.last_index)
        assert k[0][1] >= first_reported                 # a compaction never comes undone
        assert all(e == ((b"%08d" % e[1]) * (1 + e[1] % 64), e[1], e[1] // 500) for e in k[:])
        k._destroy()


KILL_AFTER = """
    import os, signal, sys
    from meta.raft_journal import StatorJournal, journal_io
    directory, io, scenario = sys.argv[1:4]
    j = StatorJournal(directory, journal_io(io))
    def entry(i, term=1):
        return (b"%08d;" % i) * (1 + i % 5), i, term
    for i in range(1, 21):
        j.add(*entry(i))
    j.sync()
    if scenario == "appends":
        for i in range(21, 31):
            j.add(*entry(i))
    else:                                                # truncations above and below the synced end
        j.deleteEntriesFrom(10)                          # below: indexes 11..20 go
        for i in range(11, 16):
            j.add(*entry(i, 2))
        j.sync()
        for i in range(16, 19):
            j.add(*entry(i, 2))
        j.deleteEntriesFrom(j.synced_index - j[0][1] + 2)   # above: unsynced 17 and 18 go, 16 stays
        j.deleteEntriesFrom(12)                          # below again, unsynced: 13..16 go
        j.add(*entry(13, 3))
    j.setCurrentTerm(4, "node-b")                        # durable at once
    j.setRaftCommitIndex(20)                             # memory only: never reaches the disk here
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _kill_entry(i: int, term: int = 1) -> tuple[bytes, int, int]:
    return (b"%08d;" % i) * (1 + i % 5), i, term


@pytest.mark.parametrize("io,scenario,expected", [
    ("memory_until_sync", "appends", [(i, 1) for i in range(1, 21)]),
    ("os", "appends", [(i, 1) for i in range(1, 31)]),
    ("memory_until_sync", "truncations", [(i, 1) for i in range(1, 11)] + [(i, 2) for i in range(11, 16)]),
    ("os", "truncations", [(i, 1) for i in range(1, 11)] + [(11, 2), (12, 2), (13, 3)]),
])
def test_sigkill_keeps_what_the_io_promises(tmp_path, io, scenario, expected):
    """memory_until_sync: a SIGKILL loses exactly what was not synced (a power loss); os: nothing (page cache)."""
    done = run_child(KILL_AFTER, str(tmp_path), io, scenario)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    j = StatorJournal(str(tmp_path))
    assert j[:] == [_kill_entry(i, term) for i, term in expected]
    assert (j.getCurrentTerm(), j.getVotedForNodeId(), j.getRaftCommitIndex()) == (4, "node-b", 1)
    j._destroy()


def test_memory_until_sync_applies_truncations_in_order(tmp_path):
    """What the file holds before and after each sync, read by a second reader, in one process."""
    d = str(tmp_path)
    j = StatorJournal(d, MemoryUntilSyncJournalIO())

    def on_disk() -> list[tuple[int, int]]:
        return [(e[1], e[2]) for e in read_journal(d).entries]

    fill(j, (entry(i) for i in range(1, 11)))
    assert on_disk() == []
    j.sync()
    assert on_disk() == [(i, 1) for i in range(1, 11)]
    j.deleteEntriesFrom(5)                               # below the synced end
    fill(j, (entry(i, term=2) for i in range(6, 9)))
    j.deleteEntriesFrom(2)                               # lower still, and the appends after 5 go with it
    fill(j, (entry(i, term=3) for i in range(3, 5)))
    assert on_disk() == [(i, 1) for i in range(1, 11)]   # nothing reached the file yet
    j.sync()
    assert on_disk() == [(1, 1), (2, 1), (3, 3), (4, 3)]
    fill(j, (entry(i, term=3) for i in range(5, 9)))
    j.deleteEntriesFrom(6)                               # inside the unsynced tail only
    j.sync()
    assert on_disk() == [(1, 1), (2, 1), (3, 3), (4, 3), (5, 3), (6, 3)]
    j.add(*entry(7, term=3))
    j._io.close(j._handle)                               # gone without a sync: index 7 never reaches the file
    assert on_disk()[-1] == (6, 3)


def test_journal_io_names():
    assert type(journal_io()) is OsJournalIO and type(journal_io("os")) is OsJournalIO
    assert type(journal_io("memory_until_sync")) is MemoryUntilSyncJournalIO
    with pytest.raises(ValueError, match="os, memory_until_sync"):
        journal_io("mmap")


# -- torn tails ------------------------------------------------------------------------------------------------
def _journal_with_last(tmp_path: Path, last_size: int, last_at: int | None = None
                       ) -> tuple[bytes, int, list[tuple[bytes, int, int]]]:
    """A synced journal of 1..5 whose last record holds ``last_size`` command bytes and starts at byte ``last_at``
    (record 4 is sized for it): (file, last record's offset, entries)."""
    entries = [entry(i) for i in range(1, 6)]
    first_three = sum(rj.RECORD_OVERHEAD_BYTES + len(e[0]) for e in entries[:3])
    if last_at is not None:
        entries[3] = entry(4, size=last_at - rj.FILE_HEADER_BYTES - first_three - rj.RECORD_OVERHEAD_BYTES)
    entries[4] = entry(5, size=last_size)
    j = StatorJournal(str(tmp_path))
    fill(j, entries)
    j._destroy()
    raw = log_bytes(tmp_path)
    return raw, len(raw) - rj.RECORD_OVERHEAD_BYTES - last_size, entries


def test_torn_tail_at_every_cut_is_truncated(tmp_path):
    raw, last_at, entries = _journal_with_last(tmp_path, 600)
    path = tmp_path / JOURNAL_FILE
    for cut in range(last_at + 1, len(raw)):
        _put_bytes(path, raw, last_at, cut)
        seen = read_journal(str(tmp_path))               # an offline reader repairs nothing
        assert (seen.entries, seen.torn_bytes) == (entries[:4], cut - last_at)
        assert path.stat().st_size == cut
        with structlog.testing.capture_logs() as logs:
            j = StatorJournal(str(tmp_path))
        assert j[:] == entries[:4] and j.synced_index == 4
        assert path.stat().st_size == last_at
        assert logs == [{"event": "raft_journal_torn_tail_truncated", "log_level": "warning", "path": str(path),
                         "offset": last_at, "bytes_dropped": cut - last_at, "last_index": 4}]
        if cut % 50 == 0:
            j.add(*entry(5, term=2))                     # appends go where the torn record was
            j.sync()
            assert read_journal(str(tmp_path)).entries == entries[:4] + [entry(5, term=2)]
        j._destroy()


def _put_bytes(path: Path, raw: bytes, start: int, end: int) -> None:
    """Make the file hold ``raw[:end]`` when it holds ``raw[:start]`` at least, in place: a rewrite from byte 0 makes
    ext4 (auto_da_alloc) write the file out on close, and these loops do it hundreds of times."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, raw[start:end], start)
        if os.fstat(fd).st_size != end:
            os.ftruncate(fd, end)
    finally:
        os.close(fd)


def _zero(raw: bytes, start: int, end: int) -> bytes:
    return raw[:start] + bytes(end - start) + raw[end:]


def test_zeroed_sectors_of_the_last_record_are_a_torn_tail(tmp_path):
    """What a power loss leaves where the file grew but data blocks were never written: the last record (header
    straddling a sector boundary, 10 bytes before it) dropped, whichever of its sectors reads as zeros."""
    raw, last_at, entries = _journal_with_last(tmp_path, 3000, last_at=502)
    assert last_at == 502 and len(raw) == 502 + 3028
    path = tmp_path / JOURNAL_FILE
    cases = {
        "a sector inside": (_zero(raw, 1024, 1536), 4),
        "the last sector, up to the end": (_zero(raw, 3072, len(raw)), 4),
        "the sector of the header's end": (_zero(raw, 512, 1024), 4),
        "from its first byte on": (_zero(raw, last_at, len(raw)), 4),
        "the file grew after it, blocks never written": (raw + bytes(4096), 5),
    }
    for name, (damaged, kept) in cases.items():
        path.write_bytes(damaged)
        j = StatorJournal(str(tmp_path))
        assert j[:] == entries[:kept], name
        assert path.read_bytes() == (raw if kept == 5 else raw[:last_at]), name
        j._destroy()


def test_damage_that_is_not_a_torn_tail_is_refused(tmp_path):
    raw, last_at, entries = _journal_with_last(tmp_path, 3000)
    path = tmp_path / JOURNAL_FILE
    record_4_at = last_at - rj.RECORD_OVERHEAD_BYTES - len(entries[3][0])
    cases = {
        # the last record, damaged without a zeroed sector: a flipped bit, not a write that never happened
        "a byte of the last command": (raw[:last_at + 700] + bytes([raw[last_at + 700] ^ 0x10]) + raw[last_at + 701:],
                                       last_at, 5, "fails its CRC"),
        "the last record's length": (raw[:last_at + 4] + bytes([raw[last_at + 4] ^ 1]) + raw[last_at + 5:],
                                     last_at, 5, "header fails its CRC"),
        # a zeroed piece in a record that is not the last: what follows it must never be dropped
        "zeros in record 4": (_zero(raw, record_4_at + 24, record_4_at + 28), record_4_at, 4, "fails its CRC"),
        "garbage after the last record": (raw + b"\x01" * 40, len(raw), 6, "header fails its CRC"),
        # a damaged header, then a torn last record: the records in between must not go with the torn one
        "record 4's length, then a torn record 5": (
            _zero(raw[:record_4_at + 4] + bytes([raw[record_4_at + 4] ^ 2]) + raw[record_4_at + 5:], 1024, 1536),
            record_4_at, 4, "header fails its CRC"),
    }
    for name, (damaged, offset, number, why) in cases.items():
        path.write_bytes(damaged)
        with pytest.raises(JournalDamaged) as caught:
            StatorJournal(str(tmp_path))
        e = caught.value
        assert (e.path, e.offset, e.record_number) == (str(path), offset, number), name
        assert why in e.why, name
        assert path.read_bytes() == damaged, name        # refused, never repaired
        text = str(e)
        assert "\n" not in text and str(path) in text and f"at byte {offset} (record {number})" in text, text
        assert "move its data directory aside" in text, text
        assert str(pickle.loads(pickle.dumps(e))) == text   # it may cross a process boundary (a tool's worker)


def _record(command: bytes, index: int, term: int, length: int | None = None) -> bytes:
    """A record as the format describes it, written here independently of encode_record."""
    fields = struct.pack("<IQQ", len(command) if length is None else length, index, term)
    head = struct.pack("<I", zlib.crc32(fields)) + fields
    return head + command + struct.pack("<I", zlib.crc32(head + command))


def test_format_is_the_documented_one_and_order_is_checked(tmp_path):
    header = b"STATOR-RAFT-LOG\0" + struct.pack("<I", 1)
    header += struct.pack("<I", zlib.crc32(header))
    assert rj.file_header() == header and rj.encode_record(b"abc", 7, 2) == _record(b"abc", 7, 2)
    path = tmp_path / JOURNAL_FILE
    cases = {
        "an index skipped": ([(b"a", 1, 1), (b"b", 2, 1), (b"c", 4, 1)], "does not follow"),
        "an index repeated": ([(b"a", 1, 1), (b"b", 1, 1)], "does not follow"),
        "a term going back": ([(b"a", 1, 2), (b"b", 2, 1)], "less than the previous"),
    }
    for name, (records, why) in cases.items():
        path.write_bytes(header + b"".join(_record(*r) for r in records))
        with pytest.raises(JournalDamaged, match=why):
            StatorJournal(str(tmp_path))
    # a header whose CRC holds but claims more than RECORD_BYTES_MAX: damaged, though it also runs past the end
    path.write_bytes(header + _record(b"a", 1, 1) + _record(b"", 2, 1, length=rj.RECORD_BYTES_MAX + 1)[:24])
    with pytest.raises(JournalDamaged, match="RECORD_BYTES_MAX"):
        StatorJournal(str(tmp_path))


# -- damage ----------------------------------------------------------------------------------------------------
def test_single_byte_flips_are_all_detected(tmp_path):
    """1,000 seeded single-byte flips over a journal of 50 records of varied sizes and its state file: opening
    either refuses the files or holds exactly what they held (every byte of both is under a CRC, so in fact every
    flip is refused). A torn-tail repair would count as undetected: it changes what the journal holds."""
    rng = random.Random(20240611)
    d = tmp_path / "node"
    j = StatorJournal(str(d))
    index, term = 41, 3
    for n in range(50):
        size = rng.choice([0, 1, 7, 24, 100, 511, 512, 513, 1500, 4096, 9000])
        command = bytes(rng.randrange(1, 256) for _ in range(size)) if size < 2000 else rng.randbytes(size)
        term += rng.random() < 0.2
        j.add(command, index + n, term)
    j.setCurrentTerm(term + 1, "10.0.0.7:4321")
    j.setRaftCommitIndex(60)
    j._destroy()
    files = {name: (d / name).read_bytes() for name in (JOURNAL_FILE, STATE_FILE)}
    original = read_journal(str(d))

    detected = harmless = undetected = 0
    for _ in range(1000):
        name = STATE_FILE if rng.random() < 0.1 else JOURNAL_FILE
        at = rng.randrange(len(files[name]))
        _put_byte(d / name, at, files[name][at] ^ rng.randrange(1, 256))
        try:
            k = StatorJournal(str(d))
        except JournalDamaged:
            detected += 1
        else:
            same = (k[:], k.getCurrentTerm(), k.getVotedForNodeId(), k.getRaftCommitIndex()) == (
                original.entries, original.current_term, original.voted_for, original.commit_index)
            k._destroy()
            harmless += same
            undetected += not same
        _put_byte(d / name, at, files[name][at])
        for other, content in files.items():
            if (d / other).read_bytes() != content:     # only a wrong repair would have changed more
                (d / other).write_bytes(content)
    assert undetected == 0
    assert (detected, harmless) == (1000, 0)


def _put_byte(path: Path, at: int, value: int) -> None:
    fd = os.open(path, os.O_WRONLY)                      # in place (see _put_bytes)
    try:
        os.pwrite(fd, bytes([value]), at)
    finally:
        os.close(fd)


def test_damaged_state_file_is_refused_by_name(tmp_path):
    j = StatorJournal(str(tmp_path))
    j.setCurrentTerm(3, "a:1")
    j._destroy()
    path = tmp_path / STATE_FILE
    good = path.read_bytes()
    body = good.split(b" ", 3)[3][:-1]
    newer = b"STATOR-RAFT-STATE 2 "
    newer += b"%08x " % zlib.crc32(body, zlib.crc32(newer)) + body + b"\n"
    for damaged, error, words in [
        (good[:-1], JournalDamaged, "one line"),
        (good.replace(b'"a:1"', b'"a:2"'), JournalDamaged, "fails its CRC"),
        (b"", JournalDamaged, "one line"),
        (newer, JournalFormatError, "found STATOR-RAFT-STATE version 2, this code reads STATOR-RAFT-STATE version 1"),
    ]:
        path.write_bytes(damaged)
        with pytest.raises(error) as caught:
            StatorJournal(str(tmp_path))
        assert str(path) in str(caught.value) and words in str(caught.value) and "\n" not in str(caught.value)
    path.unlink()                                        # missing: pysyncobj's defaults
    k = StatorJournal(str(tmp_path))
    assert (k.getCurrentTerm(), k.getVotedForNodeId(), k.getRaftCommitIndex()) == (0, None, 1)
    k._destroy()


def test_pysyncobj_journal_and_other_versions_are_refused(tmp_path):
    old = FileJournal(str(tmp_path / JOURNAL_FILE))
    old.add(b"\x01", 1, 0)
    old.add(b"\x00abc", 2, 1)
    old._destroy()
    path = tmp_path / JOURNAL_FILE
    for opener in (StatorJournal, read_journal):
        with pytest.raises(JournalFormatError) as caught:
            opener(str(tmp_path))
        text = str(caught.value)
        assert text.startswith(f"{path}: found pysyncobj's own journal (format version 1, pysyncobj 0.3.17), "
                               "this code reads STATOR-RAFT-LOG version 1 only;"), text
        assert "\n" not in text and isinstance(caught.value, JournalDamaged)
        assert str(pickle.loads(pickle.dumps(caught.value))) == text

    newer = b"STATOR-RAFT-LOG\0" + struct.pack("<I", 2)
    path.write_bytes(newer + struct.pack("<I", zlib.crc32(newer)))
    with pytest.raises(JournalFormatError, match="found STATOR-RAFT-LOG version 2, this code reads STATOR-RAFT-LOG "
                                                 "version 1 only"):
        StatorJournal(str(tmp_path))
    path.write_bytes(b"SQLite format 3\0" + bytes(100))
    with pytest.raises(JournalFormatError, match="another format"):
        StatorJournal(str(tmp_path))
    path.write_bytes(rj.file_header()[:10])
    with pytest.raises(JournalDamaged, match="shorter than its 24-byte header"):
        StatorJournal(str(tmp_path))
    with pytest.raises(FileNotFoundError):
        read_journal(str(tmp_path / "nowhere"))


# -- pysyncobj on top ------------------------------------------------------------------------------------------
class Counter(SyncObj):
    def __init__(self, address: str, conf: SyncObjConf):
        super().__init__(address, [], conf)
        self.total = 0

    @replicated
    def incr(self, n: int) -> int:
        self.total += n
        return self.total


def _start_counter(monkeypatch, address: str, directory: str) -> tuple[Counter, list[StatorJournal]]:
    journals: list[StatorJournal] = []

    def create_journal(path: str) -> StatorJournal:
        journals.append(StatorJournal(path))
        return journals[-1]

    conf = SyncObjConf(autoTick=True, journalFile=directory, raftMinTimeout=0.1, raftMaxTimeout=0.2,
                       appendEntriesPeriod=0.02, connectionRetryTime=0.2)
    before = set(threading.enumerate())
    with monkeypatch.context() as m:
        m.setattr(pysyncobj_syncobj, "createJournal", create_journal)
        counter = Counter(address, conf)
    counter.tick_threads = set(threading.enumerate()) - before   # pysyncobj's autoTick thread
    return counter, journals


def _stop(counter: Counter) -> None:
    counter.destroy()
    for thread in counter.tick_threads:
        thread.join(WAIT_S)
        assert not thread.is_alive()


def _wait_for(check, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_pysyncobj_runs_on_stator_journal(tmp_path, monkeypatch):
    directory = str(tmp_path / "raft")
    base = free_base_port()
    counter, journals = _start_counter(monkeypatch, f"127.0.0.1:{base}", directory)
    try:
        _wait_for(counter._isLeader, "the single node to lead")
        results = [counter.incr(n, sync=True, timeout=WAIT_S) for n in (1, 2, 3)]
        assert results == [1, 3, 6]
        journal = journals[0]
        assert [e[0][:1] for e in journal[:]][-3:] == [b"\x00"] * 3   # REGULAR commands after the no-ops
        assert journal.getCurrentTerm() >= 1 and journal.state_writes >= 1
    finally:
        _stop(counter)
    contents = read_journal(directory)
    assert contents.commit_index == contents.entries[-1][1]         # saved by _destroy
    assert contents.voted_for == f"127.0.0.1:{base}"

    again, journals = _start_counter(monkeypatch, f"127.0.0.1:{base + 1}", directory)
    try:
        _wait_for(lambda: again.total == 6, "the journal to be replayed")
        assert journals[0][:len(contents.entries)] == contents.entries
        _wait_for(again._isLeader, "the restarted node to lead")
        assert again.incr(4, sync=True, timeout=WAIT_S) == 10
    finally:
        _stop(again)
