"""What a read costs the disk (broker/storage/segment.py ``_chunk_bytes`` and ``_read_from``): one pread per read
that fits a chunk, never much more than the records it returns, and reads longer than a chunk that take exactly what
was asked across their chunks and files.

A segment guesses how many bytes its records take from the file's mean record size: a short guess costs a second
pread, a long one copies bytes nobody asked for. Every other storage test checks what a read returns; none counted
preads, so mutation testing (issue 36) left the guess itself unchecked: a read-ahead short by a header, a mean
computed without the file's base offset, a skip into an index interval that forgot the interval. Here each read's
preads are counted and their bytes bounded by the frames it returned, plus one record's guess and one header.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.storage import CorruptData, PhysicalQueue, QueueConfig, files, limits
from broker.storage.record import HEADER_BYTES, SIZE_BYTES
from tests.support.preads import Preads

RECORD = 200                      # bytes of payload per record
BATCH = 10                        # records per append: one frame
FRAME = HEADER_BYTES + BATCH * (SIZE_BYTES + RECORD)
INTERVAL = 2 * FRAME              # an index entry every second frame
ONE_FILE = QueueConfig(segment_bytes_max=64 * 2**20, index_interval_bytes=INTERVAL,
                       index_interval_records=limits.INDEX_INTERVAL_RECORDS_MAX, flush_policy="interval")


def _filled(path: Path, start: int, frames: int, config: QueueConfig = ONE_FILE) -> PhysicalQueue:
    q = PhysicalQueue.create(str(path), start, config)
    for f in range(frames):
        q.append([bytes([f % 251, i]) * (RECORD // 2) for i in range(BATCH)], 1_000 + f)
    return q


def _mean_record(path: Path, q: PhysicalQueue) -> int:
    """The segment's guess of one record's bytes: its one file's bytes over its records, rounded up."""
    return (path / files.log_name(q.min_offset)).stat().st_size // (q.max_offset - q.min_offset) + 1


def _bases(path: Path) -> list[int]:
    return sorted(int(p.stem) for p in path.glob("*.log"))


@pytest.fixture
def preads(monkeypatch):
    return Preads(monkeypatch)


@pytest.mark.parametrize("start", [0, 10**6])
@pytest.mark.parametrize("records", [100, 250, 500])
def test_a_read_from_an_index_entry_takes_one_pread_of_little_more_than_its_frames(tmp_path, preads, start, records):
    """Reads of 20 KB and more (past the smallest chunk, 16 KiB) that start where the index points: one pread, and at
    most one record's guess, one header and a byte a record (the guess's rounding) past the frames returned."""
    with _filled(tmp_path / "q", start, 100) as q:
        mean = _mean_record(tmp_path / "q", q)
        got = preads.during(lambda: q.read(start, records, limits.READ_BYTES_MAX))
        assert [r.offset for r in got] == list(range(start, start + records))
        assert len(preads.calls) == 1, preads.calls
        frames = records // BATCH * FRAME
        assert frames <= preads.asked <= frames + mean + HEADER_BYTES + records, (preads.asked, frames, mean)


@pytest.mark.parametrize("start", [0, 10**6])
def test_a_read_that_starts_between_index_entries_reads_the_skipped_frame_in_the_same_pread(tmp_path, preads, start):
    """The index points one frame before the offset: the chunk covers that frame too (an index interval more)."""
    with _filled(tmp_path / "q", start, 100) as q:
        mean = _mean_record(tmp_path / "q", q)
        offset = start + 3 * BATCH             # frame 3: its index entry is frame 2's
        got = preads.during(lambda: q.read(offset, 200, limits.READ_BYTES_MAX))
        assert [r.offset for r in got] == list(range(offset, offset + 200))
        assert len(preads.calls) == 1 and preads.calls[0].pos == 2 * FRAME, preads.calls
        needed = FRAME + 200 // BATCH * FRAME
        assert needed <= preads.asked <= needed + mean + HEADER_BYTES + 200 + INTERVAL, (preads.asked, needed)


def test_a_read_that_goes_on_from_the_last_stops_reads_from_there_without_an_interval(tmp_path, preads):
    with _filled(tmp_path / "q", 0, 100) as q:
        mean = _mean_record(tmp_path / "q", q)
        q.read(0, 150, limits.READ_BYTES_MAX)      # stops inside frame 15, between index entries
        got = preads.during(lambda: q.read(150, 300, limits.READ_BYTES_MAX))
        assert [r.offset for r in got] == list(range(150, 450))
        assert len(preads.calls) == 1 and preads.calls[0].pos == 15 * FRAME, preads.calls
        assert preads.asked <= 30 * FRAME + mean + HEADER_BYTES + 300, preads.asked


def test_a_byte_budget_that_binds_takes_one_pread_of_exactly_the_frame(tmp_path, preads):
    """Two large records, one a frame: a read of one record with a budget of exactly its payload guesses the chunk
    from the budget (the mean record would take both), and that is the whole frame, to the byte."""
    big = 100 * 1024
    with PhysicalQueue.create(str(tmp_path / "q"), 0, ONE_FILE) as q:
        q.append([b"x" * big], 1)
        q.append([b"y" * big], 2)
        got = preads.during(lambda: q.read(0, 1, big))
        assert [len(r.payload) for r in got] == [big]
        assert [(c.size, c.pos) for c in preads.calls] == [(HEADER_BYTES + SIZE_BYTES + big, 0)]


LARGE = 64 * 1024                  # records of reads longer than one chunk (READ_CHUNK_BYTES_MAX, 4 MiB)
LARGE_FRAME = HEADER_BYTES + SIZE_BYTES + LARGE


def test_a_read_longer_than_a_chunk_takes_exactly_what_it_asked_across_chunks_and_files(tmp_path, preads):
    per_file = 100
    config = QueueConfig(segment_bytes_max=per_file * LARGE_FRAME, index_interval_bytes=limits.INDEX_INTERVAL_BYTES_MAX,
                         index_interval_records=limits.INDEX_INTERVAL_RECORDS_MAX, flush_policy="interval")
    with PhysicalQueue.create(str(tmp_path / "q"), 0, config) as q:
        for i in range(per_file + 60):
            q.append([i.to_bytes(4, "big") * (LARGE // 4)], 1)
        assert _bases(tmp_path / "q") == [0, per_file]
        chunk_records = limits.READ_CHUNK_BYTES_MAX // LARGE_FRAME

        got = preads.during(lambda: q.read(0, 80, limits.READ_BYTES_MAX))
        assert [r.offset for r in got] == list(range(80)), "no more records than asked, over two chunks"
        assert all(r.payload == r.offset.to_bytes(4, "big") * (LARGE // 4) for r in got)
        assert len(preads.calls) == 2 and preads.calls[1].pos == chunk_records * LARGE_FRAME, preads.calls
        # the first chunk's torn last frame is read again by the second, which guesses from the 17 records left
        assert preads.asked <= 82 * LARGE_FRAME + HEADER_BYTES + 80, "the second chunk guessed from what was left"

        got = preads.during(lambda: q.read(80, 40, limits.READ_BYTES_MAX))   # on from the last read's stop
        assert [r.offset for r in got] == list(range(80, 120))
        assert all(r.payload == r.offset.to_bytes(4, "big") * (LARGE // 4) for r in got)
        assert preads.calls[0].pos == 80 * LARGE_FRAME, preads.calls

        got = q.read(0, 120, limits.READ_BYTES_MAX)   # two chunks of the first file, then the second file
        assert [r.offset for r in got] == list(range(120)), "the first file's records counted across its chunks"


def test_a_file_that_shrank_under_an_open_queue_is_named_at_the_chunk_it_could_not_read(tmp_path):
    with _filled(tmp_path / "q", 0, 40, QueueConfig(segment_bytes_max=20 * FRAME, index_interval_bytes=INTERVAL,
                                                    index_interval_records=limits.INDEX_INTERVAL_RECORDS_MAX,
                                                    flush_policy="interval")) as q:
        assert _bases(tmp_path / "q") == [0, 200]
        os.truncate(tmp_path / "q" / files.log_name(0), 10 * FRAME)   # the sealed file loses its second half
        with pytest.raises(CorruptData) as err:
            q.read(120, 10, limits.READ_BYTES_MAX)
        # the chunk's first frame (an index entry); nothing past the cut can be told where to resume
        assert (err.value.message, err.value.details) == ("segment file shrank under the reader",
                                                          {"offset": 120, "next_offset": None})
        assert err.value.offset == 120 and err.value.next_offset is None


def test_a_damaged_frame_is_named_with_where_reading_resumes(tmp_path):
    with _filled(tmp_path / "q", 0, 40, QueueConfig(segment_bytes_max=20 * FRAME, index_interval_bytes=INTERVAL,
                                                    index_interval_records=limits.INDEX_INTERVAL_RECORDS_MAX,
                                                    flush_policy="interval")) as q:
        with open(tmp_path / "q" / files.log_name(0), "r+b") as f:   # a payload byte of frame 5 (offsets 50-59)
            f.seek(5 * FRAME + HEADER_BYTES + SIZE_BYTES + 7)
            f.write(b"\xff")
        with pytest.raises(CorruptData) as err:
            q.read(53, 10, limits.READ_BYTES_MAX)
        assert (err.value.message, err.value.details) == ("a record failed its check on read",
                                                          {"offset": 53, "next_offset": 60})
        assert [r.offset for r in q.read(60, 5)] == list(range(60, 65))
