"""The pop service's start, restart and background parts (broker/pop/service.py, revive.py, state.py), on the real
service of a broker node in the test's process (the ``node`` fixture of tests/support/pop_node.py) or the part
itself: the files it keeps in the data directory and its incarnation number, what a restart keeps of each delivery
in flight (a new number, the rest as it was) and what it starts again (their deadlines, the journal, a frozen head's
hand-over), the revive scheduler's waits, failures and stop, a pop woken when the busy queue it gave up on is freed,
a failed chore told, the rotation's first queue, an admin's adopt count, and two journal lines' exact fields."""

from __future__ import annotations

import asyncio
import os

import pytest
import structlog

from broker.pop import revive as revive_mod
from broker.pop import service as service_mod
from broker.pop.revive import Reviver
from broker.pop.service import SEQ_BITS, _next_incarnation
from broker.pop.state import QueueState
from tests.support import pop_node as base
from tests.support.pop_node import KEY, pop, route, seg, told, two_queues, until

node = base.node
WAIT_S = 10.0


@pytest.fixture
async def restarting(broker_node):
    """As ``node``, for a test that stops b1's pop service itself (to start another on its data directory)."""
    broker_node.routes.update(base.one_head())
    await broker_node.peers.start()
    await broker_node.pop.start()
    try:
        yield broker_node
    finally:
        await broker_node.peers.stop()


# -- the data directory and the incarnation ----------------------------------------------------------------------------

def test_each_incarnation_is_one_more_than_the_last_kept_on_disk(tmp_path):
    path = str(tmp_path / "incarnation")
    assert [_next_incarnation(path) for _ in range(3)] == [1, 2, 3]
    assert open(path, "rb").read() == b"3"
    with open(path, "wb") as f:
        f.write(b"junk")
    assert _next_incarnation(path) == 1, "a number it cannot read starts over at 1"


async def test_the_pop_service_keeps_its_files_under_pop_in_the_data_directory(node):
    root = os.path.join(node.config.data_dir, "pop")
    assert sorted(os.listdir(root)) == ["dlq", "handle.key", "incarnation", "journal.log", "replica.log"]
    assert len(open(os.path.join(root, "handle.key"), "rb").read()) == 32
    assert open(os.path.join(root, "incarnation"), "rb").read() == b"1"
    assert os.path.isdir(os.path.join(root, "dlq"))


async def test_a_restart_numbers_each_delivery_in_flight_anew_above_the_next_incarnation_and_keeps_the_rest(restarting):
    node = restarting
    await node.writer.send("t", 0, [{"body": "a"}, {"body": "b"}])
    a, b = await pop(node, 2)
    assert [node.pop.codec.decode("g", m.handle).seq for m in (a, b)] == [(1 << SEQ_BITS) | 1, (1 << SEQ_BITS) | 2], \
        "the first incarnation's numbers, from 1"
    before = {o: (d.attempt, d.deadline_ms) for o, d in node.pop.states[KEY].in_flight.items()}
    await node.pop.stop()                         # its journal writes both (first deliveries included)
    again = base.restarted_service(node)
    await again.start()
    try:
        st = again.states[KEY]
        assert {o: (d.seq, d.attempt, d.deadline_ms, d.written, d.dead) for o, d in st.in_flight.items()} == {
            o: (((2 << SEQ_BITS) | (o + 1)), attempt, deadline, True, False)
            for o, (attempt, deadline) in before.items()}
        assert (st.ready, st.moved_below, st.frozen) == ({}, 0, False), "a head not frozen keeps them, not due"
        assert again._handing == set()
        await until(lambda: again.journal.lines_written >= 1)   # the new numbers go to the journal
        back = again.journal.states[KEY]
        assert back is st
    finally:
        async with asyncio.timeout(base.STOP_S):
            await again.stop()
    reread = base.restarted_service(node)
    try:
        assert {o: d.seq for o, d in reread.states[KEY].in_flight.items()} == {
            0: (2 << SEQ_BITS) | 1, 1: (2 << SEQ_BITS) | 2}
    finally:
        await reread.journal.close()
        reread.replica.close()
        reread.dlq.close()


async def test_a_delivery_in_flight_before_a_restart_comes_due_after_it(restarting):
    node = restarting
    await node.writer.send("t", 0, [{"body": "a"}])
    await pop(node, 1, invisible_ms=50)
    await node.pop.stop()
    again = base.restarted_service(node)
    await again.start()
    try:
        await until(lambda: 0 in again.states[KEY].ready)
    finally:
        async with asyncio.timeout(base.STOP_S):
            await again.stop()


async def test_a_frozen_head_restarted_with_deliveries_in_flight_hands_them_over_again(restarting):
    node = restarting
    await node.writer.send("t", 0, [{"body": "a"}, {"body": "b"}])
    await pop(node, 2)
    node.routes.update(route(6, [seg(0, "b1", 0, 2, "sealed"), seg(1, "b2", 2, None, "active", 2)]))
    await node.pop.freeze(KEY, 6, caller="b2")    # b2 does not answer: the deliveries stay here, frozen
    assert node.pop.states[KEY].frozen and len(node.pop.states[KEY].in_flight) == 2
    await node.pop.stop()
    again = base.restarted_service(node)
    await again.start()
    try:
        assert again._handing == {KEY}, "the hand-over of the key starts again"
        assert list(again.states[KEY].ready) == [0, 1]
    finally:
        async with asyncio.timeout(base.STOP_S):
            await again.stop()


# -- the revive scheduler ----------------------------------------------------------------------------------------------

async def test_a_reviver_never_started_stops(tmp_path):
    await Reviver(lambda key, offset, seq: None).stop()


async def test_a_stopped_reviver_has_ended_its_task_and_fires_nothing_more():
    fired = []
    r = Reviver(lambda key, offset, seq: fired.append(offset))
    r.start()
    await asyncio.sleep(0.05)
    await r.stop()
    assert r._task.done(), "stop returns once the task has ended"
    r.schedule(0, KEY, 1, 1)                      # due at once, were anything still running
    await asyncio.sleep(0.2)
    assert fired == []


async def test_a_delivery_whose_revive_fails_is_told_and_the_next_ones_still_fire():
    fired = []

    def fire(key, offset, seq):
        if offset == 3:
            raise RuntimeError("a bug")
        fired.append(offset)

    r = Reviver(fire)
    with structlog.testing.capture_logs() as logs:
        r.schedule(1, KEY, 3, 1)
        r.schedule(2, KEY, 4, 2)
        r.start()
        try:
            await until(lambda: fired == [4])
        finally:
            await r.stop()
    assert [{k: e[k] for k in ("event", "key", "offset")} for e in told(logs)] == [
        {"event": "pop_revive_failed", "key": KEY, "offset": 3}]


async def test_a_deadline_not_yet_due_is_looked_at_again_when_it_comes_not_a_second_later(monkeypatch):
    """The clock stands still 1 ms before the deadline: the reviver waits 1 ms at a time (so a delivery comes due
    on time), not its idle wait (here 30 s), nor a second."""
    monkeypatch.setattr(revive_mod, "IDLE_WAKE_S", 30.0)
    reads = []

    def clock():
        reads.append(1)
        return 1_000_000

    r = Reviver(lambda key, offset, seq: None, now_ms=clock)
    r.schedule(1_000_001, KEY, 0, 10 ** 15)
    r.start()
    try:
        await until(lambda: len(reads) >= 30, WAIT_S)
    finally:
        await r.stop()


# -- pops, chores, adopt -----------------------------------------------------------------------------------------------

async def test_a_pop_that_gave_up_on_a_busy_queue_is_woken_when_it_is_freed(node, monkeypatch):
    monkeypatch.setattr(service_mod, "BUSY_QUEUE_WAIT_MS", 100)
    await node.writer.send("t", 0, [{"body": "a"}])
    async with node.pop.locks.hold(KEY):          # another pop works on the queue, for longer than a pop waits
        waiting = asyncio.create_task(node.pop.pop("t", "g", 1, 60_000, None, False, 30_000))
        await until(lambda: node.pop._waiters == 1)   # skipped it, and long-polls now
    async with asyncio.timeout(WAIT_S):
        got = await waiting
    assert [m.offset for m in got] == [0]


async def test_a_chore_that_fails_is_told_by_name(node):
    async def broken():
        raise RuntimeError("a bug")

    with structlog.testing.capture_logs() as logs:
        node.pop._spawn(broken())
        await until(lambda: told(logs, "pop_chore_failed"))
    assert told(logs, "pop_chore_failed") == [{
        "event": "pop_chore_failed", "what": broken.__qualname__, "error": "RuntimeError('a bug')"}]


async def test_the_first_pop_over_every_queue_starts_at_the_second(node):
    two_queues(node)
    await node.writer.send("t", 0, [{"body": "q0"}])
    await node.writer.send("t", 1, [{"body": "q1"}])
    [m] = await pop(node, 1, queue=None)
    assert m.queue == 1
    [m] = await pop(node, 1, queue=None)
    assert m.queue == 0


async def test_an_admin_adopt_answers_how_many_deliveries_it_took(node):
    await node.writer.send("t", 0, [{"body": "a"}, {"body": "b"}, {"body": "c"}])
    a, b, c = await pop(node, 3)
    assert await node.pop.ack("g", [a.handle, b.handle]) == [{"handle": h, "ok": True} for h in (a.handle, b.handle)]
    assert await node.pop.adopt(KEY, [[0, 1], [1, 2], [2, 1]]) == 2, "offset 2 is in flight already"


# -- journal lines -----------------------------------------------------------------------------------------------------

def test_a_dead_delivery_s_record_says_1():
    st = QueueState(KEY, 0)
    st.deliver_new(0, 1, 0, 100)
    assert st.expire(0, 1, 100, 1) == "dead"
    line = st.take_line(1_000)
    assert line[7] == [[0, 1, 1, 100, 1]]


def test_a_line_under_the_same_later_gen_holds_only_what_changed():
    st = QueueState(KEY, 0, gen=1)
    for o in range(3):
        st.deliver_new(o, o + 1, 0, 60_000)
    first = st.take_line(1_000)
    assert [u[0] for u in first[7]] == [0, 1, 2]
    st.ack(1)
    assert st.take_line(1_000)[7:] == [[], [1]], "the removal only: the other records are written already"
