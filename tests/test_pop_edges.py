"""Pop's small promises at their edges (broker/pop): handles at their bounds and in their pinned format, one queue's
state at a deadline exactly now and across a write of the journal, group settings at their bounds, the revive
scheduler's and the long poll's wake-ups, the refusals a client reads word for word, and the service's choices
(which state a freeze answers with, which delivery a topic-wide ordered pop takes, what is on disk before an answer).
The pure parts directly; PopService on a real broker node in this process (tests/support/pop_node.py)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from broker.codec import messages
from broker.pop import journal as journal_mod
from broker.pop import params
from broker.pop import service as service_mod
from broker.pop import settings as settings_mod
from broker.pop.handles import Handle, HandleCodec
from broker.pop.keyed_locks import KeyedLocks
from broker.pop.limits import DELIVERY_WRITE_DELAY_MS, HANDLE_CHARS_MAX
from broker.pop.revive import Reviver
from broker.pop.settings import GroupSettings
from broker.pop.state import DONE, UNKNOWN, Delivery, QueueState, replay_line
from broker.pop.wakeup import TopicSignals
from broker.storage.errors import UnsupportedFormat
from broker.storage import lines
from tests.support import pop_node as base
from tests.support.pop_edges import Clock, signed
from wire.errors import ApiError

node = base.node          # b1 heading queue 0 of topic t, its pop service started
KEY, seg, route, pop, until = base.KEY, base.seg, base.route, base.pop, base.until
SECRET = b"a secret of exactly 32 bytes...."


# -- handles ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("handle, raw", [
    (Handle("qaW", 3, 17, (5 << 32) | 9), "3.17.21474836489.cWFX.npx62BQhJb9vAjRs_Yjbrg"),
    (Handle("t", 0, 0, 1), "0.0.1.dA.GTQDXot24fVQ8_scLXZ4-A"),
])
def test_a_handle_keeps_its_format_so_handles_made_before_an_upgrade_still_verify(handle, raw):
    """``<queue>.<offset>.<seq>.<base64url(topic), unpadded>.<16-byte MAC, unpadded>``, the MAC over the group, a NUL
    and the rest: the secret outlives the broker's version, and so must every handle a client still holds."""
    codec = HandleCodec(SECRET)
    assert codec.encode("g", handle) == raw
    assert codec.decode("g", raw) == handle


def handle_of_length(codec: HandleCodec, chars: int) -> str:
    for n in range(700, 800):
        for digits in range(1, 8):
            raw = codec.encode("g", Handle("t" * n, 0, 10 ** (digits - 1), 1))
            if len(raw) == chars:
                return raw
    raise AssertionError(f"no handle of {chars} characters")


def test_a_handle_of_exactly_the_bound_decodes_and_one_character_more_does_not():
    codec = HandleCodec(SECRET)
    at = handle_of_length(codec, HANDLE_CHARS_MAX)
    assert codec.decode("g", at) is not None
    past = handle_of_length(codec, HANDLE_CHARS_MAX + 1)
    assert codec.decode("g", past) is None


def test_a_signed_handle_with_bad_numbers_or_fields_is_malformed_not_an_error():
    """Numbers of at most 20 ASCII digits, four dots: anything else is None even behind a valid MAC."""
    codec = HandleCodec(SECRET)
    assert codec.decode("g", signed(codec, "g", "0.%s.1.dA" % ("9" * 20))) == Handle("t", 0, 10 ** 20 - 1, 1)
    for body in ("0.%s.1.dA" % ("1" * 21), "0.x.1.dA", "0.1x.1.dA", "0.-1.1.dA", "0..1.dA", "1.2.3.4.dA", "1.2.dA"):
        assert codec.decode("g", signed(codec, "g", body)) is None, body


def test_the_group_field_of_a_change_of_invisible_time_is_named_in_its_refusal():
    with pytest.raises(ApiError) as e:
        params.invisible_request({"handle": "h", "invisible_ms": 1000})
    assert (e.value.status, e.value.code, e.value.message, e.value.details) == (
        400, "INVALID_ARGUMENT", "group must be 1-255 characters of valid Unicode", {"field": "group"})


# -- one queue's state -------------------------------------------------------------------------------------------------

def written(n: int) -> QueueState:
    """``n`` first deliveries (seq 100 + offset, deadline 1000), written to the journal."""
    st = QueueState(KEY, 0)
    for o in range(n):
        st.deliver_new(o, 100 + o, 0, 1000)
    st.take_line(DELIVERY_WRITE_DELAY_MS)
    return st


def replayed(*journal: list | None) -> QueueState:
    states: dict = {}
    for line in journal:
        if line is not None:
            replay_line(states, json.loads(json.dumps(line)))
    return states[KEY]


def test_the_pop_offset_itself_was_never_delivered():
    st = written(2)
    assert st.check(1, 101) != UNKNOWN
    assert st.check(2, 1) == UNKNOWN, "the pop offset: not handed out yet"
    st.ack(1)
    assert st.check(1, 101) == DONE


@pytest.mark.parametrize("change", ["redeliver", "change_invisible"])
def test_a_written_delivery_given_a_new_handle_then_acked_is_removed_from_the_journal(change):
    st = written(1)
    first = st.take_line(DELIVERY_WRITE_DELAY_MS + 1, force=True)
    if change == "redeliver":
        assert st.expire(0, 100, 1000, 16) == "ready"
        st.redeliver(0, 200, 1000, 1000)
    else:
        st.change_invisible(0, 200, 5000)
    st.ack(0)                                  # before the new record is written
    line = st.take_line(DELIVERY_WRITE_DELAY_MS + 2)
    assert line is not None and line[8] == [0], "its written record removed"
    assert replayed(first, line).in_flight == {}


def test_a_due_delivery_given_more_invisible_time_is_no_longer_due():
    st = written(1)
    assert st.expire(0, 100, 1000, 16) == "ready" and list(st.ready) == [0]
    st.change_invisible(0, 200, 5000)
    assert not st.ready and st.in_flight[0].deadline_ms == 5000


def test_a_delivery_handed_over_then_dead_at_its_deadline_is_no_longer_ready():
    st = written(2)
    st.hand_over_all()                         # frozen: every delivery is to go to the head, due or not
    assert list(st.ready) == [0, 1]
    assert st.expire(0, 100, 1000, 1) == "dead"
    assert list(st.ready) == [1] and st.in_flight[0].dead


def test_an_adopted_delivery_whose_deadline_is_exactly_now_is_due_at_once():
    st = QueueState(KEY, 5, 1)
    st.adopt(1, 7, 2, 3000, deadline_ms=3000)
    st.adopt(2, 8, 2, 3000, deadline_ms=3001)
    assert list(st.ready) == [1]
    assert (st.in_flight[1].deadline_ms, st.in_flight[2].deadline_ms) == (3000, 3001)


def test_a_delivery_whose_deadline_is_exactly_now_is_neither_invisible_nor_blocking():
    st = QueueState(KEY, 0)
    st.deliver_new(0, 1, 0, 1000)
    assert st.invisible_count(999) == 1 and st.blocked(999)
    assert st.invisible_count(1000) == 0 and not st.blocked(1000)


def test_a_compacted_line_marks_dead_deliveries_1_and_the_others_0():
    st = written(2)
    assert st.expire(1, 101, 1000, 1) == "dead"
    st.take_line(DELIVERY_WRITE_DELAY_MS + 1, force=True)
    full = st.full_line()
    assert full[7] == [[0, 100, 1, 1000, 0], [1, 101, 1, 1000, 1]]
    back = replayed(full)
    assert (back.in_flight[0].dead, back.in_flight[1].dead) == (False, True)


def test_a_journal_of_stator_0_1_is_refused_by_name(tmp_path):
    path = tmp_path / "journal.log"
    path.write_bytes(lines.encode(["g", "t", 0, 1, 0, False, [], []]))
    with pytest.raises(UnsupportedFormat) as e:
        journal_mod.load(str(path))
    assert str(e.value) == (f"{path}: good line 1: a pop journal line of Stator 0.1 (8 fields; this build writes 9, "
                            "with moved_below)")


async def test_a_closed_journal_refuses_with_the_words_a_client_reads(tmp_path):
    path = str(tmp_path / "j.log")
    states, whole = journal_mod.load(path)
    j = journal_mod.Journal(path, states, whole)
    await j.close()
    with pytest.raises(ApiError) as e:
        await j.durable()
    assert (e.value.status, e.value.code, e.value.message) == (
        503, "STORAGE_UNAVAILABLE", "the broker could not store the pop state: its journal failed or is closed, or "
                                    "the disk did not confirm in time")


# -- group settings, locks, wake-ups, the reviver ----------------------------------------------------------------------

def test_max_attempts_takes_its_largest_value_and_ignores_a_repeat_of_the_same_version():
    s = GroupSettings()
    s.apply({"group": "g", "version": 5, "config": {"max_attempts": settings_mod.MAX_ATTEMPTS_MAX}})
    assert s.max_attempts("g") == 1000
    s.apply({"group": "g", "version": 6, "config": {"max_attempts": settings_mod.MAX_ATTEMPTS_MAX + 1}})
    assert s.max_attempts("g") == 1000
    s.apply({"group": "g", "version": 6, "config": {"max_attempts": 3}})
    s.apply({"group": "g", "version": 6, "config": {"max_attempts": 9}})
    assert s.max_attempts("g") == 3, "the same version again changes nothing"


def test_groups_past_the_remembered_bound_keep_the_default_and_known_ones_still_change(monkeypatch):
    monkeypatch.setattr(settings_mod, "GROUPS_REMEMBERED_MAX", 2)
    s = GroupSettings()
    for i, g in enumerate(("a", "b", "c")):
        s.apply({"group": g, "version": 1, "config": {"max_attempts": 3 + i}})
    assert [s.max_attempts(g) for g in "abc"] == [3, 4, 16]
    s.apply({"group": "a", "version": 2, "config": {"max_attempts": 7}})
    assert s.max_attempts("a") == 7


async def test_a_lock_found_busy_tells_its_release_and_one_never_asked_about_does_not():
    freed = []
    locks = KeyedLocks(freed.append)
    assert not locks.busy(KEY)
    async with locks.hold(KEY):
        pass
    assert freed == []
    async with locks.hold(KEY):
        assert locks.busy(KEY)
    assert freed == [KEY]


async def test_every_pop_parked_on_a_topic_is_woken_by_one_notify():
    s = TopicSignals()
    stamp = s.stamp("t")
    parked = [asyncio.create_task(s.wait("t", stamp, 5.0)) for _ in range(3)]
    await asyncio.sleep(0.02)
    s.notify("t")
    await asyncio.wait_for(asyncio.gather(*parked), 1.0)


async def test_a_deadline_before_every_other_wakes_the_reviver_at_once_on_an_empty_heap_too():
    """The reviver sleeps up to IDLE_WAKE_S (1 s) or to its earliest deadline; a new earlier one must cut that
    short. Deadlines and numbers as a broker makes them (ms since 1970, the incarnation in the high bits)."""
    clock = [1_700_000_000_000]
    fired = []
    rv = Reviver(lambda key, offset, seq: fired.append(offset), now_ms=lambda: clock[0])
    rv.start()
    try:
        await asyncio.sleep(0.05)                             # parked on an empty heap
        rv.schedule(clock[0], KEY, 1, (1 << 32) | 1)
        await until(lambda: fired == [1], 0.5)
        rv.schedule(clock[0] + 60_000, KEY, 2, (1 << 32) | 2)
        await asyncio.sleep(0.05)                             # parked until the next idle wake
        rv.schedule(clock[0], KEY, 3, (1 << 32) | 3)
        await until(lambda: fired == [1, 3], 0.5)
    finally:
        await rv.stop()


# -- the service: pops -------------------------------------------------------------------------------------------------

async def test_a_long_poll_parks_for_exactly_its_wait_and_a_wait_of_0_never_parks(node, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(service_mod, "time", clock.module())
    parks = []

    async def wait(topic, stamp, timeout_s):
        parks.append(timeout_s)
        clock.now += max(timeout_s, 0.001)    # the wait passes whole (a mutant parking for 0 still moves on)
    monkeypatch.setattr(node.pop.signals, "wait", wait)
    assert await node.pop.pop("t", "g", 1, 60_000, 0, False, 0) == []
    assert parks == []
    assert await node.pop.pop("t", "g", 1, 60_000, 0, False, 1000) == []
    assert parks == [1.0], "one park of the whole wait, then an answer with none left"


async def test_the_last_delivery_number_of_an_incarnation_is_used_and_none_past_it(node):
    await node.writer.send("t", 0, [{"body": "a"}, {"body": "b"}])
    node.pop._seq = (1 << service_mod.SEQ_BITS) - 2
    [a] = await pop(node, 1)
    assert node.pop.codec.decode("g", a.handle).seq == node.pop._seq_base | ((1 << service_mod.SEQ_BITS) - 1)
    with pytest.raises(AssertionError):
        await pop(node, 1)                # the next would reach into the incarnation's bits
    assert sorted(node.pop.states[KEY].in_flight) == [0]


async def test_a_pop_hands_out_each_message_s_stored_payload(node):
    await node.writer.send("t", 0, [{"body": "m0"}, {"body": "m1"}])
    stored = [m.payload for m in messages((await node.reader.read_history("t", 0, 0, 2))["messages"])]
    got = await pop(node, 2)
    assert [m.payload for m in got] == stored and b'"m1"' in stored[1]


async def test_a_pull_answer_starting_below_the_pop_offset_delivers_what_is_past_it(node, monkeypatch):
    await node.writer.send("t", 0, [{"body": f"m{i}"} for i in range(3)])
    assert [m.offset for m in await pop(node, 1)] == [0]
    real = node.pop.reader.pull

    async def pull(topic, queue, offset, max_n, held_by=None):   # a read that starts one message early
        return await real(topic, queue, max(0, offset - 1), max_n + 1, held_by)
    monkeypatch.setattr(node.pop.reader, "pull", pull)
    assert [(m.offset, m.attempt) for m in await pop(node, 5)] == [(1, 1), (2, 1)]


async def test_a_topic_wide_ordered_pop_sends_a_due_batch_again_before_anything_new_on_another_queue(node):
    base.two_queues(node)
    await node.writer.send("t", 1, [{"body": "q1"}])
    assert len(await node.pop.pop("t", "g", 1, 50, 1, True, 0)) == 1
    await until(lambda: 0 in node.pop.states[("g", "t", 1)].ready)
    await node.writer.send("t", 0, [{"body": "q0"}])
    got = await node.pop.pop("t", "g", 1, 60_000, None, True, 0)
    assert [(m.queue, m.offset, m.attempt) for m in got] == [(1, 0, 2)]


async def test_deliveries_again_are_read_until_the_byte_budget_is_spent_to_its_last_byte(node, monkeypatch):
    await node.writer.send("t", 0, [{"body": f"m{i}"} for i in range(3)])
    got = await pop(node, 3, invisible_ms=50)
    assert (await node.pop.ack("g", [got[1].handle]))[0]["ok"]
    st = node.pop.states[KEY]
    await until(lambda: sorted(st.ready) == [0, 2])
    size = len(messages((await node.reader.read_history("t", 0, 0, 1))["messages"])[0].payload)
    monkeypatch.setattr(service_mod, "PULL_BYTES_MAX", size + 1)   # one byte left after offset 0: 2 is read too
    assert [(m.offset, m.attempt) for m in await pop(node, 5)] == [(0, 2), (2, 2)]


async def test_the_revive_heap_rebuilt_holds_only_the_deliveries_not_yet_due(node, monkeypatch):
    """Checked at every scheduling here: rebuilt once it holds more than 4 entries per delivery in flight plus
    HEAP_CHECK_EVERY, from the deliveries neither due nor dead."""
    monkeypatch.setattr(service_mod, "HEAP_CHECK_EVERY", 1)
    await node.writer.send("t", 0, [{"body": "a"}, {"body": "b"}])
    await pop(node, 1, invisible_ms=50)
    [b] = await pop(node, 1, invisible_ms=60_000)
    st = node.pop.states[KEY]
    await until(lambda: 0 in st.ready)
    await node.pop.reviver.stop()           # the heap as the service leaves it, nothing taken off it
    assert len(node.pop.reviver) == 1
    handle = b.handle
    for _ in range(8):
        handle = await node.pop.change_invisible("g", handle, 60_000)
    assert len(node.pop.reviver) == 9, "2 in flight: 9 entries are not more than 4 * 2 + 1"
    await node.pop.change_invisible("g", handle, 60_000)
    assert len(node.pop.reviver) == 1, "the 10th: rebuilt, without the due one"


# -- the service: what is on disk before an answer -----------------------------------------------------------------------

def on_disk(node) -> QueueState:
    return journal_mod.load(node.pop.journal.path)[0][KEY]


async def written_and_due(node, body: str = "m") -> QueueState:
    """One message popped, its delivery written at once (a change of invisible time) and due 50 ms later."""
    await node.writer.send("t", 0, [{"body": body}])
    [m] = await pop(node, 1)
    await node.pop.change_invisible("g", m.handle, 50)
    assert on_disk(node).in_flight[0].attempt == 1
    return node.pop.states[KEY]


async def test_a_delivery_again_of_a_written_delivery_is_on_disk_when_the_pop_is_answered(node):
    st = await written_and_due(node)
    await until(lambda: 0 in st.ready)
    [again] = await pop(node, 1)
    assert again.attempt == 2
    assert (on_disk(node).in_flight[0].attempt, on_disk(node).in_flight[0].seq) == (2, st.in_flight[0].seq)


async def test_a_written_delivery_past_its_attempts_is_dead_on_disk_before_it_is_read_for_the_dlq(node, monkeypatch):
    base.max_attempts(node, "g", 1)
    st = await written_and_due(node, "poison")
    marked = []
    real = node.pop.reader.read_history

    async def read_history(topic, queue, offset, max_n):
        marked.append(on_disk(node).in_flight[0].dead)
        return await real(topic, queue, offset, max_n)
    monkeypatch.setattr(node.pop.reader, "read_history", read_history)
    await until(lambda: not st.in_flight)
    assert marked == [True]


# -- the service: handles' verdicts ------------------------------------------------------------------------------------

async def test_a_change_of_invisible_time_with_a_bad_handle_is_refused_as_a_client_reads_it(node):
    with pytest.raises(ApiError) as e:
        await node.pop.change_invisible("g", "nope", 1000)
    assert (e.value.status, e.value.code, e.value.message) == (
        400, "INVALID_HANDLE", "the handle is malformed or unknown to this broker: not made by this broker for this "
                               "group, or never delivered")


async def test_a_handle_newer_than_an_offset_s_last_delivery_is_invalid_and_an_older_one_expired(node):
    await node.writer.send("t", 0, [{"body": "m"}])
    [m] = await pop(node, 1)
    renewed = await node.pop.change_invisible("g", m.handle, 60_000)
    assert await node.pop.ack("g", [renewed]) == [{"handle": renewed, "ok": True}]
    last = node.pop.codec.decode("g", renewed)
    never = node.pop.codec.encode("g", last._replace(seq=last.seq + 1))
    assert await node.pop.ack("g", [m.handle, renewed, never]) == [
        {"handle": m.handle, "ok": False, "code": "HANDLE_EXPIRED"},
        {"handle": renewed, "ok": True},
        {"handle": never, "ok": False, "code": "INVALID_HANDLE"}]


async def test_an_ack_is_answered_when_the_route_no_longer_lists_the_gen_its_state_popped_under(node):
    await node.writer.send("t", 0, [{"body": "m"}])
    [m] = await pop(node, 1)
    node.routes.update(route(6, [seg(1, "b1", 0, None, "active")]))   # gen 0's segment gone from the route
    assert await node.pop.ack("g", [m.handle]) == [{"handle": m.handle, "ok": True}]


# -- the service: handover, freeze, stats ------------------------------------------------------------------------------

async def test_a_hint_to_a_new_head_names_a_group_with_a_slash_as_one_path_segment(node, monkeypatch):
    asked = []

    async def request(method, segment, path, json=None):
        asked.append((method, segment.broker, path))
        return {}
    monkeypatch.setattr(node.reader.peers, "request", request)
    await node.writer.send("t", 0, [{"body": "m"}])
    await pop(node, 1, group="g/1")
    node.routes.update(route(6, [seg(0, "b1", 0, 1, "sealed"), seg(1, "b2", 1, None, "active", 1)]))
    node.pop.hint_new_heads("t")
    await until(lambda: asked)
    assert asked == [("POST", "b2", "/v1/pop-takeover/g%2F1/t/0")]


def moved_to_b2(node, monkeypatch) -> None:
    """b1 remapped queue 0 to b2 (gen 1); b2 does not answer b1's pushes."""
    async def down(method, segment, path, json=None):
        raise ApiError("b2 does not answer", {"reason": "down"}, code="BROKER_UNAVAILABLE", status=503)
    monkeypatch.setattr(node.reader.peers, "request", down)
    node.routes.update(route(6, [seg(0, "b1", 0, 1, "sealed"), seg(1, "b2", 1, None, "active", 1)]))


def a_copy(next_offset: int, gen: int, offset: int) -> QueueState:
    copy = QueueState(KEY, next_offset, gen)
    copy.in_flight[offset] = Delivery(77, 2, service_mod.now_ms() + 60_000)
    return copy


async def test_a_freeze_asked_for_a_copy_of_its_own_gen_answers_its_own_state_and_keeps_the_copy(node, monkeypatch):
    await node.writer.send("t", 0, [{"body": "m"}])
    await pop(node, 1)                                        # b1's own state under gen 0: offset 0 in flight
    node.pop.replica.states[KEY] = a_copy(5, 0, 3)            # a copy of gen 0 too, not newer than its own
    moved_to_b2(node, monkeypatch)
    answer = await node.pop.freeze(KEY, 6, copy_of_gen=0)
    assert (answer["found"], answer["gen"], answer["next_offset"], [d[0] for d in answer["deliveries"]]) == (
        True, 0, 1, [0])
    assert KEY in node.pop.replica.states


async def test_a_freeze_asked_again_answers_without_another_journal_round(node, monkeypatch):
    await node.writer.send("t", 0, [{"body": "m"}])
    await pop(node, 1)
    moved_to_b2(node, monkeypatch)
    first = await node.pop.freeze(KEY, 6)
    rounds = []
    real = node.pop.journal.durable

    async def durable(confirm=()):
        rounds.append(confirm)
        await real(confirm)
    monkeypatch.setattr(node.pop.journal, "durable", durable)
    assert await node.pop.freeze(KEY, 6) == first
    assert rounds == [], "frozen and handed over already: nothing new to write"


async def test_a_copy_older_than_the_asker_s_state_is_taken_here_but_not_frozen_nor_answered(node, monkeypatch):
    async def down(method, segment, path, json=None):
        raise ApiError("down", {"reason": "down"}, code="BROKER_UNAVAILABLE", status=503)
    monkeypatch.setattr(node.reader.peers, "request", down)
    node.routes.update(route(6, [seg(0, "b1", 0, 2, "sealed"), seg(1, "b3", 2, 4, "sealed", 2),
                                 seg(2, "b2", 4, None, "active", 4)]))
    node.pop.replica.states[KEY] = a_copy(4, 1, 2)
    answer = await node.pop.freeze(KEY, 6, copy_of_gen=1, above_gen=2)
    assert answer["found"] is False
    st = node.pop.states[KEY]
    assert (st.gen, st.frozen, sorted(st.in_flight)) == (1, False, [2])


async def test_stats_of_one_group_count_due_and_dead_deliveries_as_the_revive_backlog(node):
    now = service_mod.now_ms()
    node.pop.states[("a", "t", 0)] = QueueState(("a", "t", 0), 0)
    st = node.pop.states[("b", "t", 0)] = QueueState(("b", "t", 0), 0)
    st.deliver_new(0, 1, 0, 1000)
    st.deliver_new(1, 2, 0, 1000)
    st.deliver_new(2, 3, now, 60_000)
    assert st.expire(0, 1, 1000, 16) == "ready" and st.expire(1, 2, 1000, 1) == "dead"
    assert node.pop.stats("b") == [{"group": "b", "topic": "t", "queue": 0, "pop_offset": 3, "in_flight": 3,
                                    "invisible": 1, "revive_backlog": 2, "frozen": False, "gen": 0}]


async def test_a_frozen_state_s_delivery_coming_due_after_its_handover_ended_is_handed_to_the_head_now(
        node, monkeypatch):
    """b1 froze its state for b2, whose adopt failed; the queue came back to b1 (the handover ends: the next pop
    here takes the state over), then moved on to b3 before any pop here. The delivery coming due is what hands it
    to b3: nothing else would (hint_new_heads skips a frozen state)."""
    monkeypatch.setattr(service_mod, "DLQ_RETRY_MS", 20)
    asked = []

    async def request(method, segment, path, json=None):
        asked.append((segment.broker, path, json))
        if segment.broker == "b2":
            raise ApiError("b2 does not answer", {"reason": "down"}, code="BROKER_UNAVAILABLE", status=503)
        return {"taken": 0}
    monkeypatch.setattr(node.reader.peers, "request", request)
    await node.writer.send("t", 0, [{"body": "m"}])
    await pop(node, 1, invisible_ms=800)
    node.routes.update(route(6, [seg(0, "b1", 0, 1, "sealed"), seg(1, "b2", 1, None, "active", 1)]))
    await node.pop.freeze(KEY, 6)
    await until(lambda: asked)
    node.routes.update(route(7, [seg(0, "b1", 0, 1, "sealed"), seg(1, "b2", 1, 1, "sealed", 1),
                                 seg(2, "b1", 1, None, "active", 1)]))
    await until(lambda: KEY not in node.pop._handing)
    node.routes.update(route(8, [seg(0, "b1", 0, 1, "sealed"), seg(1, "b2", 1, 1, "sealed", 1),
                                 seg(2, "b1", 1, 1, "sealed", 1), seg(3, "b3", 1, None, "active", 1)]))
    st = node.pop.states[KEY]
    assert sorted(st.in_flight) == [0], "still here, and due in under a second"
    await until(lambda: not st.in_flight, 5)
    assert asked[-1] == ("b3", "/v1/pop-adopt/g/t/0", {"deliveries": []})
