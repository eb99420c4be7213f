"""What a queue under group commit (flush policy "group") says a sync may cover and what it marks readable, and
the syncfs(2) that group commit calls: a record is readable only once a sync that began after its write returned,
and never after a sync that failed."""

from __future__ import annotations

import ctypes
import errno
import os

import pytest

from broker.storage import InvalidArgument, PhysicalQueue, ProducerMark, QueueConfig, files
from broker.storage.config import FLUSH_GROUP, FLUSH_INTERVAL
from meta.raft import journal as raft_journal
from runtime import libc
from tests.support.storage_payloads import framed_records

GROUP = QueueConfig(flush_policy=FLUSH_GROUP)


@pytest.fixture
def q(tmp_path):
    queue = PhysicalQueue.create(str(tmp_path / "q"), 0, GROUP)
    yield queue
    queue.close()


def test_a_sync_marks_readable_only_what_was_written_before_it_began_and_a_flush_takes_the_rest(q):
    q.append([b"a", b"b"], 1)
    pending = q.pending_sync()
    assert pending is not None and pending.end_offset == 2
    q.append([b"c"], 2)                     # written while the sync runs: not covered by it
    q.synced(pending)
    assert q.max_offset == 2 and q.next_offset == 3
    # What the sync did not cover is still dirty: a flush (a seal, a close) syncs it
    q.flush()
    assert q.max_offset == 3
    assert q.pending_sync() is None          # nothing left to sync
    assert q.maybe_flush(10**9) is False     # and nothing dirty for a tick either


def test_an_older_sync_ending_after_a_newer_one_marks_nothing_back(q):
    q.append([b"a"], 1)
    older = q.pending_sync()
    q.append([b"b"], 1)
    newer = q.pending_sync()
    q.synced(newer)
    q.synced(older)
    assert q.max_offset == 2
    assert q.maybe_flush(10**9) is False


def test_a_failed_queue_offers_nothing_to_sync_and_never_marks_its_unsynced_records_readable(q):
    q.append([b"a"], 1)
    q.sync_failed()
    assert q.pending_sync() is None
    assert q.max_offset == 0


def test_a_queue_whose_closing_sync_failed_offers_nothing_more_to_sync(tmp_path, monkeypatch):
    queue = PhysicalQueue.create(str(tmp_path / "q"), 0, GROUP)
    queue.append([b"a"], 1)

    def fail(fd):
        raise OSError(errno.EIO, "injected")
    monkeypatch.setattr(files, "sync_data", fail)
    with pytest.raises(OSError):
        queue.close()
    # Its pages may be gone: a group commit round that took it now would mark them readable after a sync
    assert queue.pending_sync() is None
    assert queue.max_offset == 0


@pytest.mark.parametrize("fn, argtypes, args", [
    (files._syncfs, [ctypes.c_int], (-1,)),
    (raft_journal._sync_file_range, [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint],
     (-1, 0, 0, raft_journal.SYNC_FILE_RANGE_WRITE)),
], ids=["syncfs", "sync_file_range"])
def test_libc_calls_are_bound_with_their_c_signatures_and_report_errno(fn, argtypes, args):
    assert fn is not None
    assert fn.argtypes == argtypes and fn.restype is ctypes.c_int
    ctypes.set_errno(0)
    assert fn(*args) == -1
    assert libc.errno() == errno.EBADF   # use_errno: the error is kept for the caller


def test_a_failed_syncfs_raises_the_errno_it_set(tmp_path):
    with pytest.raises(OSError) as e:
        files._checked_syncfs(-1)
    assert e.value.errno == errno.EBADF
    assert e.value.strerror == f"syncfs: {os.strerror(errno.EBADF)}"
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        files._checked_syncfs(fd)   # a directory of a healthy file system: no error
    finally:
        os.close(fd)


def test_syncfs_is_refused_where_it_cannot_report_write_back_errors(monkeypatch):
    assert files.syncfs_unusable() is None   # this machine: Linux 5.8 or later
    monkeypatch.setattr(files, "_syncfs", None)
    assert files.syncfs_unusable() == "this system has no syncfs(2) (Linux only)"


def test_an_interval_flush_comes_once_the_oldest_unflushed_append_has_waited_its_interval(tmp_path):
    config = QueueConfig(flush_policy=FLUSH_INTERVAL, flush_interval_ms=100)
    queue = PhysicalQueue.create(str(tmp_path / "q"), 0, config)
    try:
        assert queue.maybe_flush(5_000) is False      # nothing written
        queue.append([b"a"], 1_000)
        queue.append([b"b"], 1_050)                   # the oldest unflushed append sets the time
        assert queue.maybe_flush(1_000) is False
        assert queue.maybe_flush(1_099) is False
        assert queue.maybe_flush(1_100) is True
        assert queue.maybe_flush(1_200) is False      # flushed: clean until the next append
        queue.append([b"c"], 2_000)
        assert queue.maybe_flush(1_999) is True       # the clock stepped back: flushed rather than held
    finally:
        queue.close()


def test_a_failed_queue_skips_the_interval_flush(tmp_path):
    config = QueueConfig(flush_policy=FLUSH_INTERVAL, flush_interval_ms=100)
    queue = PhysicalQueue.create(str(tmp_path / "q"), 0, config)
    queue.append([b"a"], 1_000)
    queue.sync_failed()
    assert queue.maybe_flush(10**9) is False
    queue.close()


@pytest.mark.parametrize("release, unusable", [("5.4.0-150-generic", True), ("5.7.19", True), ("5.8.0", False),
                                               ("6.2.1", False), ("6.18.3", False), ("not-a-release", True)])
def test_syncfs_is_refused_on_a_kernel_before_5_8_by_its_release(monkeypatch, release, unusable):
    monkeypatch.setattr(os, "uname", lambda: os.uname_result(("Linux", "h", release, "#1", "x86_64")))
    why = files.syncfs_unusable()
    if unusable:
        assert why == f"Linux {release} does not report write-back errors to syncfs(2) (5.8 and later do)"
    else:
        assert why is None


def test_an_append_that_need_not_wait_is_stored_untagged_and_unmarked_unless_told(q):
    assert q.try_append_records(framed_records([b"a"]), 1, 5) == 0
    assert q.try_append_records(framed_records([b"b"]), 1, 5, 3) == 1
    q.flush()
    runs = q.read_runs(0, 10)
    assert [(r.offset, r.tag) for r in runs] == [(0, 0), (1, 3)]
    with pytest.raises(InvalidArgument):   # not walked only when the caller says it walked them
        q.try_append_records(framed_records([b"c"]), 2, 5)


def test_an_append_that_need_not_wait_keeps_its_producer_mark_for_a_recovery(tmp_path):
    path = str(tmp_path / "q")
    queue = PhysicalQueue.create(path, 0, GROUP)
    assert queue.try_append_records(framed_records([b"a", b"b"]), 2, 5, 0, False, ProducerMark(4, 9, 100)) == 0
    queue.flush()
    for segment in queue._segments:   # the process dies: no clean close
        segment.close()
    with PhysicalQueue.open(path, GROUP) as again:
        assert again.take_recovered_marks() == [(0, 2, ProducerMark(4, 9, 100))]
