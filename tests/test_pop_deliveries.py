"""One broker's deliveries (broker/pop/service.py): the revive heap kept in bounds, the in-flight bounds of a pop,
deliveries again read run by run within a byte budget, the verdict on each handle acked (a failover that deposed
this broker, a hand-over forgotten by a restart), what wakes a parked pop, and dead letters made once. A real broker
node in this process (the ``node`` fixture of tests/support/pop_node.py), so a mutant of broker/pop is what runs.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from broker.codec import messages
from broker.pop import journal as journal_mod
from broker.pop import service as service_mod
from broker.pop.handles import Handle
from broker.pop.state import Delivery, QueueState
from tests.support import pop_node as base
from wire.errors import ApiError

node = base.node          # b1 heading queue 0 of topic t, its pop service started
KEY, seg, route, pop, until = base.KEY, base.seg, base.route, base.pop, base.until


def on_disk(node) -> QueueState:
    return journal_mod.load(node.pop.journal.path)[0][KEY]


async def settled(node) -> None:
    """Every first delivery written and no key waiting for the journal's next round."""
    await until(lambda: all(d.written for st in node.pop.states.values() for d in st.in_flight.values())
                and not node.pop.journal._changed)


# -- the revive heap -------------------------------------------------------------------------------------------------

async def test_the_revive_heap_is_rebuilt_from_the_live_deliveries_once_stale_entries_outnumber_them(
        node, monkeypatch):
    """Every HEAP_CHECK_EVERY deadlines scheduled, a heap holding more than 4 entries per delivery in flight (plus
    HEAP_CHECK_EVERY) is rebuilt from the deliveries in flight, not due and not dead; those come due as before."""
    monkeypatch.setattr(service_mod, "HEAP_CHECK_EVERY", 6)
    await node.writer.send("t", 0, [{"body": f"m{i}"} for i in range(3)])
    a, _, _ = await pop(node, 3)                         # 3 scheduled, 3 in flight
    handle = a.handle
    for _ in range(15):                                  # 18 scheduled: 18 entries, not more than 4 * 3 + 6
        handle = await node.pop.change_invisible("g", handle, 60_000)
    assert len(node.pop.reviver) == 18
    for _ in range(5):
        handle = await node.pop.change_invisible("g", handle, 60_000)
    handle = await node.pop.change_invisible("g", handle, 200)   # the 24th: 24 entries, rebuilt
    assert len(node.pop.reviver) == 3, "one entry per delivery in flight"
    st = node.pop.states[KEY]
    await until(lambda: 0 in st.ready)
    assert sorted(st.ready) == [0], "the one whose new deadline came within the rebuild comes due"


# -- what a pop may hand out -----------------------------------------------------------------------------------------

async def test_a_full_queue_still_delivers_what_came_due_on_it(node, monkeypatch):
    monkeypatch.setattr(service_mod, "IN_FLIGHT_PER_QUEUE_MAX", 2)
    await node.writer.send("t", 0, [{"body": f"m{i}"} for i in range(3)])
    assert len(await pop(node, 5, invisible_ms=50)) == 2
    st = node.pop.states[KEY]
    await until(lambda: sorted(st.ready) == [0, 1])
    assert [(m.offset, m.attempt) for m in await pop(node, 5)] == [(0, 2), (1, 2)]


async def test_the_broker_wide_bound_counts_what_one_pop_hands_out_over_its_queues(node, monkeypatch):
    monkeypatch.setattr(service_mod, "IN_FLIGHT_MAX", 3)
    base.two_queues(node)
    for q in (0, 1):
        await node.writer.send("t", q, [{"body": f"q{q}m{i}"} for i in range(3)])
    assert len(await pop(node, 1, queue=0)) == 1
    assert len(await pop(node, 5, queue=None)) == 2, "3 in flight at most on this broker"
    with pytest.raises(ApiError) as e:
        await pop(node, 5, queue=1)
    assert e.value.code == "TOO_MANY_IN_FLIGHT"
    assert node.pop.in_flight_total() == 3


async def test_a_state_frozen_under_the_head_s_own_gen_hands_out_nothing(node):
    await node.writer.send("t", 0, [{"body": "m"}])
    st = node.pop.states[KEY] = QueueState(KEY, 0, 0)
    st.frozen = True
    assert await pop(node, 5) == [] and await pop(node, 5, queue=None) == []


# -- deliveries again: read run by run ---------------------------------------------------------------------------------

def reads(node, monkeypatch, answers: dict[int, dict] | None = None, during=None) -> list[int]:
    """``reader.read_history`` answering ``answers[offset]`` where given, else the real store; ``during`` is awaited
    within each read (something happening while a pop reads). Returns the offsets read, in order."""
    real = node.pop.reader.read_history
    asked: list[int] = []

    async def read_history(topic, queue, offset, max_n):
        asked.append(offset)
        if during is not None:
            await during()
        if answers and offset in answers:
            return answers[offset]
        return await real(topic, queue, offset, max_n)
    monkeypatch.setattr(node.pop.reader, "read_history", read_history)
    return asked


async def due(node, n: int, acked: list[int]) -> QueueState:
    """``n`` messages popped with 50 ms to come due, those at ``acked`` acked; returns once the others are due."""
    await node.writer.send("t", 0, [{"body": f"m{i}"} for i in range(n)])
    got = await pop(node, n, invisible_ms=50)
    assert all(r["ok"] for r in await node.pop.ack("g", [got[o].handle for o in acked]))
    st = node.pop.states[KEY]
    await until(lambda: len(st.ready) == n - len(acked))
    return st


async def test_deliveries_again_are_read_one_run_of_offsets_at_a_time(node, monkeypatch):
    await due(node, 5, acked=[3])
    asked = reads(node, monkeypatch)
    assert [(m.offset, m.attempt) for m in await pop(node, 5)] == [(0, 2), (1, 2), (2, 2), (4, 2)]
    assert asked == [0, 4]


async def test_a_message_storage_no_longer_holds_is_dropped_one_not_read_stays_due_and_the_rest_go_out(
        node, monkeypatch):
    st = await due(node, 5, acked=[1, 3])
    answers = {0: {"messages": [], "next_offset": 1, "min_offset": 1, "max_offset": 5},                 # retention
               2: {"messages": [], "next_offset": 3, "min_offset": 0, "max_offset": 5, "unavailable": True}}  # down
    asked = reads(node, monkeypatch, answers)
    assert [(m.offset, m.attempt) for m in await pop(node, 5)] == [(4, 2)]
    assert asked == [0, 2, 4]
    assert sorted(st.in_flight) == [2, 4] and list(st.ready) == [2], "0 dropped, 2 due still"
    assert on_disk(node).in_flight[4].attempt == 2, "the delivery again is on disk when answered"
    assert node.pop.redelivered == 1
    del answers[2]                          # its broker back
    assert [(m.offset, m.attempt) for m in await pop(node, 5)] == [(2, 2)]
    assert node.pop.redelivered == 2


async def test_one_pop_reads_deliveries_again_within_its_byte_budget(node, monkeypatch):
    await due(node, 3, acked=[1])
    size = len(messages((await node.reader.read_history("t", 0, 0, 1))["messages"])[0].payload)
    monkeypatch.setattr(service_mod, "PULL_BYTES_MAX", size)
    asked = reads(node, monkeypatch)
    assert [m.offset for m in await pop(node, 5)] == [0], "the budget spent on 0: 2 waits for the next pop"
    assert asked == [0]
    monkeypatch.setattr(service_mod, "PULL_BYTES_MAX", size + 1)
    assert [m.offset for m in await pop(node, 5)] == [2]


async def test_a_delivery_acked_while_a_pop_reads_it_is_not_delivered_again_and_the_others_are(node, monkeypatch):
    got_handles = []
    await node.writer.send("t", 0, [{"body": f"m{i}"} for i in range(3)])
    got_handles = [m.handle for m in await pop(node, 3, invisible_ms=50)]
    st = node.pop.states[KEY]
    await until(lambda: len(st.ready) == 3)

    async def ack_0():
        if 0 in st.in_flight:
            await node.pop.ack("g", [got_handles[0]])
    reads(node, monkeypatch, during=ack_0)
    assert [(m.offset, m.attempt) for m in await pop(node, 5)] == [(1, 2), (2, 2)]
    assert 0 not in st.in_flight


# -- each handle's verdict ---------------------------------------------------------------------------------------------

async def test_a_handle_is_acked_after_its_invisible_time_until_delivered_again(node):
    await node.writer.send("t", 0, [{"body": "m"}])
    [m] = await pop(node, 1, invisible_ms=50)
    await until(lambda: 0 in node.pop.states[KEY].ready)
    assert await node.pop.ack("g", [m.handle]) == [{"handle": m.handle, "ok": True}]


async def test_a_handle_that_verifies_but_names_nothing_delivered_is_invalid(node):
    await node.writer.send("t", 0, [{"body": "m"}])
    [m] = await pop(node, 1)
    never = node.pop.codec.encode("g", Handle("t", 0, 9, 1))
    assert await node.pop.ack("g", [never]) == [{"handle": never, "ok": False, "code": "INVALID_HANDLE"}]


@pytest.mark.parametrize("case, expired", [
    ("deposed", True),          # a failover: b2 sealed b1's gen and leads gen 1, with b1's deliveries
    ("remapped", False),        # a remap: b1 sealed its gen itself; its deliveries stay its own to answer
    ("sealing", False),         # b2 elected to seal b1's gen, no newer head yet
])
async def test_a_leader_a_failover_deposed_refuses_acks_of_what_it_delivered_and_one_remapped_answers_them(
        node, case, expired):
    await node.writer.send("t", 0, [{"body": "a"}, {"body": "b"}])
    a, b = await pop(node, 2)
    both = ["b1", "b2"]
    node.routes.update({
        "deposed": route(6, [seg(0, "b1", 0, 2, "sealed", replicas=both, in_sync=["b2"], sealer="b2"),
                             seg(1, "b2", 2, None, "active", 2, replicas=both, in_sync=["b2"])]),
        "remapped": route(6, [seg(0, "b1", 0, 2, "sealed"), seg(1, "b2", 2, None, "active", 2)]),
        "sealing": route(6, [seg(0, "b1", 0, None, "sealing", replicas=both, in_sync=["b2"], sealer="b2")]),
    }[case])
    if expired:
        assert await node.pop.ack("g", [a.handle]) == [{"handle": a.handle, "ok": False, "code": "HANDLE_EXPIRED"}]
        return
    with pytest.raises(ApiError) as e:      # not refused: applied here, in doubt as the queue moves on
        await node.pop.ack("g", [a.handle])
    assert e.value.code == "REPLICATION_UNCONFIRMED"


async def test_a_handle_handed_over_before_a_restart_is_refused_after_it(broker_node, monkeypatch):
    """The old head forgot which deliveries it handed over (a restart); the handles below the offset it handed over
    from are refused, never answered ok: the new head delivers those messages again once due."""
    node = broker_node
    node.routes.update(base.one_head())
    await node.pop.start()
    await node.writer.send("t", 0, [{"body": "a"}, {"body": "b"}])
    a, b = await pop(node, 2)

    async def request(method, segment, path, json=None):
        return {"taken": 0}
    monkeypatch.setattr(node.reader.peers, "request", request)
    node.routes.update(route(6, [seg(0, "b1", 0, 2, "sealed"), seg(1, "b2", 2, None, "active", 2)]))
    await node.pop.freeze(KEY, 6, caller="b2")
    await until(lambda: not node.pop.states[KEY].in_flight)
    await node.pop.stop()
    again = base.restarted_service(node)
    await again.start()
    try:
        assert await again.ack("g", [a.handle, b.handle]) == [
            {"handle": h, "ok": False, "code": "HANDLE_EXPIRED"} for h in (a.handle, b.handle)]
    finally:
        async with asyncio.timeout(base.STOP_S):
            await again.stop()


# -- acks and what they wake -------------------------------------------------------------------------------------------

async def test_an_ack_of_a_written_delivery_is_on_disk_when_answered(node):
    await node.writer.send("t", 0, [{"body": "a"}, {"body": "b"}])
    a, b = await pop(node, 2)
    await settled(node)
    assert sorted(on_disk(node).in_flight) == [0, 1]
    assert (await node.pop.ack("g", [a.handle]))[0]["ok"]
    assert sorted(on_disk(node).in_flight) == [1]


async def test_an_ack_frees_an_ordered_queue_for_a_parked_pop_at_once(node):
    await node.writer.send("t", 0, [{"body": "a"}, {"body": "b"}])
    [a] = await node.pop.pop("t", "g", 1, 60_000, 0, True, 0)
    parked = asyncio.create_task(node.pop.pop("t", "g", 1, 60_000, 0, True, 8_000))
    await until(lambda: node.pop._waiters == 1)
    started = time.monotonic()
    assert (await node.pop.ack("g", [a.handle]))[0]["ok"]
    [b] = await asyncio.wait_for(parked, 10)
    assert b.offset == 1 and time.monotonic() - started < 4, "woken by the ack, not by its wait's end"


async def test_a_delivery_coming_due_wakes_a_parked_pop(node):
    await node.writer.send("t", 0, [{"body": "a"}])
    await pop(node, 1, invisible_ms=300)
    parked = asyncio.create_task(node.pop.pop("t", "g", 1, 60_000, 0, False, 8_000))
    started = time.monotonic()
    [again] = await asyncio.wait_for(parked, 10)
    assert (again.offset, again.attempt) == (0, 2) and time.monotonic() - started < 4


async def test_a_long_poll_looks_again_only_when_woken_or_at_its_end(node, monkeypatch):
    node.pop.signals.notify("t")           # the topic was notified before: the poll parks from its own stamp
    looks = []
    real = node.pop._queues

    def counting(topic, queue):
        looks.append(time.monotonic())
        return real(topic, queue)
    monkeypatch.setattr(node.pop, "_queues", counting)
    started = time.monotonic()
    assert await node.pop.pop("t", "g", 1, 60_000, 0, False, 300) == []
    assert time.monotonic() - started >= 0.29 and len(looks) == 2, looks


# -- dead letters ------------------------------------------------------------------------------------------------------

async def test_a_dead_letter_is_marked_on_disk_before_its_copy_and_removed_on_disk_after(node, monkeypatch):
    await base.dead_letter_after_one_attempt(node, "poison")
    marked = []

    async def look():
        marked.append(on_disk(node).in_flight[0].dead)
    reads(node, monkeypatch, during=look)
    st = node.pop.states[KEY]
    await until(lambda: not st.in_flight)
    assert marked == [True], "dead on disk before the message is read for its copy"
    await until(lambda: not on_disk(node).in_flight, 3)


async def test_dead_letters_are_counted_one_by_one(node):
    base.max_attempts(node, "g", 1)
    await node.writer.send("t", 0, [{"body": "a"}, {"body": "b"}])
    await pop(node, 1, invisible_ms=50)
    await until(lambda: node.pop.dead_lettered == 1, base.WAIT_S)
    await pop(node, 1, invisible_ms=50)
    await until(lambda: node.pop.dead_lettered == 2, base.WAIT_S)
    assert [m["origin_offset"] for m in (await node.pop.dlq.read("g", 0, 10))["messages"]] == [0, 1]


async def test_a_dead_letter_copied_before_a_crash_is_not_copied_again_after_the_restart(broker_node):
    node = broker_node
    node.routes.update(base.one_head())
    await node.pop.start()
    base.max_attempts(node, "g", 1)
    await node.writer.send("t", 0, [{"body": "poison"}])
    await pop(node, 1, invisible_ms=60_000)
    st = node.pop.states[KEY]
    d = st.in_flight[0]
    st.expire(0, d.seq, d.deadline_ms, 1)          # dead, marked durably, copied: a crash before the removal
    node.pop.journal.touch(KEY)
    await node.pop.journal.durable()
    payload = messages((await node.reader.read_history("t", 0, 0, 1))["messages"])[0].payload
    await node.pop.dlq.append("g", [{"topic": "t", "queue": 0, "origin_offset": 0, "attempts": 1,
                                     "message": payload}], 0)
    await node.pop.reviver.stop()
    await node.pop.journal.close()
    node.pop.dlq.close()
    again = base.restarted_service(node)
    await again.start()
    try:
        await until(lambda: not again.states[KEY].in_flight)
        assert [m["body"] for m in (await again.dlq.read("g", 0, 10))["messages"]] == ["poison"], "once"
    finally:
        async with asyncio.timeout(base.STOP_S):
            await again.stop()


async def test_a_copy_taken_over_brings_its_deliveries_due_here_and_its_dead_ones_to_the_dlq(node, monkeypatch):
    """b2 led gen 0 (b1 in sync) and is lost; b1 takes the group over from its copy: the copy's delivery in flight
    comes due here under a new number, its dead one goes to the DLQ once."""
    base.max_attempts(node, "g", 5)
    await node.writer.send("t", 0, [{"body": f"m{i}"} for i in range(3)])
    node.routes.update(route(9, [seg(0, "b2", 0, 3, "sealed", replicas=["b2", "b1"], in_sync=["b2", "b1"]),
                                 seg(1, "b1", 3, None, "active", 3)]))
    copy = node.pop.replica.states[KEY] = QueueState(KEY, 3, 0)
    copy.in_flight[1] = Delivery(7, 2, service_mod.now_ms() + 200)
    copy.in_flight[2] = Delivery(8, 5, 0, dead=True)

    async def lost(method, segment, path, json=None):
        raise ApiError("b2 does not answer", {"reason": "down"}, code="BROKER_UNAVAILABLE", status=503)
    monkeypatch.setattr(node.reader.peers, "request", lost)
    async with node.pop.locks.hold(KEY):
        st = await node.pop._state_for(KEY)
    assert st.in_flight[1].seq != 7 and st.in_flight[1].attempt == 2
    await until(lambda: 1 in st.ready and 2 not in st.in_flight)
    dead = (await node.pop.dlq.read("g", 0, 10))["messages"]
    assert [(m["origin_offset"], m["attempts"], m["body"]) for m in dead] == [(2, 5, "m2")]
    assert [(m.offset, m.attempt) for m in await pop(node, 5)] == [(1, 3)]


async def test_a_delivery_handed_over_on_its_last_attempt_is_not_dead_lettered_by_the_old_head(node, monkeypatch):
    """b1 handed its deliveries in flight to b2 (``freeze``: b2 adopted them with their attempts and deadlines) and
    keeps them until b2 confirms; b2's first confirmation is refused. The message on its last attempt comes due at b1
    meanwhile: it is b2's to dead-letter (b2 holds it with the same attempt and deadline), so b1 hands it over rather
    than copy it to its own DLQ too: dead-lettered at both, the group's DLQ held it twice."""
    base.max_attempts(node, "g", 1)
    await node.writer.send("t", 0, [{"body": "last"}])
    [m] = await pop(node, 1, invisible_ms=300)
    pushes = []

    async def request(method, segment, path, json=None):
        pushes.append(path.split("?")[0])
        raise base.ApiError("not ready", code="CATCHING_UP", status=503)
    monkeypatch.setattr(node.reader.peers, "request", request)
    node.routes.update(route(6, [seg(0, "b1", 0, 1, "sealed"), seg(1, "b2", 1, None, "active", 1)]))
    answer = await node.pop.freeze(KEY, 6, caller="b2")
    assert [o for o, *_ in answer["deliveries"]] == [0]
    await asyncio.sleep(0.6)                     # past its deadline, while b2 has not confirmed
    st = node.pop.states[KEY]
    assert node.pop.dead_lettered == 0 and not st.in_flight[0].dead, "b2 decides, not b1"
    assert 0 in st.ready and pushes, "due here means: hand it over"
