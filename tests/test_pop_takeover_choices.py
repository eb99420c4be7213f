"""Which older state a new head's takeover of pop state starts from, whom it asks and when it refuses (broker/pop/
service.py ``_state_for``): the choices at their bounds -- a head that is not this broker's, the bound on pop queues
and the refusal a client reads, the bound on brokers asked, equal gens (a state known of the very gen a segment
names), the branches for gens this broker led, sealed, or whose leader was asked already. One real broker node (b1,
the ``node`` fixture of tests/support/pop_node.py); the other brokers answer through the stand-in of
tests/support/pop_copies.py.
"""

from __future__ import annotations

import pytest
import structlog

from broker.peers import Unreachable
from broker.pop import service as service_mod
from broker.pop.state import QueueState
from tests.support import pop_copies as peers_mod
from tests.support import pop_node as base
from wire.errors import ApiError

node = base.node
KEY, seg, route = base.KEY, base.seg, base.route
Peers, take_over, with_addresses = peers_mod.Peers, peers_mod.take_over, peers_mod.with_addresses


def found(gen: int, next_offset: int, deliveries: list | None = None) -> dict:
    return {"found": True, "gen": gen, "next_offset": next_offset, "deliveries": deliveries or []}


def asked_of(peers) -> list[tuple[str, str, str]]:
    """(own or copy, broker, the question's tail after the route version) of each question, in order."""
    return [(kind, broker, path.split("route_version=")[1].split("&", 1)[1] if "&" in path else "")
            for kind, _, broker, _, path in peers.asked]


# -- whose takeover it is ----------------------------------------------------------------------------------------------

async def test_a_broker_that_does_not_lead_the_head_takes_nothing_over_and_asks_nobody(node, monkeypatch):
    node.routes.update(with_addresses(route(6, [seg(0, "b1", 0, 5, "sealed"), seg(1, "b2", 5, None, "active", 5)])))
    peers = Peers(node, monkeypatch, own={"b1": found(0, 5)})
    assert await take_over(node) is None
    assert peers.asked == [] and KEY not in node.pop.states


async def test_a_head_here_without_a_logic_start_takes_nothing_over(node, monkeypatch):
    node.routes.update(with_addresses(route(6, [seg(0, "b2", 0, 5, "sealed"), seg(1, "b1", None, None, "active", 5)])))
    peers = Peers(node, monkeypatch, own={"b2": found(0, 5)})
    assert await take_over(node) is None
    assert peers.asked == [] and KEY not in node.pop.states


# -- the bound on pop queues -------------------------------------------------------------------------------------------

async def test_a_takeover_past_the_bound_on_pop_queues_is_refused_with_the_words_and_limit_a_client_reads(
        node, monkeypatch):
    monkeypatch.setattr(service_mod, "POP_QUEUES_MAX", 1)
    other = ("h", "t", 0)
    node.pop.states[other] = QueueState(other, 0, 0)
    peers = Peers(node, monkeypatch)
    with pytest.raises(ApiError) as e:
        await take_over(node)
    assert (e.value.status, e.value.code, e.value.message, e.value.details) == (
        409, "TOO_MANY_POP_QUEUES", "this broker keeps pop state of at most 1 (group, topic, queue)", {"limit": 1})
    assert peers.asked == [] and KEY not in node.pop.states


# -- the bound on brokers asked ----------------------------------------------------------------------------------------

async def test_older_heads_are_asked_until_the_brokers_known_pass_the_bound_and_one_more_at_exactly_the_bound(
        node, monkeypatch):
    """With at most 2 brokers' state known, b1 and b3 (gen 1's leader, holding nothing) make 2: gen 0's leader b2 is
    still asked, and its state is where b1 starts."""
    monkeypatch.setattr(service_mod, "HANDOVER_PEERS_MAX", 2)
    node.routes.update(with_addresses(route(9, [seg(0, "b2", 0, 5, "sealed"), seg(1, "b3", 5, 5, "sealed", 5),
                                                seg(2, "b1", 5, None, "active", 5)])))
    peers = Peers(node, monkeypatch, own={"b2": found(0, 4)})
    st = await take_over(node)
    assert [a[2] for a in peers.asked] == ["b3", "b2"]
    assert (st.gen, st.next_offset) == (2, 4)


# -- a state known of the very gen a segment names ---------------------------------------------------------------------

async def test_the_leader_of_the_gen_of_the_state_known_is_still_asked_and_frozen_though_its_answer_is_no_newer(
        node, monkeypatch):
    """b3, gen 2's leader, answers with gen 1's state (its own, older): gen 1's leader b2 is asked all the same, told
    which gen b1 knows; its answer of the same gen does not replace the one b1 has."""
    node.routes.update(with_addresses(route(9, [seg(0, "b4", 0, 1, "sealed"), seg(1, "b2", 1, 5, "sealed", 1),
                                                seg(2, "b3", 5, 5, "sealed", 5),
                                                seg(3, "b1", 5, None, "active", 5)])))
    peers = Peers(node, monkeypatch, own={"b3": found(1, 8), "b2": found(1, 5)})
    st = await take_over(node)
    assert asked_of(peers) == [("own", "b3", ""), ("own", "b2", "above_gen=1")]
    assert (st.gen, st.next_offset) == (3, 8), "the first answer of gen 1 stands"


async def test_a_gen_this_broker_led_whose_state_is_known_already_is_not_asked_of_its_copies(node, monkeypatch):
    node.routes.update(with_addresses(route(9, [seg(0, "b1", 0, 5, "sealed", replicas=["b1", "b4"], in_sync=["b1", "b4"]),
                                                seg(1, "b3", 5, 5, "sealed", 5),
                                                seg(2, "b1", 5, None, "active", 5)])))
    peers = Peers(node, monkeypatch, own={"b3": found(0, 8)}, copies={("b4", 0): found(0, 2)})
    st = await take_over(node)
    assert asked_of(peers) == [("own", "b3", "")]
    assert (st.gen, st.next_offset) == (2, 8)


async def test_a_gen_sealed_here_whose_state_is_known_already_starts_from_that_answer_not_from_the_copy_here(
        node, monkeypatch):
    node.routes.update(with_addresses(route(9, [seg(0, "b2", 0, 5, "sealed", sealer="b1"),
                                                seg(1, "b3", 5, 5, "sealed", 5),
                                                seg(2, "b1", 5, None, "active", 5)])))
    node.pop.replica.states[KEY] = QueueState(KEY, 3, 0)
    Peers(node, monkeypatch, own={"b3": found(0, 8)})
    st = await take_over(node)
    assert (st.gen, st.next_offset) == (2, 8)
    assert KEY in node.pop.replica.states, "the copy is not taken"


async def test_a_copy_here_of_the_gen_of_the_state_known_does_not_replace_it_when_the_leader_holds_nothing(
        node, monkeypatch):
    node.routes.update(with_addresses(route(9, [seg(0, "b4", 0, 1, "sealed"),
                                                seg(1, "b2", 1, 5, "sealed", 1, replicas=["b2", "b1"],
                                                    in_sync=["b2", "b1"]),
                                                seg(2, "b3", 5, 5, "sealed", 5),
                                                seg(3, "b1", 5, None, "active", 5)])))
    node.pop.replica.states[KEY] = QueueState(KEY, 3, 1)
    Peers(node, monkeypatch, own={"b3": found(1, 8)})
    st = await take_over(node)
    assert (st.gen, st.next_offset) == (3, 8)
    assert KEY in node.pop.replica.states, "the copy is not taken"


async def test_a_leader_answering_the_same_gen_as_the_state_known_does_not_replace_it_or_its_deliveries(
        node, monkeypatch):
    node.routes.update(with_addresses(route(9, [seg(0, "b4", 0, 1, "sealed"), seg(1, "b2", 1, 5, "sealed", 1),
                                                seg(2, "b3", 5, 5, "sealed", 5),
                                                seg(3, "b1", 5, None, "active", 5)])))
    Peers(node, monkeypatch, own={"b3": found(1, 8, [[6, 2, 0]]), "b2": found(1, 5, [[2, 1, 0]])})
    st = await take_over(node)
    assert (st.gen, st.next_offset, sorted(st.in_flight)) == (3, 8, [6])


# -- a gen this broker led, holding nothing of it ------------------------------------------------------------------------

def led_here_then_by_b2(copies: list[str]) -> dict:
    """b1 led gen 0 and gen 1 (gen 1's copies ``copies``), b2 gen 2, b1 heads gen 3."""
    return with_addresses(route(9, [seg(0, "b1", 0, 5, "sealed"),
                                    seg(1, "b1", 5, 5, "sealed", 5, replicas=["b1", *copies], in_sync=["b1", *copies]),
                                    seg(2, "b2", 5, 5, "sealed", 5),
                                    seg(3, "b1", 5, None, "active", 5)]))


async def test_a_gen_led_here_and_lost_is_asked_of_its_copies_though_an_older_state_here_has_a_larger_offset(
        node, monkeypatch):
    node.routes.update(led_here_then_by_b2(["b3"]))
    node.pop.states[KEY] = QueueState(KEY, 9, 0)
    peers = Peers(node, monkeypatch, copies={("b3", 1): found(1, 12)})
    st = await take_over(node)
    assert asked_of(peers) == [("own", "b2", "above_gen=0"), ("copy", "b3", "copy_of_gen=1&above_gen=0")]
    assert (st.gen, st.next_offset) == (3, 12)


async def test_a_copy_s_older_state_of_the_gen_already_held_here_is_not_taken_for_a_gen_led_here(node, monkeypatch):
    """b1 holds gen 0's state at offset 4; gen 1's copy b3 holds only gen 0's, at 7 (and a delivery): b1 goes on
    from its own."""
    node.routes.update(led_here_then_by_b2(["b3"]))
    node.pop.states[KEY] = QueueState(KEY, 4, 0)
    Peers(node, monkeypatch, copies={("b3", 1): found(0, 7, [[5, 1, 0]])})
    st = await take_over(node)
    assert (st.gen, st.next_offset, sorted(st.in_flight)) == (3, 4, [])


async def test_a_gen_led_here_settled_by_one_copy_is_not_held_back_by_another_that_does_not_answer(
        node, monkeypatch):
    node.routes.update(led_here_then_by_b2(["b3", "b4"]))
    node.pop.states[KEY] = QueueState(KEY, 4, 0)
    Peers(node, monkeypatch, copies={("b3", 1): {"found": False, "holds": ["t.q0.g1"]},
                                     ("b4", 1): Unreachable("down")})
    st = await take_over(node)
    assert (st.gen, st.next_offset) == (3, 4)


async def test_a_gen_led_here_whose_state_a_later_answer_holds_already_is_not_asked_of_its_copies(node, monkeypatch):
    node.routes.update(led_here_then_by_b2(["b3"]))
    peers = Peers(node, monkeypatch, own={"b2": found(1, 8)}, copies={("b3", 1): found(1, 2)})
    st = await take_over(node)
    assert asked_of(peers) == [("own", "b2", "")]
    assert (st.gen, st.next_offset) == (3, 8)


async def test_a_lost_leader_s_gen_starts_from_the_copy_held_here_though_an_older_state_here_has_a_larger_offset(
        node, monkeypatch):
    """b1 holds gen 0's state at offset 9 and, as gen 1's in-sync copy, gen 1's at 12; gen 1's leader b2 holds
    nothing: the copy, the newer state, is where b1 starts."""
    node.routes.update(with_addresses(route(9, [seg(0, "b1", 0, 5, "sealed"),
                                                seg(1, "b2", 5, 5, "sealed", 5, replicas=["b2", "b1"],
                                                    in_sync=["b2", "b1"]),
                                                seg(2, "b1", 5, None, "active", 5)])))
    node.pop.states[KEY] = QueueState(KEY, 9, 0)
    node.pop.replica.states[KEY] = QueueState(KEY, 12, 1)
    Peers(node, monkeypatch)
    st = await take_over(node)
    assert (st.gen, st.next_offset) == (2, 12)
    assert KEY not in node.pop.replica.states, "the copy is taken"


# -- a gen whose leader was asked already --------------------------------------------------------------------------------

def b2_led_gens_1_and_2(copies: list[str]) -> dict:
    return with_addresses(route(9, [seg(0, "b4", 0, 5, "sealed"),
                                    seg(1, "b2", 5, 5, "sealed", 5, replicas=["b2", *copies], in_sync=["b2", *copies]),
                                    seg(2, "b2", 5, 5, "sealed", 5, replicas=["b2", *copies], in_sync=["b2", *copies]),
                                    seg(3, "b1", 5, None, "active", 5)]))


async def test_an_empty_leader_s_older_gen_is_asked_of_its_copies_though_the_state_here_has_a_larger_offset(
        node, monkeypatch):
    node.routes.update(b2_led_gens_1_and_2(["b3"]))
    node.pop.states[KEY] = QueueState(KEY, 9, 0)
    peers = Peers(node, monkeypatch, copies={("b3", 1): found(1, 15)})
    st = await take_over(node)
    assert asked_of(peers) == [("own", "b2", "above_gen=0"), ("copy", "b3", "copy_of_gen=2&above_gen=0"),
                               ("copy", "b3", "copy_of_gen=1&above_gen=0")]
    assert (st.gen, st.next_offset) == (3, 15)


async def test_an_empty_leader_s_older_gen_whose_copies_hold_nothing_leaves_the_state_here_and_its_elders_asked(
        node, monkeypatch):
    node.routes.update(b2_led_gens_1_and_2(["b3"]))
    node.pop.states[KEY] = QueueState(KEY, 4, 0)
    peers = Peers(node, monkeypatch)
    st = await take_over(node)
    assert (st.gen, st.next_offset) == (3, 4)
    assert ("copy", "b3", "copy_of_gen=1&above_gen=0") in asked_of(peers)


async def test_an_empty_leader_s_older_gen_whose_copies_answer_nothing_leaves_the_oldest_gen_s_leader_asked(
        node, monkeypatch):
    node.routes.update(b2_led_gens_1_and_2(["b3"]))
    peers = Peers(node, monkeypatch, own={"b4": found(0, 3)})
    st = await take_over(node)
    assert [a[2] for a in peers.asked] == ["b2", "b3", "b3", "b4"]
    assert (st.gen, st.next_offset) == (3, 3)


async def test_an_empty_leader_s_older_gen_settled_by_one_copy_is_not_held_back_by_another_that_does_not_answer(
        node, monkeypatch):
    node.routes.update(b2_led_gens_1_and_2(["b3", "b4"]))
    node.pop.states[KEY] = QueueState(KEY, 4, 0)
    Peers(node, monkeypatch, copies={("b3", 2): {"found": False, "holds": ["t.q0.g2"]},
                                     ("b3", 1): {"found": False, "holds": ["t.q0.g1"]},
                                     ("b4", 2): Unreachable("down"), ("b4", 1): Unreachable("down")})
    st = await take_over(node)
    assert (st.gen, st.next_offset) == (3, 4)


async def test_an_empty_leader_s_older_gen_already_known_by_a_copy_s_answer_is_not_asked_again(node, monkeypatch):
    node.routes.update(b2_led_gens_1_and_2(["b3"]))
    peers = Peers(node, monkeypatch, copies={("b3", 2): found(1, 6), ("b3", 1): found(1, 2)})
    st = await take_over(node)
    assert asked_of(peers) == [("own", "b2", ""), ("copy", "b3", "copy_of_gen=2")]
    assert (st.gen, st.next_offset) == (3, 6)


async def test_an_empty_leader_s_older_gen_s_copy_holding_only_the_gen_known_here_does_not_replace_it(
        node, monkeypatch):
    node.routes.update(b2_led_gens_1_and_2(["b3"]))
    node.pop.states[KEY] = QueueState(KEY, 4, 0)
    Peers(node, monkeypatch, copies={("b3", 1): found(0, 7, [[5, 1, 0]])})
    st = await take_over(node)
    assert (st.gen, st.next_offset, sorted(st.in_flight)) == (3, 4, [])


async def test_a_leader_asked_already_whose_answer_held_state_is_not_asked_of_its_older_gen_s_copies(
        node, monkeypatch):
    """b2, asked for gen 2, answers with its own gen-0 state: gen 1, which it led too, is not asked of its copies."""
    node.routes.update(b2_led_gens_1_and_2(["b3"]))
    peers = Peers(node, monkeypatch, own={"b2": found(0, 4)}, copies={("b3", 1): found(1, 15)})
    st = await take_over(node)
    assert asked_of(peers) == [("own", "b2", ""), ("own", "b4", "above_gen=0")]
    assert (st.gen, st.next_offset) == (3, 4)


# -- where the offset goes on ----------------------------------------------------------------------------------------------

async def test_a_newer_state_s_offset_replaces_this_broker_s_older_one_even_when_lower(node, monkeypatch):
    node.routes.update(with_addresses(route(9, [seg(0, "b4", 0, 1, "sealed"), seg(1, "b1", 1, 5, "sealed", 1),
                                                seg(2, "b3", 5, 5, "sealed", 5),
                                                seg(3, "b1", 5, None, "active", 5)])))
    node.pop.states[KEY] = QueueState(KEY, 9, 1)
    Peers(node, monkeypatch, own={"b3": found(2, 1)})
    st = await take_over(node)
    assert (st.gen, st.next_offset) == (3, 1)


async def test_deliveries_adopted_from_an_older_head_wake_the_topic_s_waiting_pops(node, monkeypatch):
    node.routes.update(with_addresses(route(9, [seg(0, "b2", 0, 5, "sealed"), seg(1, "b1", 5, None, "active", 5)])))
    Peers(node, monkeypatch, own={"b2": found(0, 5, [[2, 1, 0]])})
    woken = []
    monkeypatch.setattr(node.pop.signals, "notify", woken.append)
    st = await take_over(node)
    assert sorted(st.in_flight) == [2] and woken == ["t"]


async def test_an_operator_reads_what_the_older_head_answered_and_which_copy_was_held_here_when_it_was_not_used(
        node, monkeypatch):
    node.routes.update(with_addresses(route(9, [seg(0, "b2", 0, 5, "sealed"), seg(1, "b1", 5, None, "active", 5)])))
    node.pop.replica.states[KEY] = QueueState(KEY, 2, 0)
    Peers(node, monkeypatch, own={"b2": found(0, 5)})
    with structlog.testing.capture_logs() as logs:
        st = await take_over(node)
    assert st.next_offset == 5
    assert base.told(logs) == [
        {"event": "pop_handover_leader_answered", "key": KEY, "leader": "b2", "gen": 0, "found_gen": 0,
         "next_offset": 5},
        {"event": "pop_state_taken_over", "key": KEY, "gen": 1, "start": 5, "adopted": 0, "from_gen": 0,
         "copy_gen": 0, "asked": ["b1", "b2"]}]
