"""A resend is stored once across remaps (broker/replication/producer_handover.py), on real processes: the producers'
batches of a queue follow its head from broker to broker, through a remap onto a broker that held nothing of it,
through a second remap with no send between, and through a restart of the broker that took them over."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from broker.replication.producer_handover import HANDOVER_WAIT_S, QUEUES_PER_ASK_MAX
from tests.support.broker_http import admin, read_all, wait_route
from tests.support.cluster import running

PRODUCER = "4242"


async def _send(c, address: str, seq: int, bodies: list[str], queue: int = 0, version: int = 0) -> tuple[int, dict]:
    """``version``: the route version the sender read (X-Route-Version): the broker decides on at least that one."""
    s, b, _ = await c.call("POST", f"{address}/v1/messages/h/{queue}", "client",
                           json={"messages": [{"body": x} for x in bodies]},
                           headers={"X-Producer-Id": PRODUCER, "X-Producer-Seq": str(seq),
                                    "X-Route-Version": str(version)})
    return s, b


async def _remap(c, onto: str, queues: int = 1) -> dict:
    s, b = await admin(c, "POST", 0, "/v1/topics/h/remap", {"brokers": [onto]})
    assert s == 200, b
    return await wait_route(c, "h", lambda r: len(r["queues"]) == queues
                            and all(q["broker"] == onto and q["writable"] for q in r["queues"]))


async def test_a_batch_resent_after_remaps_onto_brokers_that_never_held_it_is_stored_once(tmp_path):
    async with running(str(tmp_path), 3, 3) as c:
        s, b = await admin(c, "POST", 0, "/v1/topics", {"topic": "h", "queues": 1, "replicas": 1})
        assert s == 201, b
        r = await wait_route(c, "h", lambda r: r["queues"][0]["writable"])
        first = r["queues"][0]["broker"]
        second, third = sorted({"b1", "b2", "b3"} - {first})
        assert await _send(c, r["queues"][0]["address"], 0, ["a", "b"]) == (200, {"queue": 0, "offsets": [0, 1]})
        assert await _send(c, r["queues"][0]["address"], 1, ["c"]) == (200, {"queue": 0, "offsets": [2]})

        # The answer to seq 1 was lost: its producer resends it to the head the remap opened on a broker holding
        # nothing of the queue
        r = await _remap(c, second)
        address = r["queues"][0]["address"]
        assert await _send(c, address, 1, ["c"], version=r["version"]) == (200, {"queue": 0, "offsets": [2]}), \
            "stored again after a remap"
        assert await _send(c, address, 2, ["d"]) == (200, {"queue": 0, "offsets": [3]})

        # Two remaps with no send between: the third broker takes what the second took over
        await _remap(c, first)
        r = await _remap(c, third)
        address = r["queues"][0]["address"]
        assert await _send(c, address, 0, ["a", "b"], version=r["version"]) == (200, {"queue": 0, "offsets": [0, 1]})
        assert await _send(c, address, 2, ["d"]) == (200, {"queue": 0, "offsets": [3]})

        # What it took over is in its producers.log: a restart on its disk keeps answering the resend, with no
        # broker left to take the batches from again
        for b in (first, second, third):
            c.kill9(b)
        c.start(third)
        assert await _send_when_up(c, address, 1, ["c"]) == (200, {"queue": 0, "offsets": [2]}), \
            "stored again after a restart"
        assert await _send(c, address, 3, ["e"]) == (200, {"queue": 0, "offsets": [4]})
        c.start(first)
        c.start(second)
        deadline = time.monotonic() + 30.0
        while True:   # the older segments come back with their brokers
            try:
                bodies = [m["body"] for m in await read_all(c, "h", 0)]
                break
            except AssertionError:
                assert time.monotonic() < deadline, "the older segments never came back"
                await asyncio.sleep(0.2)
        assert bodies == ["a", "b", "c", "d", "e"]


async def _send_when_up(c, address: str, seq: int, bodies: list[str], timeout_s: float = 30.0) -> tuple[int, dict]:
    """``_send`` to a broker starting again: retried while it is down or not registered yet (503)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            s, b = await _send(c, address, seq, bodies)
            if s != 503:
                return s, b
        except (aiohttp.ClientError, asyncio.TimeoutError):
            pass
        assert time.monotonic() < deadline, "the broker never took the send again"
        await asyncio.sleep(0.2)


async def test_every_queue_of_a_topic_larger_than_one_ask_takes_its_batches_over(tmp_path):
    """A remap of more queues than one ask names (QUEUES_PER_ASK_MAX): each queue's resend is answered."""
    queues = QUEUES_PER_ASK_MAX + 6
    async with running(str(tmp_path), 3, 2) as c:
        s, b = await admin(c, "POST", 0, "/v1/topics", {"topic": "h", "queues": queues, "replicas": 1,
                                                        "brokers": ["b1"]})
        assert s == 201, b
        r = await wait_route(c, "h", lambda r: all(q["writable"] for q in r["queues"]))
        address = r["queues"][0]["address"]
        for q in range(queues):
            assert await _send(c, address, 0, [f"m{q}"], queue=q) == (200, {"queue": q, "offsets": [0]})
        r = await _remap(c, "b2", queues=queues)
        address = r["queues"][0]["address"]
        for q in range(queues):
            assert await _send(c, address, 0, [f"m{q}"], queue=q, version=r["version"]) == \
                (200, {"queue": q, "offsets": [0]}), q
        for q in range(queues):
            assert [m["body"] for m in await read_all(c, "h", q)] == [f"m{q}"]


async def test_an_idempotent_send_waits_at_most_the_handover_bound_when_no_holder_of_the_old_segment_answers(tmp_path):
    """The old segment's only holder is dead with its disk: the new head cannot take its batches, and holds an
    idempotent send for HANDOVER_WAIT_S, then stores it (at-least-once for that window), never longer."""
    async with running(str(tmp_path), 3, 2, meta={"session_timeout_ms": 3_000, "heartbeat_interval_ms": 500}) as c:
        s, b = await admin(c, "POST", 0, "/v1/topics", {"topic": "h", "queues": 1, "replicas": 1, "brokers": ["b1"]})
        assert s == 201, b
        r = await wait_route(c, "h", lambda r: r["queues"][0]["writable"])
        assert (await _send(c, r["queues"][0]["address"], 0, ["a"]))[0] == 200
        c.kill9("b1")
        r = await _remap(c, "b2")
        started = time.monotonic()
        s, b = await _send(c, r["queues"][0]["address"], 1, ["b"], version=r["version"])
        waited = time.monotonic() - started
        assert s == 200 and len(b["offsets"]) == 1, b
        assert waited < HANDOVER_WAIT_S + 10.0, waited   # its wait began when the route reached b2: not bounded below
