"""A snapshot installed from the leader is never overwritten by an older one this node was still writing.

The race, put in order by hand: a follower's forked writer starts on its image at index L; while it writes, the
leader's snapshot of index L' > L is installed (the file in place, the journal cut to start at L'); then the writer
finishes. Before the fix the child renamed its file over the installed one: on restart the journal no longer
followed the snapshot, pysyncobj cleared it, and every entry after L was gone from the node. Now the child only
writes beside the snapshot and the tick thread (where installs also happen) puts it in place only if it is newer.
"""

from __future__ import annotations

import os
import time

from meta.raft import snapshot_file
from meta.raft.snapshot_file import BackgroundWriter, LogEntry, Snapshot, WriterState

WAIT_S = 60.0


def _snapshot(index: int, blob_bytes: int) -> Snapshot:
    # Random-looking text does not compress: the child spends a while on it, the window the race needs.
    blob = os.urandom(blob_bytes // 2).hex()
    return Snapshot({"version": index, "blob": blob}, LogEntry(index, 1, b"\x00{}"), LogEntry(index - 1, 1, b"\x01"),
                    ("127.0.0.1:1",))


def _child_running(pid: int) -> bool:
    # WNOWAIT: look without reaping, so the writer's own poll still sees the exit.
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None


def _poll_until_finished(writer: BackgroundWriter) -> WriterState:
    deadline = time.monotonic() + WAIT_S
    while (state := writer.poll()) is WriterState.WRITING:
        assert time.monotonic() < deadline, "the snapshot writer did not finish"
        time.sleep(0.02)
    return state


def test_an_older_write_finishing_after_an_install_is_dropped(tmp_path):
    path = str(tmp_path / "raft.snapshot")
    writer = BackgroundWriter(path)
    assert writer.start(_snapshot(100, 64 * 1024 * 1024))
    pid = writer.pid
    # The install, as pysyncobj and MetaSyncObj do it on the tick thread: the leader's file received under another
    # name, renamed into place, then noted.
    received = str(tmp_path / "raft.snapshot.1.tmp")
    snapshot_file.write(received, _snapshot(500, 1024))
    os.replace(received, path)
    writer.note_on_disk(500)
    assert _child_running(pid), "the writer finished before the install: the race was not set up"

    assert _poll_until_finished(writer) is WriterState.FAILED   # pysyncobj then cuts nothing from the journal
    assert snapshot_file.read(path).last_applied.index == 500
    assert not os.path.exists(path + snapshot_file.WRITING_SUFFIX)
    assert writer.superseded == 1


def test_a_newer_write_is_put_in_place(tmp_path):
    path = str(tmp_path / "raft.snapshot")
    writer = BackgroundWriter(path)
    snapshot_file.write(path, _snapshot(50, 1024))
    writer.note_on_disk(50)
    assert writer.start(_snapshot(100, 1024))
    assert _poll_until_finished(writer) is WriterState.DONE
    assert snapshot_file.read(path).last_applied.index == 100
    assert writer.on_disk_index == 100 and writer.superseded == 0
    assert not os.path.exists(path + snapshot_file.WRITING_SUFFIX)
