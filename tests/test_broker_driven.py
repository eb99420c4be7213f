"""A broker node built driven (``BrokerNode(config, driven=True)``): no thread of its own, every part's blocking work
run inline or as a callback on the caller's event loop, which is how the deterministic simulator (ops/sim, issue 36)
runs real brokers on its one-thread loop. Here an ordinary asyncio loop stands in for the simulator's; its executor
runs work inline as the simulator's does (``to_thread`` is the loop's to run, not the broker's).

Also the two seams this rests on, alone: ``GroupCommit.run_round`` and ``OffsetStore.run_pending``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import threading
import time

import pytest

from broker.config import BrokerConfig
from broker.group_commit import GroupCommit
from broker.node import BrokerNode
from broker.offsets import OffsetStore
from broker.storage import FLUSH_GROUP, QueueConfig, QueueStore, files
from tests.support.local_routes import one_queue_route

WAIT_S = 10.0


class InlineExecutor(concurrent.futures.ThreadPoolExecutor):
    """The simulator's executor: work handed to it runs at once on the calling thread (a ThreadPoolExecutor only
    because asyncio's default executor must be one; it never starts a thread)."""

    def submit(self, fn, /, *args, **kwargs):
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001 - the awaiting caller's, as an executor's would be
            future.set_exception(e)
        return future


@pytest.fixture
async def inline_executor():
    asyncio.get_running_loop().set_default_executor(InlineExecutor())


def threads() -> set[threading.Thread]:
    return set(threading.enumerate())


@pytest.fixture
def started(monkeypatch) -> list[str]:
    """The names of the threads started from now on, even one that has ended by the time anyone looks."""
    names: list[str] = []
    real = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        names.append(thread.name)
        real(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    return names


def config(tmp_path) -> BrokerConfig:
    return BrokerConfig(broker="b1", data_dir=str(tmp_path / "b1"), http_host="127.0.0.1", http_port=1,
                        meta_urls=("http://127.0.0.1:9",), token="bt", client_token="ct")


async def test_a_driven_node_sends_reads_pops_commits_and_stops_without_a_thread_of_its_own(tmp_path, started,
                                                                                           inline_executor):
    before = threads()
    node = BrokerNode(config(tmp_path), driven=True)
    node.session.epoch, node.session.state, node.session.last_ack_sent = 1, "active", time.monotonic() + 3600
    node.routes.update(one_queue_route(5, [("b1", 0)]))   # gen 0: no older segment to ask meta for
    async with asyncio.timeout(WAIT_S):
        await node.start()   # its meta is nowhere: the link's calls fail and retry, the node serves on
        try:
            assert await node.writer.send("t", 0, [{"body": "one"}, {"body": "two"}]) == [0, 1]
            assert await node.writer.send("t", 0, [{"body": "three"}]) == [2]
            assert threads() == before
            pq = node.store.get("t.q0.g0")
            assert pq.max_offset == 3, "only a group commit round makes records readable"
            read = await node.reader.pull("t", 0, 0, 10)
            assert [(run.offset, run.count) for run in read["messages"]] == [(0, 2), (2, 1)], "one run per send"
            popped = await node.pop.pop("t", "p", 2, 60_000, 0, False, 0)
            assert [m.offset for m in popped] == [0, 1]
            assert [r["ok"] for r in await node.pop.ack("p", [m.handle for m in popped])] == [True, True]
            assert await node.writer.commit_offset("g", "t", 0, 2) == 2
            assert node.offsets.get("g", "t", 0) == 2
            # a dead letter: the dead-letter store has a queue open, which its close closes too
            await node.pop.dlq.append("p", [{"topic": "t", "queue": 0, "origin_offset": 2, "attempts": 1,
                                             "message": json.dumps({"body": "three"}).encode()}], 0)
            assert threads() == before
        finally:
            await node.stop()
    assert threads() == before and started == [], "a driven node starts no thread, not even to stop"
    assert pq.closed
    reopened = OffsetStore(os.path.join(node.config.data_dir, "offsets.log"), driven=True)
    try:
        assert reopened.get("g", "t", 0) == 2, "the commit acknowledged is on disk"
    finally:
        reopened.close()
    store = QueueStore(os.path.join(node.config.data_dir, "queues"), driven=True)
    try:
        assert [json.loads(r.payload)["body"] for r in store.get("t.q0.g0").read(0)] == ["one", "two", "three"]
    finally:
        store.close()


async def test_a_driven_store_closes_its_queues_cleanly_one_after_another_on_this_thread(tmp_path, started):
    root = str(tmp_path / "queues")
    store = QueueStore(root, driven=True)
    queues = [store.create(f"q{i}") for i in range(3)]
    for i, q in enumerate(queues):
        q.append([b"x"] * (i + 1), 1)
    store.close()
    assert [q.closed for q in queues] == [True] * 3 and started == []
    assert [os.path.exists(os.path.join(q.path, files.CLEAN_MARKER)) for q in queues] == [True] * 3, \
        "each closed cleanly: the next open skips its recovery scan"
    reopened = QueueStore(root, driven=True)
    try:
        assert [reopened.get(f"q{i}").max_offset for i in range(3)] == [1, 2, 3]
    finally:
        reopened.close()


# -- GroupCommit.run_round ------------------------------------------------------------------------------------------

@pytest.fixture
def store(tmp_path):
    s = QueueStore(str(tmp_path / "queues"), QueueConfig(flush_policy=FLUSH_GROUP), driven=True)
    yield s
    s.close()


def counted_syncs(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = files.sync_filesystem

    def sync_filesystem(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(files, "sync_filesystem", sync_filesystem)
    return calls


async def test_a_driven_round_runs_as_a_later_callback_and_covers_every_queue_asked_before_it(store, monkeypatch,
                                                                                              started):
    syncs = counted_syncs(monkeypatch)
    commit = GroupCommit(store.root, driven=True)
    try:
        a, b = store.create("a"), store.create("b")
        a.append([b"1", b"2"], 1)
        b.append([b"3"], 1)
        commit.ask(a)
        commit.ask(b)
        commit.ask(a)
        assert (a.max_offset, b.max_offset, syncs) == (0, 0, []), "asking syncs nothing on the asker's turn"
        await asyncio.sleep(0)
        assert (a.max_offset, b.max_offset, len(syncs)) == (2, 1, 1), "one round, scheduled once, covered both"
        b.append([b"4"], 1)
        await asyncio.wait_for(commit.durable(b, 2), WAIT_S)   # a wait asks, and a later callback's round wakes it
        assert (b.max_offset, len(syncs)) == (2, 2)
    finally:
        commit.close()
    assert started == []


async def test_run_round_called_directly_syncs_what_was_asked_and_wakes_its_waiters(store):
    commit = GroupCommit(store.root, driven=True)
    try:
        q = store.create("q")
        q.append([b"x"], 1)
        waiting = asyncio.ensure_future(commit.durable(q, 1))
        await asyncio.sleep(0)                  # the waiter has asked, and its round is scheduled
        assert commit.run_round() is True       # ahead of the scheduled one: that one finds nothing asked
        assert q.max_offset == 1 and not waiting.done(), "the waiter is woken by a callback, not inside the round"
        await asyncio.wait_for(waiting, WAIT_S)
    finally:
        commit.close()
    assert commit.run_round() is False, "closed: no round runs on the closed descriptor"


# -- OffsetStore.run_pending ----------------------------------------------------------------------------------------

async def test_a_driven_offset_store_stores_each_batch_in_a_later_callback_without_a_thread(tmp_path, started):
    path = str(tmp_path / "offsets.log")
    s = OffsetStore(path, driven=True)
    try:
        assert s.run_pending() is False, "nothing queued"
        first = asyncio.ensure_future(s.commit("g", "t", 0, 5, gen=1))
        second = asyncio.ensure_future(s.commit("g", "t", 1, 7, gen=1))
        await asyncio.sleep(0)                  # both queued; one batch scheduled
        assert s.run_pending() is True          # one fsync for both, on this thread
        assert (s.get("g", "t", 0), s.get("g", "t", 1)) == (5, 7)
        await asyncio.wait_for(asyncio.gather(first, second), WAIT_S)
        # and without a hand here: the batch a commit schedules on the loop stores and answers it
        await asyncio.wait_for(s.commit("g", "t", 0, 6, gen=1), WAIT_S)
        queued = asyncio.ensure_future(s.commit("h", "t", 0, 9, gen=1))
        await asyncio.sleep(0)                  # queued, its batch scheduled behind this step
    finally:
        s.close()
    assert s.get("h", "t", 0) == 9, "close stores what is queued still, as the thread would before ending"
    await asyncio.wait_for(queued, WAIT_S)
    assert started == []
    reopened = OffsetStore(path, driven=True)
    try:
        assert [reopened.get(*k) for k in (("g", "t", 0), ("g", "t", 1), ("h", "t", 0))] == [6, 7, 9]
    finally:
        reopened.close()
