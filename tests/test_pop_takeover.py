"""A new head taking a group's pop state over from the brokers that held its queue before (broker/pop/service.py
``_state_for``, ``_ask_copies``, ``freeze``, the takeovers started by route changes and hints): whom it asks, at which
address, with which question, and what it starts from. One real broker node in this process (b1, the ``node``
fixture of tests/test_pop_service.py); the other brokers' answers come through its client to them
(``reader.peers``), as in tests/test_pop_service.py.
"""

from __future__ import annotations

import pytest

from broker.peers import Unreachable
from broker.pop.state import QueueState
from tests import test_pop_service as base
from wire.errors import ApiError, rejection

node = base.node          # b1 heading queue 0 of topic t, its pop service started
KEY, seg, route, pop, until = base.KEY, base.seg, base.route, base.pop, base.until
ADDRESSES = {"b1": "http://b1:1", "b2": "http://b2:1", "b3": "http://b3:1", "b4": "http://b4:1"}


def with_addresses(r: dict) -> dict:
    r["addresses"] = dict(ADDRESSES)
    return r


class Peers:
    """What the other brokers answer: ``own[broker]`` to ``pop-handover`` without ``copy_of_gen`` (a Found body, an
    ApiError or Unreachable raised), ``copies[(broker, gen)]`` to one with it; every question is recorded."""

    def __init__(self, node, monkeypatch, own: dict | None = None, copies: dict | None = None):
        self.own, self.copies = own or {}, copies or {}
        self.asked: list[tuple] = []
        monkeypatch.setattr(node.reader.peers, "request", self.request)
        monkeypatch.setattr(node.reader.peers, "call", self.call)

    def _answer(self, answer):
        if isinstance(answer, (ApiError, Unreachable)):
            raise answer
        return answer if answer is not None else {"found": False}

    async def request(self, method, segment, path, json=None):
        self.asked.append(("own", method, segment.broker, segment.address, path))
        return self._answer(self.own.get(segment.broker))

    async def call(self, method, broker, address, path, json=None):
        gen = int(path.split("copy_of_gen=")[1].split("&")[0])
        self.asked.append(("copy", method, broker, address, path))
        return self._answer(self.copies.get((broker, gen)))


async def take_over(node) -> QueueState:
    async with node.pop.locks.hold(KEY):
        return await node.pop._state_for(KEY)


async def refused_takeover(node) -> ApiError:
    with pytest.raises(ApiError) as e:
        await take_over(node)
    return e.value


# -- the copies of a gen whose leader holds nothing ------------------------------------------------------------------

async def test_copies_are_asked_at_their_own_addresses_and_a_takeover_they_do_not_answer_names_each_and_why(
        node, monkeypatch):
    """b2 led gen 0 and holds nothing now; b3 and b4, its in-sync copies, do not answer (one cannot be reached, one
    refuses): b1 pops nothing, and its answer names both and why, the first of them as the broker to wait for."""
    node.routes.update(with_addresses(route(6, [
        seg(0, "b2", 0, 7, "sealed", replicas=["b2", "b4", "b3"], in_sync=["b2", "b4", "b3"]),
        seg(1, "b1", 7, None, "active", 7)])))
    peers = Peers(node, monkeypatch, copies={("b3", 0): Unreachable("connection refused"),
                                             ("b4", 0): rejection(503, "CATCHING_UP", "behind")})
    e = await refused_takeover(node)
    assert (e.status, e.code, e.details) == (503, "BROKER_UNAVAILABLE", {
        "queue": 0, "broker": "b3", "reason": "b3: connection refused; b4: CATCHING_UP"})
    assert e.message == ("the pop state of queue 0 of 't' under gen 0 is held by none that answered, and "
                         "['b3', 'b4'] did not: starting without them could deliver acknowledged pops again")
    version = node.routes.version
    assert peers.asked == [
        ("own", "POST", "b2", "http://127.0.0.1:1", f"/v1/pop-handover/g/t/0?route_version={version}"),
        ("copy", "POST", "b4", "http://b4:1", f"/v1/pop-handover/g/t/0?route_version={version}&copy_of_gen=0"),
        ("copy", "POST", "b3", "http://b3:1", f"/v1/pop-handover/g/t/0?route_version={version}&copy_of_gen=0")]
    assert KEY not in node.pop.states


async def test_the_first_copy_holding_the_gen_asked_is_where_the_takeover_starts_and_no_other_is_asked(
        node, monkeypatch):
    node.routes.update(with_addresses(route(6, [
        seg(0, "b2", 0, 7, "sealed", replicas=["b2", "b3", "b4"], in_sync=["b2", "b3", "b4"]),
        seg(1, "b1", 7, None, "active", 7)])))
    peers = Peers(node, monkeypatch, copies={("b3", 0): {"found": True, "gen": 0, "next_offset": 6,
                                                         "deliveries": [[4, 2, 0]]},
                                             ("b4", 0): Unreachable("down")})
    st = await take_over(node)
    assert (st.gen, st.next_offset, sorted(st.in_flight), st.in_flight[4].attempt) == (1, 6, [4], 2)
    assert [a[2] for a in peers.asked] == ["b2", "b3"], "b4 not asked: b3 held the gen's state"


async def test_a_copy_in_the_in_sync_set_whose_disk_held_the_gen_and_holds_no_state_of_it_settles_it(
        node, monkeypatch):
    """b1 holds its own gen-0 state; b2 led gen 1, lost before it popped; b3, in gen 1's in-sync set (not its
    sealer), held gen 1 on its disk and holds no state of it: b2 acknowledged nothing under gen 1, and b1 goes on
    from its own state although b2 does not answer."""
    node.routes.update(with_addresses(route(9, [
        seg(0, "b1", 0, 5, "sealed"),
        seg(1, "b2", 5, 5, "sealed", replicas=["b2", "b3"], in_sync=["b2", "b3"]),
        seg(2, "b1", 5, None, "active", 5)])))
    node.pop.states[KEY] = QueueState(KEY, 4, 0)
    Peers(node, monkeypatch, own={"b2": rejection(503, "BROKER_UNAVAILABLE", "b2 does not answer",
                                                  reason="down")},
          copies={("b3", 1): {"found": False, "holds": ["t.q0.g1"]}})
    st = await take_over(node)
    assert (st.gen, st.next_offset) == (2, 4)


async def test_a_copy_that_held_another_segment_settles_nothing(node, monkeypatch):
    node.routes.update(with_addresses(route(9, [
        seg(0, "b1", 0, 5, "sealed"),
        seg(1, "b2", 5, 5, "sealed", replicas=["b2", "b3"], in_sync=["b2", "b3"]),
        seg(2, "b1", 5, None, "active", 5)])))
    node.pop.states[KEY] = QueueState(KEY, 4, 0)
    Peers(node, monkeypatch, own={"b2": rejection(503, "BROKER_UNAVAILABLE", "b2 does not answer")},
          copies={("b3", 1): {"found": False, "holds": ["t.q0.g0", "t.q1.g1"]}})
    assert (await refused_takeover(node)).code == "BROKER_UNAVAILABLE"
    assert node.pop.states[KEY].gen == 0
