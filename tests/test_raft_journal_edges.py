"""The raft journal (meta/raft/journal.py) at the edges its main tests (tests/test_raft_journal.py) pass by, each
found by a mutant that survived them: the power-loss ledger fed by the journal's own calls, the crash-test I/O on
files it created and reopened, torn-write zeros at a sector's edge, the state file's header fields at their bounds,
truncations that drop exactly the last segment, the dead segments' unlinks, and an I/O that is not the disk's."""

from __future__ import annotations

import random
import threading

import pytest
import structlog

from meta.raft import journal as rj
from meta.raft import membership
from meta.raft.entry import encode_stamp
from meta.raft.journal import (JournalDamaged, JournalFormatError, MemoryUntilSyncJournalIO, OsJournalIO,
                               StatorJournal, journal_exists, journal_files, read_journal)
from ops.sim.disk import SimDisk, SimJournalIO
from runtime import power_loss
from tests.support.raft_journal_files import (SMALL_SEGMENT, entry, fill, journal_with_last, segment, segments,
                                              seqs, state_line)

WAIT_S = 20.0

@pytest.fixture(autouse=True)
def _segments_grow_with_their_records(monkeypatch):
    """These tests read, cut and flip the segment files byte by byte as a file that grows with each record: no space
    allocated ahead. The layout with it, and power losses in it, are tests/test_raft_journal_allocation.py's."""
    monkeypatch.setattr(rj, "ALLOCATE_AHEAD_BYTES", 0)



def _entries(first: int, last: int, term: int = 1) -> list[tuple[bytes, int, int]]:
    return [entry(i, term) for i in range(first, last + 1)]


# -- the power-loss ledger -------------------------------------------------------------------------------------
def test_the_journal_feeds_the_power_loss_ledger_and_a_power_loss_keeps_what_it_synced(tmp_path):
    """Every create, remove, directory sync and whole-file write of the journal reaches the ledger (by its path), so
    a power loss after the last sync loses nothing the journal acknowledged."""
    power_loss.enable(str(tmp_path))
    try:
        d = str(tmp_path / "raft")
        j = StatorJournal(d, segment_bytes_max=SMALL_SEGMENT)
        fill(j, _entries(1, 14))
        assert len(segments(d)) >= 3
        assert power_loss.unsynced_bytes(str(tmp_path)) > 0      # appended, not synced
        j.sync()
        j.setCurrentTerm(3, "n2")
        with structlog.testing.capture_logs() as logs:
            j.deleteEntriesTo(j._segments[1].start)              # the first segment is dead: unlinked, forgotten
            j.deleteEntriesFrom(j._segments[-1].start - 1)       # the last one removed, the one before truncated
            j.sync()
            assert j.wait_for_unlinks(WAIT_S)
        assert logs == []                                        # the unlink thread's removal raised nothing
        kept = j[:]
        assert power_loss.unsynced_bytes(str(tmp_path)) == 0
        j._destroy()
        power_loss.lose_unsynced(str(tmp_path), random.Random(7), tear=True)
    finally:
        power_loss.disable(str(tmp_path))
    seen = read_journal(d)
    assert (seen.entries, seen.current_term, seen.voted_for, seen.torn_bytes) == (kept, 3, "n2", 0)


# -- the crash-test I/O ----------------------------------------------------------------------------------------
def test_memory_until_sync_truncates_in_a_segment_it_created_and_in_one_it_reopened(tmp_path):
    d = str(tmp_path)
    j = StatorJournal(d, MemoryUntilSyncJournalIO())             # the segment is created through the I/O
    fill(j, _entries(1, 5))
    j.sync()
    fill(j, _entries(6, 8))
    j.deleteEntriesFrom(6)                                       # keeps 1..6: a cut inside the unsynced appends
    j.sync()
    j._destroy()
    assert read_journal(d).entries == _entries(1, 6)

    j = StatorJournal(d, MemoryUntilSyncJournalIO())             # reopened for appending
    fill(j, _entries(7, 9))
    j.deleteEntriesFrom(7)
    j.sync()
    j.add(*entry(8, term=2))
    j.sync()
    j._destroy()
    assert read_journal(d).entries == _entries(1, 7) + [entry(8, term=2)]


# -- torn tails ------------------------------------------------------------------------------------------------
def test_a_journal_of_a_header_alone_has_no_torn_tail(tmp_path):
    StatorJournal(str(tmp_path))._destroy()
    assert read_journal(str(tmp_path)).torn_bytes == 0
    with structlog.testing.capture_logs() as logs:
        StatorJournal(str(tmp_path))._destroy()
    assert [e["event"] for e in logs if e["event"].startswith("raft_journal")] == []


def test_a_state_file_without_segments_reads_as_an_empty_log_with_no_torn_tail(tmp_path):
    """What a clear() leaves when a crash stops it before it creates its segment."""
    (tmp_path / rj.STATE_FILE).write_bytes(rj.encode_state(rj.RaftState(current_term=4, first_segment=3)))
    seen = read_journal(str(tmp_path))
    assert (seen.entries, seen.current_term, seen.torn_bytes) == ([], 4, 0)


def _flip(raw: bytes, at: int) -> bytes:
    return raw[:at] + bytes([raw[at] ^ 0x20]) + raw[at + 1:]


def _zero(raw: bytes, start: int, end: int) -> bytes:
    assert any(raw[start:end])                                   # zeros here are the damage, not the data
    return raw[:start] + bytes(end - start) + raw[end:]


@pytest.mark.parametrize("last_at, damage, torn", [
    # 4 zero bytes (TORN_ZEROS_MIN_BYTES) at the header's start, up to a sector boundary: a torn write
    (1020, lambda raw: _zero(raw, 1020, 1024), True),
    # 2 zero bytes there: too few to mean it, and the rest of the header is written
    (1022, lambda raw: _zero(raw, 1022, 1024), False),
    # a header that ends at a sector boundary, flipped, then a zeroed sector of its command: the zeros are not in
    # the header's sectors, so the header is damaged, not torn
    (1000, lambda raw: _zero(_flip(raw, 1000 + 9), 1024, 1536), False),
])
def test_zeros_count_as_a_torn_header_only_in_the_header_s_own_sectors_and_long_enough(tmp_path, last_at, damage,
                                                                                        torn):
    raw, at, entries = journal_with_last(tmp_path, 3000, last_at=last_at)
    assert at == last_at
    path = segment(tmp_path, 1)
    path.write_bytes(damage(raw))
    if torn:
        j = StatorJournal(str(tmp_path))
        assert j[:] == entries[:4] and path.read_bytes() == raw[:last_at]
        j._destroy()
    else:
        with pytest.raises(JournalDamaged) as caught:
            StatorJournal(str(tmp_path))
        assert (caught.value.offset, caught.value.record_number) == (last_at, 5)
        assert caught.value.why.startswith("the record header fails its CRC")


# -- refusals --------------------------------------------------------------------------------------------------
def test_a_segment_of_another_format_is_refused_naming_what_this_code_reads(tmp_path):
    path = segment(tmp_path, 1)
    path.write_bytes(b"NOT-A-RAFT-LOG\0\0" + bytes(16))
    with pytest.raises(JournalFormatError) as caught:
        StatorJournal(str(tmp_path))
    assert caught.value.reads == "STATOR-RAFT-LOG version 1"
    assert str(caught.value).startswith(f"{path}: found a file of another format (it begins b'NOT-A-RAFT-LOG"
                                        f"\\x00\\x00'), this code reads STATOR-RAFT-LOG version 1 only; ")


def test_a_state_file_of_another_version_of_nine_digits_is_refused_naming_it(tmp_path):
    """Nine digits is the most a version may have and still be read as one (ten are damage:
    tests/test_raft_journal.py's refusals)."""
    body = rj.encode_state(rj.RaftState()).split(b" ", 3)[3][:-1]
    (tmp_path / rj.STATE_FILE).write_bytes(state_line(999999999, body))
    with pytest.raises(JournalFormatError) as caught:
        read_journal(str(tmp_path))
    assert caught.value.found == "STATOR-RAFT-STATE version 999999999"


# -- start-up --------------------------------------------------------------------------------------------------
def test_start_up_removes_an_earlier_build_s_unfinished_rewrite(tmp_path):
    StatorJournal(str(tmp_path))._destroy()
    leftover = tmp_path / (rj.segment_name(1) + rj.COMPACTING_SUFFIX)
    leftover.write_bytes(b"half a rewrite")
    with structlog.testing.capture_logs() as logs:
        StatorJournal(str(tmp_path))._destroy()
    assert not leftover.exists()
    assert logs == [{"event": "raft_journal_unfinished_write_removed", "log_level": "info", "path": str(leftover)}]


# -- truncations and clears ------------------------------------------------------------------------------------
class OpenHandlesIO(OsJournalIO):
    """The disk's calls, and the handles open now."""

    def __init__(self) -> None:
        super().__init__()
        self.open: set[int] = set()

    def create(self, path: str) -> int:
        handle = super().create(path)
        self.open.add(handle)
        return handle

    def open_append(self, path: str) -> int:
        handle = super().open_append(path)
        self.open.add(handle)
        return handle

    def close(self, handle: int) -> None:
        self.open.discard(handle)
        super().close(handle)


def test_a_truncation_that_drops_exactly_the_last_segment_closes_it_and_appends_to_the_one_before(tmp_path):
    d = str(tmp_path)
    io = OpenHandlesIO()
    j = StatorJournal(d, io, segment_bytes_max=SMALL_SEGMENT)
    fill(j, _entries(1, 14))
    j.sync()
    before = seqs(d)
    assert len(before) >= 3
    cut = j._segments[-2].start + 1                              # inside the segment before the last
    j.deleteEntriesFrom(cut)
    j.sync()
    assert seqs(d) == before[:-1] and len(io.open) == 1
    j.add(*entry(cut + 1, term=2))
    j.sync()
    j._destroy()
    assert io.open == set()
    assert read_journal(d).entries == _entries(1, cut) + [entry(cut + 1, term=2)]


def test_clears_are_counted_and_a_cleared_journal_truncates_back_into_its_first_segment(tmp_path):
    d = str(tmp_path)
    j = StatorJournal(d, segment_bytes_max=SMALL_SEGMENT)
    fill(j, _entries(1, 6))
    j.clear()
    fill(j, _entries(10, 24, term=2))
    assert len(j._segments) >= 3
    j.deleteEntriesFrom(2)                                       # back into the segment the clear created
    j.sync()
    assert len(j._segments) == 1
    j.add(*entry(12, term=3))
    j.sync()
    assert read_journal(d).entries == _entries(10, 11, term=2) + [entry(12, term=3)]
    j.clear()
    assert j.compactions == 2
    j._destroy()


def _membership_entry(i: int, term: int, voters: int) -> tuple[bytes, int, int]:
    members = tuple(membership.Member(raft=f"127.0.0.1:{7000 + k}", name=f"m{k}", disk=f"{k:x}" * 32,
                                      url=None, voter=True) for k in range(voters))
    return (bytes([membership.MEMBERSHIP_COMMAND]) + membership.payload(members, "bootstrap",
                                                                         encode_stamp({"ts": i})), i, term)


def test_a_compaction_keeps_the_membership_in_force_before_the_entries_it_keeps(tmp_path):
    """Terms far above indexes, so that mixing the two up drops the wrong entries."""
    j = StatorJournal(str(tmp_path))
    for i in range(1, 13):
        j.add(*(_membership_entry(i, 100, {2: 1, 5: 2, 9: 3}[i]) if i in (2, 5, 9) else entry(i, 100)))
    j.deleteEntriesTo(7)                                         # index 8 first: 2 and 5 compacted, 5 in force
    assert [len(m) for m in (j.membership.before(9), j.membership.current()[1])] == [2, 3]
    assert j.membership.current()[0] == 9
    j._destroy()


# -- the dead segments' unlinks --------------------------------------------------------------------------------
class HeldUnlinksIO(OsJournalIO):
    """Each dead segment's unlink waits for ``release`` (at most WAIT_S); ``failure``, if set, is raised instead."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.failure: OSError | None = None

    def remove_dead(self, path: str) -> bool:
        if self.failure is not None:
            raise self.failure
        self.release.wait(WAIT_S)
        return super().remove_dead(path)


def _compacted(d: str, io: HeldUnlinksIO) -> tuple[StatorJournal, str]:
    """A journal of 1..14 in small segments whose first segment a compaction made dead: (journal, its path)."""
    j = StatorJournal(d, io, segment_bytes_max=SMALL_SEGMENT)
    fill(j, _entries(1, 14))
    first = j._segments[0].path
    j.deleteEntriesTo(j._segments[1].start)
    return j, first


def test_wait_for_unlinks_waits_for_every_unlink_still_running_not_only_the_last_compaction_s(tmp_path):
    io = HeldUnlinksIO()
    j, dead = _compacted(str(tmp_path), io)
    j.deleteEntriesTo(1)                                         # one entry, no segment: nothing more to unlink
    # Released after 5 s whatever happens, so that a wait without its timeout ends (and fails the check below).
    releaser = threading.Timer(5.0, io.release.set)
    releaser.start()
    try:
        assert j.wait_for_unlinks(0.2) is False
        io.release.set()
        assert j.wait_for_unlinks(WAIT_S) is True
    finally:
        releaser.cancel()
        releaser.join()
    assert not segment(tmp_path, 1).exists() and dead.endswith(rj.segment_name(1))
    j._destroy()


def test_a_stop_waits_for_the_unlinks_still_running(tmp_path):
    io = HeldUnlinksIO()
    j, dead = _compacted(str(tmp_path), io)
    releaser = threading.Timer(0.5, io.release.set)
    releaser.start()
    try:
        j._destroy()
        assert not segment(tmp_path, 1).exists()                 # gone when the stop returns, not later
    finally:
        releaser.join()


def test_a_failed_unlink_is_logged_with_its_path_and_error(tmp_path):
    io = HeldUnlinksIO()
    io.failure = OSError(5, "Input/output error")
    with structlog.testing.capture_logs() as logs:
        j, dead = _compacted(str(tmp_path), io)
        assert j.wait_for_unlinks(WAIT_S)
    assert [e for e in logs if e["event"] == "raft_journal_dead_segment_unlink_failed"] == [
        {"event": "raft_journal_dead_segment_unlink_failed", "log_level": "warning", "path": dead,
         "error": repr(io.failure)}]
    j._destroy()


# -- an I/O that is not the disk's -----------------------------------------------------------------------------
def test_journal_exists_and_journal_files_look_through_the_io_they_are_given(tmp_path):
    """The simulator's disk (ops/sim/disk.py), at a path the real disk holds empty."""
    io = SimJournalIO(SimDisk(random.Random(1)))
    d = str(tmp_path)
    j = StatorJournal(d, io)
    fill(j, _entries(1, 3))
    j.setCurrentTerm(2, None)
    j._destroy()
    assert journal_exists(d, io) and not journal_exists(d)
    assert journal_files(d, io) == [f"{d}/{rj.segment_name(1)}", f"{d}/{rj.STATE_FILE}"] and journal_files(d) == []
