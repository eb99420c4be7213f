"""A physical queue's creation, closing and descriptors, and the frame check at its bounds (broker/storage/queue.py
``create`` and ``_close``, segment.py ``close``, handles.py ``release``, record.py ``frame_at``): what mutation
testing (issue 36) left alive there.

A create that fails must leave nothing in the store's directory (its temporary directory is made there, beside the
queue it becomes, so that one rename publishes it); a closed or deleted queue must give back every descriptor it
held, its own and the shared pool's, or a broker moving queues for days runs out of them.
"""

from __future__ import annotations

import errno
import gc
import os

import pytest

from broker.storage import (CorruptQueue, InvalidArgument, PhysicalQueue, QueueClosed, QueueConfig, QueueExists,
                            QueueFailed, QueueStore, files, limits)
from broker.storage.record import HEADER_BYTES, STOP_BAD, SIZE, frame_at, frame_header

SMALL = QueueConfig(segment_bytes_max=1024, flush_policy="interval")


def _open_fds() -> int:
    """This process's descriptors, once the garbage an earlier test left is collected (its files closed now, not
    between two counts of this test)."""
    gc.collect()
    return len(os.listdir("/proc/self/fd"))


def test_create_refuses_a_bad_start_and_an_existing_queue_by_name(tmp_path):
    with pytest.raises(InvalidArgument) as refused:
        PhysicalQueue.create(str(tmp_path / "q"), -1)
    assert (refused.value.message, refused.value.details) == (
        f"start_offset must be an integer in [0, {limits.OFFSET_MAX}]", {"start_offset": -1})
    PhysicalQueue.create(str(tmp_path / "q")).close()
    with pytest.raises(QueueExists) as refused:
        PhysicalQueue.create(str(tmp_path / "q"))
    assert (refused.value.message, refused.value.details) == ("queue directory already exists",
                                                              {"path": str(tmp_path / "q")})


def test_a_create_that_fails_leaves_nothing_and_says_why(tmp_path, monkeypatch):
    parent = tmp_path / "queues"
    parent.mkdir()
    made: list[str] = []
    real_mkdir = os.mkdir

    def mkdir(path, *args, **kwargs):
        made.append(str(path))
        return real_mkdir(path, *args, **kwargs)

    def sync_dir(_path):
        raise OSError(errno.EIO, "the disk failed")
    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(files, "sync_dir", sync_dir)
    with pytest.raises(OSError) as err:
        PhysicalQueue.create(str(parent / "q"))
    assert err.value.errno == errno.EIO, "the create's own error, not one of its clean-up"
    assert [os.path.dirname(p) for p in made] == [str(parent)], "made beside the queue, for one rename to publish"
    assert os.listdir(parent) == [], "nothing half made is left"


def test_a_closed_queue_has_synced_and_says_so(tmp_path):
    q = PhysicalQueue.create(str(tmp_path / "q"), 0, QueueConfig(flush_policy="interval"))
    q.append([b"a", b"b", b"c"], 1)
    q.close()
    assert q.flushed_offset == 3


def test_closing_and_deleting_queues_gives_back_every_descriptor(tmp_path):
    before = _open_fds()
    with PhysicalQueue.create(str(tmp_path / "own"), 0, SMALL) as q:   # a pool of its own
        for i in range(40):
            q.append([bytes([i]) * 100], i)
        assert len(list((tmp_path / "own").glob("*.log"))) > 3
        assert len(q.read(0, 1_000)) == 40        # every sealed file leased from its pool
    assert _open_fds() == before

    store = QueueStore(str(tmp_path / "store"), SMALL)
    try:
        base = _open_fds()
        q = store.create("a")
        for i in range(40):
            q.append([bytes([i]) * 100], i)
        assert len(q.read(0, 1_000)) == 40        # the sealed files' descriptors, from the store's shared pool
        assert _open_fds() > base
        store.delete("a")
        assert _open_fds() == base, "a deleted queue's files are closed in the shared pool too"
    finally:
        store.close()
    assert _open_fds() == before


def _frame(records: bytes, count: int) -> bytes:
    return frame_header(records, count, 0, 1, 0) + records


def test_a_frame_whose_count_needs_more_bytes_than_it_holds_is_bad_though_its_checksum_is_right():
    records = SIZE.pack(4) + b"abcd"          # 8 bytes: room for two empty records at most
    assert frame_at(_frame(records, 1), 0, 0)[0] == -1
    assert frame_at(_frame(records, 2), 0, 0)[0] == -1      # 8 bytes hold two sizes (the records are the writer's)
    assert frame_at(_frame(records, 3), 0, 0)[0] == STOP_BAD


def test_the_largest_frame_is_whole():
    count = limits.BATCH_RECORDS_MAX
    sizes = [limits.BATCH_BYTES_MAX // count] * (count - 1)
    sizes.append(limits.BATCH_BYTES_MAX - sum(sizes))
    records = b"".join(SIZE.pack(n) + bytes(n) for n in sizes)
    assert len(records) == limits.FRAME_BYTES_MAX
    status, got, _, _, end = frame_at(_frame(records, count), 0, 0)
    assert (status, got, end) == (-1, count, HEADER_BYTES + limits.FRAME_BYTES_MAX)


def test_an_append_s_refusals_name_their_argument_and_bound(tmp_path):
    with PhysicalQueue.create(str(tmp_path / "q")) as q:
        for call, message, details in (
                (lambda: q.append([b"x"], -1), f"ts_ms must be an integer in [0, {limits.TS_MS_MAX}]", {"ts_ms": -1}),
                (lambda: q.append([b"x"], 1, 2**32), f"tag must be an integer in [0, {2**32 - 1}]", {"tag": 2**32}),
                (lambda: q.append([], 1), f"a batch holds 1 to {limits.BATCH_RECORDS_MAX} records", {"records": 0}),
                (lambda: q.append([b"x" * limits.RECORD_BYTES_MAX] * 5, 1),
                 f"a batch holds at most {limits.BATCH_BYTES_MAX} bytes",
                 {"batch_bytes": 5 * limits.RECORD_BYTES_MAX})):
            with pytest.raises(InvalidArgument) as refused:
                call()
            assert (refused.value.message, refused.value.details) == (message, details)
        assert q.max_offset == 0


def test_the_last_offsets_fit_and_the_one_past_them_is_refused(tmp_path):
    start = limits.OFFSET_MAX - 3
    with PhysicalQueue.create(str(tmp_path / "q"), start) as q:
        assert q.append([b"a", b"b", b"c"], 1) == start      # up to OFFSET_MAX exactly
        with pytest.raises(InvalidArgument) as refused:
            q.append([b"d"], 2)
        assert (refused.value.message, refused.value.details) == ("the queue has run out of offsets",
                                                                  {"max_offset": limits.OFFSET_MAX})
        assert q.max_offset == limits.OFFSET_MAX and not q.failed


def test_a_closed_queue_refuses_by_name(tmp_path):
    q = PhysicalQueue.create(str(tmp_path / "q"))
    q.close()
    for call in (lambda: q.append([b"x"], 1), lambda: q.read(0)):
        with pytest.raises(QueueClosed) as refused:
            call()
        assert (refused.value.message, refused.value.details) == ("queue is closed", {"path": str(tmp_path / "q")})


def test_a_short_write_is_finished_from_where_it_stopped(tmp_path, monkeypatch):
    """pwritev may write less than asked (a signal, a full pipe of the block layer): the rest is written after it."""
    real = os.pwritev

    def short(fd, buffers, pos):
        return real(fd, [bytes(buffers[0])[:10]], pos)   # ten bytes of the header, no more
    with PhysicalQueue.create(str(tmp_path / "q")) as q:
        q.append([b"first"], 1)
        monkeypatch.setattr(os, "pwritev", short)
        assert q.append([b"second", b"third"], 2) == 1
        monkeypatch.setattr(os, "pwritev", real)
        assert [r.payload for r in q.read(0)] == [b"first", b"second", b"third"]
    with PhysicalQueue.open(str(tmp_path / "q")) as q:
        assert [r.payload for r in q.read(0)] == [b"first", b"second", b"third"]


def test_a_write_that_cannot_be_undone_fails_the_queue_until_it_is_reopened(tmp_path, monkeypatch):
    def fails(*_args):
        raise OSError(errno.EIO, "the disk failed")
    q = PhysicalQueue.create(str(tmp_path / "q"))
    q.append([b"kept"], 1)
    monkeypatch.setattr(os, "pwritev", fails)
    monkeypatch.setattr(os, "ftruncate", fails)     # and the cut back to the last whole frame fails too
    with pytest.raises(QueueFailed):
        q.append([b"lost"], 2)
    monkeypatch.undo()
    assert q.failed
    with pytest.raises(QueueFailed) as refused:
        q.append([b"later"], 3)
    assert (refused.value.message, refused.value.details) == (
        "a write or fsync failed earlier; reopen the queue to recover", {"path": str(tmp_path / "q")})
    q.close()
    with PhysicalQueue.open(str(tmp_path / "q")) as q:
        assert [r.payload for r in q.read(0)] == [b"kept"]
        assert q.append([b"again"], 4) == 1


def test_a_write_that_makes_no_progress_is_refused_and_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    """A short pwritev, then a pwrite that writes nothing (a full disk that says so by writing 0 bytes): ENOSPC, the
    file cut back to its last whole frame, and the queue goes on."""
    real = os.pwritev
    with PhysicalQueue.create(str(tmp_path / "q")) as q:
        q.append([b"kept"], 1)
        size = os.path.getsize(tmp_path / "q" / files.log_name(0))
        monkeypatch.setattr(os, "pwritev", lambda fd, buffers, pos: real(fd, [bytes(buffers[0])[:10]], pos))
        monkeypatch.setattr(os, "pwrite", lambda fd, data, pos: 0)
        with pytest.raises(OSError) as err:
            q.append([b"lost"], 2)
        assert (err.value.errno, err.value.strerror, err.value.filename) == (
            errno.ENOSPC, "write made no progress", str(tmp_path / "q" / files.log_name(0)))
        monkeypatch.undo()
        assert os.path.getsize(tmp_path / "q" / files.log_name(0)) == size
        assert not q.failed and q.append([b"next"], 3) == 1
        assert [r.payload for r in q.read(0)] == [b"kept", b"next"]


def test_a_queue_directory_without_its_files_is_refused_by_name(tmp_path):
    missing = tmp_path / "missing"
    with pytest.raises(CorruptQueue) as refused:
        PhysicalQueue.open(str(missing))
    assert (refused.value.message, refused.value.details) == ("queue directory is missing or not a directory",
                                                              {"path": str(missing)})
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorruptQueue) as refused:
        PhysicalQueue.open(str(tmp_path / "empty"))
    assert (refused.value.message, refused.value.details) == ("queue directory holds no segment file",
                                                              {"path": str(tmp_path / "empty")})


def test_a_queue_that_starts_at_the_last_offset_opens_again(tmp_path):
    PhysicalQueue.create(str(tmp_path / "q"), limits.OFFSET_MAX).close()
    with PhysicalQueue.open(str(tmp_path / "q")) as q:
        assert q.min_offset == q.max_offset == limits.OFFSET_MAX
