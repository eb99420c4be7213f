"""A group's lag counts messages, never a skipped offset budget (issue 35): a broker whose session lapsed has its
segment sealed at the end of its granted budget, and the queue's next segment starts there (DESIGN.md invariant 5).
The offsets between hold no message. Real meta nodes and brokers; lag read through `group describe` and from the
head broker's Prometheus scrape."""

from __future__ import annotations

import aiohttp

from tests.support.meta_http import ok, wait_until
from tests.support.metrics import scrape, value

FENCE_WAIT_S = 30.0     # the fixture's 3 s session, then the fence and the remap's seal, on a loaded machine
READY_WAIT_S = 30.0     # a restarted broker registers again
TOPIC, GROUP = "skips", "late"


async def _describe(c) -> dict:
    d = await ok(c, "GET", f"/v1/groups/{GROUP}", "client")
    return {(o["topic"], o["queue"]): o for o in d["offsets"]}[(TOPIC, 0)]


async def test_lag_does_not_count_the_budget_skipped_after_a_lapsed_session(full_cluster):
    c = full_cluster
    created = await ok(c, "POST", "/v1/topics", json={"topic": TOPIC, "queues": 1, "brokers": ["b1"], "replicas": 1},
                       expect=(201,))
    await ok(c, "POST", f"/v1/messages/{TOPIC}/0", "client", url=c.url("b1"),
             json={"messages": [{"body": f"m{i}"} for i in range(40)]},
             headers={"X-Route-Version": str(created["version"])})   # b1 decides on at least the new topic
    await ok(c, "PUT", f"/v1/offsets/{GROUP}/{TOPIC}/0", "client", url=c.url("b1"), json={"offset": 32})

    # b1 dies; its session lapses and meta fences it; the operator moves the queue (the guide's steps)
    c.kill9("b1")

    async def fenced():
        brokers = (await ok(c, "GET", "/v1/brokers", "client"))["brokers"]
        return next(b for b in brokers if b["broker"] == "b1")["state"] == "fenced"
    await wait_until(fenced, FENCE_WAIT_S, "b1 fenced")
    await ok(c, "POST", f"/v1/topics/{TOPIC}/remap", json={"brokers": ["b2"]})

    async def moved():
        route = await ok(c, "GET", f"/v1/routes/{TOPIC}", "client")
        q = route["queues"][0]
        return route if q["broker"] == "b2" and q["writable"] and q["segments"][0]["state"] == "sealed" else None
    route = await wait_until(moved, FENCE_WAIT_S, "queue 0 writable on b2")
    old, new = route["queues"][0]["segments"][0], route["queues"][0]["segments"][-1]
    assert new["logic_start"] == old["logic_end"] >= 1_000_000, "the old segment was sealed at its budget's end"
    await ok(c, "POST", f"/v1/messages/{TOPIC}/0", "client", url=c.url("b2"),
             json={"messages": [{"body": f"n{i}"} for i in range(5)]},
             headers={"X-Route-Version": str(route["version"])})   # b2 decides on at least the route read

    # b1 comes back with its disk: the group's commit and the old segment's 40 messages are readable again
    c.start("b1")

    async def described():
        try:
            o = await _describe(c)
        except AssertionError:
            return None
        return o if o["committed_offset"] == 32 else None
    o = await wait_until(described, READY_WAIT_S, "the group's commit on b1 readable")
    assert (o["max_offset"], o["lag"]) == (new["logic_start"] + 5, (40 - 32) + 5), o

    # The group commits on the new head, below its start (it has not read the old segment's last messages yet):
    # the head broker's scrape counts the head's messages only (the budget-ended segment is another broker's), and
    # describe asks b1 for the rest
    await ok(c, "PUT", f"/v1/offsets/{GROUP}/{TOPIC}/0", "client", url=c.url("b2"), json={"offset": 36})
    o = await _describe(c)
    assert (o["committed_offset"], o["lag"]) == (36, (40 - 36) + 5), o
    async with aiohttp.ClientSession() as http:
        samples = await scrape(http, c.url("b2"))
    assert value(samples, "stator_broker_consumer_lag_messages", group=GROUP, topic=TOPIC, queue="0") == 5
    assert value(samples, "stator_broker_consumer_committed_offset", group=GROUP, topic=TOPIC, queue="0") == 36
