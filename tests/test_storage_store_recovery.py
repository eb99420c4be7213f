"""The queue store at a start after a crash: which queues it recovers and the producers' marks it hands back, past
clean and unopenable queues; queues it opens later keep the store's settings and share its read handles; a delete
leaves nothing behind under any name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.storage import CorruptQueue, QueueConfig, QueueExists, QueueNotFound, QueueStore, TooManyQueues, limits
from broker.storage import store as store_module
from broker.storage.record import ProducerMark
from tests.support.storage_payloads import framed_records, payloads

SMALL = QueueConfig(segment_bytes_max=1024, index_interval_bytes=64, index_interval_records=3)


def _crash(store: QueueStore) -> None:
    """The store's process dies: no queue is closed (no clean marker, active indexes unwritten); only the
    descriptors go, as the kernel would close them."""
    for queue in store._open.values():
        for segment in queue._segments:
            segment.close()
    store._open.clear()


def _append_marked(store: QueueStore, name: str, producer: int, seq: int) -> int:
    q = store.get(name)
    items = payloads(q.next_offset, 2)
    return q.append_records(framed_records(items), 2, 1_000, 0, False, ProducerMark(producer, seq, 40 + seq))


def test_recovery_yields_the_marks_of_every_crashed_queue_past_clean_and_unopenable_ones(tmp_path):
    root = str(tmp_path / "queues")
    store = QueueStore(root, SMALL)
    for name in ("a-clean", "b-crashed", "c-broken", "d-crashed"):
        store.create(name)
    first_b = _append_marked(store, "b-crashed", 7, 1)
    first_d = _append_marked(store, "d-crashed", 9, 4)
    store.get("a-clean").append([b"x"], 1_000)
    store.get("a-clean").close()              # closed cleanly: nothing to recover
    store._open.pop("a-clean")
    _crash(store)
    # A queue that cannot open (its files are gone, its directory left): refused to whoever asks, not to recovery
    for f in Path(store._path("c-broken")).iterdir():
        f.unlink()

    again = QueueStore(root, SMALL)
    try:
        recovered = dict(again.recover())
        assert recovered == {"b-crashed": [(first_b, 2, ProducerMark(7, 1, 41))],
                             "d-crashed": [(first_d, 2, ProducerMark(9, 4, 44))]}
        # The clean one was left closed: it opens when first asked for, with nothing recovered
        assert "a-clean" not in again._open
        assert again.get("a-clean").take_recovered_marks() == []
        # Marks are handed back once
        assert dict(again.recover()) == {}
        with pytest.raises(CorruptQueue):
            again.get("c-broken")
    finally:
        again.close()


def test_a_queue_opened_after_a_restart_keeps_the_store_settings(tmp_path):
    root = str(tmp_path / "queues")
    with QueueStore(root, SMALL) as store:
        store.create("q").append([b"x" * 100], 1_000)
    with QueueStore(root, SMALL) as store:
        q = store.get("q")
        assert q.config == SMALL
        for _ in range(30):
            q.append([b"y" * 100], 1_000)
        assert q.segment_count > 2   # it rolls at the store's small segment size, not the default


def test_queues_opened_after_a_restart_share_the_store_read_handles(tmp_path):
    fd_dir = Path("/proc/self/fd")
    root = str(tmp_path / "queues")
    with QueueStore(root, SMALL) as store:
        for i in range(3):
            q = store.create(f"q{i}")
            for j in range(150):
                q.append([b"%d" % j], 1_000)
    with QueueStore(root, SMALL, read_handles_max=2) as store:
        # Counted before the opens: an open reads the sealed files too, and keeps their descriptors in its pool
        before = len(list(fd_dir.iterdir()))
        queues = [store.get(f"q{i}") for i in range(3)]
        assert all(q.segment_count > 5 for q in queues)
        for q in queues:
            offset = q.min_offset
            while offset < q.max_offset:
                offset = q.read(offset, 50)[-1].offset + 1
        assert len(list(fd_dir.iterdir())) <= before + len(queues) + 2   # their active files and the pool's two


def test_a_deleted_queue_leaves_nothing_under_the_root_and_its_name_can_be_created_again(tmp_path):
    root = tmp_path / "queues"
    with QueueStore(str(root), SMALL) as store:
        store.create("gone").append([b"x"], 1_000)
        store.create("kept")
        before = sorted(os.listdir(root))
        store.delete("gone")
        assert sorted(os.listdir(root)) == [n for n in before if n != os.path.basename(store._path("gone"))]
        assert "gone" not in store.names()
        with pytest.raises(QueueNotFound) as e:
            store.get("gone")
        assert e.value.details == {"name": "gone"}
        with pytest.raises(QueueNotFound):
            store.delete("gone")
        assert store.create("gone").max_offset == 0
        with pytest.raises(QueueExists) as e:
            store.create("gone")
        assert e.value.message == "queue already exists" and e.value.details == {"name": "gone"}


def test_a_delete_cut_before_its_files_are_removed_leaves_a_hidden_directory_the_next_open_removes(tmp_path,
                                                                                                 monkeypatch):
    root = tmp_path / "queues"
    store = QueueStore(str(root), SMALL)
    store.create("gone").append([b"x"], 1_000)
    monkeypatch.setattr(store_module.shutil, "rmtree", lambda *a, **k: None)   # the process dies right there
    store.delete("gone")
    left = [n for n in os.listdir(root) if n.startswith(store_module.DELETING_PREFIX)]
    assert len(left) == 1 and len(left[0]) == len(store_module.DELETING_PREFIX) + 16   # 8 random bytes, in hex
    assert "gone" not in store.names()
    store.close()
    monkeypatch.undo()
    with QueueStore(str(root), SMALL) as again:
        assert "gone" not in again.names()
        assert not [n for n in os.listdir(root) if n.startswith(store_module.DELETING_PREFIX)]


def test_a_directory_that_is_not_the_canonical_spelling_of_a_name_is_no_queue(tmp_path):
    root = tmp_path / "queues"
    with QueueStore(str(root), SMALL) as store:
        store.create("a")
    # "%61" spells "a" too, escaped where it need not be: listed, it would be a second directory of queue "a"
    for stray in ("%61", "%2e", "%4", "caf\u00e9"):
        (root / stray).mkdir()
    with QueueStore(str(root), SMALL) as store:
        assert store.names() == ["a"]


def test_opening_every_queue_keeps_the_ones_open_already_and_a_queue_never_opened_deletes(tmp_path):
    root = str(tmp_path / "queues")
    with QueueStore(root, SMALL) as store:
        for name in ("a", "b", "c"):
            store.create(name).append([b"x"], 1_000)
    with QueueStore(root, SMALL) as store:
        a = store.get("a")
        assert store.open_all() == 3
        assert store.get("a") is a   # one object per queue: two would be two writers of one directory
        store.delete("b")
    with QueueStore(root, SMALL) as store:
        store.delete("c")            # never opened in this store
        assert store.names() == ["a"]


def test_a_store_holds_at_most_its_bound_of_queues(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "QUEUES_MAX", 2)
    with QueueStore(str(tmp_path / "queues"), SMALL) as store:
        store.create("a")
        store.create("b")
        with pytest.raises(TooManyQueues) as e:
            store.create("c")
        assert e.value.message == "a store holds at most 2 queues" and e.value.details == {"name": "c"}
        store.delete("a")
        store.create("c")
