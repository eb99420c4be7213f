"""What mutation testing (issue 36) left alive at broker/storage's edges: a write that cannot be undone says which
file and where, a store closes its queues on worker threads unless driven, a queue directory whose removal fails
(a symlink: rmtree never follows one) neither fails the delete nor stops the next open, a directory name that is not
the canonical spelling of a queue name is no queue, the power-loss ledger hears of every segment file made and
removed (or a crash test would keep a deleted file's durable length, and lose a new file it never heard of), a
sealed file holding records past the next file's base serves none of them, a frame whose length a rotting disk
raised under an open queue is refused at once, naming where to resume (not read again and again for bytes the file
will never have), a failed create whose clean-up fails too raises its own error, not the clean-up's, a clean-close
marker naming another file, or a size that is not an integer, is not trusted, a queue that closes or fails to open
leaves the descriptors of the other queues of a shared pool open, a pool's size is held to its bound, a whole-file
write over a longer leftover of an earlier one keeps none of its bytes, and a new segment file counts no bytes.

Real files in tmp_path; where the disk has to fail, an OS call is replaced (as tests/test_storage_queue_lifecycle.py
does), never the storage code under test.
"""

from __future__ import annotations

import errno
import json
import os
import struct
import sys
import threading

import pytest

from broker.storage import (CorruptData, HandlePool, InvalidArgument, PhysicalQueue, QueueConfig, QueueFailed,
                            QueueStore, files, limits, queue_name)
from broker.storage.queue import CREATING_PREFIX
from broker.storage.record import HEADER_BYTES, SIZE_BYTES
from broker.storage.segment import Segment
from broker.storage.store import DELETING_PREFIX
from runtime import power_loss
from tests.support.storage_payloads import frame_bytes, payloads

SMALL = QueueConfig(segment_bytes_max=1024, flush_policy="interval")


def test_a_write_that_cannot_be_undone_names_the_file_and_the_position_it_could_not_cut_back_to(tmp_path,
                                                                                                   monkeypatch):
    def fails(*_args):
        raise OSError(errno.EIO, "the disk failed")
    q = PhysicalQueue.create(str(tmp_path / "q"))
    q.append([b"kept"], 1)
    log = str(tmp_path / "q" / files.log_name(0))
    end = os.path.getsize(log)
    monkeypatch.setattr(os, "pwritev", fails)
    monkeypatch.setattr(os, "ftruncate", fails)
    with pytest.raises(QueueFailed) as refused:
        q.append([b"lost"], 2)
    monkeypatch.undo()
    assert (refused.value.code, refused.value.message, refused.value.details) == (
        "QUEUE_FAILED", "a failed write could not be undone", {"path": log, "position": end})
    assert str(refused.value) == "a failed write could not be undone"
    assert isinstance(refused.value.__cause__, OSError) and refused.value.__cause__.errno == errno.EIO
    q.close()


def _closing_threads(store: QueueStore) -> list[str]:
    """The names of the threads that ran a queue's close during ``store.close()`` (a profile hook on this thread
    and on every thread started meanwhile: it observes, it replaces nothing)."""
    names: list[str] = []
    queue_file = sys.modules[PhysicalQueue.__module__].__file__

    def hook(frame, event, _arg):
        if event == "call" and frame.f_code.co_name == "close" and frame.f_code.co_filename == queue_file:
            names.append(threading.current_thread().name)
    threading.setprofile(hook)
    sys.setprofile(hook)
    try:
        store.close()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return names


def test_a_store_closes_its_queues_on_worker_threads_by_default_and_on_the_callers_thread_when_driven(tmp_path):
    """Each close syncs several times: a broker with thousands of queues stops in time only when they close side by
    side (store.py CLOSE_THREADS). A driven store (ops/sim) starts no thread."""
    me = threading.current_thread().name
    for driven, root in ((False, "threads"), (True, "driven")):
        store = QueueStore(str(tmp_path / root), SMALL, **({"driven": True} if driven else {}))   # False by default
        for name in ("a", "b", "c"):
            store.create(name).append([name.encode()], 1)
        names = _closing_threads(store)
        assert len(names) == 3, names
        if driven:
            assert names == [me] * 3
        else:
            assert me not in names and all(n.startswith("queue-close") for n in names), names
        with QueueStore(str(tmp_path / root), SMALL) as again:   # every queue was closed cleanly
            assert [r.payload for r in again.get("b").read(0)] == [b"b"]


def test_a_queue_directory_that_cannot_be_removed_neither_fails_its_delete_nor_stops_the_next_open(tmp_path):
    """A queue directory that is a symlink (to another disk, say): the delete renames the link out of sight, and
    rmtree refuses a symlink. The delete still succeeds, the target is never followed and emptied, and the next open
    of the store leaves the leftover alone (it retries the removal) rather than refusing to open."""
    root = tmp_path / "root"
    QueueStore(str(root)).close()          # the root's format file
    target = tmp_path / "elsewhere"
    PhysicalQueue.create(str(target)).close()
    kept = sorted(os.listdir(target))
    os.symlink(target, root / "q")
    store = QueueStore(str(root))
    assert store.names() == ["q"]
    store.delete("q")                      # rmtree of the renamed link fails: not the caller's error
    assert store.names() == [] and "q" not in store
    store.close()
    leftovers = [e for e in os.listdir(root) if e.startswith(DELETING_PREFIX)]
    assert len(leftovers) == 1 and os.path.islink(root / leftovers[0])
    assert sorted(os.listdir(target)) == kept
    with QueueStore(str(root)) as again:   # the removal fails again at open: the store opens all the same
        assert again.names() == []
        assert again.create("q").append([b"new"], 1) == 0
    assert os.path.islink(root / leftovers[0]) and sorted(os.listdir(target)) == kept


def test_a_directory_not_spelled_as_its_queue_name_is_spelled_is_no_queue(tmp_path):
    """Only the one canonical spelling maps back: %71 decodes to "q" but "q" is spelled q, and %2E is how a leading
    dot is spelled but an inner one is not escaped; a store lists neither."""
    assert queue_name("q") == "q" and queue_name("%2Ex") == ".x" and queue_name("a.b") == "a.b"
    assert queue_name("%71") is None
    assert queue_name("a%2Eb") is None
    root = tmp_path / "root"
    os.makedirs(root / "%71")
    os.makedirs(root / "a%2Eb")
    with QueueStore(str(root)) as store:
        assert store.names() == []
        store.create("q").close()
        assert store.names() == ["q"]


def _ledger_lines(data_dir) -> list[str]:
    with open(os.path.join(data_dir, power_loss.LEDGER_NAME)) as f:
        return f.read().splitlines()


def test_the_power_loss_ledger_hears_of_every_segment_file_made_and_removed(tmp_path):
    data = str(tmp_path)
    led = power_loss.enable(data)
    try:
        q = PhysicalQueue.create(os.path.join(data, "q"), 0, SMALL)
        for i in range(6):
            q.append([bytes([65 + i]) * 300], i + 1)
        logs = sorted(os.path.join(data, "q", n) for n in os.listdir(os.path.join(data, "q"))
                      if files.parse_log_name(n) is not None)
        assert len(logs) >= 3
        lines = _ledger_lines(data)
        # The first file is made in the creation's temporary directory; the others by rolls, where they stay.
        assert [f"N 0 {log}" in lines for log in logs] == [False] + [True] * (len(logs) - 1)
        assert all(led.durable(log) is not None for log in logs[1:])
        assert q.truncate_before(files.parse_log_name(os.path.basename(logs[2]))) == 2
        lines = _ledger_lines(data)
        assert f"R 0 {logs[0]}" in lines and f"R 0 {logs[1]}" in lines and f"R 0 {logs[2]}" not in lines
        assert led.durable(logs[1]) is None and led.durable(logs[2]) is not None
        q.close()
    finally:
        power_loss.disable()


def test_a_sealed_file_holding_records_past_the_next_files_base_gives_those_offsets_from_the_next_file(tmp_path):
    """Offsets belong to the next file from its base on (segment.py open_sealed): a sealed file that holds more (put
    there by hand, or left by a roll gone wrong) serves its records only below that base, and a read across the base
    goes on in the next file, whatever the records_max asked; a seek by time looks at no record past that base."""
    other = tmp_path / "other"
    with PhysicalQueue.create(str(other), 0, QueueConfig(flush_policy="interval")) as q:
        for i in range(6):
            q.append([b"other-%d" % i], i + 1 if i < 2 else 9)   # stamped 9 past the base the next file will have
    path = tmp_path / "q"
    with PhysicalQueue.create(str(path), 0, SMALL) as q:
        for i in range(5):
            q.append([b"%d" % i * 400], i + 1)
    bases = sorted(b for b in map(files.parse_log_name, os.listdir(path)) if b is not None)
    assert bases[:2] == [0, 2], bases
    # The first file swapped for one of six records; its index goes with it, so it is rebuilt from the data.
    os.replace(other / files.log_name(0), path / files.log_name(0))
    os.remove(path / files.index_name(0))
    with PhysicalQueue.open(str(path), SMALL) as q:
        got = q.read(0, 10)
        assert [(r.offset, r.payload) for r in got] == (
            [(0, b"other-0"), (1, b"other-1")] + [(i, b"%d" % i * 400) for i in range(2, 5)])
        got = q.read(1, 10)   # from inside the first file: its records up to the base, no more
        assert [(r.offset, r.payload) for r in got] == [(1, b"other-1")] + [(i, b"%d" % i * 400) for i in range(2, 5)]
        # A seek by time answers from the records readers get (stamped 1 to 5 at offsets 0 to 4), never from the
        # first file's own records past the base (stamped 9).
        assert [q.offset_for_time(t) for t in range(1, 7)] == [0, 1, 2, 3, 4, 5]


def test_a_frame_whose_length_rotted_past_the_file_s_end_under_an_open_queue_is_refused_naming_where_to_resume(
        tmp_path):
    # One index entry (the file's first record), so the open trusted the file and only the read can find it.
    config = QueueConfig(segment_bytes_max=1 << 20, index_interval_bytes=1 << 20, index_interval_records=1000)
    with PhysicalQueue.create(str(tmp_path / "q"), 0, config) as q:
        for first in range(0, 30, 3):
            q.append(payloads(first, 3), 1_000)
        log = tmp_path / "q" / files.log_name(0)
        with open(log, "r+b") as f:   # the length field of the frame of records 9..11: the whole file's size
            f.seek(sum(frame_bytes(payloads(first, 3)) for first in range(0, 9, 3)))
            f.write(struct.pack("<I", log.stat().st_size))
        assert [r.offset for r in q.read(0, 20)] == list(range(9))
        with pytest.raises(CorruptData) as err:
            q.read(9, 20)
        assert (err.value.message, err.value.offset, err.value.next_offset) == (
            "a record failed its check on read", 9, 30)


def test_a_create_whose_clean_up_fails_too_raises_its_own_error(tmp_path, monkeypatch):
    def sync_dir(_path):
        raise OSError(errno.EIO, "the disk failed")

    def rmdir(*_args, **_kwargs):
        raise PermissionError(errno.EACCES, "held open elsewhere")
    monkeypatch.setattr(files, "sync_dir", sync_dir)
    monkeypatch.setattr(os, "rmdir", rmdir)
    with pytest.raises(OSError) as err:
        PhysicalQueue.create(str(tmp_path / "q"))
    monkeypatch.undo()
    assert err.value.errno == errno.EIO
    [left] = os.listdir(tmp_path)   # what the clean-up could not remove is named as a creation's leftover
    assert left.startswith(CREATING_PREFIX) and os.listdir(tmp_path / left) == []


@pytest.mark.parametrize("marker, records", [
    (lambda size: {"base": 0, "file_bytes": size}, 30),           # trusted: the index is loaded, the damage unseen
    (lambda size: {"base": 3, "file_bytes": size}, 0),            # another file's: a full scan, cut at the damage
    (lambda size: {"base": 0, "file_bytes": float(size)}, 0),     # a size that only compares equal: not trusted
])
def test_a_clean_close_marker_is_trusted_only_for_the_active_file_and_an_integer_size(tmp_path, marker, records):
    # A flipped byte in the first frame, before the index's last entry: only a full scan of the file finds it (and
    # cuts the active file there), so the records served say whether the open trusted the marker.
    config = QueueConfig(segment_bytes_max=1 << 20, index_interval_bytes=200, index_interval_records=1000)
    path = tmp_path / "q"
    with PhysicalQueue.create(str(path), 0, config) as q:
        for first in range(0, 30, 3):
            q.append(payloads(first, 3), 1_000)
    log = path / files.log_name(0)
    data = bytearray(log.read_bytes())
    data[HEADER_BYTES + SIZE_BYTES] ^= 1
    log.write_bytes(bytes(data))
    (path / files.CLEAN_MARKER).write_bytes(json.dumps(marker(len(data))).encode())
    with PhysicalQueue.open(str(path), config) as q:
        assert q.max_offset == records


def _queue_read_whole(path, pool: HandlePool) -> PhysicalQueue:
    """A queue of 40 records in SMALL's files, all read once: its sealed files' descriptors are in ``pool``."""
    q = PhysicalQueue.create(str(path), 0, SMALL, pool)
    for i in range(40):
        q.append([bytes([i]) * 100], i)
    assert len(q.read(0, 1_000)) == 40
    return q


def test_a_queue_that_closes_or_fails_to_open_leaves_the_shared_pool_s_other_descriptors_open(tmp_path,
                                                                                              monkeypatch):
    pool = HandlePool(64)
    kept = _queue_read_whole(tmp_path / "kept", pool)
    held = len(pool)
    assert held > 0
    _queue_read_whole(tmp_path / "closed", pool).close()
    assert len(pool) == held

    failing = _queue_read_whole(tmp_path / "failing", pool)
    failing.close()
    os.unlink(tmp_path / "failing" / files.CLEAN_MARKER)    # the open recovers the last file, and its sync fails

    def sync_data(_fd):
        raise OSError(errno.EIO, "the disk failed")
    monkeypatch.setattr(files, "sync_data", sync_data)
    with pytest.raises(OSError) as err:
        PhysicalQueue.open(str(tmp_path / "failing"), SMALL, pool)
    monkeypatch.undo()
    assert err.value.errno == errno.EIO
    assert len(pool) == held
    assert len(kept.read(0, 1_000)) == 40
    kept.close()
    pool.close_all()


@pytest.mark.parametrize("handles_max", [limits.READ_HANDLES_MAX_MIN - 1, "8", 8.0])
def test_a_handle_pool_s_size_is_an_integer_at_least_its_minimum(handles_max):
    with pytest.raises(InvalidArgument) as refused:
        HandlePool(handles_max)
    assert (refused.value.message, refused.value.details) == (
        f"handles_max must be an integer >= {limits.READ_HANDLES_MAX_MIN}", {"handles_max": handles_max})


def test_a_whole_file_write_over_a_longer_leftover_keeps_none_of_its_bytes(tmp_path):
    path = tmp_path / "clean-shutdown.json"
    (tmp_path / ("clean-shutdown.json" + files.TMP_SUFFIX)).write_bytes(b"x" * 100)   # a crash's leftover
    files.write_atomic(str(path), b"{}")
    assert path.read_bytes() == b"{}"


def test_a_new_segment_file_counts_no_bytes_toward_retention(tmp_path):
    """A roll's new file: its size is what retention adds up until the append that rolled to it writes."""
    pool = HandlePool(4)
    segment = Segment.create(str(tmp_path), 10, SMALL, pool)
    assert (segment.file_bytes, segment.end_pos, segment.end_offset) == (0, 0, 10)
    segment.close()
