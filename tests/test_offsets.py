"""The consumer offset store: group commit off the event loop, durability across reopen, its coded refusals,
directory fsyncs after create and compaction, and torn tails after a crash. Real files; the fsync functions of
broker.storage.files are wrapped (never replaced) to observe or hold them."""

from __future__ import annotations

import asyncio
import os

import pytest

from broker import offsets
from broker.offsets import Committed, OffsetStore
from broker.storage import files
from broker.storage import lines as checked_lines
from tests.support.disk_errors import eio
from tests.support.held_syncs import WAIT_S, HeldSyncs
from wire.errors import ApiError


def lines(path) -> list[bytes]:
    with open(path, "rb") as f:
        return f.read().splitlines(keepends=True)


async def test_commit_is_acknowledged_only_after_the_fsync_covering_it(tmp_path, monkeypatch):
    store = OffsetStore(str(tmp_path / "offsets.log"))
    held = HeldSyncs(monkeypatch)
    task = asyncio.create_task(store.commit("g", "t", 0, 42, gen=0))
    await held.wait_entered()
    await asyncio.sleep(0)  # give the loop every chance to run an early acknowledgement
    assert not task.done(), "acknowledged before its fsync returned"
    assert store.get("g", "t", 0) is None, "readable before it is durable"
    written = [checked_lines.decode(line) for line in lines(tmp_path / "offsets.log")]   # written, not yet synced
    assert [w[:5] for w in written] == [["g", "t", 0, 42, 0]] and isinstance(written[0][5], int)
    held.release.set()
    await asyncio.wait_for(task, WAIT_S)
    assert store.get("g", "t", 0) == 42
    held.check()
    store.close()


async def test_concurrent_commits_share_fsyncs_and_all_survive_reopen(tmp_path, monkeypatch):
    path = str(tmp_path / "offsets.log")
    store = OffsetStore(path)
    held = HeldSyncs(monkeypatch)
    commits = 200
    first = asyncio.create_task(store.commit("g", "t", 0, 0, gen=0))
    await held.wait_entered()  # the first fsync is under way: every later commit queues behind it
    rest = [asyncio.create_task(store.commit("g", f"t{i % 7}", i, i, gen=0)) for i in range(1, commits)]
    await asyncio.sleep(0)  # each task runs up to its await, so every commit is queued
    held.let_go()
    await asyncio.wait_for(asyncio.gather(first, *rest), WAIT_S)
    assert held.calls == 2, "the queued commits should have shared one fsync"
    held.check()
    store.close()
    reopened = OffsetStore(path)
    assert reopened.get("g", "t", 0) == 0
    assert all(reopened.get("g", f"t{i % 7}", i) == i for i in range(1, commits))
    reopened.close()


async def test_commits_do_not_block_the_event_loop(tmp_path, monkeypatch):
    store = OffsetStore(str(tmp_path / "offsets.log"))
    held = HeldSyncs(monkeypatch)
    task = asyncio.create_task(store.commit("g", "t", 0, 1, gen=0))
    await held.wait_entered()
    # The fsync is held; the loop must still serve other work meanwhile.
    assert await asyncio.wait_for(asyncio.to_thread(lambda: "served"), WAIT_S) == "served"
    held.release.set()
    await asyncio.wait_for(task, WAIT_S)
    held.check()
    store.close()


async def test_key_limit_is_a_coded_refusal(tmp_path, monkeypatch):
    monkeypatch.setattr(offsets, "KEYS_MAX", 3)
    store = OffsetStore(str(tmp_path / "offsets.log"))
    for q in range(3):
        await store.commit("g", "t", q, q, gen=0)
    # Two new keys in one round must not slip past the bound together.
    results = await asyncio.gather(store.commit("g", "t", 3, 3, gen=0), store.commit("g", "t", 4, 4, gen=0),
                                   return_exceptions=True)
    for err in results:
        assert isinstance(err, ApiError), err
        assert (err.status, err.code) == (409, "TOO_MANY_OFFSETS")
    await store.commit("g", "t", 1, 100, gen=0)  # keys already held still move
    assert store.get("g", "t", 1) == 100 and store.get("g", "t", 3) is None
    store.close()


async def test_waiting_commits_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(offsets, "COMMITS_WAITING_MAX", 2)
    store = OffsetStore(str(tmp_path / "offsets.log"))
    held = HeldSyncs(monkeypatch)
    waiting = [asyncio.create_task(store.commit("g", "t", q, q, gen=0)) for q in range(2)]
    await held.wait_entered()
    with pytest.raises(ApiError) as refused:
        await store.commit("g", "t", 2, 2, gen=0)
    assert (refused.value.status, refused.value.code) == (503, "TOO_MANY_WAITERS")
    held.let_go()
    await asyncio.wait_for(asyncio.gather(*waiting), WAIT_S)
    await store.commit("g", "t", 2, 2, gen=0)  # room again once the others are answered
    held.check()
    store.close()


async def test_failed_fsync_refuses_that_commit_and_every_later_one(tmp_path, monkeypatch):
    store = OffsetStore(str(tmp_path / "offsets.log"))

    monkeypatch.setattr(files, "sync_data", eio)
    for _ in range(2):
        with pytest.raises(ApiError) as refused:
            await store.commit("g", "t", 0, 1, gen=0)
        assert (refused.value.status, refused.value.code) == (503, "STORAGE_UNAVAILABLE")
    assert store.get("g", "t", 0) is None
    store.close()


class DirSyncs:
    """Wraps files.sync_dir, noting for each call how many lines the offsets file then had."""

    def __init__(self, monkeypatch, path):
        self.real = files.sync_dir
        self.path = path
        self.seen: list[int] = []
        monkeypatch.setattr(files, "sync_dir", self)

    def __call__(self, directory: str) -> None:
        assert directory == os.path.dirname(self.path)
        self.seen.append(len(lines(self.path)))
        self.real(directory)


async def test_directory_is_synced_after_create_and_after_compaction(tmp_path, monkeypatch):
    path = str(tmp_path / "offsets.log")
    syncs = DirSyncs(monkeypatch, path)
    store = OffsetStore(path)
    assert syncs.seen == [0], "the new file's directory entry must be made durable"
    OffsetStore(path).close()  # reopening an existing file creates nothing
    assert syncs.seen == [0]
    monkeypatch.setattr(offsets, "COMPACT_AFTER_LINES", 5)
    for i in range(8):
        await store.commit("g", "t", i % 2, i, gen=0)
    await asyncio.to_thread(store.close)
    assert syncs.seen[1:], "the compaction's rename must be made durable"
    assert syncs.seen[1] == 2, "synced after the compacted file took the name: two keys, two lines"
    reopened = OffsetStore(path)
    assert (reopened.get("g", "t", 0), reopened.get("g", "t", 1)) == (6, 7)
    reopened.close()


async def test_close_waits_for_queued_commits(tmp_path):
    path = str(tmp_path / "offsets.log")
    store = OffsetStore(path)
    tasks = [asyncio.create_task(store.commit("g", "t", q, q, gen=0)) for q in range(5)]
    await asyncio.sleep(0)  # queued, not yet answered
    store.close()
    await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S)
    with pytest.raises(ApiError) as refused:
        await store.commit("g", "t", 9, 9, gen=0)
    assert refused.value.code == "STORAGE_UNAVAILABLE"
    reopened = OffsetStore(path)
    assert [reopened.get("g", "t", q) for q in range(5)] == list(range(5))
    reopened.close()


async def test_torn_last_line_is_ignored_and_cut_before_new_commits(tmp_path):
    path = tmp_path / "offsets.log"
    path.write_bytes(b'["g", "t", 0, 5, 0, 1]\n["g", "t", 1, 6, 0, 2]\n["g", "t", 0, 9')  # format 0, a crash mid-write
    store = OffsetStore(str(path))
    assert (store.get("g", "t", 0), store.get("g", "t", 1)) == (5, 6)
    await store.commit("g", "t", 2, 7, gen=0)
    store.close()
    reopened = OffsetStore(str(path))
    assert [reopened.get("g", "t", q) for q in range(3)] == [5, 6, 7], "the new line was glued to the torn one"
    reopened.close()


async def test_a_key_keeps_its_newest_stamp_whatever_order_values_arrive_in(tmp_path):
    """A copy gets its leader's pushes and snapshots out of order and twice (broker/replication/offsets.py)."""
    path = str(tmp_path / "offsets.log")
    store = OffsetStore(path)
    key = ("g", "t", 0)
    await store.store([(key, Committed(30, 1, 5))])
    await store.store([(key, Committed(10, 1, 3)), (key, Committed(99, 0, 9))])   # older seq, older gen: kept out
    assert store.get_committed(*key) == Committed(30, 1, 5)
    await store.store([(key, Committed(20, 1, 6))])   # a newer commit may go back: a consumer's reset
    await store.store([(key, Committed(5, 2, 0)), (key, Committed(7, 2, 1))])   # a new gen, two in one round
    assert store.get_committed(*key) == Committed(7, 2, 1)
    mine = store.stamp(8, 2)
    assert mine.seq > 1 and store.stamp(8, 2).seq > mine.seq, "the leader's own stamps count up"
    assert store.queue_values("t", 0) == [(key, Committed(7, 2, 1))] and store.queue_values("t", 1) == []
    store.close()
    reopened = OffsetStore(path)
    assert reopened.get_committed(*key) == Committed(7, 2, 1), "replay keeps the same value"
    reopened.close()

