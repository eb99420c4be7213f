"""The file-system steps under storage: the modes and flags its files are created with, a lines file's torn tail
cut at open, a failed open that leaks no descriptor, the sync time a queue reports, and the longest queue name."""

from __future__ import annotations

import errno
import fcntl
import gc
import os
import stat

import pytest

from broker.storage import (InvalidQueueName, PhysicalQueue, QueueConfig, QueueFailed, dir_name, files, limits,
                            queue_name)
from tests.support.storage_payloads import framed_records


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_queue_file_is_created_readable_by_all_writable_by_its_owner_and_closed_on_exec(tmp_path, umask_022):
    q = PhysicalQueue.create(str(tmp_path / "q"), 0, QueueConfig(segment_bytes_max=1024))
    while q.segment_count < 3:   # the first file is made with the queue, the others by rolls
        q.append([b"x" * 200], 1)
    for base in q._bases:
        assert _mode(tmp_path / "q" / files.log_name(base)) == 0o644
    active = q._segments[-1]
    assert fcntl.fcntl(active.fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    q.close()


def test_a_roll_onto_a_file_that_exists_already_fails_the_queue_and_leaves_that_file_alone(tmp_path):
    q = PhysicalQueue.create(str(tmp_path / "q"), 0, QueueConfig(segment_bytes_max=1024))
    while not q.would_roll(len(framed_records([b"x" * 200]))):
        q.append([b"x" * 200], 1)
    stray = tmp_path / "q" / files.log_name(q.next_offset)   # where the roll's file would go
    stray.write_bytes(b"not ours")
    with pytest.raises(QueueFailed):
        q.append([b"x" * 200], 1)
    assert stray.read_bytes() == b"not ours"
    q.close()


def test_a_lines_file_is_created_with_mode_644_and_its_torn_tail_cut_at_open(tmp_path, umask_022):
    path = str(tmp_path / "producers.lines")
    fd = files.open_lines(path, -1)          # no file yet: made, its directory entry synced
    os.write(fd, b"whole line\n")
    os.close(fd)
    assert _mode(path) == 0o644
    with open(path, "ab") as f:
        f.write(b"torn li")                  # a crash in the middle of the next line
    fd = files.open_lines(path, len(b"whole line\n"))
    assert os.path.getsize(path) == len(b"whole line\n")
    os.close(fd)
    # A file read as empty whose bytes are all a torn line: cut to nothing
    with open(path, "wb") as f:
        f.write(b"half")
    fd = files.open_lines(path, 0)
    assert os.path.getsize(path) == 0
    os.close(fd)


def test_a_lines_file_whose_open_fails_raises_the_error_and_leaks_no_descriptor(tmp_path, monkeypatch):
    def fail(path):
        raise OSError(errno.EIO, "injected")
    monkeypatch.setattr(files, "sync_dir", fail)
    gc.collect()   # an earlier test's unreferenced files are closed now, not between the two counts
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError) as e:
        files.open_lines(str(tmp_path / "new.lines"), -1)
    assert e.value.errno == errno.EIO
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_queue_reports_each_fsync_in_seconds(tmp_path):
    seen: list[float] = []
    q = PhysicalQueue.create(str(tmp_path / "q"), 0, QueueConfig(observe_sync_s=seen.append))
    q.append([b"x"], 1)                      # flush policy fsync: synced before it returns
    assert seen and all(isinstance(s, float) and 0 <= s < 60 for s in seen)
    q.close()


def test_the_longest_name_that_fits_a_directory_is_a_queue_and_one_byte_more_is_refused():
    # Each "\u00e9" is two UTF-8 bytes, each escaped as three characters: 42 of them and 3 plain letters make 255,
    # the longest name one directory entry holds
    exact = "\u00e9" * 42 + "abc"
    assert len(dir_name(exact)) == limits.DIR_NAME_BYTES_MAX
    assert queue_name(dir_name(exact)) == exact
    with pytest.raises(InvalidQueueName):
        dir_name(exact + "d")
