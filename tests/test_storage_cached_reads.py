"""Reads that must not wait (``PhysicalQueue.try_read_runs``, which the broker runs on its event loop): they return
what ``read_runs`` returns when every page is in the page cache, and None, having done nothing, when a page would
come from the disk, the queue's lock is held, or a chunk is longer than ``CACHED_READ_CHUNK_BYTES_MAX``. Pages are
dropped from the cache with ``posix_fadvise(DONTNEED)`` after a sync, as memory pressure would drop them."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import glob
import mmap
import os
import time

from broker.storage import QueueStore
from broker.storage.limits import CACHED_READ_CHUNK_BYTES_MAX


DROP_TRIES = 100          # DONTNEED is advice: the kernel may keep a page a while (another CPU's LRU batch holds it)
DROP_RETRY_S = 0.01

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
_MAP_FAILED = ctypes.c_void_p(-1).value


def _drop_cached_pages(queue_path: str) -> None:
    """Drop the queue's files from the page cache, and return once the kernel took the advice: no page of any file
    is cached any more.

    Asked by mincore, which reads nothing. The probe this replaces read the file with RWF_NOWAIT: a read that finds a
    page missing answers EAGAIN at once but starts a readahead of it, and when that landed before the test's own read
    the records were cached again (2 runs of 290 failed so; tests/test_storage_cached_reads.py's history)."""
    for path in glob.glob(os.path.join(queue_path, "*.log")):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)   # only clean pages can be dropped
            size = os.fstat(fd).st_size
            for _ in range(DROP_TRIES):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                if _cached_pages(fd, size) == 0:
                    break
                time.sleep(DROP_RETRY_S)
            else:
                raise AssertionError(f"the kernel kept pages of {path} through {DROP_TRIES} DONTNEED advices")
        finally:
            os.close(fd)


def _cached_pages(fd: int, size: int) -> int:
    """How many pages of the file's first ``size`` bytes are in the page cache (mincore(2) of a mapping of it)."""
    if size == 0:
        return 0
    addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if addr == _MAP_FAILED:
        raise OSError(ctypes.get_errno(), "mmap of the queue file failed")
    try:
        vec = ctypes.create_string_buffer((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE)
        if _libc.mincore(addr, size, vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
        return sum(b & 1 for b in vec.raw)
    finally:
        _libc.munmap(addr, size)


def test_the_probe_sees_pages_leave_the_cache_and_a_read_bring_them_back(tmp_path):
    path = tmp_path / "probe.log"
    path.write_bytes(b"p" * 40_000)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        assert _cached_pages(fd, 40_000) == 10, "just written: every page cached"
        _drop_cached_pages(str(tmp_path))
        assert _cached_pages(fd, 40_000) == 0
        assert os.pread(fd, 40_000, 0) == b"p" * 40_000
        assert _cached_pages(fd, 40_000) == 10
    finally:
        os.close(fd)


def test_a_cached_read_returns_what_a_read_returns(tmp_path):
    with QueueStore(str(tmp_path)) as store:
        q = store.create("a")
        for i in range(20):
            q.append([f"{i}-{k}".encode() * (k + 1) for k in range(7)], 1000 + i)
        for offset, records, max_bytes in ((0, 1000, 1 << 20), (3, 5, 1 << 20), (17, 100, 10), (139, 10, 1 << 20)):
            assert q.try_read_runs(offset, records, max_bytes) == q.read_runs(offset, records, max_bytes)


def test_a_read_of_pages_not_in_the_cache_is_left_to_a_thread(tmp_path, monkeypatch):
    # RWF_NOWAIT answers EAGAIN for a page not cached, but first starts its readahead, and when the disk answers
    # before the kernel looks at the page again (a host's cache behind virtio, a few microseconds) the read returns
    # the page: on this VM that happened on 50 tries in a row of a loaded suite run (2026-12-03). So the kernel seen
    # here is one that is never quicker than its own check: a NOWAIT read of a range mincore says is not all cached
    # answers EAGAIN; every other read is the real one. A read without RWF_NOWAIT reaches the disk and fails this.
    real_preadv = os.preadv
    nowait_misses = []

    def preadv(fd, buffers, pos, flags=0):
        size = sum(len(b) for b in buffers)
        if flags & os.RWF_NOWAIT and not _range_cached(fd, pos, size):
            nowait_misses.append((pos, size))
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        return real_preadv(fd, buffers, pos, flags)

    with QueueStore(str(tmp_path)) as store:
        q = store.create("a")
        q.append([b"x" * 1000] * 100, 1)
        _drop_cached_pages(q.path)
        monkeypatch.setattr(os, "preadv", preadv)
        assert q.try_read_runs(0, 100) is None, "a page on the disk only: the event loop must not wait for it"
        assert nowait_misses, "the read asked the kernel not to wait, and was told the page is not cached"
        assert _cached_pages_of(q.path) == 0, "the refused read read nothing"
        runs = q.read_runs(0, 100)   # a thread's read waits for the disk, and leaves the pages cached
        assert sum(r.count for r in runs) == 100
        assert q.try_read_runs(0, 100) == runs


def _range_cached(fd: int, pos: int, size: int) -> bool:
    """Whether every page of ``size`` bytes at ``pos`` of the file is in the page cache."""
    end = min(pos + size, os.fstat(fd).st_size)   # past the end of the file there is nothing to wait for
    first, last = pos // mmap.PAGESIZE, (end + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    return _cached_pages(fd, end) - _cached_pages(fd, first * mmap.PAGESIZE) == last - first


def _cached_pages_of(queue_path: str) -> int:
    total = 0
    for path in glob.glob(os.path.join(queue_path, "*.log")):
        fd = os.open(path, os.O_RDONLY)
        try:
            total += _cached_pages(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
    return total


def test_a_held_lock_or_a_long_chunk_is_left_to_a_thread(tmp_path):
    with QueueStore(str(tmp_path)) as store:
        q = store.create("a")
        q.append([b"y" * 100], 1)
        with q._lock:   # an append's fsync on a thread holds it (taken here only to hold it)
            assert q.try_read_runs(0, 10) is None
        q.append([b"z" * (CACHED_READ_CHUNK_BYTES_MAX + 1)], 2)
        assert q.try_read_runs(1, 10, 4 << 20) is None, "one copy that long would stall the event loop"
        assert [r.count for r in q.read_runs(1, 10, 4 << 20)] == [1]
