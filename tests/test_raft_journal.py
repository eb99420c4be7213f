"""meta/raft/journal.py on real files: round trips, truncation and compaction, segments, what a crash keeps (SIGKILLed
children, with the page cache and with the power-loss simulation), torn tails, single-byte damage, pysyncobj on
top, and what a compaction costs."""

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

from meta.raft import journal as rj
from meta.raft.journal import (JOURNAL_FILE, STATE_FILE, JournalDamaged, JournalFormatError, JournalIO,
                               MemoryUntilSyncJournalIO, OsJournalIO, StatorJournal, journal_exists, journal_files,
                               journal_io, read_journal)
from ops.devcluster import free_base_port
from tests.support.raft_journal_files import (SMALL_SEGMENT, entry, fill, journal_with_last, log_bytes, segment,
                                                 segments, seqs, state_line)

REPO = Path(__file__).resolve().parent.parent
WAIT_S = 20.0
def run_child(script: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], cwd=REPO, env=_child_env(),
                          capture_output=True, timeout=60)

@pytest.fixture(autouse=True)
def _segments_grow_with_their_records(monkeypatch):
    """These tests read, cut and flip the segment files byte by byte as a file that grows with each record: no space
    allocated ahead. The layout with it, and power losses in it, are tests/test_raft_journal_allocation.py's."""
    monkeypatch.setattr(rj, "ALLOCATE_AHEAD_BYTES", 0)



def _child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


# -- round trips -----------------------------------------------------------------------------------------------
def test_fresh_journal_has_pysyncobjs_defaults(tmp_path):
    d = tmp_path / "new" / "dir"
    j = StatorJournal(str(d))
    assert (len(j), j.last_index, j.synced_index, j.dirty) == (0, 0, 0, False)
    assert (j.getCurrentTerm(), j.getVotedForNodeId(), j.getRaftCommitIndex()) == (0, None, 1)
    assert j[:] == [] and j.sync() is False
    j._destroy()
    assert [p.name for p in segments(d)] == ["raft.log.0000000000000001"]
    assert log_bytes(d) == rj.file_header()
    assert not (d / STATE_FILE).exists()                 # nothing changed: nothing written
    assert journal_exists(str(d)) and journal_files(str(d)) == [str(segment(d, 1))]
    assert not journal_exists(str(tmp_path)) and not journal_exists(str(tmp_path / "nowhere"))


@pytest.mark.parametrize("segment_bytes_max", [rj.SEGMENT_BYTES_MAX, 64 * 1024])
def test_round_trip_with_big_and_empty_commands(tmp_path, segment_bytes_max):
    rng = random.Random(7)
    sizes = [0, 1, 100 * 1024, 2 * 1024 * 1024, 5, 40_000, 40_000, 40_000]
    entries = [(rng.randbytes(size), 10 + n, 3 + n // 2) for n, size in enumerate(sizes)]
    j = StatorJournal(str(tmp_path), segment_bytes_max=segment_bytes_max)
    fill(j, entries)
    j.setCurrentTerm(5, "127.0.0.1:4000")
    j.setRaftCommitIndex(12)
    j._destroy()
    files = segments(tmp_path)
    if segment_bytes_max == rj.SEGMENT_BYTES_MAX:
        assert len(files) == 1
    else:   # a record bigger than a segment goes whole into one of its own; the others are cut at the limit
        record_sizes = [rj.RECORD_OVERHEAD_BYTES + size for size in sizes]
        assert [f.stat().st_size - rj.FILE_HEADER_BYTES for f in files] == [
            sum(record_sizes[:2]), record_sizes[2], record_sizes[3], sum(record_sizes[4:6]), record_sizes[6],
            record_sizes[7]]
        assert seqs(tmp_path) == [1, 2, 3, 4, 5, 6]

    k = StatorJournal(str(tmp_path), segment_bytes_max=segment_bytes_max)
    assert k[:] == entries and len(k) == len(entries)
    assert all(type(e) is tuple for e in k[:])
    assert (k.getCurrentTerm(), k.getVotedForNodeId(), k.getRaftCommitIndex()) == (5, "127.0.0.1:4000", 12)
    assert k.synced_index == k.last_index == 17
    for item in (0, -1, 3, slice(1, 3), slice(-2, None), slice(None), slice(None, None, 2), slice(3, 99),
                 slice(99, None), slice(-99, 2)):
        assert k[item] == entries[item], item
    with pytest.raises(IndexError):
        k[len(entries)]
    contents = read_journal(str(tmp_path))
    assert contents.entries == entries and contents.torn_bytes == 0
    assert (contents.current_term, contents.voted_for, contents.commit_index) == (5, "127.0.0.1:4000", 12)
    assert journal_files(str(tmp_path)) == [str(f) for f in files] + [str(tmp_path / STATE_FILE)]
    k._destroy()


@pytest.mark.parametrize("segment_bytes_max", [rj.SEGMENT_BYTES_MAX, SMALL_SEGMENT])
def test_truncation_compaction_and_clear_survive_reopen(tmp_path, segment_bytes_max):
    d = str(tmp_path)
    small = segment_bytes_max == SMALL_SEGMENT

    def journal() -> StatorJournal:
        return StatorJournal(d, segment_bytes_max=segment_bytes_max)

    j = journal()
    fill(j, (entry(i) for i in range(1, 31)))
    j.sync()
    j.deleteEntriesFrom(20)                      # a log conflict: positions >= 20, so indexes 21..30
    assert j.last_index == 20 and j.synced_index == 20 and j.dirty
    fill(j, (entry(i, term=2) for i in range(21, 26)))
    j._destroy()

    j = journal()
    expected = [entry(i) for i in range(1, 21)] + [entry(i, term=2) for i in range(21, 26)]
    assert j[:] == expected
    before = seqs(tmp_path)
    assert (len(before) > 4) == small
    j.deleteEntriesTo(5)                         # compaction: drop positions < 5, indexes 1..5
    assert j[:] == expected[5:] and j.compactions == 1 and not j.dirty and j.synced_index == 25
    assert read_journal(d).entries == expected[5:]   # durable on return, the unlinks in the background
    assert j.wait_for_unlinks(WAIT_S)
    assert (seqs(tmp_path) != before) == small   # only whole segments below index 6 went
    assert read_journal(d).entries == expected[5:]
    fill(j, (entry(i, term=2) for i in range(26, 29)))
    j.deleteEntriesTo(0)                         # nothing to drop: no compaction
    assert j.compactions == 1
    j._destroy()

    j = journal()
    expected = expected[5:] + [entry(i, term=2) for i in range(26, 29)]
    assert j[:] == expected and j[0][1] == 6
    j.deleteEntriesFrom(1)                       # everything but index 6, across segments when they are small
    fill(j, (entry(i, term=3) for i in range(7, 12)))
    j.sync()
    assert read_journal(d).entries == [expected[0]] + [entry(i, term=3) for i in range(7, 12)]
    last_seq = seqs(tmp_path)[-1]
    j.clear()
    assert (len(j), j.last_index, j.synced_index) == (0, 0, 0)
    assert read_journal(d).entries == []         # clear() is durable at once (a second reader sees it)
    assert j.wait_for_unlinks(WAIT_S) and seqs(tmp_path) == [last_seq + 1]
    fill(j, [entry(100, term=7), entry(101, term=7)])   # after a clear the log may start anywhere (a snapshot)
    j._destroy()

    j = journal()
    assert j[:] == [entry(100, term=7), entry(101, term=7)]
    j.deleteEntriesTo(5)                         # past the end: everything goes
    j.deleteEntriesFrom(0)
    assert j[:] == []
    fill(j, [entry(50, term=8)])                 # and again anywhere
    j.deleteEntriesFrom(0)                       # a conflict at the first entry: the log may then start anywhere
    fill(j, [entry(40, term=9)])
    j._destroy()
    j = journal()
    assert j[:] == [entry(40, term=9)]
    j.deleteEntriesFrom(0)
    j._destroy()
    assert StatorJournal(d)[:] == [] and len(segments(tmp_path)) == 1 and log_bytes(tmp_path) == rj.file_header()


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
    assert (tmp_path / STATE_FILE).read_bytes().startswith(b"STATOR-RAFT-STATE 3 ")
    assert (tmp_path / STATE_FILE).read_bytes().endswith(
        b',"first_segment":1,"first_index":null,"founding_voter":false}\n')


def test_a_writeback_started_ahead_makes_nothing_durable_and_is_skipped_when_nothing_is_new(tmp_path):
    # The leader has the disk start on its entries before it sends them (GroupCommit.start_writeback): only a sync
    # may move what counts as durable, or the leader would count itself for entries a power loss can still take.
    j = StatorJournal(str(tmp_path))
    assert j.start_writeback() is False and j.writebacks == 0        # nothing appended
    fill(j, (entry(i) for i in range(1, 4)))
    assert j.start_writeback() is True and j.writebacks == 1          # sync_file_range(2) on Linux
    assert j.dirty and j.synced_index == 0 and j.syncs == 0
    assert j.sync() is True and j.synced_index == 3 and not j.dirty
    assert j.start_writeback() is False and j.writebacks == 1         # synced: nothing to start
    j._destroy()
    m = StatorJournal(str(tmp_path / "m"), MemoryUntilSyncJournalIO())
    m.add(*entry(1))
    assert m.start_writeback() is False and m.writebacks == 0         # its appends are in memory until the sync
    m._destroy()


def test_a_founding_voter_mark_is_durable_at_once_written_once_and_kept_across_restarts(tmp_path):
    j = StatorJournal(str(tmp_path))
    assert j.founding_voter is False
    writes = j.state_writes
    j.mark_founding_voter()
    assert j.founding_voter is True and j.state_writes == writes + 1
    assert readstate_line(tmp_path).endswith(b',"founding_voter":true}\n')   # on disk before it returns
    j.mark_founding_voter()
    j.setCurrentTerm(5, None)   # a later term and vote keep it
    assert j.state_writes == writes + 2
    j._destroy()
    k = StatorJournal(str(tmp_path))
    assert k.founding_voter is True and k.getCurrentTerm() == 5
    k._destroy()


def readstate_line(directory) -> bytes:
    return (directory / STATE_FILE).read_bytes()


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
    with pytest.raises(ValueError, match="no room"):
        StatorJournal(str(tmp_path), segment_bytes_max=rj.FILE_HEADER_BYTES)


# -- compaction costs nothing per record -----------------------------------------------------------------------
class CountingIO(JournalIO):
    """OsJournalIO underneath; counts the bytes each file is given (by name) and notes removals and truncations."""

    def __init__(self) -> None:
        self.inner = OsJournalIO()
        self.names: dict[int, str] = {}
        self.written: dict[str, int] = {}
        self.removed: list[str] = []
        self.truncated: list[str] = []

    def _count(self, name: str, data: bytes) -> None:
        self.written[name] = self.written.get(name, 0) + len(data)

    def make_directory(self, path: str) -> None:
        self.inner.make_directory(path)

    def list_directory(self, path: str) -> list[str]:
        return self.inner.list_directory(path)

    def read(self, path: str) -> bytes | None:
        return self.inner.read(path)

    def write_durably(self, path: str, chunks: Iterable[bytes], tmp_path: str) -> None:
        data = b"".join(chunks)
        self._count(os.path.basename(path), data)
        self.inner.write_durably(path, [data], tmp_path)

    def remove(self, path: str) -> bool:
        self.removed.append(os.path.basename(path))
        return self.inner.remove(path)

    def create(self, path: str) -> int:
        handle = self.inner.create(path)
        self.names[handle] = os.path.basename(path)
        return handle

    def open_append(self, path: str) -> int:
        handle = self.inner.open_append(path)
        self.names[handle] = os.path.basename(path)
        return handle

    def append(self, handle: int, data: bytes) -> None:
        self._count(self.names[handle], data)
        self.inner.append(handle, data)

    def truncate(self, handle: int, size: int) -> None:
        self.truncated.append(self.names[handle])
        self.inner.truncate(handle, size)

    def sync(self, handle: int) -> None:
        self.inner.sync(handle)

    def sync_directory(self, path: str) -> None:
        self.inner.sync_directory(path)

    def close(self, handle: int) -> None:
        self.inner.close(handle)


def _first_index_in(path: Path) -> int:
    return struct.unpack_from("<Q", path.read_bytes(), rj.FILE_HEADER_BYTES + 8)[0]


def test_compaction_and_clear_never_copy_a_record(tmp_path):
    """deleteEntriesTo writes the state file and unlinks whole segments, nothing else; clear() adds one segment
    header. Reopened, the journal holds exactly the kept entries."""
    d = str(tmp_path)
    io = CountingIO()
    j = StatorJournal(d, io, segment_bytes_max=4096)
    fill(j, (entry(i) for i in range(1, 401)))
    j.sync()
    before = segments(tmp_path)
    assert len(before) >= 6
    io.written.clear()
    j.deleteEntriesTo(300)                               # indexes 1..300 go, 301 is the first kept
    assert j.wait_for_unlinks(WAIT_S)
    after = segments(tmp_path)
    assert io.written == {STATE_FILE: len((tmp_path / STATE_FILE).read_bytes())}
    assert io.truncated == []
    assert io.removed == [p.name for p in before[:len(before) - len(after)]] and len(io.removed) >= 4
    assert after == before[len(io.removed):]
    assert _first_index_in(after[0]) <= 301 < _first_index_in(after[1])   # the one holding 301 is the first kept
    assert (j[0][1], j.last_index, j.compactions) == (301, 400, 1)
    state = (tmp_path / STATE_FILE).read_bytes()
    assert state.endswith(b',"first_segment":%d,"first_index":301,"founding_voter":false}\n' % seqs(tmp_path)[0])
    j._destroy()

    k = StatorJournal(d, segment_bytes_max=4096)
    assert k[:] == [entry(i) for i in range(301, 401)]
    last = seqs(tmp_path)[-1]
    k._destroy()

    io = CountingIO()
    k = StatorJournal(d, io, segment_bytes_max=4096)
    k.clear()
    assert k.wait_for_unlinks(WAIT_S)
    assert io.written == {STATE_FILE: len((tmp_path / STATE_FILE).read_bytes()),
                          rj.segment_name(last + 1): rj.FILE_HEADER_BYTES}
    assert seqs(tmp_path) == [last + 1] and k.compactions == 1
    k._destroy()
    assert StatorJournal(d)[:] == []


def test_compactions_in_a_row_each_drop_whole_segments_and_reopen_to_the_kept_entries(tmp_path):
    """Each compaction finds the first kept segment from the list positions the one before renumbered."""
    d = str(tmp_path)
    j = StatorJournal(d, segment_bytes_max=4096)
    fill(j, (entry(i) for i in range(1, 401)))
    j.sync()
    for dropped, first in ((100, 101), (100, 201), (150, 351)):
        j.deleteEntriesTo(dropped)                       # positions < dropped of what is left
        assert j.wait_for_unlinks(WAIT_S)
        assert j[:] == [entry(i) for i in range(first, 401)]
        kept = segments(tmp_path)
        assert _first_index_in(kept[0]) <= first and (len(kept) == 1 or first < _first_index_in(kept[1]))
    assert j.compactions == 3
    j._destroy()
    k = StatorJournal(d, segment_bytes_max=4096)
    assert k[:] == [entry(i) for i in range(351, 401)]
    k._destroy()


def test_a_dead_segment_is_shrunk_in_steps_before_it_is_removed(tmp_path, monkeypatch):
    cuts: list[int] = []
    pauses: list[float] = []
    real_ftruncate = os.ftruncate
    monkeypatch.setattr(rj.os, "ftruncate", lambda fd, size: (cuts.append(size), real_ftruncate(fd, size))[1])
    monkeypatch.setattr(rj.time, "sleep", pauses.append)
    step = rj.DEAD_SHRINK_BYTES
    io = OsJournalIO()
    for size, expected in ((2 * step + 1, [step + 1, 1]), (step, []), (step + 1, [1]), (0, [])):
        dead = tmp_path / f"dead-{size}"
        with open(dead, "wb") as f:
            f.truncate(size)                         # sparse: no bytes written
        cuts.clear()
        pauses.clear()
        assert io.remove_dead(str(dead)) is True
        assert not dead.exists() and cuts == expected and pauses == [rj.DEAD_SHRINK_PAUSE_S] * len(expected)
    assert io.remove_dead(str(tmp_path / "never-there")) is False


def test_an_empty_or_foreign_single_file_raft_log_is_refused_by_name(tmp_path):
    single = tmp_path / JOURNAL_FILE
    reads = "this code reads STATOR-RAFT-LOG version 1 in segment files raft.log.<seq> only;"
    for content in (b"", b"SQLite format 3\0"):
        single.write_bytes(content)
        with pytest.raises(JournalFormatError) as caught:
            StatorJournal(str(tmp_path))
        assert str(caught.value).startswith(f"{single}: found a single-file raft.log of another format, {reads}")
    assert segments(tmp_path) == []


def test_a_segment_holding_pysyncobj_s_journal_is_refused_naming_it_and_what_it_is(tmp_path):
    path = segment(tmp_path, 1)
    path.write_bytes(rj.PYSYNCOBJ_MAGIC.ljust(rj._PYSYNCOBJ_VERSION_AT, b"\0") + b"0.3.17\0\0" + struct.pack("<I", 1)
                     + b"entries")
    with pytest.raises(JournalFormatError) as caught:
        StatorJournal(str(tmp_path))
    assert caught.value.path == str(path)
    assert str(caught.value) == (
        f"{path}: found pysyncobj's own journal (format version 1, pysyncobj 0.3.17), this code reads "
        "STATOR-RAFT-LOG version 1 only; this node cannot trust its raft log: stop it, move its data directory aside "
        "and restart it, so it rejoins the cluster from a peer")


def test_pysyncobj_s_header_is_described_only_when_read_whole():
    name = rj.PYSYNCOBJ_MAGIC.ljust(rj._PYSYNCOBJ_VERSION_AT, b"\0")
    whole = name + b"0.3.17\0\0" + struct.pack("<I", 1)
    assert len(whole) == rj._PYSYNCOBJ_VERSION_AT + 12
    assert rj._pysyncobj_journal(whole) == "pysyncobj's own journal (format version 1, pysyncobj 0.3.17)"
    assert rj._pysyncobj_journal(whole[:-1]) == "pysyncobj's own journal"
    odd = name + b"0.3\xff\0\0\0\0" + struct.pack("<I", 7)   # a version string that is not ASCII
    assert rj._pysyncobj_journal(odd) == "pysyncobj's own journal (format version 7, pysyncobj 0.3\ufffd)"


def test_compaction_cost_measured(tmp_path, capsys):
    """A measurement, printed, not asserted: deleteEntriesTo keeping the last 10 MiB of a 50 MiB log of 1 MiB
    entries, as the single-file build did it (the kept records written to a new file, fsynced, renamed, directory
    fsynced: timed here with OsJournalIO.write_durably) and now (a state file write and unlinks)."""
    rng = random.Random(5)
    entries = [(rng.randbytes(1 << 20), i, 1) for i in range(1, 51)]
    kept = entries[40:]
    rewrite = tmp_path / "rewrite.log"
    started = time.perf_counter()
    OsJournalIO().write_durably(str(rewrite), [rj.file_header(), *(rj.encode_record(*e) for e in kept)],
                                str(rewrite) + rj.COMPACTING_SUFFIX)
    rewrite_s = time.perf_counter() - started
    measured = []
    for segment_bytes_max in (rj.SEGMENT_BYTES_MAX, 8 << 20):
        d = tmp_path / f"segments-{segment_bytes_max}"
        j = StatorJournal(str(d), segment_bytes_max=segment_bytes_max)
        fill(j, entries)
        j.sync()
        count = len(segments(d))
        started = time.perf_counter()
        j.deleteEntriesTo(40)
        took = time.perf_counter() - started
        assert j.wait_for_unlinks(WAIT_S)
        measured.append((took, time.perf_counter() - started, segment_bytes_max >> 20, count - len(segments(d))))
        assert j[:] == kept
        j._destroy()
    with capsys.disabled():
        print(f"\ncompaction keeping the last 10 MiB of a 50 MiB log: single-file rewrite {rewrite_s * 1e3:.1f} ms "
              "on the tick thread; segments: " + "; ".join(
                  f"{size} MiB segments {took * 1e3:.2f} ms on the tick thread, {gone} unlinked in the background "
                  f"by {done * 1e3:.1f} ms" for took, done, size, gone in measured))


# -- crashes ---------------------------------------------------------------------------------------------------
class _Crash(Exception):
    pass


class CrashingIO(OsJournalIO):
    """Does the first ``steps`` steps of a compaction's durable replace of the state file, then "crashes" (raises):
    what is on disk then is what a kill at that moment leaves (the page cache survives a kill). Step 4: the state
    file is in place and one dead segment unlinked (then the unlinking thread fails: the process is gone)."""

    def __init__(self, steps: int):
        super().__init__()
        self.steps = steps
        self.unlinked = 0

    def write_durably(self, path: str, chunks: Iterable[bytes], tmp_path: str) -> None:
        if self.steps == 4:
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

    def remove(self, path: str) -> bool:
        if self.unlinked == 1:
            raise _Crash
        self.unlinked += 1
        return super().remove(path)


@pytest.mark.parametrize("steps", [0, 1, 2, 3, 4])
def test_compaction_crash_at_each_step_leaves_a_whole_log(tmp_path, steps):
    d = str(tmp_path)
    j = StatorJournal(d, segment_bytes_max=SMALL_SEGMENT)
    fill(j, (entry(i) for i in range(1, 41)))
    j._destroy()
    before = seqs(tmp_path)
    j = StatorJournal(d, CrashingIO(steps), segment_bytes_max=SMALL_SEGMENT)
    if steps < 4:
        with pytest.raises(_Crash):
            j.deleteEntriesTo(25)
    else:
        with structlog.testing.capture_logs() as logs:
            j.deleteEntriesTo(25)
            assert j.wait_for_unlinks(WAIT_S)
        assert logs[0]["event"] == "raft_journal_dead_segment_unlink_failed" and "_Crash" in logs[0]["error"]
    j._io.close(j._handle)                               # the crashed process's descriptor
    leftover = tmp_path / (STATE_FILE + rj.STATE_WRITING_SUFFIX)
    assert leftover.exists() == (steps < 3)
    assert seqs(tmp_path) == (before if steps < 4 else before[1:])
    with structlog.testing.capture_logs() as logs:
        k = StatorJournal(d, segment_bytes_max=SMALL_SEGMENT)
    assert not leftover.exists()
    assert k[:] == [entry(i) for i in range(1 if steps < 3 else 26, 41)]
    if steps < 3:
        assert logs == [] and seqs(tmp_path) == before
    else:                                                # the state file says they are dead: deleted now
        dead = [rj.segment_name(seq) for seq in before if seq < seqs(tmp_path)[0]]
        assert len(dead) >= 3 and seqs(tmp_path) == before[len(dead):]
        assert [(e["event"], [os.path.basename(p) for p in e["paths"]]) for e in logs] == [
            ("raft_journal_dead_segments_removed", dead[steps - 3:])]
    k._destroy()


class CrashOnCreate(OsJournalIO):
    def create(self, path: str) -> int:
        raise _Crash


def test_clear_crash_before_its_segment_is_created(tmp_path):
    """clear() writes the state file first: a crash before the new segment exists leaves an empty log, start-up
    creates the segment and deletes the dead ones."""
    d = str(tmp_path)
    j = StatorJournal(d, segment_bytes_max=SMALL_SEGMENT)
    fill(j, (entry(i) for i in range(1, 21)))
    j.sync()
    last = seqs(tmp_path)[-1]
    j._io = CrashOnCreate()
    with pytest.raises(_Crash):
        j.clear()                                        # the state file is written, the old handle closed
    with structlog.testing.capture_logs() as logs:
        k = StatorJournal(d, segment_bytes_max=SMALL_SEGMENT)
    assert k[:] == [] and seqs(tmp_path) == [last + 1] and log_bytes(tmp_path) == rj.file_header()
    assert [e["event"] for e in logs] == ["raft_journal_dead_segments_removed"]
    fill(k, [entry(500, term=3), entry(501, term=3)])
    k._destroy()
    assert StatorJournal(d)[:] == [entry(500, term=3), entry(501, term=3)]


KILL_DURING_COMPACTIONS = """
    import sys
    from meta.raft.journal import StatorJournal, journal_io
    j = StatorJournal(sys.argv[1], journal_io("memory_until_sync"), segment_bytes_max=int(sys.argv[2]))
    i = j.last_index
    step = 0
    while True:
        step += 1
        if step % 7 == 0:                         # as a snapshot install: the log starts over, further on
            print("clear", flush=True)
            j.clear()                             # durable on return
            i += 1000
        for _ in range(20):
            i += 1
            j.add((b"%08d" % i) * (1 + i % 64), i, i // 500)
        if step % 2 == 0 and len(j) > 50:         # every other step a compaction, which a kill may interrupt
            j.deleteEntriesTo(len(j) - 50)        # durable on return (with nothing to drop it does nothing)
        else:
            j.sync()
        print(j[0][1], j.last_index, flush=True)   # everything from the first to the last is durable
"""


@pytest.mark.parametrize("segment_bytes_max", [rj.SEGMENT_BYTES_MAX, 1500])
def test_sigkill_in_a_loop_of_compactions_clears_and_appends(tmp_path, segment_bytes_max):
    """A child appends, syncs, compacts and clears without pause, with the power-loss IO; SIGKILLed at random
    moments, again and again on the same directory. Every time the log reopens whole, holding every entry the child
    reported durable (unless a clear() came after the report), each one intact, and no dead segment is left."""
    d = str(tmp_path)
    rng = random.Random(11)
    for _round in range(4):
        child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(KILL_DURING_COMPACTIONS), d,
                                  str(segment_bytes_max)], cwd=REPO, env=_child_env(), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
        try:
            ready, _, _ = select.select([child.stdout], [], [], WAIT_S)
            assert ready, "the child reported nothing"
            time.sleep(rng.uniform(0.02, 0.3))
        finally:
            child.send_signal(signal.SIGKILL)
            out, err = child.communicate(timeout=WAIT_S)
        assert child.returncode == -signal.SIGKILL, err.decode()
        lines = [line.split() for line in out.decode().split("\n")[:-1]]   # whole lines only
        reports = [n for n, line in enumerate(lines) if len(line) == 2]
        assert reports
        first_reported, reported_last = map(int, lines[reports[-1]])
        cleared_since = ["clear"] in lines[reports[-1]:]
        k = StatorJournal(d, segment_bytes_max=segment_bytes_max)   # checks every record, index order and terms
        kept = len(k) > 0 and first_reported <= k[0][1] <= reported_last <= k.last_index
        if cleared_since:                                # before the clear, or after it (nothing synced since)
            assert kept or len(k) == 0 or k[0][1] >= reported_last + 1001, (k[0][1], reported_last)
        else:                                            # a compaction never comes undone
            assert kept, (first_reported, reported_last, k[0][1] if len(k) else None, k.last_index)
        assert all(e == ((b"%08d" % e[1]) * (1 + e[1] % 64), e[1], e[1] // 500) for e in k[:])
        k._destroy()
        on_disk = [str(p) for p in segments(tmp_path)]
        assert journal_files(d) == on_disk + ([str(tmp_path / STATE_FILE)] if (tmp_path / STATE_FILE).exists()
                                              else [])   # every segment on disk is live
        assert seqs(tmp_path) == list(range(seqs(tmp_path)[0], seqs(tmp_path)[-1] + 1))


KILL_AFTER = """
    import os, signal, sys
    from meta.raft.journal import StatorJournal, journal_io
    directory, io, scenario, segment_bytes_max = sys.argv[1:5]
    j = StatorJournal(directory, journal_io(io), segment_bytes_max=int(segment_bytes_max))
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


KILL_SEGMENT = 150      # two or three of _kill_entry's records per segment
BEFORE_LAST_TRUNCATION = [(i, 1) for i in range(1, 11)] + [(i, 2) for i in range(11, 19)]


@pytest.mark.parametrize("io,scenario,segment_bytes_max,expected,at_least", [
    ("memory_until_sync", "appends", rj.SEGMENT_BYTES_MAX, [(i, 1) for i in range(1, 21)], None),
    ("os", "appends", rj.SEGMENT_BYTES_MAX, [(i, 1) for i in range(1, 31)], None),
    ("memory_until_sync", "truncations", rj.SEGMENT_BYTES_MAX,
     [(i, 1) for i in range(1, 11)] + [(i, 2) for i in range(11, 16)], None),
    ("os", "truncations", rj.SEGMENT_BYTES_MAX, [(i, 1) for i in range(1, 11)] + [(11, 2), (12, 2), (13, 3)], None),
    # A new segment syncs the full one first: some of 21..30 may be kept.
    ("memory_until_sync", "appends", KILL_SEGMENT, [(i, 1) for i in range(1, 31)], 20),
    ("os", "appends", KILL_SEGMENT, [(i, 1) for i in range(1, 31)], None),
    # The unlinks of a truncation reach the directory at once, its cut and later appends only with a sync: the log is
    # a prefix of the one before the last truncation that keeps every entry it kept (1..12).
    ("memory_until_sync", "truncations", KILL_SEGMENT, BEFORE_LAST_TRUNCATION, 12),
    ("os", "truncations", KILL_SEGMENT, [(i, 1) for i in range(1, 11)] + [(11, 2), (12, 2), (13, 3)], None),
])
def test_sigkill_keeps_what_the_io_promises(tmp_path, io, scenario, segment_bytes_max, expected, at_least):
    """memory_until_sync: a SIGKILL loses exactly what was not synced (a power loss); os: nothing (page cache)."""
    done = run_child(KILL_AFTER, str(tmp_path), io, scenario, str(segment_bytes_max))
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    assert (len(segments(tmp_path)) > 3) == (segment_bytes_max == KILL_SEGMENT)
    j = StatorJournal(str(tmp_path))
    expected_entries = [_kill_entry(i, term) for i, term in expected]
    if at_least is None:
        assert j[:] == expected_entries
    else:
        assert at_least <= len(j) and j[:] == expected_entries[:len(j)], [e[1:] for e in j[:]]
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


def test_a_new_segment_lost_to_a_power_loss_is_repaired(tmp_path):
    """A segment whose creation no sync covered holds nothing acknowledged: whatever a power loss left of it (no
    bytes, a beginning of its header, zeros), as the last segment it is rewritten empty; before another segment it
    is damage."""
    d = tmp_path / "j"
    j = StatorJournal(str(d), MemoryUntilSyncJournalIO(), segment_bytes_max=SMALL_SEGMENT)
    fill(j, (entry(i) for i in range(1, 6)))             # 160 record bytes: segment 1 is full
    j.sync()
    j.add(*entry(6))                                     # segment 2, its header and record in memory only
    assert seqs(d) == [1, 2] and j.dirty
    j._io.close(j._handle)                               # a power loss
    assert segment(d, 2).read_bytes() == b""
    saved = {p.name: p.read_bytes() for p in d.iterdir()}
    kept = [entry(i) for i in range(1, 6)]
    record_6 = rj.encode_record(*entry(6))
    for left in (b"", rj.file_header()[:10], rj.file_header()[:23], bytes(7), bytes(24), bytes(24) + record_6):
        for name, raw in saved.items():
            (d / name).write_bytes(raw)
        segment(d, 2).write_bytes(left)
        seen = read_journal(str(d))                      # repairs nothing
        assert (seen.entries, seen.torn_bytes) == (kept, len(left))
        assert segment(d, 2).read_bytes() == left
        with structlog.testing.capture_logs() as logs:
            k = StatorJournal(str(d), segment_bytes_max=SMALL_SEGMENT)
        assert k[:] == kept and segment(d, 2).read_bytes() == rj.file_header()
        assert logs == [{"event": "raft_journal_torn_tail_truncated", "log_level": "warning",
                         "path": str(segment(d, 2)), "offset": 0, "bytes_dropped": len(left), "last_index": 5}]
        k.add(*entry(6, term=2))                         # the records go on in the repaired segment
        k._destroy()
        assert StatorJournal(str(d), segment_bytes_max=SMALL_SEGMENT)[:] == kept + [entry(6, term=2)]
        assert seqs(d) == [1, 2]

        for name, raw in saved.items():
            (d / name).write_bytes(raw)
        segment(d, 2).write_bytes(left)
        segment(d, 3).write_bytes(rj.file_header() + record_6)   # not the last segment any more: damage
        with pytest.raises(JournalDamaged) as caught:
            StatorJournal(str(d))
        assert caught.value.path == str(segment(d, 2)) and caught.value.offset == 0, str(caught.value)
        assert segment(d, 2).read_bytes() == left
        segment(d, 3).unlink()


def test_journal_io_names():
    assert type(journal_io()) is OsJournalIO and type(journal_io("os")) is OsJournalIO
    assert type(journal_io("memory_until_sync")) is MemoryUntilSyncJournalIO
    with pytest.raises(ValueError, match="os, memory_until_sync"):
        journal_io("mmap")


# -- torn tails ------------------------------------------------------------------------------------------------
def test_torn_tail_at_every_cut_is_truncated(tmp_path):
    raw, last_at, entries = journal_with_last(tmp_path, 600)
    path = segment(tmp_path, 1)
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
    raw, last_at, entries = journal_with_last(tmp_path, 3000, last_at=502)
    assert last_at == 502 and len(raw) == 502 + 3028
    path = segment(tmp_path, 1)
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
    raw, last_at, entries = journal_with_last(tmp_path, 3000)
    path = segment(tmp_path, 1)
    record_4_at = last_at - rj.RECORD_OVERHEAD_BYTES - len(entries[3][0])
    cases = {
        # the last record, damaged without a zeroed sector: a flipped bit, not a write that never happened
        "a byte of the last command": (raw[:last_at + 700] + bytes([raw[last_at + 700] ^ 0x10]) + raw[last_at + 701:],
                                       last_at, 5, "the record fails its CRC (the record before it holds index 4, "
                                                   "term 1)"),
        "the last record's length": (raw[:last_at + 4] + bytes([raw[last_at + 4] ^ 1]) + raw[last_at + 5:],
                                     last_at, 5, "the record header fails its CRC (the record before it holds "
                                                 "index 4, term 1)"),
        # a zeroed piece in a record that is not the last: what follows it must never be dropped
        "zeros in record 4": (_zero(raw, record_4_at + 24, record_4_at + 28), record_4_at, 4,
                              "the record fails its CRC (the record before it holds index 3, term 1)"),
        "garbage after the last record": (raw + b"\x01" * 40, len(raw), 6, "the record header fails its CRC (the "
                                          "record before it holds index 5, term 1)"),
        # a damaged header, then a torn last record: the records in between must not go with the torn one
        "record 4's length, then a torn record 5": (
            _zero(raw[:record_4_at + 4] + bytes([raw[record_4_at + 4] ^ 2]) + raw[record_4_at + 5:], 1024, 1536),
            record_4_at, 4, "the record header fails its CRC (the record before it holds index 3, term 1)"),
    }
    for name, (damaged, offset, number, why) in cases.items():
        path.write_bytes(damaged)
        with pytest.raises(JournalDamaged) as caught:
            StatorJournal(str(tmp_path))
        e = caught.value
        assert (e.path, e.offset, e.record_number) == (str(path), offset, number), name
        assert e.why == why, (name, e.why)
        assert path.read_bytes() == damaged, name        # refused, never repaired
        text = str(e)
        assert "\n" not in text and str(path) in text and f"at byte {offset} (record {number})" in text, text
        assert "move its data directory aside" in text, text
        assert str(pickle.loads(pickle.dumps(e))) == text   # it may cross a process boundary (a tool's worker)


def _several_segments(directory: Path, last: int = 30) -> list[Path]:
    j = StatorJournal(str(directory), segment_bytes_max=SMALL_SEGMENT)
    fill(j, (entry(i) for i in range(1, last + 1)))
    j._destroy()
    files = segments(directory)
    assert len(files) >= 5
    return files


NOT_LAST = "and this is not the last segment (every other one was synced whole)"


def test_damage_in_a_segment_that_is_not_the_last_is_refused_naming_it(tmp_path):
    """Every segment but the last was synced whole before the next began: a torn tail there is damage, and so is a
    record missing at its end (the next segment's first record does not follow)."""
    files = _several_segments(tmp_path)
    second, third = files[1], files[2]
    raw = second.read_bytes()
    first_len = rj.RECORD_OVERHEAD_BYTES + len(entry(_first_index_in(second))[0])
    last_at = len(raw) - rj.RECORD_OVERHEAD_BYTES - len(entry(_first_index_in(third) - 1)[0])
    cases = {
        "a byte of its first record": (second, raw[:54] + bytes([raw[54] ^ 0x40]) + raw[55:], second, 24, 1,
                                       "the record fails its CRC (the previous segment's last record holds index "
                                       "5, term 1)"),
        "its second record's header": (second, raw[:first_len + 30] + bytes([raw[first_len + 30] ^ 1]) +
                                       raw[first_len + 31:], second, 24 + first_len, 2,
                                       "the record header fails its CRC (the record before it holds index 6, term 1)"),
        "a torn tail": (second, raw[:-3], second, last_at, None,
                        f"the record runs past the end of the file, {NOT_LAST} (the record before it holds index 8, "
                        "term 1)"),
        "a cut inside a record header": (second, raw[:last_at + 10], second, last_at, None,
                                         f"the file ends inside a record header, {NOT_LAST} (the record before it "
                                         "holds index 8, term 1)"),
        "its last sector zeroed": (second, _zero(raw, len(raw) - 8, len(raw)), second, last_at, None,
                                   "the record fails its CRC (the record before it holds index 8, term 1)"),
        "its last record gone": (second, raw[:last_at], third, 24, 1, "it holds index 10, which does not follow the "
                                 "previous record's (the previous segment's last record holds index 8, term 1)"),
        "its file header": (second, raw[:20] + bytes([raw[20] ^ 1]) + raw[21:], second, 0, None,
                            "the file header fails its CRC"),
    }
    for name, (path, damaged, named, offset, number, why) in cases.items():
        path.write_bytes(damaged)
        for opener in (StatorJournal, read_journal):
            with pytest.raises(JournalDamaged) as caught:
                opener(str(tmp_path))
            e = caught.value
            assert (e.path, e.offset) == (str(named), offset) and e.why == why, (name, e.why)
            if number is not None:
                assert e.record_number == number, name
        assert path.read_bytes() == damaged, name        # refused, never repaired
        path.write_bytes(raw)
    assert read_journal(str(tmp_path)).entries == [entry(i) for i in range(1, 31)]


def _state(directory: Path) -> rj.RaftState:
    return rj._decode_state(str(directory / STATE_FILE), (directory / STATE_FILE).read_bytes())


def test_missing_segments_are_refused_naming_the_directory(tmp_path):
    d = tmp_path / "j"
    files = _several_segments(d)
    j = StatorJournal(str(d), segment_bytes_max=SMALL_SEGMENT)
    j.deleteEntriesTo(7)                                 # the first live segment holds dead records before 8
    j._destroy()
    live = [Path(p) for p in journal_files(str(d))[:-1]]
    assert live == files[1:] and _first_index_in(live[0]) < 8 and _state(d).first_index == 8
    state = (d / STATE_FILE).read_bytes()
    aside = tmp_path / "aside"
    aside.mkdir()

    def refused(why: str) -> None:
        for opener in (StatorJournal, read_journal):
            with pytest.raises(JournalDamaged) as caught:
                opener(str(d))
            e = caught.value
            assert (e.path, e.offset, e.record_number) == (str(d), None, None), str(e)
            assert why in e.why and "\n" not in str(e), str(e)

    def missing(path: Path, why: str) -> None:
        path.rename(aside / path.name)
        refused(why)
        (aside / path.name).rename(path)

    missing(live[2], f"segment {live[2].name} is missing: between {live[1].name} and {live[3].name}")
    missing(live[0], f"segment {live[0].name} is missing: the live segments begin at {live[1].name} (the state "
                     f"file's first segment is 2)")
    for path in live:
        path.rename(aside / path.name)
    refused("the state file says the log begins at index 8, but the live segments' records hold no entry from it on")
    for path in live:
        (aside / path.name).rename(path)
    (d / STATE_FILE).write_bytes(rj.encode_state(rj.RaftState(first_segment=2, first_index=3)))
    refused(f"the state file says the log begins at index 3, but the live segments' records begin at index "
            f"{_first_index_in(live[0])}")
    (d / STATE_FILE).unlink()                            # no state file: the log must begin at segment 1
    refused(f"segment {files[0].name} is missing: the live segments begin at {live[0].name}")
    (d / STATE_FILE).write_bytes(state)
    assert read_journal(str(d)).entries == [entry(i) for i in range(8, 31)]


def _record(command: bytes, index: int, term: int, length: int | None = None) -> bytes:
    """A record as the format describes it, written here independently of encode_record."""
    fields = struct.pack("<IQQ", len(command) if length is None else length, index, term)
    head = struct.pack("<I", zlib.crc32(fields)) + fields
    return head + command + struct.pack("<I", zlib.crc32(head + command))


def test_format_is_the_documented_one_and_order_is_checked(tmp_path):
    header = b"STATOR-RAFT-LOG\0" + struct.pack("<I", 1)
    header += struct.pack("<I", zlib.crc32(header))
    assert rj.file_header() == header and rj.encode_record(b"abc", 7, 2) == _record(b"abc", 7, 2)
    assert rj.segment_name(1) == "raft.log.0000000000000001" and rj.segment_name(12345) == "raft.log.0000000000012345"
    path = segment(tmp_path, 1)
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
    # across segments, the same rules
    for second, why in [([(b"c", 4, 1)], "does not follow"), ([(b"c", 2, 1)], "does not follow"),
                        ([(b"c", 3, 0)], "less than the previous")]:
        path.write_bytes(header + _record(b"a", 1, 1) + _record(b"b", 2, 1))
        segment(tmp_path, 2).write_bytes(header + b"".join(_record(*r) for r in second))
        with pytest.raises(JournalDamaged, match=why) as caught:
            read_journal(str(tmp_path))
        assert (caught.value.path, caught.value.offset) == (str(segment(tmp_path, 2)), 24)
    segment(tmp_path, 2).write_bytes(header + _record(b"c", 3, 1))
    assert StatorJournal(str(tmp_path))[:] == [(b"a", 1, 1), (b"b", 2, 1), (b"c", 3, 1)]
    # files that are not segments are left alone
    for name in ("raft.log.1", "raft.log.00000000000000001", "raft.log.000000000000000x", "raft.logs"):
        (tmp_path / name).write_bytes(b"x")
    assert read_journal(str(tmp_path)).entries == [(b"a", 1, 1), (b"b", 2, 1), (b"c", 3, 1)]
    StatorJournal(str(tmp_path))._destroy()
    assert all((tmp_path / name).exists() for name in ("raft.log.1", "raft.log.00000000000000001"))


# -- damage ----------------------------------------------------------------------------------------------------
def test_single_byte_flips_are_all_detected(tmp_path):
    """1,000 seeded single-byte flips over a compacted journal of 50 records of varied sizes in at least 3 segments
    and its state file: opening either refuses the files or holds exactly what they held (every byte of them is
    under a CRC, so in fact every flip is refused). A torn-tail repair would count as undetected: it changes what
    the journal holds."""
    rng = random.Random(20240611)
    d = tmp_path / "node"
    j = StatorJournal(str(d), segment_bytes_max=12_000)
    index, term = 41, 3
    for n in range(50):
        size = rng.choice([0, 1, 7, 24, 100, 511, 512, 513, 1500, 4096, 9000])
        command = bytes(rng.randrange(1, 256) for _ in range(size)) if size < 2000 else rng.randbytes(size)
        term += rng.random() < 0.2
        j.add(command, index + n, term)
    j.deleteEntriesTo(2)                                 # dead records in the first live segment
    j.setCurrentTerm(term + 1, "10.0.0.7:4321")
    j.setRaftCommitIndex(60)
    j._destroy()
    names = [Path(p).name for p in journal_files(str(d))]
    assert len(names) >= 4 and names[-1] == STATE_FILE  # three segments at least, then the state file
    files = {name: (d / name).read_bytes() for name in names}
    original = read_journal(str(d))
    assert original.entries[0][1] == 43 and _first_index_in(d / names[0]) == 41
    segment_names = names[:-1]
    weights = [len(files[name]) for name in segment_names]

    detected = harmless = undetected = 0
    for _ in range(1000):
        name = STATE_FILE if rng.random() < 0.1 else rng.choices(segment_names, weights)[0]
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
            if not (d / other).exists() or (d / other).read_bytes() != content:   # only a wrong repair changes more
                (d / other).write_bytes(content)
    assert undetected == 0
    assert (detected, harmless) == (1000, 0)
    assert sorted(p.name for p in d.iterdir()) == sorted(names)


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
    assert good == state_line(3, body)
    assert body == (b'{"current_term":3,"voted_for":"a:1","commit_index":1,"first_segment":1,"first_index":null,'
                    b'"founding_voter":false}')
    for damaged, error, words in [
        (good[:-1], JournalDamaged, "one line"),
        (good.replace(b'"a:1"', b'"a:2"'), JournalDamaged, "fails its CRC"),
        (b"", JournalDamaged, "one line"),
        (state_line(4, body), JournalFormatError,
         "found STATOR-RAFT-STATE version 4, this code reads STATOR-RAFT-STATE version 3"),
        (state_line(2, body.replace(b',"founding_voter":false', b"")), JournalFormatError,
         "found STATOR-RAFT-STATE version 2, this code reads STATOR-RAFT-STATE version 3"),
        (state_line(1, b'{"current_term":3,"voted_for":"a:1","commit_index":1}'), JournalFormatError,
         "found STATOR-RAFT-STATE version 1, this code reads STATOR-RAFT-STATE version 3"),
        (state_line(3, body.replace(b',"first_index":null', b"")), JournalDamaged, "does not hold exactly"),
        (state_line(3, body.replace(b',"founding_voter":false', b"")), JournalDamaged, "does not hold exactly"),
        (state_line(3, body.replace(b'"first_segment":1', b'"first_segment":0')), JournalDamaged,
         "first segment or first index of the wrong type"),
        (state_line(3, body.replace(b'"first_index":null', b'"first_index":"7"')), JournalDamaged,
         "first segment or first index of the wrong type"),
        (state_line(3, body.replace(b'"founding_voter":false', b'"founding_voter":0')), JournalDamaged,
         "holds a founding_voter that is not true or false"),
    ]:
        path.write_bytes(damaged)
        with pytest.raises(error) as caught:
            StatorJournal(str(tmp_path))
        assert str(path) in str(caught.value) and words in str(caught.value) and "\n" not in str(caught.value)
    path.unlink()                                        # missing: pysyncobj's defaults
    k = StatorJournal(str(tmp_path))
    assert (k.getCurrentTerm(), k.getVotedForNodeId(), k.getRaftCommitIndex()) == (0, None, 1)
    k._destroy()


_GOOD_STATE = (b'{"current_term":3,"voted_for":"a:1","commit_index":1,"first_segment":1,"first_index":null,'
               b'"founding_voter":false}')


@pytest.mark.parametrize("raw, why", [
    # the line itself
    (state_line(3, _GOOD_STATE) * 2, f"is not one line of at most {rj.STATE_BYTES_MAX} bytes"),
    (state_line(3, _GOOD_STATE)[:-1].replace(b" ", b"\n", 1),
     f"is not one line of at most {rj.STATE_BYTES_MAX} bytes"),
    (state_line(3, b'{"pad":"' + b"x" * rj.STATE_BYTES_MAX + b'"}'),
     f"is not one line of at most {rj.STATE_BYTES_MAX} bytes"),
    (b"STATOR-RAFT-STATES 3 00000000 {}\n", "does not begin with STATOR-RAFT-STATE"),
    (b"STATOR-RAFT-STATE 3 00000000\n", "does not begin with STATOR-RAFT-STATE"),
    # its version and CRC
    (b"STATOR-RAFT-STATE x3 00000000 {}\n", "has no version and CRC after its name"),
    (b"STATOR-RAFT-STATE 0000000003 00000000 {}\n", "has no version and CRC after its name"),
    (b"STATOR-RAFT-STATE 3 0000000 {}\n", "has no version and CRC after its name"),
    (b"STATOR-RAFT-STATE 3 0000000g {}\n", "has no version and CRC after its name"),
    (b"STATOR-RAFT-STATE 3 00000000 {}\n", "fails its CRC"),
    # its body
    (state_line(3, b"[1, 2"), "holds no JSON after its CRC"),
    (state_line(3, b"[]"),
     "does not hold exactly current_term, voted_for, commit_index, first_segment, first_index and founding_voter"),
    (state_line(3, _GOOD_STATE.replace(b"}", b',"more":1}')),
     "does not hold exactly current_term, voted_for, commit_index, first_segment, first_index and founding_voter"),
    (state_line(3, _GOOD_STATE.replace(b'"current_term":3', b'"current_term":-1')),
     "holds a term, vote or commit index of the wrong type"),
    (state_line(3, _GOOD_STATE.replace(b'"current_term":3', b'"current_term":true')),
     "holds a term, vote or commit index of the wrong type"),
    (state_line(3, _GOOD_STATE.replace(b'"commit_index":1', b'"commit_index":1.0')),
     "holds a term, vote or commit index of the wrong type"),
    (state_line(3, _GOOD_STATE.replace(b'"a:1"', b"[]")), "holds a term, vote or commit index of the wrong type"),
    (state_line(3, _GOOD_STATE.replace(b'"a:1"', b"-2")), "holds a term, vote or commit index of the wrong type"),
    (state_line(3, _GOOD_STATE.replace(b'"first_segment":1', b'"first_segment":"1"')),
     "holds a first segment or first index of the wrong type"),
    (state_line(3, _GOOD_STATE.replace(b'"first_index":null', b'"first_index":-3')),
     "holds a first segment or first index of the wrong type"),
    (state_line(3, _GOOD_STATE.replace(b'"founding_voter":false', b'"founding_voter":null')),
     "holds a founding_voter that is not true or false"),
    # the header's fields at their bounds: one space only, at most 9 digits of version, 8 lower-case hex of CRC
    (state_line(3, _GOOD_STATE).replace(b"STATE 3", b"STATE  3"), "has no version and CRC after its name"),
    (state_line(1000000000, _GOOD_STATE), "has no version and CRC after its name"),
    (state_line(3, _GOOD_STATE)[:26] + b"X" + state_line(3, _GOOD_STATE)[27:], "has no version and CRC after its name"),
])
def test_every_refusal_of_the_state_file_says_what_is_wrong_in_whole(tmp_path, raw, why):
    path = str(tmp_path / STATE_FILE)
    with pytest.raises(JournalDamaged) as caught:
        rj._decode_state(path, raw)
    assert type(caught.value) is JournalDamaged
    assert str(caught.value) == f"{path}: damaged: the raft state file {why}; {rj.REJOIN_ADVICE}"


@pytest.mark.parametrize("body, state", [
    (_GOOD_STATE, rj.RaftState(3, "a:1", 1, 1, None)),
    (b'{"current_term":0,"voted_for":7,"commit_index":0,"first_segment":1,"first_index":0,"founding_voter":true}',
     rj.RaftState(0, 7, 0, 1, 0, True)),
    (b'{"current_term":9,"voted_for":null,"commit_index":12,"first_segment":4,"first_index":300,'
     b'"founding_voter":false}', rj.RaftState(9, None, 12, 4, 300, False)),
])
def test_the_state_file_reads_back_what_was_written_at_every_edge_of_its_fields(tmp_path, body, state):
    # a vote may name a node by address (str) or by number; a term, a commit and a first index of 0 are whole numbers
    assert rj._decode_state(str(tmp_path / STATE_FILE), state_line(3, body)) == state
    assert rj._decode_state("x", rj.encode_state(state)) == state


def test_a_state_file_of_exactly_the_largest_size_is_read(tmp_path):
    # STATE_BYTES_MAX is inclusive: one byte more is refused (above)
    head = state_line(3, _GOOD_STATE)
    pad = rj.STATE_BYTES_MAX - len(head)
    vote = "a:1" + " " * pad   # a vote with spaces: only the length matters here
    raw = state_line(3, _GOOD_STATE.replace(b'"a:1"', f'"{vote}"'.encode()))
    assert len(raw) == rj.STATE_BYTES_MAX
    assert rj._decode_state("x", raw).voted_for == vote
    with pytest.raises(JournalDamaged):
        rj._decode_state("x", state_line(3, _GOOD_STATE.replace(b'"a:1"', f'"{vote} "'.encode())))


def test_pysyncobj_journal_earlier_builds_and_other_versions_are_refused(tmp_path):
    single = tmp_path / JOURNAL_FILE
    old = FileJournal(str(single))
    old.add(b"\x01", 1, 0)
    old.add(b"\x00abc", 2, 1)
    old._destroy()
    reads = "this code reads STATOR-RAFT-LOG version 1 in segment files raft.log.<seq> only;"
    for opener in (StatorJournal, read_journal, journal_files):
        with pytest.raises(JournalFormatError) as caught:
            opener(str(tmp_path))
        text = str(caught.value)
        assert text.startswith(f"{single}: found pysyncobj's own journal (format version 1, pysyncobj 0.3.17), "
                               f"{reads}"), text
        assert "\n" not in text and isinstance(caught.value, JournalDamaged)
        assert str(pickle.loads(pickle.dumps(caught.value))) == text
    assert journal_exists(str(tmp_path)) and segments(tmp_path) == []   # refused before anything was created

    # the single-file log of an earlier build: refused by name, even beside segments
    single.write_bytes(rj.file_header() + rj.encode_record(b"a", 1, 1))
    segment(tmp_path, 1).write_bytes(rj.file_header())
    with pytest.raises(JournalFormatError) as caught:
        StatorJournal(str(tmp_path))
    assert str(caught.value).startswith(f"{single}: found a single-file raft.log of an earlier build, {reads}")
    single.unlink()

    path = segment(tmp_path, 1)
    newer = b"STATOR-RAFT-LOG\0" + struct.pack("<I", 2)
    path.write_bytes(newer + struct.pack("<I", zlib.crc32(newer)))
    with pytest.raises(JournalFormatError, match="found STATOR-RAFT-LOG version 2, this code reads STATOR-RAFT-LOG "
                                                 "version 1 only") as caught:
        StatorJournal(str(tmp_path))
    assert caught.value.path == str(path)
    path.write_bytes(b"SQLite format 3\0" + bytes(100))
    with pytest.raises(JournalFormatError, match="another format"):
        StatorJournal(str(tmp_path))
    path.write_bytes(rj.file_header()[:10] + b"x")     # not a beginning of the header: damage, even when last
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


class DiskFullIO(OsJournalIO):
    """Writes half of the next append and then fails, as a full disk does part-way."""

    def __init__(self):
        super().__init__()
        self.full = False

    def append(self, handle: int, data: bytes) -> None:
        if not self.full:
            return super().append(handle, data)
        super().append(handle, data[:len(data) // 2])
        raise OSError(28, "No space left on device")


def test_an_append_the_disk_cut_short_is_cut_off_so_the_next_record_follows_a_whole_one(tmp_path):
    io = DiskFullIO()
    j = StatorJournal(str(tmp_path), io)
    fill(j, [entry(i) for i in range(1, 4)])
    size = log_bytes(tmp_path).__len__()
    io.full = True
    with pytest.raises(OSError):
        j.add(*entry(4))
    assert len(log_bytes(tmp_path)) == size, "the half record is gone"
    io.full = False
    j.add(*entry(4))
    j.flush()
    assert StatorJournal(str(tmp_path))[:] == [entry(i) for i in range(1, 5)]


def _roll_at(tmp_path: Path) -> int:
    """The index of entry() whose add opens the second segment of a SMALL_SEGMENT journal."""
    probe = StatorJournal(str(tmp_path / "probe"), segment_bytes_max=SMALL_SEGMENT)
    i = 1
    while len(segments(tmp_path / "probe")) < 2:
        probe.add(*entry(i))
        i += 1
    probe._destroy()
    return i - 1


def test_a_new_segment_whose_header_the_full_disk_refused_is_removed_and_the_log_goes_on(tmp_path):
    roll = _roll_at(tmp_path)
    d = tmp_path / "raft"
    io = DiskFullIO()
    j = StatorJournal(str(d), io, segment_bytes_max=SMALL_SEGMENT)
    fill(j, [entry(i) for i in range(1, roll)])
    before = segments(d)
    io.full = True
    with pytest.raises(OSError):
        j.add(*entry(roll))
    assert segments(d) == before, "the new segment's file is gone"
    io.full = False
    fill(j, [entry(i) for i in range(roll, roll + 3)])
    assert len(segments(d)) == len(before) + 1
    j._destroy()
    assert StatorJournal(str(d))[:] == [entry(i) for i in range(1, roll + 3)]


class SyncOrderIO(CountingIO):
    """Notes each directory fsync and file sync, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs: list[str] = []

    def sync(self, handle: int) -> None:
        self.syncs.append(self.names[handle])
        super().sync(handle)

    def sync_directory(self, path: str) -> None:
        self.syncs.append("directory")
        super().sync_directory(path)


def test_a_new_segment_s_name_is_synced_before_its_first_record(tmp_path):
    roll = _roll_at(tmp_path)
    io = SyncOrderIO()
    j = StatorJournal(str(tmp_path / "raft"), io, segment_bytes_max=SMALL_SEGMENT)
    fill(j, [entry(i) for i in range(1, roll)])
    assert j.sync()
    io.syncs.clear()
    j.add(*entry(roll))                          # rolls (the full segment, synced already, is not synced again)
    new = segments(tmp_path / "raft")[-1].name
    assert io.syncs == [] and j.dirty and new != rj.segment_name(1)
    assert j.sync() and io.syncs == ["directory", new]
    fill(j, [entry(roll + 1)])
    io.syncs.clear()
    assert j.sync() and io.syncs == [new], "the name is durable already"


def test_a_sync_after_segments_were_removed_or_cleared_syncs_the_directory_first(tmp_path):
    io = SyncOrderIO()
    j = StatorJournal(str(tmp_path), io, segment_bytes_max=SMALL_SEGMENT)
    fill(j, [entry(i) for i in range(1, 15)])
    assert j.sync() and len(segments(tmp_path)) > 2
    io.syncs.clear()
    assert j.sync() is False and io.syncs == [], "nothing new: no sync"
    j.deleteEntriesFrom(2)   # a log conflict: the later segments go
    assert len(segments(tmp_path)) == 1 and j.sync() is True
    assert io.syncs == ["directory", segments(tmp_path)[0].name], "the unlinks are durable before the truncation"
    io.syncs.clear()
    j.deleteEntriesFrom(0)   # every entry: a clear, into a new segment
    assert j.sync() is True and io.syncs[0] == "directory" and len(io.syncs) == 2
    assert j[:] == [] and StatorJournal(str(tmp_path))[:] == []


def test_a_vote_that_is_no_node_id_is_refused_and_changes_nothing(tmp_path):
    j = StatorJournal(str(tmp_path))
    try:
        j.setCurrentTerm(2, 7)                           # a node may be named by number, too
        writes = j.state_writes
        for bad in (1.5, b"a:1", ("a", 1)):
            with pytest.raises(TypeError) as caught:
                j.setCurrentTerm(3, bad)
            assert str(caught.value) == (f"raft journal {j.directory}: a vote for {type(bad).__name__} cannot be "
                                         "stored, only a node id (str or int) or None")
        assert (j.getCurrentTerm(), j.getVotedForNodeId(), j.state_writes) == (2, 7, writes)
        j.setCurrentTerm(3, None)
        assert read_journal(str(tmp_path)).current_term == 3 and read_journal(str(tmp_path)).voted_for is None
    finally:
        j._destroy()


@pytest.mark.parametrize("chunks, size, pieces", [
    ([b"ab", b"cd", b"e"], 4, [b"abcd", b"e"]),      # a piece ends once it holds ``size`` bytes, not one more
    ([b"ab", b"c"], 3, [b"abc"]),                     # counted from nothing
    ([b"a", b"b", b"c"], 2, [b"ab", b"c"]),           # every chunk counts
    ([b"aa", b"b", b"c"], 2, [b"aa", b"bc"]),         # and from nothing again after each piece
    ([], 2, []),
])
def test_the_durable_writes_go_out_in_pieces_of_the_size_asked(chunks, size, pieces):
    assert list(rj._batched(chunks, size)) == pieces


def test_a_durable_write_of_many_chunks_holds_them_in_order(tmp_path, monkeypatch):
    monkeypatch.setattr(rj, "COMPACTION_WRITE_BYTES", 5)
    chunks = [b"%d:" % n * (n % 4) for n in range(50)]
    path = str(tmp_path / "f")
    rj.OsJournalIO().write_durably(path, chunks, path + ".writing")
    assert (tmp_path / "f").read_bytes() == b"".join(chunks) and not (tmp_path / "f.writing").exists()


def test_the_segment_limit_is_exact_and_a_first_record_bigger_than_a_segment_takes_the_empty_one(tmp_path,
                                                                                                   monkeypatch):
    record = rj.RECORD_OVERHEAD_BYTES + 10
    # two records fill a segment to its last byte: both stay in it; the third starts the next
    j = StatorJournal(str(tmp_path / "exact"), segment_bytes_max=rj.FILE_HEADER_BYTES + 2 * record)
    fill(j, [(b"x" * 10, i, 1) for i in (1, 2, 3)])
    assert seqs(tmp_path / "exact") == [1, 2]
    j._destroy()
    # a journal whose first command is bigger than a segment writes it into segment 1 (empty till then), no new one
    k = StatorJournal(str(tmp_path / "big"), segment_bytes_max=rj.FILE_HEADER_BYTES + 8)
    fill(k, [(b"y" * 100, 1, 1)])
    assert seqs(tmp_path / "big") == [1]
    k._destroy()


def test_a_command_is_stored_as_bytes_up_to_the_record_limit_and_refused_past_it(tmp_path, monkeypatch):
    monkeypatch.setattr(rj, "RECORD_BYTES_MAX", 100)
    j = StatorJournal(str(tmp_path))
    try:
        j.add(bytearray(b"m" * 100), 1, 1)                # the largest, and handed over as a bytearray
        assert j[0] == (b"m" * 100, 1, 1) and type(j[0][0]) is bytes
        with pytest.raises(ValueError) as caught:
            j.add(b"m" * 101, 2, 1)
        assert str(caught.value) == (f"raft journal {j.directory}: a command of 101 bytes is more than "
                                     "RECORD_BYTES_MAX (100)")
        assert len(j) == 1
    finally:
        j._destroy()
    assert read_journal(str(tmp_path)).entries == [(b"m" * 100, 1, 1)]


def test_a_journal_error_crosses_a_process_boundary_whole():
    # a tool's worker raises it in another process: pickling rebuilds it from its args
    for e in (JournalDamaged("/d/raft.log.3", 24, 2, "the record fails its CRC"),
              JournalFormatError("/d/raft.log", "pysyncobj 0.3", "STATOR-RAFT-LOG version 1")):
        again = pickle.loads(pickle.dumps(e))
        assert type(again) is type(e) and str(again) == str(e)
        assert (again.path, again.offset, again.record_number, again.why) == (e.path, e.offset, e.record_number, e.why)


def test_the_os_calls_of_the_journal_io(tmp_path):
    io = rj.OsJournalIO()
    d = str(tmp_path / "a" / "b")
    io.make_directory(d)
    io.make_directory(d)                                 # there already: nothing to do
    old = os.umask(0o022)
    try:
        handle = io.create(os.path.join(d, "seg"))
        io.close(handle)
        io.write_durably(os.path.join(d, "state"), [b"x"], os.path.join(d, "state.writing"))
    finally:
        os.umask(old)
    for name in ("seg", "state"):                        # readable by the operator's tools, written by the node alone
        assert os.stat(os.path.join(d, name)).st_mode & 0o777 == 0o644, name
    assert io.remove(os.path.join(d, "seg")) is True and io.remove(os.path.join(d, "seg")) is False


def test_closing_a_journal_twice_is_harmless_and_reading_one_that_is_not_there_names_it(tmp_path):
    j = StatorJournal(str(tmp_path))
    j.add(b"a", 1, 1)
    j._destroy()
    j._destroy()                                         # a second stop changes nothing
    assert read_journal(str(tmp_path)).entries == [(b"a", 1, 1)]
    with pytest.raises(FileNotFoundError) as caught:
        read_journal(str(tmp_path / "none"))
    assert str(caught.value) == f"{tmp_path / 'none' / JOURNAL_FILE}.<seq>: no raft journal"

    class Counting(rj.OsJournalIO):
        reads = 0

        def read(self, path):
            Counting.reads += 1
            return super().read(path)
    assert read_journal(str(tmp_path), Counting()).entries == [(b"a", 1, 1)] and Counting.reads >= 2   # its io


def test_a_segment_that_vanishes_while_it_is_read_is_named(tmp_path):
    class Vanishing(rj.OsJournalIO):
        def read(self, path):
            return None if path.endswith(rj.segment_name(1)) else super().read(path)
    j = StatorJournal(str(tmp_path))
    j.add(b"a", 1, 1)
    j._destroy()
    with pytest.raises(JournalDamaged) as caught:
        read_journal(str(tmp_path), Vanishing())
    e = caught.value
    assert (e.path, e.offset, e.record_number) == (str(tmp_path), None, None)
    assert e.why == f"segment {rj.segment_name(1)} vanished while it was read"
