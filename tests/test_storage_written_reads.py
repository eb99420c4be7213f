"""Reads of what is written but not yet synced, and the rest of what mutation testing left in broker/storage (issue 36):
the replication source's ``written=True`` reads against a reader's default, a damaged file's gap and time lookups
past its damage, the store's root scan, and the small helpers whose answers callers act on.

With flush policy "group" a queue's readers see only what a sync covered (``max_offset``): an acknowledged record is
never taken back. The leader's push to its followers reads further (``written=True``): what is written, synced or not,
since a copy needs it before the leader's own sync ends. Every earlier test read written records after their sync,
where both answers are the same.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from broker.storage import CorruptData, InvalidArgument, PhysicalQueue, QueueConfig, QueueStore, files, limits
from broker.storage.config import FLUSH_GROUP
from broker.storage.lines import encode
from broker.storage.record import HEADER_BYTES, SIZE_BYTES

GROUP = QueueConfig(flush_policy=FLUSH_GROUP)


def _offsets(runs) -> list[int]:
    return [r.offset + i for r in runs for i in range(r.count)]


def test_readers_see_what_a_sync_covered_and_the_push_sees_what_is_written(tmp_path):
    with PhysicalQueue.create(str(tmp_path / "q"), 0, GROUP) as q:
        q.append([b"a", b"b"], 1)
        pending = q.pending_sync()
        q.append([b"c", b"d", b"e"], 2)                 # written after the sync began: not covered by it
        q.synced(pending)                               # as the group syncer tells it after its round
        assert q.max_offset == 2
        assert [r.offset for r in q.read(0)] == [0, 1], "a reader's default: what the sync covered"
        assert _offsets(q.read_runs(0)) == [0, 1]
        assert _offsets(q.read_runs(0, written=False)) == [0, 1]
        assert _offsets(q.try_read_runs(0)) == [0, 1]
        assert q.read(2) == [] and q.read_runs(2) == []
        assert _offsets(q.read_runs(0, written=True)) == [0, 1, 2, 3, 4]
        assert _offsets(q.try_read_runs(0, written=True)) == [0, 1, 2, 3, 4]
        assert _offsets(q.read_runs(1, 1_000, written=True)) == [1, 2, 3, 4]
        assert _offsets(q.read_runs(3, written=True)) == [3, 4]
        assert _offsets(q.read_runs(1, 1_000)) == [1], "from inside, still no further than the sync"


FRAME = HEADER_BYTES + 10 * (SIZE_BYTES + 100)
SMALL_FILES = QueueConfig(segment_bytes_max=20 * FRAME, index_interval_bytes=limits.INDEX_INTERVAL_BYTES_MAX,
                          index_interval_records=limits.INDEX_INTERVAL_RECORDS_MAX, flush_policy="interval")


def _two_files(path: Path) -> None:
    """Files at 0 and 200, frames of ten records of 100 bytes stamped 1,000 + their frame number."""
    with PhysicalQueue.create(str(path), 0, SMALL_FILES) as q:
        for f in range(30):
            q.append([bytes([f]) * 100] * 10, 1_000 + f)
    assert sorted(int(p.stem) for p in path.glob("*.log")) == [0, 200]


def test_a_sealed_file_cut_short_names_its_missing_records_and_where_reading_resumes(tmp_path):
    _two_files(tmp_path / "q")
    os.truncate(tmp_path / "q" / files.log_name(0), 15 * FRAME)   # the file loses its last five frames
    with PhysicalQueue.open(str(tmp_path / "q"), SMALL_FILES) as q:
        assert [r.offset for r in q.read(140, 20)] == list(range(140, 150)), "what is left before the gap"
        with pytest.raises(CorruptData) as err:
            q.read(150)
        assert (err.value.message, err.value.details) == ("records are missing from a damaged segment file",
                                                          {"offset": 150, "next_offset": 200})


def test_a_time_lookup_past_a_damaged_frame_goes_on_in_the_next_file(tmp_path):
    """The disk rots under an open queue (an open's scan would have cut the file's known end before the damage): the
    first file's only index entry is its first frame, so a lookup of a time in its damaged tail finds no frame there
    (its scan stops at the damage) and answers from the next file."""
    _two_files(tmp_path / "q")
    with PhysicalQueue.open(str(tmp_path / "q"), SMALL_FILES) as q:
        with open(tmp_path / "q" / files.log_name(0), "r+b") as f:   # a payload byte of frame 12 (offsets 120-129)
            f.seek(12 * FRAME + HEADER_BYTES + SIZE_BYTES + 3)
            f.write(b"\xee")
        assert q.offset_for_time(1_005) == 50
        assert q.offset_for_time(1_015) == 200, "past the damage: the next file's first frame"
        assert q.offset_for_time(1_025) == 250


def test_the_store_s_root_scan_takes_directories_only(tmp_path):
    root = tmp_path / "queues"
    store = QueueStore(str(root))
    store.create("a.q0").append([b"x"], 1)
    store.close()
    (root / "b.q1").write_bytes(b"a file, spelled like a queue's directory")
    store = QueueStore(str(root))
    try:
        assert store.names() == ["a.q0"]
    finally:
        store.close()


def test_remove_if_exists_says_whether_it_removed(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x")
    assert files.remove_if_exists(str(path)) is True and not path.exists()
    assert files.remove_if_exists(str(path)) is False


def test_a_line_is_compact_json_behind_its_checksum():
    """The lines format on disk (lines.py, format 1): no spaces in the JSON, so a value's bytes are the same on every
    writer and a line's size is what the limits count."""
    line = encode({"a": 1, "b": [2, 3]})
    assert line.endswith(b' {"a":1,"b":[2,3]}\n'), line


@pytest.mark.parametrize("args, field, bounds", [
    ((-1, 10, 100), "offset", f"[0, {limits.OFFSET_MAX}]"),
    ((0, 0, 100), "max_records", f"[1, {limits.READ_RECORDS_MAX}]"),
    ((0, 10, 0), "max_bytes", f"[1, {limits.READ_BYTES_MAX}]"),
])
def test_a_read_s_refusal_names_the_argument_and_its_bounds(tmp_path, args, field, bounds):
    with PhysicalQueue.create(str(tmp_path / "q"), 0, GROUP) as q:
        with pytest.raises(InvalidArgument) as refused:
            q.read_runs(*args)
        value = args[("offset", "max_records", "max_bytes").index(field)]
        assert (refused.value.message, refused.value.details) == (f"{field} must be an integer in {bounds}",
                                                                  {field: value})


@pytest.mark.parametrize("code, waits", [(errno.EOPNOTSUPP, True), (errno.EINVAL, True), (errno.EIO, False)])
def test_a_file_system_that_cannot_read_without_waiting_leaves_the_read_to_a_thread(tmp_path, monkeypatch, code,
                                                                                     waits):
    """preadv2's RWF_NOWAIT refused by the file system (EOPNOTSUPP, EINVAL) means "ask a thread"; any other error is
    the disk's, and is raised."""
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)

    def refused(*_args):
        raise OSError(code, os.strerror(code))
    monkeypatch.setattr(os, "preadv", refused)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(files.WouldWait if waits else OSError) as err:
            files.pread_cached(fd, 10, 0)
        assert waits or err.value.errno == code
    finally:
        os.close(fd)
