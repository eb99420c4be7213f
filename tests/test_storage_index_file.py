"""A segment's stored sparse index (broker/storage/index.py ``SparseIndex.from_bytes``, segment.py ``_load_index``):
which stored indexes are taken, which are refused and rebuilt from the data, and what opening a queue reads.

An index is only a cache of its data file: one that is refused costs a scan, one wrongly taken would send readers to
positions that hold no frame. Mutation testing (issue 36) left the checks of each entry and the size bound alive:
every earlier test wrote indexes that were whole or garbage, never one wrong in a single field.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest

from broker.storage import PhysicalQueue, QueueConfig, files, limits
from broker.storage.index import ENTRY, TRAILER, SparseIndex
from broker.storage.record import HEADER_BYTES, SIZE_BYTES
from tests.support.preads import Preads

INTERVAL_BYTES, INTERVAL_RECORDS = 64, 1


def _stored(*entries: tuple[int, int, int]) -> bytes:
    body = b"".join(ENTRY.pack(*e) for e in entries)
    return body + TRAILER.pack(zlib.crc32(body))


def _parsed(data: bytes, file_bytes: int = 1_000) -> SparseIndex | None:
    return SparseIndex.from_bytes(data, INTERVAL_BYTES, INTERVAL_RECORDS, file_bytes)


def test_a_well_formed_index_is_taken_entry_for_entry():
    index = _parsed(_stored((0, 0, 0), (3, 100, 0), (7, 250, 9)))
    assert index is not None
    assert (list(index.rels), list(index.positions), list(index.times)) == ([0, 3, 7], [0, 100, 250], [0, 0, 9])
    assert _parsed(_stored(), file_bytes=0) is not None, "an empty file's index has no entries"


@pytest.mark.parametrize("entries, why", [
    (((0, 0, 5), (3, 100, 5), (3, 200, 6)), "two entries for one offset"),
    (((0, 0, 5), (3, 100, 5), (4, 100, 6)), "two entries at one position"),
    (((0, 0, 5), (3, 100, 6), (4, 200, 5)), "time going back"),
    (((0, 0, 5), (3, 1_000, 6)), "an entry at the file's end, where no frame starts"),
    (((0, 7, 5), (3, 100, 6)), "a first entry not at position 0"),
    (((1, 0, 5), (3, 100, 6)), "a first entry not at offset 0"),
    ((), "no entry for a file with frames"),
])
def test_an_index_wrong_in_one_field_is_refused(entries, why):
    assert _parsed(_stored(*entries)) is None, why


def test_an_index_that_fails_its_checksum_or_is_cut_is_refused():
    data = _stored((0, 0, 5), (3, 100, 6))
    assert _parsed(data[:-1] + bytes([data[-1] ^ 1])) is None
    assert _parsed(data[:-2]) is None


DENSE = (INTERVAL_BYTES, 1)
SPARSE = (limits.INDEX_INTERVAL_BYTES_MAX, limits.INDEX_INTERVAL_RECORDS_MAX)   # the first frame's entry alone


def _config(interval: tuple[int, int]) -> QueueConfig:
    return QueueConfig(segment_bytes_max=1024, index_interval_bytes=interval[0], index_interval_records=interval[1],
                       flush_policy="interval")


def _sealed_file_of_five_frames(path: Path, interval: tuple[int, int]) -> Path:
    """A queue whose first file is sealed with five frames of one empty record each, the smallest frames there are
    (a large sixth frame does not fit the file and starts the next)."""
    with PhysicalQueue.create(str(path), 0, _config(interval)) as q:
        for i in range(5):
            q.append([b""], i)
        q.append([b"x" * 900], 5)
    assert sorted(int(p.stem) for p in path.glob("*.log")) == [0, 5]
    return path / files.index_name(0)


def test_a_sealed_files_index_is_taken_so_opening_reads_only_its_last_frame(tmp_path, monkeypatch):
    """Every frame indexed, in the smallest file that can hold them: the index is as large as a valid one gets
    against the file's size, and is still taken (the size bound only keeps junk from being read whole)."""
    index_path = _sealed_file_of_five_frames(tmp_path / "q", DENSE)
    preads = Preads(monkeypatch)
    with PhysicalQueue.open(str(tmp_path / "q"), _config(DENSE)):
        pass
    frame = HEADER_BYTES + SIZE_BYTES
    assert preads.positions(files.log_name(0)) == [4 * frame], \
        "the sealed file is checked from its last entry on, not scanned from its start"
    assert len(_parsed_file(index_path)) == 5


def _parsed_file(index_path: Path, file_frames: int = 5) -> SparseIndex:
    file_bytes = file_frames * (HEADER_BYTES + SIZE_BYTES)
    index = SparseIndex.from_bytes(index_path.read_bytes(), INTERVAL_BYTES, 1, file_bytes)
    assert index is not None
    return index


def test_a_stored_index_is_written_again_only_when_opening_extended_it(tmp_path):
    index_path = _sealed_file_of_five_frames(tmp_path / "q", SPARSE)
    assert len(_parsed_file(index_path)) == 1
    before = os.stat(index_path)
    with PhysicalQueue.open(str(tmp_path / "q"), _config(SPARSE)):
        pass
    after = os.stat(index_path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), "a whole index is left alone"
    with PhysicalQueue.open(str(tmp_path / "q"), _config(DENSE)):   # denser now: the scan adds an entry a frame
        pass
    assert len(_parsed_file(index_path)) == 5, "the extended index was stored"


def test_an_index_gone_between_its_stat_and_its_read_means_a_scan(tmp_path, monkeypatch):
    _sealed_file_of_five_frames(tmp_path / "q", DENSE)
    real = files.read_file
    monkeypatch.setattr(files, "read_file",
                        lambda path: None if path.endswith(files.index_name(0)) else real(path))
    with PhysicalQueue.open(str(tmp_path / "q"), _config(DENSE)) as q:
        assert [r.offset for r in q.read(0, 10)] == list(range(6))


def test_a_frame_gets_an_entry_when_it_is_the_first_or_an_interval_of_bytes_or_records_past_the_last():
    index = SparseIndex(interval_bytes=100, interval_records=5)
    for rel, pos in ((0, 0), (2, 40), (4, 99), (5, 120), (6, 219), (7, 220), (12, 230), (13, 240)):
        index.add_frame(rel, pos, 7)
    assert list(zip(index.rels, index.positions)) == [(0, 0), (5, 120), (7, 220), (12, 230)]
    assert list(index.times) == [7] * 4
    late = SparseIndex(interval_bytes=100, interval_records=5)
    late.add_frame(3, 50, 1)                  # a file's first frame is always an entry, wherever it starts
    assert list(zip(late.rels, late.positions)) == [(3, 50)]
