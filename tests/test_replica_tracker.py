"""The leader's view of its followers (broker/replication/leader.py), in process with the real route table: who is
lagging, who has caught up, and what a send waits for. The clock is the test's (each fetch and each look names its
time), so ten seconds of lag take no time."""

from __future__ import annotations

import asyncio

import pytest

from broker.replication import leader as leader_mod
from broker.replication.leader import LAG_MAX_S
from tests.support.replica_leader import Leader, failed_over, route
from wire import route as route_model


def test_a_follower_under_steady_load_stays_in_sync_though_the_leader_always_holds_more():
    lead = Leader(["b1", "b2", "b3"])
    now = 0.0
    lead.wanted(now)   # first sight: their times start now
    for step in range(int(3 * LAG_MAX_S)):
        held = lead.end
        lead.end += 10   # a send lands between any two fetches
        now = float(step)
        for f in ("b2", "b3"):
            lead.tracker.fetched(lead.head, f, held, 1, now)   # each holds what the leader held a moment ago
        assert lead.wanted(now) == [], f"a follower that keeps up was dropped at {now} s"


def test_a_follower_that_stops_leaves_after_the_lag_bound_and_comes_back_once_it_holds_the_high_watermark():
    lead = Leader(["b1", "b2", "b3"])
    lead.wanted(0.0)
    lead.end = 50
    lead.tracker.fetched(lead.head, "b2", 50, 1, 1.0)
    lead.tracker.fetched(lead.head, "b3", 20, 1, 1.0)
    assert lead.wanted(LAG_MAX_S - 1) == []
    lead.tracker.fetched(lead.head, "b2", 50, 1, LAG_MAX_S + 1)
    assert lead.wanted(LAG_MAX_S + 2) == [["b1", "b2"]]
    lead.routes.update(route(2, ["b1", "b2"]))
    lead.tracker.route_changed()
    assert lead.tracker.readable_end(lead.head) == 50   # b3 no longer counts
    lead.tracker.fetched(lead.head, "b3", 40, 1, LAG_MAX_S + 3)
    assert lead.wanted(LAG_MAX_S + 3) == [], "behind the high watermark: not yet"
    lead.tracker.fetched(lead.head, "b3", 50, 1, LAG_MAX_S + 4)
    assert lead.wanted(LAG_MAX_S + 4) == [["b1", "b2", "b3"]]
    assert lead.wanted(LAG_MAX_S + 5) == [["b1", "b2", "b3"]], "asked again until the route shows it"
    lead.end = 60
    assert lead.tracker.readable_end(lead.head) == 50, "a follower asked to be added counts at once"


async def test_a_send_waits_for_every_copy_in_sync_and_is_refused_below_min_insync(monkeypatch):
    lead = Leader(["b1", "b2", "b3"])
    lead.end = 10
    waiting = asyncio.ensure_future(lead.tracker.replicated(lead.head, 10))
    lead.tracker.fetched(lead.head, "b2", 10, 1, 0.0)
    await asyncio.sleep(0)
    assert not waiting.done(), "acknowledged before b3 held it"
    lead.tracker.fetched(lead.head, "b3", 10, 1, 0.0)
    await asyncio.wait_for(waiting, 1)
    lead.routes.update(route(2, ["b1"]))
    with pytest.raises(Exception) as refused:
        lead.tracker.check_writable(lead.head)
    assert getattr(refused.value, "code", None) == "NOT_ENOUGH_REPLICAS"
    monkeypatch.setattr(leader_mod, "REPLICATION_WAIT_S", 0.05)
    lead.routes.update(route(3, ["b1", "b2"]))
    lead.end = 20
    with pytest.raises(Exception) as timed_out:
        await lead.tracker.replicated(lead.head, 20)
    assert getattr(timed_out.value, "code", None) == "REPLICATION_UNCONFIRMED"


async def test_a_pull_at_the_elected_copy_while_it_seals_answers_its_copy_s_end(broker_node):
    """Between a failover and the elected copy's seal report, the queue's newest decided segment is the one being
    sealed, led by the lost broker and sealed here: a pull here answers from this copy (its end is the segment's
    end), never asks a holder list that leaves this broker out (it was empty: an IndexError, a 500)."""
    broker_node.routes.update(failed_over(5, lost="b2", elected="b1"))
    copy = broker_node.store.open_or_create("t.q0.g0", 0)
    copy.append([b'{"body":"a"}', b'{"body":"b"}'], 1)
    copy.flush()   # durable: a copy's end is what it holds on disk
    answer = await broker_node.reader.pull("t", 0, 0, 10)
    assert answer["max_offset"] == 2 and answer["next_offset"] == 2, answer
    assert sum(run.count for run in answer["messages"]) == 2, answer


def test_what_is_kept_of_a_head_goes_once_the_routes_no_longer_give_it_to_this_broker():
    lead = Leader(["b1", "b2", "b3"])
    lead.end = 5
    lead.tracker.fetched(lead.head, "b2", 5, 1, 0.0)   # no look at the in-sync set yet: only the fetch is kept
    moved = route(2, ["b1", "b2", "b3"])
    for seg in moved["queues"][0]["segments"]:   # the queue moved on: another broker leads gen 0's successor here
        seg.update(broker="b2", replicas=["b2", "b3"], in_sync=["b2", "b3"])
    moved["queues"][0] = route_model.queue_json(0, True, moved["queues"][0]["segments"])
    lead.routes.update(moved)
    lead.tracker.route_changed()
    kept = (lead.tracker._acked, lead.tracker._caught_up, lead.tracker._end_at_fetch, lead.tracker._hw,
            lead.tracker._adding, lead.tracker._waiters)
    assert all("t.q0.g0" not in table for table in kept), kept


def test_a_follower_registered_again_is_added_only_once_its_new_registration_holds_the_high_watermark():
    """Kafka's KIP-903: what the leader knew of a follower's copy before it registered again (a new disk) is void,
    and an addition names the registration the leader heard from (meta refuses another)."""
    lead = Leader(["b1", "b2"])
    lead.wanted(0.0)
    lead.end = 50
    lead.tracker.fetched(lead.head, "b2", 50, 1, 1.0)
    lead.tracker.fetched(lead.head, "b3", 50, 4, 1.0)
    [change] = lead.tracker.changes_wanted(1.0)
    assert (change["in_sync"], change["epochs"]) == (["b1", "b2", "b3"], {"b2": 1, "b3": 4})
    forgotten = []
    lead.tracker.on_new_follower_epoch = forgotten.append
    lead.tracker.fetched(lead.head, "b3", 0, 5, 2.0)   # back on an empty disk, registration 5
    assert forgotten == ["b3"] and lead.tracker.readable_end(lead.head) == 50
    assert lead.wanted(2.0) == [], "no longer asked for: its new copy holds nothing"
    lead.tracker.fetched(lead.head, "b3", 50, 5, 3.0)
    [change] = lead.tracker.changes_wanted(3.0)
    assert (change["in_sync"], change["epochs"]["b3"]) == (["b1", "b2", "b3"], 5)


def test_a_compacted_pop_journal_sends_each_led_queue_whole_to_its_copies_at_the_next_round():
    """broker/replication/pop_copies.py: a compaction brings every key up to date in the new file only; a delta line
    after it would move a copy's pop offset past deliveries it never got, so the next round sends snapshots."""
    from broker.pop.state import QueueState
    from broker.replication.pop_copies import PopCopies
    lead = Leader(["b1", "b2"])
    copies = PopCopies("b1", lead.routes, lead.tracker, peers=None)
    st = QueueState(("g", "t", 0), 7, 0)
    st.deliver_new(7, 1, 0, 60_000)   # popped, not written yet
    assert copies.collect({st.key: st}, [], 0)[1] == [], "nothing changed: nothing to push"
    copies.resync()
    extra, pushes, _ = copies.collect({st.key: st}, [], 0)
    assert [(p.copy, p.reset, p.waited) for p in pushes] == [("b2", True, True)]
    assert pushes[0].lines == [st.full_line()] and st.full_line()[7] == [[7, 1, 1, 60_000, 0]]
    assert extra and extra[0][3] == 8, "the delivery is written here too before the snapshot shows it"


async def test_a_journal_compaction_asks_the_copies_for_snapshots(tmp_path):
    from broker.pop.journal import Journal
    from broker.pop.state import QueueState
    st = QueueState(("g", "t", 0), 3, 0)
    journal = Journal(str(tmp_path / "journal.log"), {st.key: st}, -1)

    class Copies:
        resyncs = 0

        def resync(self) -> None:
            Copies.resyncs += 1
    journal.copies = Copies()
    await journal._compact()
    assert Copies.resyncs == 1
    journal.copies = None
    await journal.close()


async def test_a_pop_push_a_waited_copy_missed_is_in_doubt_when_the_head_moves_on_meanwhile(monkeypatch):
    """broker/replication/pop_copies.py: b2, waited for, does not take the round's lines; while the push retries,
    the head moves on (here a failover elects b2). The round (an ack in it) is answered REPLICATION_UNCONFIRMED, not
    ok: it used to return as if stored (the chaos runner, seed 7, after a remap: the ack answered ok, the old head
    wiped, and b2 delivered the message again from its copy)."""
    from broker.peers import Unreachable
    from broker.replication import pop_copies
    from broker.replication.pop_copies import PopCopies, Push
    from wire.errors import ApiError
    monkeypatch.setattr(pop_copies, "PUSH_RETRY_S", 0.01)
    lead = Leader(["b1", "b2"])
    calls = []

    class Peers:
        async def call(self, method, broker, address, path, body):
            calls.append(broker)
            if len(calls) == 2:
                lead.routes.update(failed_over(2, lost="b1", elected="b2"))
            raise Unreachable("ConnectionRefusedError")

    copies = PopCopies("b1", lead.routes, lead.tracker, Peers())
    line = ["g", "t", 0, 5, 0, False, 0, [], [4]]   # offset 4 acked
    with pytest.raises(ApiError) as e:
        await copies.push([Push(lead.head, "b2", [line], False, True)])
    assert e.value.code == "REPLICATION_UNCONFIRMED" and len(calls) == 2
    stale = PopCopies("b1", lead.routes, lead.tracker, Peers())
    await stale.push([Push(lead.routes.segments("t", 0)[0], "b3", [line], False, False)])   # not waited for: moot


async def test_an_ack_whose_queue_moved_away_before_its_round_is_in_doubt_not_ok(tmp_path):
    """broker/pop/journal.py with pop_copies.py: a round that finds the queue's head moved away from here writes the
    ack's line on this disk only (the copies refuse a deposed gen's leader), so the ack is answered
    REPLICATION_UNCONFIRMED, not ok. The chaos runner, seed 63: b1 answered acks ok just after a remap moved the
    queue on, then lost its disk before any head took them over, and b2 delivered them again from its copy. A wait
    that confirms nothing (a takeover, a dead letter) is answered ok; so is the same ack while b1 still leads."""
    from broker.pop.journal import Journal
    from broker.pop.state import QueueState
    from broker.replication.pop_copies import PopCopies
    from wire.errors import ApiError
    lead = Leader(["b1", "b2"])
    pushed = []

    class Peers:
        async def call(self, method, broker, address, path, body):
            pushed.append((broker, body["lines"]))

    st = QueueState(("g", "t", 0), 7, 0)
    for offset in (7, 8):
        st.deliver_new(offset, offset, 0, 60_000)
    journal = Journal(str(tmp_path / "journal.log"), {st.key: st}, -1)
    journal.copies = PopCopies("b1", lead.routes, lead.tracker, Peers())
    journal.start()
    try:
        st.ack(7)
        journal.touch(st.key)
        await asyncio.wait_for(journal.durable(confirm={("t", 0)}), 5)   # led here: pushed to b2, ok
        assert [b for b, _ in pushed] == ["b2"]
        lead.routes.update(failed_over(2, lost="b1", elected="b2"))
        st.ack(8)
        journal.touch(st.key)   # and, with no await between (as PopService.ack), the wait: one round has both
        with pytest.raises(ApiError) as e:
            await journal.durable(confirm={("t", 0)})
        assert e.value.code == "REPLICATION_UNCONFIRMED" and e.value.details["queue"] == 0
        journal.touch(st.key)
        await journal.durable()
        assert len(pushed) == 1, "a deposed head's lines go to no copy"
    finally:
        journal.copies = None
        await journal.close()
