"""Pop's pure parts without processes: handles, one queue's state, the journal's lines and replay, the DLQ store,
group settings, request bounds. The broker-level behaviour is in tests/test_pop.py, on real processes."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from broker.pop import journal as journal_mod
from broker.pop import params
from broker.pop.dlq import DeadLetters
from broker.pop.handles import Handle, HandleCodec, load_secret
from broker.pop.limits import DELIVERY_WRITE_DELAY_MS, HANDLES_PER_ACK_MAX, INVISIBLE_MS_MIN, WAIT_MS_MAX
from broker.pop.settings import GroupSettings
from broker.pop.state import DONE, EXPIRED, LIVE, UNKNOWN, QueueState, replay_line
from wire.errors import ApiError, rejection
from tests.support.disk_errors import eio

KEY = ("g", "t", 0)


# -- handles -------------------------------------------------------------------------------------------------------

def test_a_handle_round_trips_and_anything_else_is_malformed(tmp_path):
    codec = HandleCodec(load_secret(str(tmp_path / "k")))
    h = Handle("tö/pic", 3, 17, (5 << 32) | 9)
    raw = codec.encode("g", h)
    assert codec.decode("g", raw) == h
    assert codec.decode("other", raw) is None, "a handle is bound to its group"
    body, _, mac = raw.rpartition(".")
    forged = body.replace(".17.", ".18.") + "." + mac
    for bad in (None, 7, "", "x", raw + "x", "A" + raw, body + ".", "." + mac, raw.replace(".", ".."), forged,
                body[:-2] + "AA." + mac, "\ud800", "x" * 5000, [raw], "\u0663" + raw[1:], "1.2.3.4.5"):
        assert codec.decode("g", bad) is None, bad
    assert HandleCodec(b"another secret of 32 bytes......").decode("g", raw) is None, "bound to its broker"


def test_the_secret_survives_a_restart(tmp_path):
    a = load_secret(str(tmp_path / "k"))
    assert load_secret(str(tmp_path / "k")) == a and len(a) == 32


# -- one queue's state ---------------------------------------------------------------------------------------------

def popped(n: int, now: int = 0, invisible: int = 1000) -> QueueState:
    st = QueueState(KEY, 0)
    for o in range(n):
        st.deliver_new(o, 100 + o, now, invisible)
    return st


def test_handles_are_live_until_acked_then_done_and_superseded_ones_expired():
    st = popped(3)
    assert st.check(0, 100) == LIVE
    assert st.check(0, 99) == EXPIRED, "an older delivery of the offset"
    assert st.check(0, 101) == UNKNOWN, "a delivery that never happened"
    assert st.check(5, 1) == UNKNOWN, "beyond the pop offset"
    st.ack(0)
    assert st.check(0, 100) == DONE
    st.change_invisible(1, 200, 5000)
    assert st.check(1, 101) == EXPIRED and st.check(1, 200) == LIVE


def test_expiry_makes_ready_then_dead_after_max_attempts_and_ignores_acked_or_superseded():
    st = popped(2)
    assert st.expire(0, 100, 999, 3) is None, "not before the deadline"
    assert st.expire(0, 100, 1000, 3) == "ready" and list(st.ready) == [0]
    d = st.redeliver(0, 300, 1000, 1000)
    assert d.attempt == 2 and not st.ready
    assert st.expire(0, 100, 5000, 3) is None, "a superseded delivery's deadline is ignored"
    st.ack(1)
    assert st.expire(1, 101, 5000, 3) is None, "an acked one too"
    assert st.expire(0, 300, 2000, 3) == "ready"
    st.redeliver(0, 301, 2000, 1000)
    assert st.expire(0, 301, 3000, 3) == "dead" and st.in_flight[0].dead and st.check(0, 301) == EXPIRED


def test_an_ordered_queue_is_blocked_while_any_delivery_is_invisible():
    st = popped(2)
    assert st.blocked(500)
    st.ack(0)
    assert st.blocked(500)
    st.ack(1)
    assert not st.blocked(500)


def test_a_pop_acked_within_the_write_delay_costs_no_delivery_record():
    st = popped(3, now=0)
    st.ack(0)
    st.ack(1)
    line = st.take_line(10)
    assert line is not None and line[3] == 2 and line[7] == [] and line[8] == [], \
        "only the pop offset up to the first unacked, unwritten delivery"
    assert st.take_line(20) is None
    line = st.take_line(DELIVERY_WRITE_DELAY_MS)
    assert line[3] == 3 and [u[0] for u in line[7]] == [2], "the unacked delivery is written once it is old enough"
    st.ack(2)
    assert st.take_line(DELIVERY_WRITE_DELAY_MS + 1)[8] == [2], "a written delivery needs its removal written"


def test_an_ack_above_unacked_fresh_deliveries_writes_them_so_the_pop_offset_can_pass_it():
    st = popped(4, now=0)
    st.ack(2)
    line = st.take_line(10)
    assert line[3] == 3 and [u[0] for u in line[7]] == [0, 1], \
        "the acked offset is below the written pop offset; the unacked ones below it are on disk"
    st.ack(3)
    assert st.take_line(20)[3] == 4 and st.take_line(30) is None


def test_replaying_the_lines_gives_the_written_state():
    st = popped(4, now=0)
    lines = [st.take_line(DELIVERY_WRITE_DELAY_MS)]
    st.ack(1)
    st.redeliver(2, 500, 1000, 2000) if st.expire(2, 102, 1000, 16) == "ready" else None
    st.deliver_new(4, 600, 2000, 1000)            # not written yet: the written pop offset stays at 4
    lines.append(st.take_line(2001))
    states = {}
    for line in lines:
        replay_line(states, json.loads(json.dumps(line)))
    back = states[KEY]
    assert back.next_offset == 4 and sorted(back.in_flight) == [0, 2, 3]
    assert back.in_flight[2].attempt == 2 and back.in_flight[2].seq == 500 and back.in_flight[2].written


def test_deliveries_dropped_then_taken_back_under_a_new_gen_survive_the_replay():
    """A head takes over a later state that adopted its own deliveries in flight: it drops its records of them and
    adopts the same offsets from the answer, all before one line is taken. Written with both the upserts and the
    removals of those offsets, the replay dropped them (the chaos runner, seed 6: b3 took back 8 deliveries of
    queue 0 that way, lost power, and they were never delivered again)."""
    st = popped(3, now=0)
    lines = [st.take_line(DELIVERY_WRITE_DELAY_MS)]
    st.drop_deliveries()
    st.gen = 2
    for offset in (0, 2):
        st.adopt(offset, 900 + offset, 1, DELIVERY_WRITE_DELAY_MS + 1, deadline_ms=5000)
    lines.append(st.take_line(DELIVERY_WRITE_DELAY_MS + 2))
    states = {}
    for line in lines:
        replay_line(states, json.loads(json.dumps(line)))
    assert sorted(states[KEY].in_flight) == sorted(st.in_flight) == [0, 2], "what memory holds, the replay holds"
    assert states[KEY].in_flight[2].seq == 902


@pytest.mark.parametrize("leave", ["hand_over_all", "drop_deliveries"])
def test_deliveries_that_leave_unacked_raise_moved_below_and_the_lines_keep_it(leave):
    """Offsets below moved_below may be delivered again by another head: a handle of one is never done here once
    the service's memory of its ack is gone (service.py ``_verdict``); a restart replays the mark."""
    st = popped(3, now=0)
    st.ack(0)
    lines = [st.take_line(DELIVERY_WRITE_DELAY_MS)]
    assert st.moved_below == 0
    getattr(st, leave)()
    assert st.moved_below == 3
    lines.append(st.take_line(DELIVERY_WRITE_DELAY_MS + 1))
    assert lines[-1] is not None, "the mark alone is a change to write"
    st.deliver_new(3, 200, 0, 1000)    # led again later: new deliveries above the mark are this state's own
    lines.append(st.take_line(DELIVERY_WRITE_DELAY_MS + 2, force=True))
    states = {}
    for line in lines:
        replay_line(states, json.loads(json.dumps(line)))
    assert (states[KEY].moved_below, states[KEY].next_offset) == (3, 4)
    assert QueueState(KEY, 9).full_line()[6] == 0


@pytest.mark.parametrize("bad", [[], ["g", "t", 0], ["g", "t", "0", 1, 0, False, 0, [], []],
                                 ["g", "t", 0, 1, 0, "no", 0, [], []], ["g", "t", 0, 1, 0, False, "0", [], []],
                                 ["g", "t", 0, 1, 0, False, 0, [[1]], []],
                                 ["g", "t", 0, 1, 0, False, [], []]])   # a line of 0.1's journal, without moved_below
def test_a_garbled_line_changes_nothing(bad):
    states = {}
    with pytest.raises((ValueError, TypeError, KeyError)):
        replay_line(states, bad)
    assert states == {}


async def test_a_copy_takes_a_new_leader_s_state_whole_and_drops_a_deposed_leader_s_late_lines(tmp_path):
    """The chaos runner, seed 13: a copy merged a new leader's lines into the old leader's state it held, so a
    delivery acked at the old leader (its line never reached the copy) stayed in flight there, and the copy, elected
    later, delivered it again."""
    from broker.pop.replica import ReplicaPopStore
    old = popped(3, now=0)                                        # gen 0: offsets 0, 1, 2 in flight
    store = ReplicaPopStore(str(tmp_path / "replica.log"))
    await store.apply("t", 0, 0, False, [old.take_line(DELIVERY_WRITE_DELAY_MS)])
    old.ack(1)                                                    # answered there; its line never reaches the copy
    new = QueueState(KEY, 3, 1)                                   # the next head's own state under gen 1
    new.adopt(2, 650, 1, 0)                                       # ... holding what it took over
    new.deliver_new(3, 700, 0, 1000)
    first = new.take_line(DELIVERY_WRITE_DELAY_MS)
    assert sorted(o for o, *_ in first[7]) == [2, 3], "the first line under a gen is whole"
    await store.apply("t", 0, 1, False, [first])
    assert (store.states[KEY].gen, sorted(store.states[KEY].in_flight)) == (1, [2, 3])
    await store.apply("t", 0, 0, False, [old.take_line(DELIVERY_WRITE_DELAY_MS + 1)])   # the deposed one, late
    assert (store.states[KEY].gen, sorted(store.states[KEY].in_flight)) == (1, [2, 3])
    store.close()
    again = ReplicaPopStore(str(tmp_path / "replica.log"))
    assert (again.states[KEY].gen, sorted(again.states[KEY].in_flight)) == (1, [2, 3]), "and so on replay"
    again.close()


async def test_a_snapshot_keeps_a_copy_of_an_older_head_s_state_its_leader_has_not_taken_over(tmp_path):
    """The chaos runner, seed 884: b2 held the only copy of gen 10's state; b3, leading gen 12 and not yet holding
    the group, sent b2 a snapshot as b2 joined its in-sync set, and the snapshot's reset dropped that copy. A reset
    drops the queue's states under the pushing leader's gen (or newer) only; the leader's own line replaces the
    older one once it has taken the group over."""
    from broker.pop.replica import ReplicaPopStore
    old = popped(3, now=0)                                        # gen 0's state, copied here
    store = ReplicaPopStore(str(tmp_path / "replica.log"))
    await store.apply("t", 0, 0, False, [old.take_line(DELIVERY_WRITE_DELAY_MS)])
    other = QueueState(("g2", "t", 0), 5, 1)                      # another group, copied from gen 1's leader
    other.deliver_new(5, 900, 0, 1000)
    await store.apply("t", 0, 1, False, [other.take_line(DELIVERY_WRITE_DELAY_MS)])
    await store.apply("t", 0, 1, True, [])                        # gen 1's leader holds nothing of the queue now
    assert store.states[KEY].gen == 0 and ("g2", "t", 0) not in store.states, \
        "the older head's copy kept, the pushing leader's own dropped"
    store.close()
    again = ReplicaPopStore(str(tmp_path / "replica.log"))
    assert sorted(again.states) == [KEY], "and so on replay"
    new = QueueState(KEY, 3, 1)                                   # gen 1's leader takes the group over
    await again.apply("t", 0, 1, True, [new.take_line(DELIVERY_WRITE_DELAY_MS)])
    assert (again.states[KEY].gen, again.states[KEY].next_offset) == (1, 3)
    again.close()


def test_a_reset_line_of_0_1_without_its_gen_is_refused_by_name(tmp_path):
    from broker.pop.replica import ReplicaPopStore
    from broker.storage import lines
    from broker.storage.errors import UnsupportedFormat
    path = tmp_path / "replica.log"
    path.write_bytes(lines.encode(["R", "t", 0]))
    with pytest.raises(UnsupportedFormat):
        ReplicaPopStore(str(path))


async def test_a_push_that_waited_for_the_store_while_a_failover_made_this_broker_the_head_is_refused(tmp_path):
    """The chaos runner, seed 49: a push from the deposed leader passed the gen check, then waited for the store's
    lock; meanwhile the route made this broker the head and its takeover took the copy's state. Applied after, the
    acks it carried landed in a state nobody takes again, and the deposed leader answered them ok. The check runs
    again under the lock (PopService.receive_copy passes it), so the push is refused and nothing is applied."""
    from broker.pop.replica import ReplicaPopStore
    old = popped(3, now=0)
    store = ReplicaPopStore(str(tmp_path / "replica.log"))
    await store.apply("t", 0, 0, False, [old.take_line(DELIVERY_WRITE_DELAY_MS)])
    old.ack(1)
    moved = []

    def still_a_copy():
        if moved:
            raise rejection(409, "NOT_LEADER", "a newer head is known here")
    async with store._lock:   # an earlier push still being written
        late = asyncio.create_task(store.apply("t", 0, 0, False, [old.take_line(DELIVERY_WRITE_DELAY_MS + 1)],
                                               still_a_copy))
        await asyncio.sleep(0.01)
        moved.append(True)      # the failover's route, then the takeover
        taken = store.take(KEY)
    with pytest.raises(ApiError) as e:
        await late
    assert e.value.code == "NOT_LEADER"
    assert sorted(taken.in_flight) == [0, 1, 2] and KEY not in store.states, "the late line applied nowhere"
    store.close()


def test_a_state_taken_over_under_a_new_gen_writes_every_delivery_in_its_next_line():
    st = popped(2, now=0)
    st.take_line(DELIVERY_WRITE_DELAY_MS)
    assert st.take_line(DELIVERY_WRITE_DELAY_MS + 1) is None
    st.gen = 1
    assert sorted(o for o, *_ in st.take_line(DELIVERY_WRITE_DELAY_MS + 2)[7]) == [0, 1]


# -- the journal ---------------------------------------------------------------------------------------------------

async def test_the_journal_writes_rounds_replays_them_and_cuts_a_torn_tail(tmp_path):
    path = str(tmp_path / "j.log")
    clock = [0]
    states, whole = journal_mod.load(path)
    j = journal_mod.Journal(path, states, whole, now_ms=lambda: clock[0])
    st = states[KEY] = popped(3)
    j.touch(KEY)
    clock[0] = DELIVERY_WRITE_DELAY_MS
    await j.round()
    st.ack(0)
    j.touch(KEY)
    await j.round()
    await j.close()
    with open(path, "ab") as f:
        f.write(b'["g","t",0,9,0,false,[],[')      # a torn last line: never acknowledged
    states, whole = journal_mod.load(path)
    assert sorted(states[KEY].in_flight) == [1, 2] and states[KEY].next_offset == 3
    j = journal_mod.Journal(path, states, whole)
    await j.close()
    assert open(path, "rb").read().endswith(b"\n")


async def test_compaction_keeps_exactly_the_durable_state(tmp_path, monkeypatch):
    monkeypatch.setattr(journal_mod, "COMPACT_AFTER_LINES", 5)
    path = str(tmp_path / "j.log")
    states, whole = journal_mod.load(path)
    j = journal_mod.Journal(path, states, whole, now_ms=lambda: 10_000)
    st = states[KEY] = QueueState(KEY, 0)
    for o in range(20):
        st.deliver_new(o, o + 1, 0, 60_000)
        if o % 2:
            st.ack(o - 1)
        j.touch(KEY)
        await j.round()
    await j.close()
    assert len(open(path, "rb").read().splitlines()) < 20, "compacted"
    back, _ = journal_mod.load(path)
    assert sorted(back[KEY].in_flight) == [o for o in range(20) if o % 2 or o == 19] and back[KEY].next_offset == 20


async def test_a_failed_disk_fails_the_waiters_instead_of_acknowledging(tmp_path, monkeypatch):
    path = str(tmp_path / "j.log")
    states, whole = journal_mod.load(path)
    j = journal_mod.Journal(path, states, whole)
    states[KEY] = popped(1)
    j.touch(KEY)
    monkeypatch.setattr(j, "_write", eio)
    j.start()
    with pytest.raises(ApiError) as e:
        await j.durable()
    assert (e.value.status, e.value.code) == (503, "STORAGE_UNAVAILABLE")
    with pytest.raises(ApiError):
        await j.durable()
    j._closed = True
    j._task.cancel()
    os.close(j._fd)


# -- the DLQ, settings, bounds ---------------------------------------------------------------------------------------

async def test_dead_letters_are_read_back_by_group_with_their_origin(tmp_path):
    d = DeadLetters(str(tmp_path / "dlq"))
    msg = b'{"key":"k","props":{},"body":"hello"}'
    await d.append("g/ü", [{"topic": "t", "queue": 1, "origin_offset": 7, "attempts": 16, "message": msg}], 5)
    got = await d.read("g/ü", 0, 10)
    assert got["messages"] == [{"offset": 0, "topic": "t", "queue": 1, "origin_offset": 7, "attempts": 16,
                                "key": "k", "props": {}, "ts": 5, "body": "hello"}] and got["next_offset"] == 1
    assert (await d.read("other", 0, 10))["messages"] == []
    assert d.holds("g/ü", "t", 1, 7) and not d.holds("g/ü", "t", 1, 8)
    d.close()
    assert DeadLetters(str(tmp_path / "dlq")).sizes == {"g/ü": 1}


def test_group_settings_follow_newer_events_and_default_to_16():
    s = GroupSettings()
    assert s.max_attempts("g") == 16
    s.apply({"group": "g", "version": 5, "config": {"max_attempts": 3}})
    s.apply({"group": "g", "version": 4, "config": {"max_attempts": 9}})
    s.apply({"group": "g", "version": 6, "config": {"max_attempts": 0}})
    s.apply({"group": "g", "version": 7})
    assert s.max_attempts("g") == 3


@pytest.mark.parametrize("body", [
    {}, {"group": ""}, {"group": 5}, {"group": "g", "max": 0}, {"group": "g", "max": 1001}, {"group": "g", "max": "3"},
    {"group": "g", "max": 1.0}, {"group": "g", "max": True}, {"group": "g", "invisible_ms": INVISIBLE_MS_MIN - 1},
    {"group": "g", "invisible_ms": 12 * 3600 * 1000 + 1}, {"group": "g", "wait_ms": WAIT_MS_MAX + 1},
    {"group": "g", "wait_ms": -1}, {"group": "g", "queue": -1}, {"group": "g", "order": "yes"},
])
def test_pop_parameters_out_of_bounds_are_400(body):
    with pytest.raises(ApiError) as e:
        params.pop_request(body)
    assert (e.value.status, e.value.code) == (400, "INVALID_ARGUMENT")


def test_pop_defaults_and_ack_bounds():
    p = params.pop_request({"group": "g"})
    assert (p.max, p.invisible_ms, p.queue, p.order, p.wait_ms) == (32, 60_000, None, False, 0)
    for bad in ({"group": "g", "handles": []}, {"group": "g", "handles": "h"},
                {"group": "g", "handles": ["h"] * (HANDLES_PER_ACK_MAX + 1)}):
        with pytest.raises(ApiError):
            params.ack_request(bad)


def test_the_brokers_openapi_spec_names_every_route_it_serves(tmp_path):
    from broker.api.app import make_app
    from broker.api.openapi import SPEC
    from broker.config import BrokerConfig
    app = make_app(BrokerConfig(broker="x", data_dir=str(tmp_path), http_host="127.0.0.1", http_port=1,
                                meta_urls=(), token="t", client_token="c"))
    served = {(r.method.lower(), r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"}
    assert served == {(m, path) for path, ops in SPEC["paths"].items() for m in ops}


async def test_a_notify_between_a_look_and_a_park_is_not_lost():
    from broker.pop.wakeup import TopicSignals
    s = TopicSignals()
    stamp = s.stamp("t")
    s.notify("t")                     # lands after the look, before the park
    started = time.monotonic()
    await s.wait("t", stamp, 5.0)
    assert time.monotonic() - started < 1.0
    stamp = s.stamp("t")
    waiting = asyncio.create_task(s.wait("t", stamp, 5.0))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    s.notify("other")
    await asyncio.sleep(0.05)
    assert not waiting.done(), "another topic's notify does not wake it"
    s.notify("t")
    await asyncio.wait_for(waiting, 1.0)


# -- request bodies (broker/pop/params.py) ----------------------------------------------------------------------------

def refusal(parse, body) -> tuple[int, str, dict]:
    with pytest.raises(ApiError) as e:
        parse(body)
    return e.value.status, e.value.message, e.value.details


def test_a_pop_request_takes_its_defaults_and_every_bound_inclusive():
    from broker.pop.limits import (INVISIBLE_MS_DEFAULT, INVISIBLE_MS_MAX, INVISIBLE_MS_MIN, POP_MESSAGES_MAX,
                                   WAIT_MS_MAX)
    assert params.pop_request({"group": "g"}) == params.PopRequest(
        group="g", max=32, invisible_ms=INVISIBLE_MS_DEFAULT, queue=None, order=False, wait_ms=0)
    low = params.pop_request({"group": "g" * 255, "max": 1, "invisible_ms": INVISIBLE_MS_MIN, "queue": 0,
                              "order": True, "wait_ms": 0})
    assert low == params.PopRequest("g" * 255, 1, INVISIBLE_MS_MIN, 0, True, 0)
    high = params.pop_request({"group": "g", "max": POP_MESSAGES_MAX, "invisible_ms": INVISIBLE_MS_MAX,
                               "queue": 2**31, "wait_ms": WAIT_MS_MAX})
    assert (high.max, high.invisible_ms, high.queue, high.wait_ms) == (POP_MESSAGES_MAX, INVISIBLE_MS_MAX, 2**31,
                                                                       WAIT_MS_MAX)
    for body, field, message in [
            ({"group": "g", "max": 0}, "max", "max must be within [1, 1000]"),
            ({"group": "g", "max": "3"}, "max", "max must be an integer within [1, 1000]"),
            ({"group": "g", "max": True}, "max", "max must be an integer within [1, 1000]"),
            ({"group": "g", "queue": 2**31 + 1}, "queue", "queue must be within [0, 2147483648]"),
            ({"group": "g", "queue": -1}, "queue", "queue must be within [0, 2147483648]"),
            ({"group": "g", "order": "yes"}, "order", "order must be true or false"),
            ({"group": "\ud800"}, "group", "group must be 1-255 characters of valid Unicode"),
            ({"group": "g" * 256}, "group", "group must be 1-255 characters of valid Unicode"),
            ({"group": ""}, "group", "group must be 1-255 characters of valid Unicode")]:
        assert refusal(params.pop_request, body) == (400, message, {"field": field}), body


def test_ack_invisible_dlq_and_adopt_bodies_are_bounded():
    from broker.pop.limits import HANDLES_PER_ACK_MAX, INVISIBLE_MS_MIN
    assert params.ack_request({"group": "g", "handles": ["h"]}) == ("g", ["h"])
    assert params.ack_request({"group": "g", "handles": ["h"] * HANDLES_PER_ACK_MAX})[1] == ["h"] * HANDLES_PER_ACK_MAX
    for handles in ([], ["h"] * (HANDLES_PER_ACK_MAX + 1), "h", None):
        assert refusal(params.ack_request, {"group": "g", "handles": handles}) == (
            400, "handles must be a list of 1 to 1000 handles", {"field": "handles", "limit": 1000})
    assert refusal(params.ack_request, {"handles": ["h"]})[2] == {"field": "group"}
    assert params.invisible_request({"group": "g", "handle": "h", "invisible_ms": INVISIBLE_MS_MIN}) == (
        "g", "h", INVISIBLE_MS_MIN)
    assert refusal(params.invisible_request, {"group": "g", "handle": "h"}) == (
        400, "invisible_ms is required", {"field": "invisible_ms"})
    assert params.dlq_query({}) == (0, 32) and params.dlq_query({"offset": "7", "max": "1000"}) == (7, 1000)
    assert refusal(params.dlq_query, {"max": "1001"}) == (400, "max must be within [1, 1000]", {"field": "max"})
    assert refusal(params.dlq_query, {"offset": "-1"})[2] == {"field": "offset"}
    assert params.adopt_request({"deliveries": [[0, 0], [2**62 - 1, 3]]}) == [[0, 0], [2**62 - 1, 3]]
    assert params.adopt_request({"deliveries": [[1, 1]] * 100_000}) == [[1, 1]] * 100_000
    assert params.adopt_request({"deliveries": [[1, 2, 2**62 - 1]]}) == [[1, 2, 2**62 - 1]], "with its deadline"
    for bad in (None, [[1, 2**62]], [[-1, 0]], [[1]], [[1, 2, 3, 4]], [[1, 2, -3]], [(1, 2)], [[1, True]],
                [[1, 1]] * 100_001):
        assert refusal(params.adopt_request, {"deliveries": bad}) == (
            400, "deliveries must be a list of [offset, attempt] or [offset, attempt, deadline_ms]", {}), \
            str(bad)[:40]


async def test_a_push_of_lines_that_are_not_its_queue_s_pop_lines_is_refused_whole(tmp_path):
    from broker.pop.replica import ReplicaPopStore
    path = tmp_path / "replica.log"
    store = ReplicaPopStore(str(path))
    good = popped(2).take_line(DELIVERY_WRITE_DELAY_MS)
    other_queue = QueueState(("g", "t", 1), 0)
    other_queue.deliver_new(0, 5, 0, 1000)
    for pushed, message in (([good, ["g", "t", 0, "x"]], "a pushed line is not a pop journal line"),
                            ([good, other_queue.take_line(DELIVERY_WRITE_DELAY_MS)],
                             "a pushed line names t/1, not t/0")):
        with pytest.raises(ApiError) as e:
            await store.apply("t", 0, 0, False, pushed)
        assert (e.value.status, e.value.code, e.value.message) == (400, "INVALID_ARGUMENT", message)
        assert store.states == {} and path.stat().st_size == 0, "nothing applied, nothing written"
    await store.apply("t", 0, 0, False, [good])
    assert sorted(store.states[KEY].in_flight) == [0, 1]
    store.close()


async def test_copies_of_more_pop_queues_than_the_bound_are_refused(tmp_path, monkeypatch):
    from broker.pop import replica
    monkeypatch.setattr(replica, "POP_QUEUES_MAX", 2)
    store = replica.ReplicaPopStore(str(tmp_path / "replica.log"))

    def line(group: str) -> list:
        st = QueueState((group, "t", 0), 0)
        st.deliver_new(0, 7, 0, 1000)
        return st.take_line(DELIVERY_WRITE_DELAY_MS)
    await store.apply("t", 0, 0, False, [line("a"), line("b")])
    with pytest.raises(ApiError) as e:
        await store.apply("t", 0, 0, False, [line("a"), line("c")])
    assert (e.value.status, e.value.code, e.value.details) == (409, "TOO_MANY_POP_QUEUES", {"limit": 2})
    assert sorted(store.states) == [("a", "t", 0), ("b", "t", 0)]
    await store.apply("t", 0, 0, False, [line("b")])   # a key held already needs no room
    store.close()


async def test_a_replica_pop_file_that_failed_refuses_every_later_push(tmp_path, monkeypatch):
    from broker.pop.replica import ReplicaPopStore
    store = ReplicaPopStore(str(tmp_path / "replica.log"))

    monkeypatch.setattr(store, "_write", eio)
    line = popped(1).take_line(DELIVERY_WRITE_DELAY_MS)
    with pytest.raises(ApiError) as e:
        await store.apply("t", 0, 0, False, [line])
    assert (e.value.status, e.value.code, e.value.message) == (
        503, "STORAGE_UNAVAILABLE", "the replica pop state file failed")
    monkeypatch.undo()
    with pytest.raises(ApiError) as e:
        await store.apply("t", 0, 0, False, [line])
    assert (e.value.status, e.value.code, e.value.message) == (
        503, "STORAGE_UNAVAILABLE", "the replica pop state file failed; restart the broker")
    store.close()


async def test_the_replica_pop_file_is_rewritten_one_line_per_key_once_it_holds_many_more(tmp_path, monkeypatch):
    from broker.pop import replica
    from broker.storage import lines
    monkeypatch.setattr(replica, "COMPACT_AFTER_LINES", 5)
    path = tmp_path / "replica.log"
    store = replica.ReplicaPopStore(str(path))
    st = QueueState(KEY, 0)
    for o in range(5):                     # one line each: 5 lines, not yet more than the bound
        st.deliver_new(o, 100 + o, 0, 1000)
        await store.apply("t", 0, 0, False, [st.take_line(DELIVERY_WRITE_DELAY_MS * (o + 1))])
    assert len(lines.read(str(path)).values) == 5
    st.ack(0)
    await store.apply("t", 0, 0, False, [st.take_line(DELIVERY_WRITE_DELAY_MS * 10)])   # the sixth: compacted
    assert len(lines.read(str(path)).values) == 1 and store._lines == 1
    st.deliver_new(5, 200, 0, 1000)
    await store.apply("t", 0, 0, False, [st.take_line(DELIVERY_WRITE_DELAY_MS * 20)])   # appended after it
    store.close()
    again = replica.ReplicaPopStore(str(path))
    assert sorted(again.states[KEY].in_flight) == [1, 2, 3, 4, 5]
    assert len(lines.read(str(path)).values) == 2
    again.close()
