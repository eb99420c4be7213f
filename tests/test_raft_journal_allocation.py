"""The raft journal's segments with space allocated ahead of their appends (meta/raft/journal.py ALLOCATE_AHEAD_BYTES):
the layout every node runs. The byte-level tests of tests/test_raft_journal.py run on files that grow with each
record; here the same rules hold where a segment's records are followed by zeros, and a power loss zeroes (never
cuts) what it loses of such a file (runtime/power_loss.py)."""

from __future__ import annotations

import os
import random

import pytest
import structlog

from meta.raft import journal as rj
from meta.raft.journal import JournalDamaged, StatorJournal, read_journal
from runtime import power_loss
from tests.support.raft_journal_files import SMALL_SEGMENT, entry, fill, segments

STEP = 64 * 1024   # allocated ahead this much at a time here: a few steps' worth of records stay quick to write


@pytest.fixture(autouse=True)
def _small_steps(monkeypatch):
    monkeypatch.setattr(rj, "ALLOCATE_AHEAD_BYTES", STEP)


def record_bytes(e: tuple[bytes, int, int]) -> int:
    return rj.RECORD_OVERHEAD_BYTES + len(e[0])


def data_end(entries: list[tuple[bytes, int, int]]) -> int:
    return rj.FILE_HEADER_BYTES + sum(record_bytes(e) for e in entries)


def zero(path, start: int, end: int) -> None:
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(bytes(end - start))


def test_appends_go_into_space_allocated_ahead_in_steps_and_a_reopen_reads_them_without_a_repair(tmp_path):
    j = StatorJournal(str(tmp_path))
    first = [entry(i) for i in range(1, 11)]
    fill(j, first)
    assert j.sync()
    (path,) = segments(tmp_path)
    assert path.stat().st_size == STEP, "the first append allocated one step"
    assert path.read_bytes()[data_end(first):] == bytes(STEP - data_end(first))
    big = [entry(i, size=40_000) for i in range(11, 14)]   # past the first step: the next ones are allocated
    fill(j, big)
    j._destroy()
    end = data_end(first + big)
    assert path.stat().st_size == -(-end // STEP) * STEP > STEP
    with structlog.testing.capture_logs() as logs:
        again = StatorJournal(str(tmp_path))
    assert again[:] == first + big
    assert not [e for e in logs if e["event"] == "raft_journal_torn_tail_truncated"], "zeros ahead are no torn tail"
    assert path.stat().st_size == end, "opened, the segment is cut to its records..."
    again.add(*entry(14))
    again.sync()
    assert path.stat().st_size == -(-(end + record_bytes(entry(14))) // STEP) * STEP, "...and allocated again"
    again._destroy()
    assert read_journal(str(tmp_path)).entries == first + big + [entry(14)]


def test_a_full_segment_ends_with_its_last_record_the_last_one_with_zeros(tmp_path):
    j = StatorJournal(str(tmp_path), segment_bytes_max=SMALL_SEGMENT)
    entries = [entry(i) for i in range(1, 30)]
    fill(j, entries)
    j._destroy()
    files = segments(tmp_path)
    assert len(files) >= 4
    for path in files[:-1]:
        raw = path.read_bytes()
        assert len(raw) <= SMALL_SEGMENT and raw[-4:] != bytes(4), f"{path.name} was cut to its records"
    assert files[-1].stat().st_size == STEP
    assert StatorJournal(str(tmp_path))[:] == entries


def test_zeros_inside_a_segment_that_is_not_the_last_are_damage(tmp_path):
    j = StatorJournal(str(tmp_path), segment_bytes_max=SMALL_SEGMENT)
    fill(j, [entry(i) for i in range(1, 30)])
    j._destroy()
    first = segments(tmp_path)[0]
    size = first.stat().st_size
    with open(first, "ab") as f:
        f.write(bytes(STEP - size))   # as if the full segment had kept its space ahead
    with pytest.raises(JournalDamaged, match="record header fails its CRC"):
        StatorJournal(str(tmp_path))


@pytest.mark.parametrize("seed", range(4))
def test_a_power_loss_at_every_point_of_the_unsynced_tail_keeps_every_synced_entry(tmp_path, seed):
    """A power loss leaves an allocated file its size and zeros where its lost blocks were (power_loss._zero): cut at
    each byte of the unsynced records (a random piece of each sector kept or not), the journal opens with every
    synced entry, whatever of the rest is whole, and goes on."""
    rng = random.Random(seed)
    d = tmp_path / "template"
    j = StatorJournal(str(d))
    synced = [entry(i) for i in range(1, 8)]
    fill(j, synced)
    j.sync()
    unsynced = [entry(i) for i in range(8, 12)]
    fill(j, unsynced)
    raw = segments(d)[0].read_bytes()
    j._destroy()
    start, end = data_end(synced), data_end(synced + unsynced)
    for cut in range(start, end + 1, 1 + rng.randrange(3)):
        case = tmp_path / f"cut{cut}"
        case.mkdir()
        for name in os.listdir(d):
            (case / name).write_bytes((d / name).read_bytes())
        path = segments(case)[0]
        path.write_bytes(raw)
        zero(path, cut, end)
        reopened = StatorJournal(str(case))
        kept = reopened[:]
        assert kept[:len(synced)] == synced
        assert kept == (synced + unsynced)[:len(kept)]
        assert data_end(kept) <= cut, "no record past the cut"
        reopened.add(*entry(len(kept) + 1, term=2))
        reopened._destroy()
        assert read_journal(str(case)).entries == kept + [entry(len(kept) + 1, term=2)]


def test_a_lost_sector_inside_the_last_record_before_the_zeros_ahead_is_a_torn_tail(tmp_path):
    """An unsynced record of several sectors of which one in the middle never reached the disk: the record is a torn
    tail, though its last sectors (and the zeros ahead after them) are there."""
    j = StatorJournal(str(tmp_path))
    entries = [entry(i, size=300) for i in range(1, 6)] + [entry(6, size=4000)]
    fill(j, entries)
    j._destroy()
    path = segments(tmp_path)[0]
    sector = (data_end(entries[:5]) // rj.SECTOR_BYTES + 2) * rj.SECTOR_BYTES
    assert sector + rj.SECTOR_BYTES < data_end(entries) - rj.SECTOR_BYTES
    zero(path, sector, sector + rj.SECTOR_BYTES)
    with structlog.testing.capture_logs() as logs:
        reopened = StatorJournal(str(tmp_path))
    assert reopened[:] == entries[:5]
    (torn,) = [e for e in logs if e["event"] == "raft_journal_torn_tail_truncated"]
    assert torn["offset"] == data_end(entries[:5]) and torn["bytes_dropped"] == STEP - data_end(entries[:5])


def test_a_flipped_byte_of_the_last_record_before_the_zeros_ahead_is_damage_not_a_torn_tail(tmp_path):
    """The zeros ahead follow every last record: they must not pass for the zeroed sector of a torn write."""
    j = StatorJournal(str(tmp_path))
    entries = [entry(i, size=200) for i in range(1, 6)]
    fill(j, entries)
    j._destroy()
    path = segments(tmp_path)[0]
    raw = bytearray(path.read_bytes())
    raw[data_end(entries) - 10] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(JournalDamaged, match="fails its CRC"):
        StatorJournal(str(tmp_path))


def test_the_ledger_counts_the_journal_s_data_not_its_space_ahead_and_a_power_loss_zeroes_it(tmp_path):
    d = str(tmp_path)
    power_loss.enable(d)
    try:
        j = StatorJournal(os.path.join(d, "raft"))
        synced = [entry(i) for i in range(1, 6)]
        fill(j, synced)
        j.sync()
        (path,) = segments(os.path.join(d, "raft"))
        assert power_loss.unsynced_bytes(d) == 0, "the zeros allocated ahead are not data"
        unsynced = [entry(i) for i in range(6, 9)]
        fill(j, unsynced)
        assert power_loss.unsynced_bytes(d) == data_end(synced + unsynced) - data_end(synced)
        j._io.close(j._handle)   # a kill -9: nothing synced more
        j._unlinker.shutdown()
    finally:
        power_loss.disable(d)
    loss = power_loss.lose_unsynced(d, random.Random(7), tear=False)
    assert loss.bytes_lost == data_end(synced + unsynced) - data_end(synced)
    assert path.stat().st_size == STEP, "the allocated size is durable: kept"
    assert path.read_bytes()[data_end(synced):] == bytes(STEP - data_end(synced))
    assert StatorJournal(os.path.join(d, "raft"))[:] == synced


def test_a_ledger_started_on_an_existing_journal_takes_its_files_for_durable(tmp_path):
    """A new ledger (after a power loss, or a restart in the mode) knows no file: the journal's start-up cuts its last
    segment to its records and allocates ahead again, which must not make the ledger think nothing of it durable."""
    d = str(tmp_path)
    j = StatorJournal(os.path.join(d, "raft"))
    entries = [entry(i) for i in range(1, 9)]
    fill(j, entries)
    j._destroy()
    power_loss.enable(d)
    try:
        reopened = StatorJournal(os.path.join(d, "raft"))
        reopened.add(*entry(9))   # allocates ahead again; no sync: lost to the next power loss, if known at all
        reopened._io.close(reopened._handle)
        reopened._unlinker.shutdown()
    finally:
        power_loss.disable(d)
    power_loss.lose_unsynced(d, random.Random(3), tear=True)
    assert StatorJournal(os.path.join(d, "raft"))[:][:len(entries)] == entries


def test_no_room_to_allocate_ahead_leaves_the_appends_growing_the_file(tmp_path, monkeypatch):
    def no_room(fd, offset, length):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(rj.os, "posix_fallocate", no_room)
    entries = [entry(i, size=3000) for i in range(1, 41)]   # two steps' worth: tried once a step, not per append
    with structlog.testing.capture_logs() as logs:
        j = StatorJournal(str(tmp_path))
        fill(j, entries)
        j._destroy()
    assert len([e for e in logs if e["event"] == "raft_journal_allocate_ahead_failed"]) == 2
    (path,) = segments(tmp_path)
    assert path.stat().st_size == data_end(entries)
    assert StatorJournal(str(tmp_path))[:] == entries
