"""Physical queue storage: framing, rolls, recovery after torn writes and kill -9, indexes, time lookup, retention,
the queue store, and a model-based test of the whole queue against a plain list."""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from broker.storage import (BatchTooLarge, CorruptData, CorruptQueue, InvalidArgument, InvalidQueueName,
                            OffsetOutOfRange, PhysicalQueue, QueueClosed, QueueConfig, QueueExists, QueueNotFound,
                            QueueStore, Record, RecordTooLarge, dir_name, queue_name)
from broker.storage import HandlePool, files, limits
from broker.storage.index import ENTRY_BYTES, SparseIndex
from broker.storage.record import HEADER_BYTES, SIZE_BYTES
from broker.storage.store import FORMAT_FILE
from tests.support.disk_errors import eio
from tests.support.storage_payloads import FIELD_AT, encode_frame, frame_bytes, payload, payloads

REPO_ROOT = Path(__file__).resolve().parents[1]

# Small files and a dense index, so that a few records exercise rolls and index lookups.
SMALL = QueueConfig(segment_bytes_max=1024, index_interval_bytes=64, index_interval_records=3)


def fill(queue: PhysicalQueue, count: int, ts_ms: int = 1_000, batch: int = 3) -> list[int]:
    """Appends records whose payload depends only on their offset; returns the first offset of each batch."""
    firsts = []
    while count > 0:
        n = min(batch, count)
        start = queue.max_offset
        firsts.append(queue.append([payload(start + i) for i in range(n)], ts_ms))
        count -= n
    return firsts


def read_all(queue: PhysicalQueue, offset: int | None = None, max_records: int = 7) -> list[Record]:
    out: list[Record] = []
    offset = queue.min_offset if offset is None else offset
    while offset < queue.max_offset:
        records = queue.read(offset, max_records)
        assert records, f"no progress at {offset}"
        out.extend(records)
        offset = records[-1].offset + 1
    return out


def logs(path: Path) -> list[Path]:
    return sorted(path.glob("*.log"))


def check_records(records: list[Record], first: int, last: int) -> None:
    assert [r.offset for r in records] == list(range(first, last))
    assert all(r.payload == payload(r.offset) for r in records)


# Appending and reading.

def test_round_trip_across_rolls(tmp_path):
    q = PhysicalQueue.create(str(tmp_path / "q"), 0, SMALL)
    firsts = fill(q, 200, batch=4)
    assert firsts == list(range(0, 200, 4))
    assert q.segment_count >= 5 and len(logs(tmp_path / "q")) == q.segment_count
    assert all(p.stat().st_size <= SMALL.segment_bytes_max for p in logs(tmp_path / "q"))
    check_records(read_all(q), 0, 200)
    check_records(q.read(0, 1000, 1 << 20), 0, 200)
    for start in (0, 1, 17, 63, 150, 199):
        check_records(q.read(start, 11), start, min(start + 11, 200))
    q.close()
    with PhysicalQueue.open(str(tmp_path / "q"), SMALL) as q:
        check_records(read_all(q, max_records=13), 0, 200)
        assert q.append([b"next"], 2_000) == 200


def test_offsets_contiguous_and_batches_never_split(tmp_path):
    path = tmp_path / "q"
    q = PhysicalQueue.create(str(path), 0, SMALL)
    batches: dict[int, list[bytes]] = {}  # first offset -> the batch's payloads
    expected = 0
    for n in (1, 5, 2, 9, 1, 3, 30):
        batches[expected] = [b"x" * 40] * n
        assert q.append(batches[expected], 1) == expected
        expected += n
    assert q.max_offset == expected
    assert [r.offset for r in read_all(q)] == list(range(expected))
    # A batch larger than the segment limit goes whole into a fresh file, as one frame.
    base = q.max_offset
    batches[base] = [b"y" * 100] * 20
    q.append(batches[base], 1)
    assert (path / files.log_name(base)).stat().st_size == HEADER_BYTES + 20 * (SIZE_BYTES + 100)
    # Every file begins at a batch's first offset and holds exactly the frames of the batches that begin in it:
    # no batch has records in two files, and none is written as more (or less) than its one frame.
    bases = [int(p.stem) for p in logs(path)]
    assert len(bases) > 2 and set(bases) <= set(batches)
    for file_base, next_base in zip(bases, bases[1:] + [q.max_offset]):
        inside = [first for first in batches if file_base <= first < next_base]
        assert (path / files.log_name(file_base)).stat().st_size == sum(frame_bytes(batches[f]) for f in inside)
    q.close()


def test_start_offset_above_zero(tmp_path):
    start = 1_000_000
    q = PhysicalQueue.create(str(tmp_path / "q"), start, SMALL)
    assert q.min_offset == q.max_offset == start
    assert q.read(start) == []
    assert [p.name for p in logs(tmp_path / "q")] == [files.log_name(start)]
    assert fill(q, 5, batch=5) == [start]
    with pytest.raises(OffsetOutOfRange) as err:
        q.read(start - 1)
    assert err.value.min_offset == start and err.value.max_offset == start + 5
    q.close()
    with PhysicalQueue.open(str(tmp_path / "q"), SMALL) as q:
        check_records(q.read(start), start, start + 5)
        assert q.append([b"z"], 1) == start + 5


def test_reading_at_or_beyond_max_returns_empty(tmp_path):
    q = PhysicalQueue.create(str(tmp_path / "q"), 0, SMALL)
    fill(q, 10)
    assert q.read(10) == []
    assert q.read(11) == []
    assert q.read(limits.OFFSET_MAX) == []
    q.close()


def test_byte_budget_returns_at_least_one_record(tmp_path):
    q = PhysicalQueue.create(str(tmp_path / "q"), 0, SMALL)
    q.append([b"a" * 300, b"b" * 10, b"c" * 10], 1)
    assert [r.payload for r in q.read(0, 10, 1)] == [b"a" * 300]
    assert [r.payload for r in q.read(1, 10, 20)] == [b"b" * 10, b"c" * 10]
    assert [r.payload for r in q.read(1, 10, 19)] == [b"b" * 10]
    q.close()


def test_limits_are_checked_and_leave_nothing_behind(tmp_path):
    q = PhysicalQueue.create(str(tmp_path / "q"), 0, SMALL)
    fill(q, 3)
    size = q.size_bytes
    with pytest.raises(RecordTooLarge):
        q.append([b"x" * (limits.RECORD_BYTES_MAX + 1)], 1)
    with pytest.raises(BatchTooLarge):
        q.append([], 1)
    with pytest.raises(BatchTooLarge):
        q.append([b""] * (limits.BATCH_RECORDS_MAX + 1), 1)
    with pytest.raises(BatchTooLarge):
        q.append([b"x" * limits.RECORD_BYTES_MAX] * 5, 1)
    for bad in (["text"], [b"ok", 7], [None], b"bytes", None):
        with pytest.raises(InvalidArgument):
            q.append(bad, 1)
    for ts in (-1, 1.5, "1", limits.TS_MS_MAX + 1):
        with pytest.raises(InvalidArgument):
            q.append([b"x"], ts)
    for kwargs in ({"max_records": 0}, {"max_records": limits.READ_RECORDS_MAX + 1}, {"max_bytes": 0}):
        with pytest.raises(InvalidArgument):
            q.read(0, **kwargs)
    with pytest.raises(InvalidArgument):
        q.read(-1)
    with pytest.raises(InvalidArgument):
        QueueConfig(segment_bytes_max=10)
    with pytest.raises(InvalidArgument):
        QueueConfig(flush_policy="sometimes")
    assert q.size_bytes == size and q.max_offset == 3
    assert q.append([b""], 1) == 3  # an empty payload is a record like any other
    assert q.read(3) == [Record(3, 1_000, b"")]
    q.close()
    with pytest.raises(QueueClosed):
        q.read(0)
    with pytest.raises(QueueClosed):
        q.append([b"x"], 1)


# Recovery.

TORN_BATCH = 3  # records in the frame a torn write leaves: a tear costs all of them, even those whose bytes are whole


def _valid_frame(offset: int) -> bytes:
    return encode_frame(payloads(offset, TORN_BATCH), offset, 5_000)


def _flipped(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]


# What a crash may leave after the last whole frame: (the bytes, how many records of them are whole and valid).
TORN_TAILS = {
    "cut header": lambda off: (_valid_frame(off)[:HEADER_BYTES - 1], 0),
    "header only": lambda off: (_valid_frame(off)[:HEADER_BYTES], 0),
    "first record whole, frame cut": lambda off: (_valid_frame(off)[:HEADER_BYTES + SIZE_BYTES + len(payload(off))], 0),
    "cut payload": lambda off: (_valid_frame(off)[:-5], 0),
    "random bytes": lambda off: (os.urandom(777), 0),
    "zero page": lambda off: (bytes(4096), 0),
    "bad crc": lambda off: (_flipped(_valid_frame(off), FIELD_AT["crc"]), 0),
    "flip in last record": lambda off: (_flipped(_valid_frame(off), len(_valid_frame(off)) - 1), 0),
    "flip in first record": lambda off: (_flipped(_valid_frame(off), HEADER_BYTES + SIZE_BYTES), 0),
    "flip in count": lambda off: (_flipped(_valid_frame(off), FIELD_AT["count"]), 0),
    "flip in tag": lambda off: (_flipped(_valid_frame(off), FIELD_AT["tag"]), 0),
    "count zero, crc valid": lambda off: (encode_frame(payloads(off, TORN_BATCH), off, 5_000, count=0), 0),
    "wrong offset": lambda off: (_valid_frame(off + 1), 0),
    "huge length": lambda off: (b"\xff\xff\xff\x7f" + bytes(40), 0),
    "whole frame, then a cut one": lambda off: (_valid_frame(off) + _valid_frame(off + TORN_BATCH)[:-5], TORN_BATCH),
    "whole frame, then a bad one": lambda off: (_valid_frame(off) + _flipped(_valid_frame(off + TORN_BATCH), -1),
                                                TORN_BATCH),
}


@pytest.mark.parametrize("clean_close", [True, False], ids=["closed", "crashed"])
@pytest.mark.parametrize("tail", sorted(TORN_TAILS))
def test_recovery_after_torn_write(tmp_path, tail, clean_close):
    """The last file is cut at the start of the first torn or invalid frame, whole: no record of that frame is kept,
    every frame before it is, byte for byte."""
    path = tmp_path / "q"
    q = PhysicalQueue.create(str(path), 0, SMALL)
    fill(q, 40)
    q.close()
    if not clean_close:
        (path / files.CLEAN_MARKER).unlink()
    last = logs(path)[-1]
    good = last.read_bytes()
    tail_bytes, kept = TORN_TAILS[tail](40)
    with open(last, "ab") as f:
        f.write(tail_bytes)
    end = 40 + kept
    with PhysicalQueue.open(str(path), SMALL) as q:
        assert q.max_offset == end
        assert last.read_bytes() == good + tail_bytes[:frame_bytes(payloads(40, kept)) if kept else 0]
        check_records(read_all(q), 0, end)
        assert q.append([payload(end)], 6_000) == end
        check_records(read_all(q), 0, end + 1)
    with PhysicalQueue.open(str(path), SMALL) as q:
        check_records(read_all(q), 0, end + 1)


# Where in the damaged frame (offsets 12..14, three records) a byte is flipped: each header field, a byte of its
# first record, the second record's size, the last byte of its last record.
DAMAGED_FIRST = 12
_DAMAGED = payloads(DAMAGED_FIRST, 3)
FRAME_SPOTS = dict(FIELD_AT, **{
    "first record": HEADER_BYTES + SIZE_BYTES + 3,
    "second record size": HEADER_BYTES + SIZE_BYTES + len(_DAMAGED[0]),
    "last record": frame_bytes(_DAMAGED) - 1,
})


@pytest.mark.parametrize("spot", sorted(FRAME_SPOTS))
def test_corruption_in_middle_of_last_file_truncates_there(tmp_path, spot):
    """Damage anywhere in a frame of the last file cuts the file at that frame's start: the frames before it are
    kept byte for byte, none of its records is, and the frames after it go too (they cannot be trusted to follow)."""
    path = tmp_path / "q"
    config = QueueConfig(segment_bytes_max=1 << 20, index_interval_bytes=64, index_interval_records=3)
    q = PhysicalQueue.create(str(path), 0, config)
    assert fill(q, 30) == list(range(0, 30, 3))  # frames of three records: offsets 12..14 are the fifth frame
    q.close()
    (path / files.CLEAN_MARKER).unlink()
    frame_start = sum(frame_bytes(payloads(first, 3)) for first in range(0, DAMAGED_FIRST, 3))
    data = bytearray((path / files.log_name(0)).read_bytes())
    data[frame_start + FRAME_SPOTS[spot]] ^= 0x5A
    (path / files.log_name(0)).write_bytes(bytes(data))
    with PhysicalQueue.open(str(path), config) as q:
        assert q.max_offset == DAMAGED_FIRST
        assert (path / files.log_name(0)).read_bytes() == bytes(data[:frame_start])
        check_records(read_all(q), 0, DAMAGED_FIRST)
        assert fill(q, 3) == [DAMAGED_FIRST]
        check_records(read_all(q), 0, DAMAGED_FIRST + 3)


def test_garbage_last_file_and_stray_files_never_crash(tmp_path):
    path = tmp_path / "q"
    q = PhysicalQueue.create(str(path), 0, SMALL)
    fill(q, 30)
    q.close()
    last = logs(path)[-1]
    base = int(last.stem)
    last.write_bytes(os.urandom(3000))
    (path / files.CLEAN_MARKER).write_bytes(b"{not json")
    (path / "notes.txt").write_text("hello")
    (path / "123.log").write_bytes(b"junk")
    (path / (files.index_name(10**15))).write_bytes(b"orphan")
    (path / (files.index_name(base) + ".tmp")).write_bytes(b"half")
    with PhysicalQueue.open(str(path), SMALL) as q:
        assert q.max_offset == base
        check_records(read_all(q), 0, base)
        assert q.append([payload(base)], 1) == base
    assert not (path / files.index_name(10**15)).exists()
    assert not (path / (files.index_name(base) + ".tmp")).exists()
    assert (path / "notes.txt").exists()


def test_unopenable_directories_raise_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorruptQueue):
        PhysicalQueue.open(str(tmp_path / "empty"))
    with pytest.raises(CorruptQueue):
        PhysicalQueue.open(str(tmp_path / "missing"))
    PhysicalQueue.create(str(tmp_path / "q")).close()
    with pytest.raises(QueueExists):
        PhysicalQueue.create(str(tmp_path / "q"))


@pytest.mark.parametrize("index", ["lost", "kept"])
def test_damaged_sealed_file_reports_its_gap(tmp_path, index):
    """A flip in a sealed file's second frame, in its second record. Without the index, opening rescans the file and
    stops at the damage, so the gap runs from the damaged frame to the next file; with the index (which opening
    trusts), the read finds the damage and resumes at the next frame, indexed as every frame of SMALL is. Either way
    the gap is the whole damaged frame (its intact first record too) or more, and every frame before it is served."""
    path = tmp_path / "q"
    q = PhysicalQueue.create(str(path), 0, SMALL)
    fill(q, 60)
    q.close()
    sealed = logs(path)[1]
    base, next_base = int(sealed.stem), int(logs(path)[2].stem)
    assert base % 3 == 0 and next_base - base >= 9  # frames of three records, and a good frame after the damaged one
    damaged = base + 3
    data = bytearray(sealed.read_bytes())
    data[frame_bytes(payloads(base, 3)) + HEADER_BYTES + SIZE_BYTES + len(payload(damaged)) + SIZE_BYTES] ^= 0xFF
    sealed.write_bytes(bytes(data))
    if index == "lost":
        (path / files.index_name(base)).unlink()
        resume = next_base
    else:
        stored = SparseIndex.from_bytes((path / files.index_name(base)).read_bytes(), SMALL.index_interval_bytes,
                                        SMALL.index_interval_records, len(data))
        assert 3 in stored.rels and 6 in stored.rels  # every frame of SMALL is indexed: the next one is the resume
        resume = damaged + 3
    with PhysicalQueue.open(str(path), SMALL) as q:
        assert q.max_offset == 60
        check_records(q.read(0, 1000), 0, damaged)  # stops at the damaged frame, having served every one before it
        check_records(q.read(damaged - 2, 1000), damaged - 2, damaged)
        for offset in range(damaged, resume):
            with pytest.raises(CorruptData) as err:
                q.read(offset)
            assert (err.value.offset, err.value.next_offset) == (offset, resume)
        check_records(read_all(q, resume), resume, 60)
        assert q.append([payload(60)], 1) == 60


def test_damage_found_on_read_names_where_to_resume(tmp_path):
    path = tmp_path / "q"
    config = QueueConfig(segment_bytes_max=1 << 20, index_interval_bytes=200, index_interval_records=1000)
    q = PhysicalQueue.create(str(path), 0, config)
    assert fill(q, 50) == list(range(0, 50, 3))  # frames of three records: 9..11 is the fourth
    q.close()
    data = bytearray((path / files.log_name(0)).read_bytes())
    frame_start = sum(frame_bytes(payloads(first, 3)) for first in range(0, 9, 3))
    data[frame_start + HEADER_BYTES + SIZE_BYTES + len(payload(9)) + SIZE_BYTES] ^= 1  # payload of record 10
    (path / files.log_name(0)).write_bytes(bytes(data))
    # Reading resumes at the first indexed frame past the damaged one: the damaged frame's length cannot be trusted
    # to find the next frame, an index entry can.
    stored = SparseIndex.from_bytes((path / files.index_name(0)).read_bytes(), config.index_interval_bytes,
                                    config.index_interval_records, len(data))
    resume = next(rel for rel in stored.rels if rel > 11)
    assert resume % 3 == 0 and resume < 20  # a frame's start, one or two frames on at this index interval
    # The clean marker and the index still match the file, so opening trusts them and the read finds the damage.
    with PhysicalQueue.open(str(path), config) as q:
        check_records(q.read(0, 20), 0, 9)  # every frame before the damaged one; none of the damaged frame's records
        check_records(q.read(7, 20), 7, 9)
        for offset in (9, 10, 11):  # the whole frame is unreadable, its intact first record too
            with pytest.raises(CorruptData) as err:
                q.read(offset, 20)
            assert (err.value.offset, err.value.next_offset) == (offset, resume)
            # What the HTTP layer maps the error from: its details, not its text
            assert err.value.details == {"offset": offset, "next_offset": resume} and err.value.message
        check_records(read_all(q, resume), resume, 50)


def test_damage_past_a_file_s_last_index_entry_resumes_reading_at_its_end(tmp_path):
    path = tmp_path / "q"
    # One index entry (the file's first record): nothing indexed follows the damaged frame. An open scans from the
    # last entry to the end, so this damage comes later, under a queue open already (a disk rotting meanwhile).
    config = QueueConfig(segment_bytes_max=1 << 20, index_interval_bytes=1 << 20, index_interval_records=1000)
    with PhysicalQueue.create(str(path), 0, config) as q:
        fill(q, 30)
        frame_start = sum(frame_bytes(payloads(first, 3)) for first in range(0, 9, 3))
        with open(path / files.log_name(0), "r+b") as f:   # the payload of record 10
            f.seek(frame_start + HEADER_BYTES + SIZE_BYTES + len(payload(9)) + SIZE_BYTES)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 1]))
        check_records(q.read(0, 20), 0, 9)
        with pytest.raises(CorruptData) as err:
            q.read(9, 20)
        assert (err.value.offset, err.value.next_offset) == (9, 30)


def test_a_read_reaching_into_a_damaged_file_first_returns_the_good_records_before_it(tmp_path):
    path = tmp_path / "q"
    q = PhysicalQueue.create(str(path), 0, SMALL)
    fill(q, 100)
    q.close()
    assert len(logs(path)) > 3  # the third file is sealed, and its index trusted on opening
    third = logs(path)[2]
    base = int(third.stem)
    data = bytearray(third.read_bytes())
    data[HEADER_BYTES + SIZE_BYTES] ^= 1  # the file's first frame; its index, kept, hides the damage from opening
    third.write_bytes(bytes(data))
    with PhysicalQueue.open(str(path), SMALL) as q:
        check_records(q.read(base - 2, 10), base - 2, base)  # the previous file's last records, then the damage
        with pytest.raises(CorruptData) as err:
            q.read(base, 10)
        assert (err.value.offset, err.value.next_offset) == (base, base + 3)


def test_index_rebuilt_when_missing_short_or_garbage(tmp_path):
    path = tmp_path / "q"
    q = PhysicalQueue.create(str(path), 0, SMALL)
    fill(q, 120)
    q.close()
    indexes = sorted(path.glob("*.index"))
    assert len(indexes) >= 5
    originals = {p: p.read_bytes() for p in indexes}
    assert all(len(data) >= 2 * ENTRY_BYTES for data in originals.values())
    indexes[0].unlink()
    indexes[1].write_bytes(os.urandom(len(originals[indexes[1]])))
    indexes[2].write_bytes(originals[indexes[2]][:ENTRY_BYTES])  # short: only the first entry
    flipped = bytearray(originals[indexes[3]])
    flipped[ENTRY_BYTES + 4] ^= 0x10  # the second entry's position: well-formed, but pointing inside a record
    indexes[3].write_bytes(bytes(flipped))
    indexes[-1].unlink()  # the active file's, with the clean marker gone too
    (path / files.CLEAN_MARKER).unlink()
    with PhysicalQueue.open(str(path), SMALL) as q:
        for p in indexes[:4]:
            assert p.read_bytes() == originals[p]
        check_records(read_all(q, max_records=2), 0, 120)
        for start in range(120):
            check_records(q.read(start, 2), start, min(start + 2, 120))
    assert indexes[-1].read_bytes() == originals[indexes[-1]]


def test_index_lookup_matches_after_clean_and_unclean_reopen(tmp_path):
    path = tmp_path / "q"
    config = QueueConfig(segment_bytes_max=1 << 20, index_interval_bytes=100, index_interval_records=1000)
    q = PhysicalQueue.create(str(path), 0, config)
    fill(q, 500, batch=7)
    q.close()
    built = (path / files.index_name(0)).read_bytes()
    assert len(built) // ENTRY_BYTES > 50  # sparse, yet many entries
    (path / files.CLEAN_MARKER).unlink()
    (path / files.index_name(0)).unlink()
    with PhysicalQueue.open(str(path), config) as q:
        for start in (0, 1, 99, 250, 499):
            check_records(q.read(start, 5), start, min(start + 5, 500))
    assert (path / files.index_name(0)).read_bytes() == built


# Time, truncation, retention, flushing.

def test_offset_for_time(tmp_path):
    q = PhysicalQueue.create(str(tmp_path / "q"), 100, SMALL)
    assert q.offset_for_time(0) == 100  # empty queue: max_offset
    stamps = {}
    for i in range(30):
        first = q.append([payload(q.max_offset + j) for j in range(3)], 1_000 + 10 * i)
        for j in range(3):
            stamps[first + j] = 1_000 + 10 * i
    assert q.segment_count > 3
    for t in list(range(990, 1_300, 5)) + [0, 10**12]:
        expected = next((o for o in sorted(stamps) if stamps[o] >= t), q.max_offset)
        assert q.offset_for_time(t) == expected, t
    # The clock stepping back never makes time go backwards in the queue.
    first = q.append([b"late"], 5)
    assert q.read(first)[0].ts_ms == 1_290
    assert q.offset_for_time(1_290) == 187
    q.close()
    with PhysicalQueue.open(str(tmp_path / "q"), SMALL) as q:
        assert q.offset_for_time(1_095) == 130
        assert q.append([b"later"], 7) == 191
        assert q.read(q.max_offset - 1)[0].ts_ms == 1_290


def test_truncate_before(tmp_path):
    path = tmp_path / "q"
    q = PhysicalQueue.create(str(path), 0, SMALL)
    fill(q, 100)
    bases = [int(p.stem) for p in logs(path)]
    target = bases[3] + 2
    assert q.truncate_before(target) == 3
    assert q.min_offset == bases[3]
    assert [int(p.stem) for p in logs(path)] == bases[3:]
    assert not (path / files.index_name(bases[0])).exists()
    with pytest.raises(OffsetOutOfRange):
        q.read(bases[3] - 1)
    check_records(read_all(q), bases[3], 100)
    assert q.truncate_before(0) == 0
    with pytest.raises(OffsetOutOfRange):
        q.truncate_before(101)
    q.close()
    with PhysicalQueue.open(str(path), SMALL) as q:
        assert q.min_offset == bases[3]
        q.truncate_before(100)  # everything, the active file included
        assert q.min_offset == q.max_offset == 100
        assert q.read(100) == []
        assert q.append([payload(100)], 1) == 100
        check_records(read_all(q), 100, 101)


def test_retention_by_age_and_size(tmp_path):
    config = QueueConfig(segment_bytes_max=1024, index_interval_bytes=64, retention_ms=1_000)
    q = PhysicalQueue.create(str(tmp_path / "age"), 0, config)
    for i in range(20):
        q.append([payload(q.max_offset + j) for j in range(4)], 10_000 + 100 * i)
    assert q.apply_retention(10_000 + 500) == 0
    deleted = q.apply_retention(10_000 + 100 * 10 + 1_000)  # everything stamped before 11,000 may go
    assert deleted > 0 and len(logs(tmp_path / "age")) == q.segment_count
    assert 0 < q.min_offset <= 40  # offset 40 is the first stamped 11,000: its file stays
    check_records(read_all(q), q.min_offset, 80)
    assert q.apply_retention(10**9) > 0  # all expired: the active file is sealed and goes too
    assert q.min_offset == q.max_offset == 80
    assert q.append([payload(80)], 10**9) == 80
    q.close()

    config = QueueConfig(segment_bytes_max=1024, index_interval_bytes=64, retention_bytes=3_000)
    q = PhysicalQueue.create(str(tmp_path / "size"), 0, config)
    fill(q, 200)
    assert q.size_bytes > 3_000
    assert q.apply_retention(0) > 0
    assert q.size_bytes <= 3_000 and q.segment_count > 1
    check_records(read_all(q), q.min_offset, 200)
    q.close()


def test_interval_flush_is_driven_by_the_owner(tmp_path):
    config = QueueConfig(flush_policy="interval", flush_interval_ms=100)
    q = PhysicalQueue.create(str(tmp_path / "q"), 0, config)
    assert q.maybe_flush(10_000) is False
    q.append([b"a", b"b"], 1_000)
    q.append([b"c"], 1_020)
    assert q.flushed_offset == 0 and q.max_offset == 3
    assert q.maybe_flush(1_099) is False
    assert q.maybe_flush(1_100) is True
    assert q.flushed_offset == 3
    assert q.maybe_flush(5_000) is False
    q.append([b"d"], 6_000)
    assert q.maybe_flush(10) is True  # the clock stepped back: flush rather than wait
    q.close()
    fsync = PhysicalQueue.create(str(tmp_path / "f"), 0, QueueConfig())
    fsync.append([b"a"], 1)
    assert fsync.flushed_offset == fsync.max_offset == 1
    assert fsync.maybe_flush(10**6) is False
    fsync.close()


# The store.

def test_queue_store(tmp_path):
    names = ["orders.q3.g1.i7", "../escape", ".", "..", ".hidden", "a/b\\c", "ünïcødé", "%41", "A", "a", "x" * 60]
    with QueueStore(str(tmp_path / "root"), SMALL) as store:
        for i, name in enumerate(names):
            q = store.create(name, start_offset=i * 10)
            q.append([name.encode()], 1)
            assert store.get(name) is q
        assert store.names() == sorted(names)
        with pytest.raises(QueueExists):
            store.create("A")
        assert store.open_or_create("A", start_offset=999) is store.get("A")   # existing: opened, start kept
        assert store.get("A").max_offset == names.index("A") * 10 + 1
        with pytest.raises(QueueNotFound):
            store.get("nope")
        for bad in ("", "x" * (limits.QUEUE_NAME_BYTES_MAX + 1), "\ud800", None, "é" * 90):
            with pytest.raises(InvalidQueueName):
                store.create(bad)
    entries = sorted(os.listdir(tmp_path / "root"))
    assert entries.count(FORMAT_FILE) == 1 and (tmp_path / "root" / FORMAT_FILE).is_file()   # the store's format
    entries.remove(FORMAT_FILE)
    assert len(entries) == len(names)
    assert all("/" not in e and e not in (".", "..") and not e.startswith(".") for e in entries)
    (tmp_path / "root" / ".creating-0123").mkdir()
    (tmp_path / "root" / ".deleting-4567").mkdir()
    (tmp_path / "root" / "not%zzvalid").mkdir()
    with QueueStore(str(tmp_path / "root"), SMALL) as store:
        assert store.names() == sorted(names)
        assert not (tmp_path / "root" / ".creating-0123").exists()
        assert not (tmp_path / "root" / ".deleting-4567").exists()
        for i, name in enumerate(names):
            assert store.get(name).read(i * 10) == [Record(i * 10, 1, name.encode())]
        store.delete("../escape")
        assert "../escape" not in store and not (tmp_path / "root" / dir_name("../escape")).exists()
        with pytest.raises(QueueNotFound):
            store.delete("../escape")
        assert store.create("../escape").max_offset == 0
        assert store.open_all() == len(names)


def test_store_bounds_read_handles(tmp_path):
    fd_dir = Path("/proc/self/fd")  # Linux, as every machine of this project
    with QueueStore(str(tmp_path), SMALL, read_handles_max=2) as store:
        queues = [store.create(f"q{i}") for i in range(3)]
        for q in queues:
            fill(q, 150)
        assert all(q.segment_count > 5 for q in queues)
        before = len(list(fd_dir.iterdir()))
        for q in queues:
            check_records(read_all(q, max_records=50), 0, 150)
        assert len(list(fd_dir.iterdir())) <= before + 2


@given(st.text(min_size=1, max_size=60))
def test_queue_names_map_to_single_safe_directories(name):
    try:
        encoded = dir_name(name)
    except InvalidQueueName:
        return
    assert queue_name(encoded) == name
    assert "/" not in encoded and "\0" not in encoded and not encoded.startswith(".")
    assert len(encoded.encode()) <= limits.DIR_NAME_BYTES_MAX


# Concurrency: appends run in worker threads while reads, retention and flushes come from elsewhere.

RACE_WAIT_S = 0.2       # how long the racing append gets to slip into a flush's fsync; only the old code lets it
STRESS_RECORDS = 2_000  # per writer: enough for dozens of rolls and retention deletions at 1 KiB files
THREAD_JOIN_S = 30


def test_flush_marks_clean_only_what_its_fsync_covered(tmp_path, monkeypatch):
    q = PhysicalQueue.create(str(tmp_path / "q"), 0, QueueConfig(flush_policy="interval", flush_interval_ms=0))
    q.append([b"before"], 1)
    racer = threading.Thread(target=q.append, args=([b"during"], 2))
    real_sync = files.sync_data

    def sync_while_an_append_races(fd: int) -> None:
        if racer.ident is None:  # the first fsync, the flush's: an append arrives while it runs
            racer.start()
            racer.join(RACE_WAIT_S)
        real_sync(fd)

    monkeypatch.setattr(files, "sync_data", sync_while_an_append_races)
    assert q.maybe_flush(10) is True
    racer.join(THREAD_JOIN_S)
    assert q.max_offset == 2
    assert q.flushed_offset == 1, "the flush marked clean a record its fsync may not have covered"
    assert q.maybe_flush(10) is True, "the late record must still be due for a flush"
    assert q.flushed_offset == 2
    q.close()


def test_pool_never_closes_a_leased_descriptor(tmp_path):
    paths = []
    for name in "abc":
        (tmp_path / name).write_bytes(name.encode())
        paths.append(str(tmp_path / name))
    pool = HandlePool(1)
    with pool.lease(paths[0]) as fd_a:
        with pool.lease(paths[1]) as fd_b:  # over the bound: evicting a would close a descriptor in use
            assert os.pread(fd_a, 1, 0) == b"a" and os.pread(fd_b, 1, 0) == b"b"
        assert os.pread(fd_a, 1, 0) == b"a"
    with pool.lease(paths[2]) as fd_c:
        assert os.pread(fd_c, 1, 0) == b"c"
    assert len(pool) == 1, "idle descriptors are evicted back to the bound"
    pool.close_all()


def test_appends_rolls_reads_retention_and_flushes_run_concurrently(tmp_path):
    """Writers roll 1 KiB files while readers, retention and flushes run on the same queues from other threads,
    through a one-descriptor pool shared by both queues. No thread may see an error or a wrong record."""
    config = QueueConfig(segment_bytes_max=1024, index_interval_bytes=64, index_interval_records=3,
                         flush_policy="interval", flush_interval_ms=0, retention_bytes=4096, retention_ms=10**9)
    store = QueueStore(str(tmp_path), config, read_handles_max=1)
    queues = [store.create(f"q{i}") for i in range(2)]
    writing = threading.Event()
    writing.set()
    errors: list[BaseException] = []

    def guarded(fn):
        def run():
            try:
                fn()
            except BaseException as err:  # a thread's failure must fail the test, not vanish
                errors.append(err)
                writing.clear()
        return run

    def write(q: PhysicalQueue) -> None:
        while q.max_offset < STRESS_RECORDS:
            start = q.max_offset
            assert q.append([payload(start + i) for i in range(3)], int(time.time() * 1000)) == start

    def read(q: PhysicalQueue) -> None:
        while writing.is_set():
            low = q.min_offset
            offset = random.randrange(low, q.max_offset + 1)
            try:
                records = q.read(offset, max_records=20)
            except OffsetOutOfRange:
                continue  # retention moved past the offset between the calls: a legal answer
            check_records(records, offset, offset + len(records))
            assert low <= q.offset_for_time(0) <= q.max_offset

    def maintain() -> None:
        while writing.is_set():
            store.apply_retention(int(time.time() * 1000))
            store.maybe_flush(int(time.time() * 1000))
            for q in queues:
                assert q.flushed_offset <= q.max_offset and q.size_bytes >= 0

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often, so the interleavings a race needs actually happen
    try:
        writers = [threading.Thread(target=guarded(lambda q=q: write(q))) for q in queues]
        others = [threading.Thread(target=guarded(lambda q=q: read(q))) for q in queues * 2]
        others += [threading.Thread(target=guarded(maintain)) for _ in range(2)]
        for t in writers + others:
            t.start()
        for t in writers:
            t.join(THREAD_JOIN_S)
        writing.clear()
        for t in others:
            t.join(THREAD_JOIN_S)
    finally:
        sys.setswitchinterval(old_interval)
    assert not errors, errors
    for q in queues:
        assert not q.failed and q.max_offset >= STRESS_RECORDS
        assert q.min_offset > 0, "retention never ran against the writers"
        check_records(read_all(q), q.min_offset, q.max_offset)
        q.flush()
        assert q.flushed_offset == q.max_offset
    store.close()


# The queue against a list model.

class QueueAgainstModel(RuleBasedStateMachine):
    config = QueueConfig(segment_bytes_max=1024, index_interval_bytes=64, index_interval_records=3,
                         flush_policy="interval", flush_interval_ms=50)

    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="stator-storage-")
        self.path = os.path.join(self.dir, "q")
        self.records: list[tuple[int, bytes]] = []  # (ts_ms, payload) at offset start + i
        self.start = 0
        self.last_ts = 0
        self.min_seen = 0
        self.queue: PhysicalQueue | None = None

    @property
    def end(self) -> int:
        return self.start + len(self.records)

    @initialize(start=st.sampled_from([0, 1, 7, 10**6, 2**40]))
    def create(self, start):
        self.start = self.min_seen = start
        self.queue = PhysicalQueue.create(self.path, start, self.config)

    @rule(payloads=st.lists(st.binary(max_size=120), min_size=1, max_size=6), ts=st.integers(0, 10_000))
    def append(self, payloads, ts):
        assert self.queue.append(payloads, ts) == self.end
        self.last_ts = max(self.last_ts, ts)
        self.records.extend((self.last_ts, p) for p in payloads)

    @rule(data=st.data(), max_records=st.integers(1, 12), max_bytes=st.integers(1, 400))
    def read(self, data, max_records, max_bytes):
        offset = data.draw(st.integers(max(0, self.start - 2), self.end + 2))
        if offset < self.queue.min_offset:
            with pytest.raises(OffsetOutOfRange):
                self.queue.read(offset, max_records, max_bytes)
            return
        expected, budget = [], max_bytes
        for i in range(offset - self.start, len(self.records)):
            ts, body = self.records[i]
            if len(expected) >= max_records or (expected and len(body) > budget):
                break
            expected.append(Record(self.start + i, ts, body))
            budget -= len(body)
        assert self.queue.read(offset, max_records, max_bytes) == expected

    @rule(ts=st.integers(-5, 10_005))
    def offset_for_time(self, ts):
        kept = range(self.queue.min_offset - self.start, len(self.records))
        expected = next((self.start + i for i in kept if self.records[i][0] >= ts), self.end)
        assert self.queue.offset_for_time(ts) == expected

    @rule(data=st.data())
    def truncate_before(self, data):
        offset = data.draw(st.integers(self.queue.min_offset, self.end))
        self.queue.truncate_before(offset)
        assert self.queue.min_offset <= offset

    @rule(now=st.integers(0, 10_100))
    def maybe_flush(self, now):
        self.queue.maybe_flush(now)

    @rule(crash=st.booleans())
    def reopen(self, crash):
        self.queue.close()
        if crash:  # without the clean-shutdown marker, opening scans and re-indexes the last file
            os.unlink(os.path.join(self.path, files.CLEAN_MARKER))
        self.queue = PhysicalQueue.open(self.path, self.config)
        kept = self.queue.min_offset < self.end
        self.last_ts = self.records[-1][0] if kept else 0
        assert self.queue.last_ts_ms == self.last_ts

    @precondition(lambda self: self.queue is not None)
    @invariant()
    def bounds_agree(self):
        assert self.queue.max_offset == self.end
        assert self.min_seen <= self.queue.min_offset <= self.end
        self.min_seen = self.queue.min_offset

    def teardown(self):
        if self.queue is not None:
            self.queue.close()
        shutil.rmtree(self.dir, ignore_errors=True)


QueueAgainstModel.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None,
                                               suppress_health_check=[HealthCheck.too_slow])
TestQueueAgainstModel = QueueAgainstModel.TestCase


# A real crash.

CHILD = """
import sys
sys.path.insert(0, sys.argv[2])
from broker.storage import PhysicalQueue, QueueConfig
from tests.support.storage_payloads import payload
queue = PhysicalQueue.create(sys.argv[1], 7, QueueConfig(segment_bytes_max=8192, index_interval_bytes=256))
i = 0
while True:
    first = queue.max_offset
    count = 1 + i % 4
    assert queue.append([payload(first + j) for j in range(count)], 1_000 + i) == first
    sys.stdout.write(f"{first} {count}\\n")
    sys.stdout.flush()
    i += 1
"""


@pytest.mark.timeout(60)
def test_kill_9_keeps_every_acknowledged_record(tmp_path):
    path = tmp_path / "q"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(REPO_ROOT)], stdout=subprocess.PIPE,
                             cwd=str(REPO_ROOT))
    acked: list[tuple[int, int]] = []
    deadline = time.monotonic() + 20
    try:
        while len(acked) < 400 and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            first, count = map(int, line.split())
            acked.append((first, count))
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    rest = child.stdout.read().decode()
    child.stdout.close()
    for line in rest.split("\n")[:-1]:  # acknowledgements printed before the kill; the last line may be cut
        first, count = map(int, line.split())
        acked.append((first, count))
    assert len(acked) >= 400, "the child did not get going"
    assert acked[0][0] == 7
    last_acked = acked[-1][0] + acked[-1][1]
    with PhysicalQueue.open(str(path), QueueConfig(segment_bytes_max=8192, index_interval_bytes=256)) as q:
        assert q.max_offset >= last_acked
        records = read_all(q, max_records=100)
        check_records(records, 7, q.max_offset)
        for first, count in acked:
            assert {records[first - 7 + j].ts_ms for j in range(count)} == {records[first - 7].ts_ms}
        assert q.append([payload(q.max_offset)], 10**6) == records[-1].offset + 1
    assert len(logs(path)) > 3


def test_a_store_closes_its_queues_at_once_each_clean_and_raises_the_first_failure(tmp_path):
    """QueueStore.close closes CLOSE_THREADS queues at a time: every queue is closed clean (its marker written, so
    the next open skips the recovery scan), and one that fails does not keep the others from closing."""
    store = QueueStore(str(tmp_path), SMALL)
    queues = [store.create(f"q{i}") for i in range(40)]
    for i, q in enumerate(queues):
        q.append([b"x"] * (i + 1), 1)
    bad = queues[7]
    close = bad.close

    def failing() -> None:
        close()
        raise OSError("the disk went away")

    bad.close = failing
    with pytest.raises(OSError, match="the disk went away"):
        store.close()
    assert all(q.closed for q in queues)
    assert all((tmp_path / e / files.CLEAN_MARKER).is_file() for e in os.listdir(tmp_path) if not e.startswith("."))
    with QueueStore(str(tmp_path), SMALL) as again:
        assert [again.get(f"q{i}").max_offset for i in range(40)] == list(range(1, 41))


def test_deleting_an_open_queue_closes_it_and_no_read_finds_it_again(tmp_path):
    with QueueStore(str(tmp_path), SMALL) as store:
        q = store.create("q")
        q.append([b"old"], 1)
        store.delete("q")
        assert q.closed, "the deleted queue's files are closed with it"
        with pytest.raises(QueueNotFound) as e:
            store.get("q")
        assert (e.value.message, e.value.details) == ("no such queue", {"name": "q"})
        with pytest.raises(QueueNotFound) as e:
            store.delete("q")
        assert (e.value.message, e.value.details) == ("no such queue", {"name": "q"})
        again = store.create("q")
        assert again is not q and again.max_offset == 0 and store.get("q") is again


def test_retention_by_size_keeps_exactly_the_newest_files_that_fit_and_counts_what_it_deleted(tmp_path):
    path = tmp_path / "q"
    q = PhysicalQueue.create(str(path), 0, SMALL)
    fill(q, 200)
    q.close()
    sizes = [f.stat().st_size for f in logs(path)]
    assert len(sizes) >= 5
    # exactly the last three files fit: the oldest ones go until the rest is no larger than retention_bytes
    keep = sum(sizes[-3:])
    q = PhysicalQueue.open(str(path), dataclasses.replace(SMALL, retention_bytes=keep))
    assert q.apply_retention(0) == len(sizes) - 3
    assert [f.stat().st_size for f in logs(path)] == sizes[-3:] and q.size_bytes == keep
    assert q.apply_retention(0) == 0, "what fits stays"
    check_records(read_all(q), q.min_offset, 200)
    q.close()
    # both bounds at once: the count is the files each deleted, added up
    two = tmp_path / "two"
    q = PhysicalQueue.create(str(two), 0, SMALL)
    fill(q, 100, ts_ms=1_000)
    fill(q, 100, ts_ms=5_000)
    q.close()
    before = len(logs(two))
    shutil.copytree(two, tmp_path / "age")
    q = PhysicalQueue.open(str(tmp_path / "age"), dataclasses.replace(SMALL, retention_ms=1_000))
    by_age = q.apply_retention(5_500)
    q.close()
    q = PhysicalQueue.open(str(two), dataclasses.replace(SMALL, retention_ms=1_000, retention_bytes=sizes[-1] * 2))
    both = q.apply_retention(5_500)
    assert 0 < by_age < both == before - len(logs(two))
    q.close()


def test_a_refused_queue_name_says_why():
    from broker.storage.names import dir_name

    def refusal(name) -> tuple[str, dict]:
        with pytest.raises(InvalidQueueName) as e:
            dir_name(name)
        return e.value.message, e.value.details

    assert refusal("") == ("a queue name is a non-empty string", {"name": "''"})
    assert refusal(None) == ("a queue name is a non-empty string", {"name": "None"})
    assert refusal("\ud800") == ("a queue name must be valid Unicode", {"name": repr("\ud800")})
    assert refusal("x" * 201) == ("a queue name holds at most 200 UTF-8 bytes", {"name_bytes": 201})
    assert dir_name("x" * 200) == "x" * 200, "the bound itself is allowed"
    assert refusal("é" * 90) == ("a queue name escapes to more than 255 bytes", {"name": "é" * 90})


def test_a_queue_config_out_of_range_is_refused_naming_its_field_and_the_bounds_are_inclusive():
    for field, low, high in [("segment_bytes_max", 1024, 2**30), ("index_interval_bytes", 1, 16 * 2**20),
                             ("index_interval_records", 1, 1_000_000), ("flush_interval_ms", 0, 60_000),
                             ("retention_ms", 0, 2**63 - 1), ("retention_bytes", 0, 2**63 - 1)]:
        assert getattr(QueueConfig(**{field: low}), field) == low
        assert getattr(QueueConfig(**{field: high}), field) == high
        for bad in (low - 1, high + 1, True, "5"):
            with pytest.raises(InvalidArgument) as e:
                QueueConfig(**{field: bad})
            assert (e.value.message, e.value.details) == (f"{field} must be an integer in [{low}, {high}]",
                                                          {field: bad}), (field, bad)
    with pytest.raises(InvalidArgument) as e:
        QueueConfig(flush_policy="sometimes")
    assert (e.value.message, e.value.details) == (
        "flush_policy must be one of ('fsync', 'interval', 'group')", {"flush_policy": "sometimes"})


def test_appends_and_reads_refused_say_why_and_an_untagged_append_is_tag_0(tmp_path):
    q = PhysicalQueue.create(str(tmp_path / "q"), 5, SMALL)
    q.append([b"a", b"b"], 1)
    assert [(r.offset, r.tag) for r in q.read_runs(5)] == [(5, 0)]
    for bad, details in ((b"a", {"type": "bytes"}), ("ab", {"type": "str"})):
        with pytest.raises(InvalidArgument) as e:
            q.append(bad, 1)
        assert (e.value.message, e.value.details) == ("payloads must be a list of bytes", details)
    with pytest.raises(InvalidArgument) as e:
        q.append([b"a", 7], 1)
    assert (e.value.message, e.value.details) == ("payloads must be a list of bytes", {})
    with pytest.raises(RecordTooLarge) as e:
        q.append([b"x" * (limits.RECORD_BYTES_MAX + 1)], 1)
    assert (e.value.message, e.value.details) == (f"a record holds at most {limits.RECORD_BYTES_MAX} bytes",
                                                  {"record_bytes": limits.RECORD_BYTES_MAX + 1})
    with pytest.raises(OffsetOutOfRange) as e:
        q.read(4)
    assert (e.value.message, e.value.details) == ("offset is below the first kept record",
                                                  {"offset": 4, "min_offset": 5, "max_offset": 7})
    assert (e.value.offset, e.value.min_offset, e.value.max_offset) == (4, 5, 7)
    q.close()


def test_a_failed_fsync_or_roll_fails_the_queue_until_it_is_opened_again(tmp_path, monkeypatch):
    """After a failed fsync the kernel may have dropped the dirty pages: no later append may be acknowledged on top
    of them (the queue refuses every write until it is opened again, which recovers from what is on disk)."""
    from broker.storage import QueueFailed
    from broker.storage import files as files_mod
    from broker.storage import segment as segment_mod

    config = dataclasses.replace(SMALL, flush_policy="fsync")
    for what in ("fsync", "roll"):
        path = tmp_path / what
        q = PhysicalQueue.create(str(path), 0, config)
        q.append([b"kept"], 1)
        with monkeypatch.context() as m:
            if what == "fsync":
                m.setattr(segment_mod.Segment, "sync", eio)
                message = "fsync failed; reopen the queue to recover"
            else:
                m.setattr(files_mod, "sync_dir", eio)
                q.append([b"x" * 900], 1)   # the next append rolls to a new file
                message = "rolling to a new segment file failed; reopen the queue"
            with pytest.raises(QueueFailed) as e:
                q.append([b"y" * 200], 1)
            assert e.value.message == message and e.value.details["path"].startswith(str(path)), what
        with pytest.raises(QueueFailed) as e:
            q.append([b"later"], 1)
        assert e.value.message == "a write or fsync failed earlier; reopen the queue to recover", what
        q.close()
        q = PhysicalQueue.open(str(path), config)
        assert q.read(0)[0].payload == b"kept" and q.append([b"again"], 1) == q.max_offset - 1
        q.close()


def test_the_handle_pool_keeps_exactly_its_bound_open_closing_the_least_recently_used(tmp_path):
    paths = []
    for i in range(4):
        p = tmp_path / f"f{i}"
        p.write_bytes(b"x")
        paths.append(str(p))
    pool = HandlePool(handles_max=2)
    for p in paths[:2]:
        with pool.lease(p):
            pass
    assert len(pool) == 2, "up to the bound, nothing is closed"
    with pool.lease(paths[0]):   # used again: now the most recent
        pass
    with pool.lease(paths[2]):
        pass
    assert len(pool) == 2 and set(pool._fds) == {paths[0], paths[2]}, "the least recently used one went"
    with pool.lease(paths[2]), pool.lease(paths[0]), pool.lease(paths[3]):   # leased ones are never closed
        assert len(pool) == 3
    pool.close_all()
    assert len(pool) == 0
