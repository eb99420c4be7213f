"""What pop state survives on disk and what its copies hold: the pop journal's compaction (broker/pop/journal.py)
replayed after a restart, and a compaction that fails; the copy's file of the queues other brokers lead
(broker/pop/replica.py): a leader's lines applied, refused, compacted and replayed; and, on a real broker node in
this process (the ``node`` fixture of tests/support/pop_node.py), the dead letters' chore and the hand-over chore of
a frozen head (broker/pop/service.py ``_dead_letter``, ``_push_expired``): what they drop, keep and write."""

from __future__ import annotations

import asyncio
import os

import pytest
import structlog

from broker.pop import journal as journal_mod
from broker.pop import replica as replica_mod
from broker.pop import service as service_mod
from broker.pop.limits import DELIVERY_WRITE_DELAY_MS
from broker.pop.state import QueueState
from broker.storage import lines
from broker.storage.errors import UnsupportedFormat
from tests.support import pop_node as base
from tests.support.disk_errors import eio
from wire.errors import ApiError, rejection

node = base.node          # b1 heading queue 0 of topic t, its pop service started
KEY, seg, route, pop, until = base.KEY, base.seg, base.route, base.pop, base.until
OTHER = ("h", "t", 0)     # another group's state of the same queue
LATER = DELIVERY_WRITE_DELAY_MS   # a first delivery popped at 0 is written from then on


def popped(key, offsets, gen: int = 0, now: int = 0, next_offset: int | None = None) -> QueueState:
    """A state of ``key`` under ``gen`` with first deliveries of ``offsets`` popped at ``now``, invisible 60 s."""
    st = QueueState(key, next_offset if next_offset is not None else min(offsets, default=0), gen)
    for o in offsets:
        st.deliver_new(o, 1000 * gen + o + 1, now, 60_000)
    return st


def file_lines(path) -> int:
    return len(lines.read(str(path)).values)


def held(states: dict) -> dict:
    """Each key's gen, pop offset and deliveries in flight (offset -> attempt, dead)."""
    return {k: (st.gen, st.next_offset, {o: (d.attempt, d.dead) for o, d in sorted(st.in_flight.items())})
            for k, st in sorted(states.items())}


# -- the pop journal: compaction ------------------------------------------------------------------------------------

async def test_a_compacted_journal_holds_one_line_per_key_with_every_delivery_and_a_restart_replays_it(
        tmp_path, monkeypatch):
    """Compaction rewrites the file as one line per key, every delivery in memory written first (a first delivery
    still inside its write delay too): a restart right after finds every delivery handed out and the pop offset past
    them. Lines written after it follow on in the new file."""
    monkeypatch.setattr(journal_mod, "COMPACT_AFTER_LINES", 4)
    path = tmp_path / "journal.log"
    clock = [0]
    states, whole = journal_mod.load(str(path))
    j = journal_mod.Journal(str(path), states, whole, now_ms=lambda: clock[0])
    a = states[KEY] = popped(KEY, [0, 1, 2])
    b = states[OTHER] = popped(OTHER, [10])
    clock[0] = LATER
    j.touch(KEY)
    j.touch(OTHER)
    await j.round()                       # lines 1 and 2
    a.ack(0)
    j.touch(KEY)
    await j.round()                       # 3
    b.ack(10)
    j.touch(OTHER)
    await j.round()                       # 4: not more than twice the keys yet
    assert file_lines(path) == 4
    a.ack(1)
    a.deliver_new(3, 7, clock[0], 60_000)   # popped just now: inside its write delay
    j.touch(KEY)
    await j.round()                       # 5: compacted
    assert file_lines(path) == 2, "one line per key"
    back, _ = journal_mod.load(str(path))
    assert held(back) == {KEY: (0, 4, {2: (1, False), 3: (1, False)}), OTHER: (0, 11, {})}, \
        "the delivery popped just now is in the new file, and the pop offset past it"
    a.ack(2)
    j.touch(KEY)
    await j.round()
    await j.close()
    back, _ = journal_mod.load(str(path))
    assert held(back) == {KEY: (0, 4, {3: (1, False)}), OTHER: (0, 11, {})}
    assert file_lines(path) == 3


async def test_a_compaction_that_fails_leaves_the_old_file_and_the_journal_refuses_every_later_wait(
        tmp_path, monkeypatch):
    """The round that compacts has answered its waiters already: a failed rewrite fails the journal (nothing after
    it can be trusted until a restart), the round itself does not raise, nothing more is written, and a restart
    replays the old file whole."""
    monkeypatch.setattr(journal_mod, "COMPACT_AFTER_LINES", 2)
    path = tmp_path / "journal.log"
    states, whole = journal_mod.load(str(path))
    j = journal_mod.Journal(str(path), states, whole, now_ms=lambda: LATER)
    st = states[KEY] = popped(KEY, [0, 1, 2, 3])
    j.touch(KEY)
    await j.round()
    st.ack(0)
    j.touch(KEY)
    await j.round()
    monkeypatch.setattr(j, "_replace", eio)
    st.ack(1)
    j.touch(KEY)
    with structlog.testing.capture_logs() as logs:
        await j.round()                   # the third line, written; its compaction fails
    assert file_lines(path) == 3
    assert [(e["event"], e["log_level"], e["path"]) for e in logs] == [
        ("pop_journal_compaction_failed", "error", os.path.abspath(path))], "an operator is told, with the file"
    with pytest.raises(ApiError) as e:
        async with asyncio.timeout(2):
            await j.durable()
    assert (e.value.status, e.value.code) == (503, "STORAGE_UNAVAILABLE")
    st.ack(2)
    j.touch(KEY)
    await j.round()
    assert file_lines(path) == 3, "a failed journal writes nothing more"
    await j.close()
    back, _ = journal_mod.load(str(path))
    assert held(back) == {KEY: (0, 4, {2: (1, False), 3: (1, False)})}


# -- the copy's file of queues led elsewhere --------------------------------------------------------------------------

async def test_the_copy_s_file_is_rewritten_once_it_holds_more_than_twice_as_many_lines_as_keys_and_replays_whole(
        tmp_path, monkeypatch):
    monkeypatch.setattr(replica_mod, "COMPACT_AFTER_LINES", 2)
    path = tmp_path / "replica.log"
    store = replica_mod.ReplicaPopStore(str(path))
    a = popped(KEY, [0])
    b = popped(OTHER, [0, 1])
    await store.apply("t", 0, 0, False, [a.take_line(LATER), b.take_line(LATER)])   # one push, two lines
    counts = [file_lines(path)]
    for o in (1, 2, 3):                   # one line of a each
        a.deliver_new(o, 50 + o, 0, 60_000)
        await store.apply("t", 0, 0, False, [a.take_line(LATER)])
        counts.append(file_lines(path))
    assert counts == [2, 3, 4, 2], "rewritten at 5 lines for 2 keys, not at 3 or 4"
    b.ack(0)
    await store.apply("t", 0, 0, False, [b.take_line(LATER)])
    assert file_lines(path) == 3, "appended after the rewrite"
    want = held(store.states)
    assert want == {KEY: (0, 4, {0: (1, False), 1: (1, False), 2: (1, False), 3: (1, False)}),
                    OTHER: (0, 2, {1: (1, False)})}
    store.close()
    again = replica_mod.ReplicaPopStore(str(path))
    assert held(again.states) == want
    again.close()


async def test_a_push_whose_first_line_is_another_queue_s_is_refused_whole_with_or_without_a_snapshot(tmp_path):
    path = tmp_path / "replica.log"
    store = replica_mod.ReplicaPopStore(str(path))
    await store.apply("t", 0, 0, False, [popped(KEY, [0, 1]).take_line(LATER)])
    before, size = held(store.states), path.stat().st_size
    stray = popped(("g", "t", 1), [0]).take_line(LATER)
    good = popped(OTHER, [5]).take_line(LATER)
    for reset in (False, True):
        with pytest.raises(ApiError) as e:
            await store.apply("t", 0, 0, reset, [stray, good])
        assert (e.value.status, e.value.code, e.value.message) == (
            400, "INVALID_ARGUMENT", "a pushed line names t/1, not t/0")
        assert held(store.states) == before and path.stat().st_size == size, "nothing applied, nothing written"
    store.close()


async def test_a_new_leader_s_first_line_replaces_the_state_of_any_older_gen_and_a_deposed_one_s_is_dropped(
        tmp_path):
    path = tmp_path / "replica.log"
    store = replica_mod.ReplicaPopStore(str(path))
    old = popped(KEY, [0, 1, 2], gen=3)
    await store.apply("t", 0, 3, False, [old.take_line(LATER)])
    new = popped(KEY, [4], gen=5, next_offset=3)          # gen 5's head: 0-2 acked under gen 3 since
    await store.apply("t", 0, 5, False, [new.take_line(LATER)])
    assert held(store.states) == {KEY: (5, 5, {4: (1, False)})}, "replaced, not merged"
    old.ack(0)
    await store.apply("t", 0, 3, False, [old.take_line(LATER + 1)])   # gen 3's leader, late
    assert held(store.states) == {KEY: (5, 5, {4: (1, False)})}
    store.close()
    again = replica_mod.ReplicaPopStore(str(path))
    assert held(again.states) == {KEY: (5, 5, {4: (1, False)})}, "and so on replay"
    again.close()


def test_a_reset_line_of_0_1_refuses_the_start_naming_the_line_and_why(tmp_path):
    path = tmp_path / "replica.log"
    path.write_bytes(lines.encode(["L", popped(KEY, [0]).take_line(LATER)]) + lines.encode(["R", "t", 0]))
    with pytest.raises(UnsupportedFormat) as e:
        replica_mod.ReplicaPopStore(str(path))
    assert str(e.value) == (f"{path}: good line 2: a reset line of Stator 0.1 (no gen: it dropped every state of "
                            "the queue)")


async def test_copies_of_more_pop_queues_than_the_bound_are_refused_in_words(tmp_path, monkeypatch):
    monkeypatch.setattr(replica_mod, "POP_QUEUES_MAX", 1)
    store = replica_mod.ReplicaPopStore(str(tmp_path / "replica.log"))
    await store.apply("t", 0, 0, False, [popped(KEY, [0]).take_line(LATER)])
    with pytest.raises(ApiError) as e:
        await store.apply("t", 0, 0, False, [popped(OTHER, [0]).take_line(LATER)])
    assert (e.value.status, e.value.code, e.value.message, e.value.details) == (
        409, "TOO_MANY_POP_QUEUES", "this broker keeps pop state of at most 1 (group, topic, queue) as a copy",
        {"limit": 1})
    assert sorted(store.states) == [KEY]
    store.close()


async def test_a_failed_rewrite_of_the_copy_s_file_keeps_what_it_acknowledged_and_refuses_every_later_push(
        tmp_path, monkeypatch):
    monkeypatch.setattr(replica_mod, "COMPACT_AFTER_LINES", 1)
    path = tmp_path / "replica.log"
    store = replica_mod.ReplicaPopStore(str(path))
    st = popped(KEY, [0, 1, 2])
    await store.apply("t", 0, 0, False, [st.take_line(LATER)])
    st.ack(0)
    await store.apply("t", 0, 0, False, [st.take_line(LATER)])
    monkeypatch.setattr(store, "_replace", eio)
    st.ack(1)
    with structlog.testing.capture_logs() as logs:
        await store.apply("t", 0, 0, False, [st.take_line(LATER)])   # durable; the rewrite after it fails
    assert [(e["event"], e["log_level"], e["path"]) for e in logs] == [
        ("replica_pop_compaction_failed", "error", os.path.abspath(path))], "an operator is told, with the file"
    st.ack(2)
    with pytest.raises(ApiError) as e:
        await store.apply("t", 0, 0, False, [st.take_line(LATER)])
    assert (e.value.status, e.value.code, e.value.message) == (
        503, "STORAGE_UNAVAILABLE", "the replica pop state file failed; restart the broker")
    store.close()
    again = replica_mod.ReplicaPopStore(str(path))
    assert held(again.states) == {KEY: (0, 3, {2: (1, False)})} and file_lines(path) == 3
    again.close()


async def test_a_push_whose_write_fails_is_refused_and_so_is_every_later_one_and_an_operator_is_told(
        tmp_path, monkeypatch):
    path = tmp_path / "replica.log"
    store = replica_mod.ReplicaPopStore(str(path))
    st = popped(KEY, [0, 1])
    await store.apply("t", 0, 0, False, [st.take_line(LATER)])
    monkeypatch.setattr(store, "_write", eio)
    st.ack(0)
    with structlog.testing.capture_logs() as logs, pytest.raises(ApiError) as e:
        await store.apply("t", 0, 0, False, [st.take_line(LATER)])
    assert (e.value.status, e.value.code, e.value.message) == (
        503, "STORAGE_UNAVAILABLE", "the replica pop state file failed")
    assert [(x["event"], x["log_level"], x["path"]) for x in logs] == [
        ("replica_pop_write_failed", "error", os.path.abspath(path))]
    monkeypatch.undo()
    st.ack(1)
    with pytest.raises(ApiError) as e:
        await store.apply("t", 0, 0, False, [st.take_line(LATER)])
    assert (e.value.status, e.value.code) == (503, "STORAGE_UNAVAILABLE"), "nothing after a failed write is trusted"
    store.close()


# -- dead letters -------------------------------------------------------------------------------------------------------

def on_disk(node) -> dict:
    return held(journal_mod.load(node.pop.journal.path)[0])


async def test_a_dead_letter_s_removal_is_on_disk_once_it_is_done(node):
    """A delivery written long before it died (its key idle in the journal since): the dead letter's removal is
    written by the next round, not left to some later change of the key."""
    base.max_attempts(node, "g", 1)
    await node.writer.send("t", 0, [{"body": "poison"}])
    await pop(node, 1, invisible_ms=DELIVERY_WRITE_DELAY_MS + 100)
    st = node.pop.states[KEY]
    await until(lambda: node.pop.dead_lettered == 1 and not st.in_flight)
    await node.pop.journal.durable()
    assert on_disk(node) == {KEY: (0, 1, {})}
    assert [m["body"] for m in (await node.pop.dlq.read("g", 0, 10))["messages"]] == ["poison"]


async def test_the_dead_letter_chore_leaves_alone_a_delivery_that_is_gone_or_not_dead(node):
    """It looks again at what it finds when it runs (a retry after a failover, a takeover that replaced the
    state): a live delivery is not copied nor removed, a gone one is nothing to do."""
    base.max_attempts(node, "g", 1)
    await node.writer.send("t", 0, [{"body": "m"}])
    [a] = await pop(node, 1)
    st = node.pop.states[KEY]
    for offset, resumed in ((0, False), (0, True), (1, False), (1, True)):
        await node.pop._dead_letter(KEY, offset, resumed)
    assert sorted(st.in_flight) == [0] and not st.in_flight[0].dead and node.pop.dead_lettered == 0
    assert (await node.pop.dlq.read("g", 0, 10))["messages"] == []
    assert (await node.pop.ack("g", [a.handle]))[0]["ok"]


async def test_a_dead_letter_whose_read_failed_is_copied_on_its_retry_after_the_journal_failed(node, monkeypatch):
    """Its mark is on disk before the first read: the retry goes on without the journal, so the message reaches the
    dead-letter queue even when the journal failed meanwhile (a restart then finds the copy, and makes no other)."""
    monkeypatch.setattr(service_mod, "DLQ_RETRY_MS", 500)
    await node.writer.send("t", 0, [{"body": "poison"}])
    [h] = await pop(node, 1, group="h")                 # another group's delivery, to fail the journal with
    await base.dead_letter_after_one_attempt(node)
    asked = base.answer_reads(node, monkeypatch, [rejection(503, "BROKER_UNAVAILABLE", "down")])
    await until(lambda: asked == [0])
    monkeypatch.setattr(node.pop.journal, "_write", eio)
    with pytest.raises(ApiError) as e:
        await node.pop.change_invisible("h", h.handle, 60_000)
    assert e.value.code == "STORAGE_UNAVAILABLE"
    assert node.pop.dead_lettered == 0, "still waiting for its retry"
    await until(lambda: node.pop.dead_lettered == 1, 5)
    assert asked == [0, 0]
    assert [m["origin_offset"] for m in (await node.pop.dlq.read("g", 0, 10))["messages"]] == [0]


# -- a frozen head's hand-over ----------------------------------------------------------------------------------------

async def test_the_hand_over_of_a_key_not_frozen_or_without_state_asks_nobody_and_keeps_its_due_deliveries(
        node, monkeypatch):
    """Only a frozen state has deliveries to hand over: a state led here again (not frozen) keeps the ones come due
    for its next pop, even while the routes name another head, and a key with no state has nothing."""
    asked = []

    async def request(method, segment, path, json=None):
        asked.append((segment.broker, path))
        return {"taken": 0}
    monkeypatch.setattr(node.reader.peers, "request", request)
    await node.writer.send("t", 0, [{"body": "a"}])
    await pop(node, 1, invisible_ms=50)
    st = node.pop.states[KEY]
    await until(lambda: 0 in st.ready)
    node.routes.update(route(6, [seg(0, "b1", 0, 3, "sealed"), seg(1, "b2", 3, None, "active", 3)]))
    assert await node.pop._push_expired(KEY)
    assert await node.pop._push_expired(("nobody", "t", 0))
    assert asked == [] and list(st.ready) == [0] and sorted(st.in_flight) == [0]
