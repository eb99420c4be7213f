"""Group commit (broker/group_commit.py, storage's flush policy "group"): one syncfs covers the appends of every queue
waiting meanwhile; a reader sees only what a sync covered; a failed sync fails every send it covered and shows none of
their records; a seal waits for the sync of the sends in flight, so its end holds every record that will be
acknowledged and nothing that will not.

A real store and a real broker node in this process; syncfs is held or failed by wrapping ``files.sync_filesystem``
(the one call every round makes), the way a slow or failing disk would.
"""

from __future__ import annotations

import asyncio

import pytest

from broker.group_commit import GroupCommit, SyncTimedOut
from broker.storage import FLUSH_GROUP, PhysicalQueue, QueueConfig, QueueFailed, QueueStore
from broker.storage.record import pack_records
from tests.support.held_syncs import WAIT_S, HeldSyncs
from tests.support.local_routes import one_queue_route
from wire.errors import ApiError



@pytest.fixture
def store(tmp_path):
    s = QueueStore(str(tmp_path / "queues"), QueueConfig(flush_policy=FLUSH_GROUP))
    yield s
    s.close()


@pytest.fixture
def commit(store):
    c = GroupCommit(store.root)
    yield c
    c.close()


async def test_a_reader_sees_only_what_a_sync_covered(store, commit, monkeypatch):
    held = HeldSyncs(monkeypatch, "sync_filesystem")
    q = store.create("a")
    assert q.append([b"one", b"two", b"three"], 1) == 0
    # written, not synced: the next append goes after it, and no reader sees it
    assert (q.next_offset, q.max_offset, q.read(0), q.offset_for_time(0)) == (3, 0, [], 0)
    durable = asyncio.create_task(commit.durable(q, 3))
    await held.wait_entered()
    assert q.read(0) == [] and not durable.done(), "a sync in progress covers nothing yet"
    assert q.append([b"four", b"five"], 1) == 3   # written while that sync runs: it may miss them
    held.release.set()
    await asyncio.wait_for(durable, WAIT_S)
    assert q.max_offset == 3 and [r.payload for r in q.read(0)] == [b"one", b"two", b"three"]
    await asyncio.wait_for(commit.durable(q, 5), WAIT_S)   # the next round covers them
    assert q.max_offset == 5 and [r.payload for r in q.read(3)] == [b"four", b"five"]
    held.check()


async def test_one_sync_covers_every_queue_that_waited_during_the_last(store, commit, monkeypatch):
    held = HeldSyncs(monkeypatch, "sync_filesystem")
    queues = [store.create(f"q{i}") for i in range(8)]
    queues[0].append([b"first"], 1)
    waits = [asyncio.create_task(commit.durable(queues[0], 1))]
    await held.wait_entered()
    for i, q in enumerate(queues[1:], 1):   # these land while the first round's sync runs
        q.append([b"x"] * i, 1)
        waits.append(asyncio.create_task(commit.durable(q, i)))
    await asyncio.sleep(0.1)   # every waiter has asked before the first round ends
    held.release.set()
    await asyncio.wait_for(asyncio.gather(*waits), WAIT_S)
    assert held.calls == 2, "the seven queues that waited during the first sync share the second"
    assert [q.max_offset for q in queues] == [1, 1, 2, 3, 4, 5, 6, 7]
    held.check()


async def test_a_queue_asked_for_is_synced_by_the_next_round_before_anything_waits_for_it(store, commit, monkeypatch):
    # A follower asks as it writes a leader's records and waits later: the round that starts meanwhile covers them,
    # and the wait that comes after it returns at once.
    held = HeldSyncs(monkeypatch, "sync_filesystem")
    first, copy = store.create("first"), store.create("copy")
    first.append([b"f"], 1)
    running = asyncio.create_task(commit.durable(first, 1))
    await held.wait_entered()
    copy.append([b"c0", b"c1"], 1)   # written while that round runs, and asked for: the next round takes it
    commit.ask(copy)
    held.release.set()
    await asyncio.wait_for(running, WAIT_S)
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while copy.max_offset < 2:   # nobody waits on it, yet a round makes it readable
        assert asyncio.get_running_loop().time() < deadline, "no round synced the queue asked for"
        await asyncio.sleep(0.01)
    calls = held.calls
    await asyncio.wait_for(commit.durable(copy, 2), WAIT_S)
    assert held.calls == calls == 2, "the wait after the round returned at once"
    held.check()


async def test_a_failed_sync_fails_each_send_it_covered_and_none_of_their_records_is_read(store, commit, monkeypatch):
    held = HeldSyncs(monkeypatch, "sync_filesystem", fail=True)
    held.release.set()
    a, b = store.create("a"), store.create("b")
    a.append([b"a0", b"a1"], 1)
    b.append([b"b0"], 1)
    results = await asyncio.wait_for(asyncio.gather(commit.durable(a, 2), commit.durable(b, 1),
                                                    return_exceptions=True), WAIT_S)
    assert [type(r) for r in results] == [QueueFailed, QueueFailed]
    for q in (a, b):
        # the kernel may have dropped those pages: the queue takes no more writes and shows nothing unsynced
        assert q.failed and q.max_offset == 0 and q.read(0) == []
        with pytest.raises(QueueFailed):
            q.append([b"more"], 2)
    held.check()


def test_an_append_that_would_wait_is_left_to_a_thread(tmp_path):
    """try_append_records runs on the broker's event loop: it must never wait for the queue's lock or for a disk."""
    config = QueueConfig(flush_policy=FLUSH_GROUP, segment_bytes_max=1024)
    with QueueStore(str(tmp_path / "queues"), config) as group_store:
        q = group_store.create("a")
        assert q.try_append_records(pack_records([b"x" * 100]), 1, 1) == 0
        with q._lock:   # a read or a sync's bookkeeping holds it (taken here only to hold it)
            assert q.try_append_records(pack_records([b"y"]), 1, 1) is None
        assert q.next_offset == 1, "refused means nothing was written"
        big = pack_records([b"z" * 1000])
        assert q.try_append_records(big, 1, 1) is None, "this one rolls to a new file, which syncs"
        assert q.append_records(big, 1, 1) == 1 and q.segment_count == 2
    with QueueStore(str(tmp_path / "fsync")) as fsync_store:   # flush policy fsync: every append syncs
        assert fsync_store.create("a").try_append_records(pack_records([b"x"]), 1, 1) is None


@pytest.fixture
async def node(broker_node):
    broker_node.routes.update(one_queue_route(5, [("b1", 0)]))
    return broker_node


async def test_a_seal_waits_for_the_sync_of_a_send_in_flight_and_its_end_holds_it(node, monkeypatch):
    held = HeldSyncs(monkeypatch, "sync_filesystem")
    send = asyncio.create_task(node.writer.send("t", 0, [{"body": f"m{i}"} for i in range(3)]))
    await held.wait_entered()
    seal = asyncio.create_task(node.writer.seal(node.routes.head("t", 0)))
    await asyncio.sleep(0.1)
    assert not send.done() and not seal.done(), "neither may answer before the records are on disk"
    held.release.set()
    assert await asyncio.wait_for(send, WAIT_S) == [0, 1, 2]
    assert await asyncio.wait_for(seal, WAIT_S) == 3, "the sealed end holds the acknowledged records"
    held.check()


async def test_a_send_whose_sync_failed_is_refused_and_a_seal_ends_before_it(node, monkeypatch):
    held = HeldSyncs(monkeypatch, "sync_filesystem", fail=True)
    held.release.set()
    with pytest.raises(ApiError) as e:
        await asyncio.wait_for(node.writer.send("t", 0, [{"body": "lost"}]), WAIT_S)
    assert (e.value.status, e.value.code) == (503, "STORAGE_UNAVAILABLE")
    head = node.routes.head("t", 0)
    assert await asyncio.wait_for(node.writer.seal(head), WAIT_S) == 0, "a refused record is not in the sealed end"
    assert node.writer.local_queue(head).read(0) == []
    held.check()


async def test_a_round_that_breaks_fails_its_queues_and_the_syncer_lives_on(store, commit, monkeypatch):
    """Anything but a failed sync (a bug, the ledger's disk in tests) must not end the syncer thread: every later
    send would wait for ever."""
    a, b = store.create("a"), store.create("b")
    real = PhysicalQueue.synced

    def broken(self, pending):
        raise RuntimeError("injected: bookkeeping after the sync broke")

    monkeypatch.setattr(PhysicalQueue, "synced", broken)
    a.append([b"a0"], 1)
    with pytest.raises(QueueFailed):
        await asyncio.wait_for(commit.durable(a, 1), WAIT_S)
    assert a.failed, "what that round covered cannot be vouched for"
    monkeypatch.setattr(PhysicalQueue, "synced", real)
    b.append([b"b0"], 1)
    await asyncio.wait_for(commit.durable(b, 1), WAIT_S)
    assert b.max_offset == 1


async def test_a_send_no_sync_covers_in_time_is_refused_and_its_records_come_later(store, monkeypatch):
    """A hung disk answers 503 after the wait's bound, and holds nothing: the waiter is gone from the table."""
    held = HeldSyncs(monkeypatch, "sync_filesystem")
    commit = GroupCommit(store.root, wait_timeout_s=0.2)
    try:
        q = store.create("a")
        q.append([b"late"], 1)
        with pytest.raises(SyncTimedOut):
            await asyncio.wait_for(commit.durable(q, 1), WAIT_S)
        assert commit._waiting == {}, "a timed-out waiter must not stay behind"
        assert q.max_offset == 0 and not q.failed
        held.release.set()
        await asyncio.wait_for(commit.durable(q, 1), WAIT_S)   # the disk came back: the record is durable after all
        assert [r.payload for r in q.read(0)] == [b"late"]
        held.check()
    finally:
        commit.close()


async def test_the_offset_budget_counts_records_still_waiting_for_their_sync(node, monkeypatch):
    """DESIGN.md invariant 5: a write stays within the offset budget the log granted. Records written but not yet
    synced are not readable (max_offset) yet hold their offsets: the budget and the heartbeat that renews it must
    count them (next_offset), or a second send would be granted offsets past the budget's end."""
    node.routes.update(one_queue_route(6, [("b1", 0)], budget_end=5))
    held = HeldSyncs(monkeypatch, "sync_filesystem")
    first = asyncio.create_task(node.writer.send("t", 0, [{"body": "a"}] * 3))
    await held.wait_entered()
    head = node.routes.head("t", 0)
    assert node.writer.next_offsets([head]) == {head.physical_queue: 3}, "what the heartbeat asks a renewal for"
    with pytest.raises(ApiError) as e:
        await asyncio.wait_for(node.writer.send("t", 0, [{"body": "b"}] * 3), WAIT_S)
    assert (e.value.status, e.value.code) == (503, "BUDGET_EXHAUSTED")
    held.release.set()
    assert await asyncio.wait_for(first, WAIT_S) == [0, 1, 2]
    held.check()
