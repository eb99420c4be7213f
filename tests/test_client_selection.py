"""client/selection.py: which queue a message goes to, and whether that choice is pinned."""

from __future__ import annotations

import base64
import random
from collections import Counter

import pytest

from client.selection import (CallableSelector, KeySelector, Message, QueueSelector, RandomSelector,
                              RoundRobinSelector, as_selector)
from client.slots import slot_of
from meta import allocation


def route(queues: int = 4, slots: int = 64, version: int = 7) -> dict:
    return {"topic": "t", "version": version, "slots": slots, "order": "best_tried",
            "slot_table": allocation.initial_slot_table(slots, queues),
            "queues": [{"queue": q, "broker": f"b{q % 2}", "address": f"http://b{q % 2}", "writable": True}
                       for q in range(queues)]}


def test_key_selector_follows_the_slot_table_and_pins():
    r = route()
    sel = KeySelector()
    for key in (f"k{i}" for i in range(200)):
        m = Message("x", key=key)
        assert sel.select(r, m) == slot_of(key, 64) * 4 // 64
        assert sel.pins(m)


def test_key_selector_sees_a_grown_table():
    sel = KeySelector()
    r = route(queues=2)
    m = Message("x", key="k")
    before = sel.select(r, m)
    table, _ = allocation.grow_slot_table(r["slot_table"], [2, 3])
    grown = {**route(queues=4, version=8), "slot_table": table}
    owner = next(q for lo, hi, q in table if lo <= slot_of("k", 64) < hi)
    assert sel.select(grown, m) == owner
    assert before in (0, 1)


def test_key_selector_falls_back_without_a_key():
    sel = KeySelector(fallback=RoundRobinSelector(start=0))
    r = route()
    m = Message("x")
    assert [sel.select(r, m) for _ in range(6)] == [0, 1, 2, 3, 0, 1]
    assert not sel.pins(m)


def test_round_robin_covers_queues_evenly():
    sel = RoundRobinSelector()
    r = route(queues=5)
    counts = Counter(sel.select(r, Message("x")) for _ in range(500))
    assert counts == {q: 100 for q in range(5)}


def test_random_stays_in_range_and_is_seedable():
    r = route(queues=3)
    a = [RandomSelector(random.Random(1)).select(r, Message("x")) for _ in range(1)]
    b = [RandomSelector(random.Random(1)).select(r, Message("x")) for _ in range(1)]
    assert a == b
    sel = RandomSelector(random.Random(2))
    seen = {sel.select(r, Message("x")) for _ in range(200)}
    assert seen == {0, 1, 2}
    assert not sel.pins(Message("x", key="k"))


def test_callable_selector_is_checked_and_pinned():
    by_room = CallableSelector(lambda r, m: int(m.props["room"]))
    r = route()
    m = Message("x", props={"room": "2"})
    assert by_room.select(r, m) == 2 and by_room.pins(m)
    with pytest.raises(ValueError):
        CallableSelector(lambda r, m: 4).select(r, m)
    with pytest.raises(ValueError):
        CallableSelector(lambda r, m: True).select(r, m)
    assert not CallableSelector(lambda r, m: 0, pinned=False).pins(m)


def test_as_selector():
    assert isinstance(as_selector(None), KeySelector)
    assert isinstance(as_selector("round_robin"), RoundRobinSelector)
    assert isinstance(as_selector("random"), RandomSelector)
    assert isinstance(as_selector(lambda r, m: 0), CallableSelector)
    rr = RoundRobinSelector()
    assert as_selector(rr) is rr and isinstance(rr, QueueSelector)
    with pytest.raises(ValueError):
        as_selector("nearest")


def test_message_json():
    assert Message("hi", key="k", props={"a": "1"}).to_json() == {"body": "hi", "key": "k", "props": {"a": "1"}}
    assert Message(b"\x00\xff").to_json() == {"body_b64": base64.b64encode(b"\x00\xff").decode()}
    with pytest.raises(TypeError):
        Message(3).to_json()  # type: ignore[arg-type]
