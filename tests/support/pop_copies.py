"""The other brokers' answers to a takeover of pop state, for tests of the copy paths (tests/test_pop_copies.py): the
same stand-in tests/test_pop_takeover.py uses, the node's client to other brokers (``reader.peers``) answering from
tables the test gives. Used with the ``node`` fixture of tests/support/pop_node.py."""

from __future__ import annotations

from broker.peers import Unreachable
from broker.pop.state import QueueState
from tests.support import pop_node as base
from wire.errors import ApiError

ADDRESSES = {"b1": "http://b1:1", "b2": "http://b2:1", "b3": "http://b3:1", "b4": "http://b4:1"}


def with_addresses(r: dict) -> dict:
    r["addresses"] = dict(ADDRESSES)
    return r


class Peers:
    """What the other brokers answer: ``own[broker]`` to ``pop-handover`` without ``copy_of_gen`` (a Found body, an
    ApiError or Unreachable raised), ``copies[(broker, gen)]`` to one with it; every question is recorded in
    ``asked`` as ("own" or "copy", method, broker, address, path)."""

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
        if method == "GET":    # the queue's start, read where its oldest segment lies
            return {"min_offset": 0, "max_offset": 3}
        self.asked.append(("own", method, segment.broker, segment.address, path))
        return self._answer(self.own.get(segment.broker))

    async def call(self, method, broker, address, path, json=None):
        gen = int(path.split("copy_of_gen=")[1].split("&")[0])
        self.asked.append(("copy", method, broker, address, path))
        return self._answer(self.copies.get((broker, gen)))


async def take_over(node) -> QueueState:
    """What b1's next pop of ``base.KEY`` starts from: its takeover, under the key's lock as a pop runs it."""
    async with node.pop.locks.hold(base.KEY):
        return await node.pop._state_for(base.KEY)
