"""Pop consumption on real processes (three meta nodes, two brokers; issue 9): pop, ack, change of invisible time,
redelivery, dead letters, long-polling, ordered pop, kill -9 of a broker, and pop across a remap.

One cluster serves the module; each test has its own topic and group. Time bounds are generous for a loaded 2-core
machine; "not before the invisible time" is checked exactly (a redelivery never comes early).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
import pytest_asyncio

from tests.support import cluster as cluster_mod
from tests.support.meta_http import ok, wait_until
from tests.support.broker_http import all_writable, send, wait_route

live = pytest.mark.asyncio(loop_scope="module")
pytestmark = live

INVISIBLE_MS = 1500
# A pop that waits this long (30 s) for a queue moved to its broker: answered long before its end, or never woken
MOVED_POP_WAIT_MS = 30_000


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory):
    async with cluster_mod.running(str(tmp_path_factory.mktemp("pop")), 3, 2,
                                   meta={"session_timeout_ms": 3000, "heartbeat_interval_ms": 500}) as c:
        yield c


async def topic(c, name: str, queues: int = 1, brokers=("b1",), messages: int = 0, replicas: int | None = None) -> dict:
    body = {"topic": name, "queues": queues, "brokers": list(brokers)}
    if replicas is not None:
        body["replicas"] = replicas
    await ok(c, "POST", "/v1/topics", json=body, expect=(201,))
    r = await wait_route(c, name, all_writable)
    for q in range(queues):
        if messages:
            await send(c, name, q, [f"{name}{q}-{i}" for i in range(messages)])
    return r


async def pop(c, url: str, t: str, group: str, expect=(200,), **kw) -> dict:
    s, b, _ = await c.call("POST", f"{url}/v1/pop/{t}", "client", json={"group": group, **kw}, timeout_s=40)
    assert s in expect, (s, b)
    return b


async def pop_all(c, url: str, t: str, group: str, **kw) -> list[dict]:
    return (await pop(c, url, t, group, **kw))["messages"]


async def ack(c, url: str, group: str, handles: list) -> list[dict]:
    s, b, _ = await c.call("POST", f"{url}/v1/ack", "client", json={"group": group, "handles": handles})
    assert s == 200, b
    return b["results"]


async def stats(c, url: str, group: str) -> dict:
    s, b, _ = await c.call("GET", f"{url}/v1/pop-stats/{group}", "client")
    assert s == 200, b
    return b


def offsets(messages: list[dict]) -> list[int]:
    return sorted(m["offset"] for m in messages)


async def test_acked_never_come_back_and_unacked_come_back_after_the_invisible_time_not_before(cluster):
    c = cluster
    await topic(c, "basic", 2, messages=5)
    b1 = c.url("b1")
    popped_at = time.time()
    got = await pop_all(c, b1, "basic", "g", max=100, invisible_ms=INVISIBLE_MS)
    assert sorted((m["queue"], m["offset"]) for m in got) == [(q, o) for q in (0, 1) for o in range(5)]
    assert all(m["attempt"] == 1 and m["body"] == f"basic{m['queue']}-{m['offset']}" for m in got)
    by = {(m["queue"], m["offset"]): m["handle"] for m in got}
    acked = [by[(0, o)] for o in range(5)] + [by[(1, 0)]]
    assert all(r["ok"] for r in await ack(c, b1, "g", acked[:5]))            # a batch
    assert (await ack(c, b1, "g", [acked[5]]))[0]["ok"]                        # a single one
    assert all(r["ok"] for r in await ack(c, b1, "g", acked)), "repeated acks are harmless"
    assert await pop_all(c, b1, "basic", "g") == [], "nothing new, nothing due yet"
    again = await pop_all(c, b1, "basic", "g", max=100, invisible_ms=60_000, wait_ms=10_000)
    arrived = time.time()
    if len(again) < 4:
        again += await pop_all(c, b1, "basic", "g", max=100, invisible_ms=60_000, wait_ms=5_000)
    assert sorted((m["queue"], m["offset"]) for m in again) == [(1, o) for o in range(1, 5)]
    assert all(m["attempt"] == 2 for m in again)
    assert arrived - popped_at >= INVISIBLE_MS / 1000 - 0.01, "never before the invisible time"
    results = await ack(c, b1, "g", [by[(1, 1)], acked[0]])
    assert results[0] == {"handle": by[(1, 1)], "ok": False, "code": "HANDLE_EXPIRED"}, results
    assert results[1]["ok"], "an acked handle stays ok"
    assert all(r["ok"] for r in await ack(c, b1, "g", [m["handle"] for m in again]))
    st = await stats(c, b1, "g")
    assert [(q["queue"], q["pop_offset"], q["in_flight"]) for q in st["queues"] if q["topic"] == "basic"] == \
        [(0, 5, 0), (1, 5, 0)]


async def test_change_of_invisible_time_gives_a_new_handle_and_the_old_one_stops_working(cluster):
    c = cluster
    await topic(c, "inv", 1, messages=2)
    b1 = c.url("b1")
    got = await pop_all(c, b1, "inv", "g", max=2, invisible_ms=1000)
    old = got[0]["handle"]
    s, b, _ = await c.call("POST", f"{b1}/v1/invisible", "client",
                           json={"group": "g", "handle": old, "invisible_ms": 4000})
    assert s == 200 and b["handle"] != old, b
    new = b["handle"]
    s, b2, _ = await c.call("POST", f"{b1}/v1/invisible", "client",
                            json={"group": "g", "handle": old, "invisible_ms": 4000})
    assert (s, b2["error"]["code"]) == (409, "HANDLE_EXPIRED")
    assert (await ack(c, b1, "g", [old]))[0]["code"] == "HANDLE_EXPIRED"
    back = await pop_all(c, b1, "inv", "g", wait_ms=3000)
    assert [m["offset"] for m in back] == [got[1]["offset"]], "only the one whose invisible time was not extended"
    assert (await ack(c, b1, "g", [new]))[0]["ok"]
    assert (await ack(c, b1, "g", [back[0]["handle"]]))[0]["ok"]


async def test_bad_handles_and_parameters_are_refused_and_change_nothing(cluster):
    c = cluster
    await topic(c, "bad", 1, messages=3)
    b1 = c.url("b1")
    got = await pop_all(c, b1, "bad", "g", max=3)
    before = await stats(c, b1, "g")
    h = got[0]["handle"]
    body, _, mac = h.rpartition(".")
    queue, offset, rest = body.split(".", 2)
    forged = f"{queue}.{int(offset) + 1}.{rest}.{mac}"      # another offset under the same MAC
    results = await ack(c, b1, "g", ["junk", 7, None, forged, h + "x", "x" * 2000])
    assert [r["code"] for r in results] == ["INVALID_HANDLE"] * 6 and not any(r["ok"] for r in results)
    assert (await ack(c, b1, "other-group", [h]))[0]["code"] == "INVALID_HANDLE", "a handle is bound to its group"
    s, b2, _ = await c.call("POST", f"{c.url('b2')}/v1/ack", "client", json={"group": "g", "handles": [h]})
    assert b2["results"][0]["code"] == "INVALID_HANDLE", "and to the broker that made it"
    for bad_body in ({"group": "g", "handle": "junk", "invisible_ms": 2000},
                     {"group": "g", "handle": forged, "invisible_ms": 2000}):
        s, b, _ = await c.call("POST", f"{b1}/v1/invisible", "client", json=bad_body)
        assert (s, b["error"]["code"]) == (400, "INVALID_HANDLE"), b
    for bad in ({"max": 0}, {"max": 1001}, {"invisible_ms": 999}, {"invisible_ms": 43_200_001}, {"wait_ms": 30_001},
                {"order": 1}, {"queue": "0"}, {"group": ""}):
        s, b, _ = await c.call("POST", f"{b1}/v1/pop/bad", "client", json={"group": "g", **bad})
        assert (s, b["error"]["code"]) == (400, "INVALID_ARGUMENT"), (bad, s, b)
    for bad in ({"group": "g", "handles": []}, {"group": "g", "handles": ["h"] * 1001},
                {"group": "g", "handle": h, "invisible_ms": 10}):
        path = "/v1/invisible" if "handle" in bad else "/v1/ack"
        s, b, _ = await c.call("POST", b1 + path, "client", json=bad)
        assert (s, b["error"]["code"]) == (400, "INVALID_ARGUMENT"), (bad, s, b)
    s, b, _ = await c.call("POST", f"{b1}/v1/pop/nope", "client", json={"group": "g"})
    assert (s, b["error"]["code"]) == (404, "TOPIC_NOT_FOUND")
    s, b, _ = await c.call("POST", f"{b1}/v1/pop/bad", "client", json={"group": "g", "queue": 5})
    assert (s, b["error"]["code"]) == (404, "QUEUE_NOT_FOUND")
    s, b, _ = await c.call("POST", f"{c.url('b2')}/v1/pop/bad", "client", json={"group": "g", "queue": 0})
    assert (s, b["error"]["code"]) == (409, "NOT_LEADER")
    assert await stats(c, b1, "g") == before, "refusals change nothing"
    assert all(r["ok"] for r in await ack(c, b1, "g", [m["handle"] for m in got]))


async def test_concurrent_pops_never_share_an_in_flight_message(cluster):
    c = cluster
    await topic(c, "conc", 4, messages=60)
    b1 = c.url("b1")
    seen: list[tuple[int, int]] = []

    async def consumer():
        while True:
            got = await pop_all(c, b1, "conc", "g", max=7, invisible_ms=60_000)
            if not got:
                return
            seen.extend((m["queue"], m["offset"]) for m in got)
            assert all(r["ok"] for r in await ack(c, b1, "g", [m["handle"] for m in got[::2]]))
    await asyncio.gather(*(consumer() for _ in range(8)))
    assert len(seen) == len(set(seen)) == 240


async def test_after_max_attempts_a_message_goes_once_to_the_dead_letter_queue(cluster):
    c = cluster
    await ok(c, "PUT", "/v1/groups/dl/config", json={"max_attempts": 2})
    await topic(c, "dead", 1, messages=2)
    b1 = c.url("b1")
    await asyncio.sleep(0.5)   # the broker hears of the group's config from meta's watch stream
    first = await pop_all(c, b1, "dead", "dl", max=2, invisible_ms=1000)
    assert (await ack(c, b1, "dl", [first[1]["handle"]]))[0]["ok"]
    second = await pop_all(c, b1, "dead", "dl", wait_ms=5000, invisible_ms=1000)
    assert [(m["offset"], m["attempt"]) for m in second] == [(0, 2)]

    async def dead_lettered():
        s, b, _ = await c.call("GET", f"{b1}/v1/dlq/dl?offset=0&max=10", "client")
        return b["messages"] if s == 200 and b["messages"] else None
    dlq = await wait_until(dead_lettered, 10, "the message in the DLQ")
    assert [(m["topic"], m["queue"], m["origin_offset"], m["attempts"], m["body"]) for m in dlq] == \
        [("dead", 0, 0, 2, "dead0-0")]
    assert await pop_all(c, b1, "dead", "dl", wait_ms=1500) == [], "never delivered again"
    assert (await ack(c, b1, "dl", [second[0]["handle"]]))[0]["code"] == "HANDLE_EXPIRED"
    s, b, _ = await c.call("GET", f"{b1}/v1/dlq/dl?offset=1&max=10", "client")
    assert b["messages"] == [] and b["next_offset"] == 1
    assert (await stats(c, b1, "dl"))["dlq_messages"] == 1
    s, text, _ = await c.call("GET", f"{b1}/metrics", None)
    assert 'stator_pop_dlq_messages{group="dl"} 1.0' in text
    assert 'stator_pop_in_flight{group="dl",queue="0",topic="dead"} 0.0' in text


async def test_a_long_poll_returns_as_soon_as_a_message_arrives(cluster):
    c = cluster
    await topic(c, "lp", 1)
    b1 = c.url("b1")
    started = time.monotonic()
    waiting = asyncio.create_task(pop_all(c, b1, "lp", "g", wait_ms=20_000))
    await asyncio.sleep(0.5)
    assert not waiting.done()
    await send(c, "lp", 0, ["hello"])
    got = await asyncio.wait_for(waiting, 15)
    assert [m["body"] for m in got] == ["hello"] and time.monotonic() - started < 15
    started = time.monotonic()
    assert await pop_all(c, b1, "lp", "g", wait_ms=300) == []
    assert 0.25 <= time.monotonic() - started < 10, "an empty long poll takes its wait, bounded"


async def test_an_ordered_pop_blocks_the_queue_while_its_batch_is_invisible(cluster):
    c = cluster
    await topic(c, "ord", 1, messages=6)
    b1 = c.url("b1")
    batch = await pop_all(c, b1, "ord", "g", max=3, order=True, invisible_ms=1000)
    assert offsets(batch) == [0, 1, 2]
    assert await pop_all(c, b1, "ord", "g", max=3, order=True) == [], "blocked while the batch is out"
    await ack(c, b1, "g", [batch[0]["handle"], batch[2]["handle"]])
    assert await pop_all(c, b1, "ord", "g", max=3, order=True) == [], "still blocked: offset 1 is unacked"
    again = await pop_all(c, b1, "ord", "g", max=3, order=True, wait_ms=5000)
    assert [(m["offset"], m["attempt"]) for m in again] == [(1, 2)], "the unacked one again, alone, before 3"
    await ack(c, b1, "g", [again[0]["handle"]])
    assert offsets(await pop_all(c, b1, "ord", "g", max=3, order=True)) == [3, 4, 5]


async def test_pop_state_survives_kill_9_of_the_broker(cluster):
    c = cluster
    await topic(c, "crash", 1, messages=6, replicas=1)   # pop state on its one broker (copies: issue 37)
    b1 = c.url("b1")
    popped_at = time.time()
    got = await pop_all(c, b1, "crash", "g", max=6, invisible_ms=3000)
    assert offsets(got) == list(range(6))
    acked = [m for m in got if m["offset"] % 2 == 0]
    assert all(r["ok"] for r in await ack(c, b1, "g", [m["handle"] for m in acked]))
    await asyncio.sleep(0.6)   # past the write delay: the unacked deliveries are on disk with their deadlines
    c.kill9("b1")
    c.start("b1")
    await wait_until(lambda: _ready(c, b1), 30, "b1 ready again")
    back = []
    while len(back) < 3:
        more = await pop_all(c, b1, "crash", "g", max=10, wait_ms=10_000, invisible_ms=60_000)
        assert more, "the unacked messages come back"
        back += more
    assert time.time() - popped_at >= 3.0 - 0.01, "not before their invisible time, restart or not"
    assert [(m["offset"], m["attempt"]) for m in sorted(back, key=lambda m: m["offset"])] == [(1, 2), (3, 2), (5, 2)]
    assert (await ack(c, b1, "g", [acked[0]["handle"]]))[0]["ok"], "the handle secret survives the restart"
    assert (await ack(c, b1, "g", [got[1]["handle"]]))[0]["code"] == "HANDLE_EXPIRED"
    assert all(r["ok"] for r in await ack(c, b1, "g", [m["handle"] for m in back]))
    assert await pop_all(c, b1, "crash", "g", wait_ms=500) == []


async def _ready(c, url: str) -> bool:
    s, _, _ = await c.call("GET", url + "/readyz", None, timeout_s=2)
    return s == 200


async def test_pop_continues_across_a_remap_without_gap_or_duplicate(cluster):
    c = cluster
    await topic(c, "moving", 1, messages=10)
    b1, b2 = c.url("b1"), c.url("b2")
    first = await pop_all(c, b1, "moving", "g", max=4, invisible_ms=2000)
    assert offsets(first) == [0, 1, 2, 3]
    await ack(c, b1, "g", [first[0]["handle"], first[1]["handle"]])
    await ok(c, "POST", "/v1/topics/moving/remap", json={"brokers": ["b2"]})
    r = await wait_route(c, "moving", lambda r: all_writable(r) and r["queues"][0]["broker"] == "b2")
    assert r["queues"][0]["address"] == b2
    s, b, _ = await c.call("POST", f"{b1}/v1/pop/moving", "client", json={"group": "g", "queue": 0})
    assert (s, b["error"]["code"]) == (409, "NOT_LEADER")
    await send(c, "moving", 0, ["after-0", "after-1"])
    rest = await pop_all(c, b2, "moving", "g", max=100, invisible_ms=60_000)
    assert offsets(rest) == list(range(4, 12)), "from the old head's pop offset, through the sealed segment's end"
    # Every delivery in flight went to the new head with the queue (one owner per delivery): the old head's handles
    # are refused, and the new head delivers them again once their invisible time ends
    assert (await ack(c, b1, "g", [first[2]["handle"]]))[0]["code"] == "HANDLE_EXPIRED"
    back = []
    deadline = time.monotonic() + 10.0
    while len(back) < 2 and time.monotonic() < deadline:
        back += await pop_all(c, b2, "moving", "g", wait_ms=2000, invisible_ms=60_000)
    assert sorted((m["offset"], m["attempt"]) for m in back) == [(2, 2), (3, 2)], "the unacked ones come back"
    assert (await ack(c, b1, "g", [first[3]["handle"]]))[0]["code"] == "HANDLE_EXPIRED"
    assert all(r["ok"] for r in await ack(c, b2, "g", [m["handle"] for m in rest + back]))
    assert await pop_all(c, b2, "moving", "g", wait_ms=300) == []
    old = [q for q in (await stats(c, b1, "g"))["queues"] if q["topic"] == "moving"]
    assert old and old[0]["frozen"] and old[0]["in_flight"] == 0


async def test_acks_of_pops_still_only_in_memory_are_durable_and_nothing_acked_comes_back_after_kill_9(cluster):
    """Pop and ack inside the write delay: no delivery record is ever written for the pair, yet the ack is answered
    only once the pop offset past it is on disk, so a kill -9 right after the answer brings none of them back."""
    c = cluster
    await topic(c, "merge", 1, messages=20, replicas=1)   # pop state on its one broker (copies: issue 37)
    b1 = c.url("b1")
    got = await pop_all(c, b1, "merge", "g", max=20, invisible_ms=3000)
    assert offsets(got) == list(range(20))
    unacked = {10, 11, 12, 18, 19}          # acks out of order too: the ones above 12 must not come back either
    acked = [m for m in got if m["offset"] not in unacked]
    assert all(r["ok"] for r in await ack(c, b1, "g", [m["handle"] for m in acked]))
    c.kill9("b1")                     # at once, well within the write delay
    c.start("b1")
    await wait_until(lambda: _ready(c, b1), 30, "b1 ready again")
    back = []
    while len(back) < len(unacked):
        more = await pop_all(c, b1, "merge", "g", max=100, wait_ms=10_000, invisible_ms=60_000)
        assert more, "the unacked ones come back"
        back += more
    # Those whose pop was never written come back at once, those written for an ack above them after 3 s.
    assert offsets(back) == sorted(unacked), "only the unacked ones come back"
    assert all(r["ok"] for r in await ack(c, b1, "g", [m["handle"] for m in back]))
    assert (await ack(c, b1, "g", [got[19]["handle"]]))[0]["code"] == "HANDLE_EXPIRED"
    assert await pop_all(c, b1, "merge", "g", wait_ms=300) == []


async def test_pop_follows_a_queue_moved_away_and_back(cluster):
    """b1 -> b2 -> b1: the second takeover on b1 continues from b2's pop offset, not from b1's own older state, and
    what b2 left unacked comes back from b1 once its invisible time ends."""
    c = cluster
    await topic(c, "roundtrip", 1, messages=6)
    b1, b2 = c.url("b1"), c.url("b2")
    first = await pop_all(c, b1, "roundtrip", "g", max=3)
    assert offsets(first) == [0, 1, 2]
    assert all(r["ok"] for r in await ack(c, b1, "g", [m["handle"] for m in first]))

    async def move(to: str) -> None:
        await ok(c, "POST", "/v1/topics/roundtrip/remap", json={"brokers": [to]})
        await wait_route(c, "roundtrip", lambda r: all_writable(r) and r["queues"][0]["broker"] == to)
    await move("b2")
    # The route says b2 leads once meta applied the remap; b2 itself may apply it a moment later (until then a pop
    # there finds no queue of the topic): the pop waits for it (see the test below)
    second = await pop_all(c, b2, "roundtrip", "g", max=2, invisible_ms=1500, wait_ms=10_000)
    assert offsets(second) == [3, 4]
    assert (await ack(c, b2, "g", [second[0]["handle"]]))[0]["ok"]
    await move("b1")
    await send(c, "roundtrip", 0, ["x", "y"])
    third = await pop_all(c, b1, "roundtrip", "g", max=100, invisible_ms=60_000)
    assert offsets(third) == [5, 6, 7], "from b2's pop offset: nothing b1 or b2 handed out is handed out again"
    back = await pop_all(c, b1, "roundtrip", "g", wait_ms=10_000, invisible_ms=60_000)
    assert [(m["offset"], m["attempt"]) for m in back] == [(4, 2)]
    assert all(r["ok"] for r in await ack(c, b1, "g", [m["handle"] for m in third + back]))
    assert await pop_all(c, b1, "roundtrip", "g", wait_ms=300) == []
    on_b2 = [q for q in (await stats(c, b2, "g"))["queues"] if q["topic"] == "roundtrip"]
    assert on_b2 and on_b2[0]["frozen"] and on_b2[0]["in_flight"] == 0


async def test_a_pop_waiting_where_a_queue_moves_is_answered_once_the_queue_is_there(cluster):
    """A topic-wide pop long-polling on b2, which leads no queue of the topic, gets the messages as soon as a remap
    moves the queue there: b2 applying the route wakes it. It used to wake only when its wait ended."""
    c = cluster
    await topic(c, "arrives", 1, messages=3)
    b2 = c.url("b2")
    waiting = asyncio.create_task(pop(c, b2, "arrives", "g", max=10, wait_ms=MOVED_POP_WAIT_MS))
    await asyncio.sleep(0.5)
    assert not waiting.done(), waiting.result()
    started = time.monotonic()
    await ok(c, "POST", "/v1/topics/arrives/remap", json={"brokers": ["b2"]})
    got = (await asyncio.wait_for(waiting, MOVED_POP_WAIT_MS / 1000 + 10))["messages"]
    took = time.monotonic() - started
    assert offsets(got) == [0, 1, 2]
    assert took < MOVED_POP_WAIT_MS / 1000 / 2, f"answered {took:.1f} s after the remap: at the end of its wait"


async def test_a_redelivery_that_came_due_goes_out_before_new_messages_of_a_busy_topic(cluster):
    c = cluster
    await topic(c, "busy", 2, messages=3000)
    b1 = c.url("b1")
    sent = time.time()
    first = await pop_all(c, b1, "busy", "g", max=1, queue=1, invisible_ms=1000)
    due = time.time() + 1.0
    while True:                        # a consumer busy with new messages of both queues meanwhile
        started = time.time()
        got = await pop_all(c, b1, "busy", "g", max=2, invisible_ms=60_000)
        assert got, "new messages left"
        again = [m for m in got if m["attempt"] == 2]
        if again or started > due + 0.2:
            assert again and got[0] == again[0], got
            assert (got[0]["queue"], got[0]["offset"]) == (1, first[0]["offset"])
            break
        await ack(c, b1, "g", [m["handle"] for m in got])
    assert time.time() >= sent + 1.0 - 0.01, "not before its invisible time"


async def test_deliveries_that_came_due_on_the_old_head_before_anyone_popped_the_new_one_come_back(cluster):
    c = cluster
    await topic(c, "stranded", 1, messages=2)
    b1, b2 = c.url("b1"), c.url("b2")
    first = await pop_all(c, b1, "stranded", "g", max=2, invisible_ms=1000)
    await ok(c, "POST", "/v1/topics/stranded/remap", json={"brokers": ["b2"]})
    await wait_route(c, "stranded", lambda r: all_writable(r) and r["queues"][0]["broker"] == "b2")
    await asyncio.sleep(1.5)           # both came due on b1, which no longer holds the head
    back = []
    while len(back) < 2:
        more = await pop_all(c, b2, "stranded", "g", wait_ms=10_000, invisible_ms=60_000)
        assert more, "b1's due deliveries reach the new head"
        back += more
    assert sorted((m["offset"], m["attempt"]) for m in back) == [(0, 2), (1, 2)]
    assert [r["code"] for r in await ack(c, b1, "g", [m["handle"] for m in first])] == ["HANDLE_EXPIRED"] * 2
    assert all(r["ok"] for r in await ack(c, b2, "g", [m["handle"] for m in back]))


async def test_contended_pops_wait_for_a_busy_queue_instead_of_answering_empty(cluster):
    """Six consumers, ten pops of up to 8 each (no long poll) on one 200-message queue: a pop that finds the queue
    held by another pop waits for it (BUSY_QUEUE_WAIT_MS), so the 60 pops hand out all 200, each once. A pop used to
    skip the busy queue and answer empty: the six were handed 152-184 of the 200."""
    c = cluster
    await topic(c, "contend", 1, messages=200)
    b1 = c.url("b1")
    handed: list[int] = []

    async def consumer() -> None:
        for _ in range(10):
            handed.extend(m["offset"] for m in await pop_all(c, b1, "contend", "gc", max=8, wait_ms=0,
                                                             invisible_ms=600_000))

    await asyncio.gather(*(consumer() for _ in range(6)))
    assert sorted(handed) == list(range(200)), (len(handed), len(set(handed)))


async def test_pop_locks_live_only_while_a_pop_holds_them(cluster):
    """Group names are the client's: 300 of them leave no lock behind (the table used to keep one per key forever)."""
    c = cluster
    await topic(c, "lockkeys", 1, messages=1)
    b1 = c.url("b1")
    await asyncio.gather(*(pop(c, b1, "lockkeys", f"lk{i}", max=1, invisible_ms=600_000) for i in range(300)))

    async def locks() -> float | None:
        s, text, _ = await c.call("GET", f"{b1}/metrics", None)
        line = next(line for line in text.splitlines() if line.startswith("stator_pop_locks "))
        return float(line.split()[1]) == 0 or None
    await wait_until(locks, 10.0, "no pop lock left")


async def test_a_redelivery_past_one_reads_byte_budget_leaves_the_rest_for_the_next_pop(cluster):
    """Three 3 MiB messages popped one by one and never acked, then one pop of 3: one read's byte budget (8 MiB)
    holds two of them. The third used to be taken for deleted by retention and acked: never delivered again, not
    in the DLQ either. Now it stays ready and the next pop hands it out."""
    c = cluster
    big = 3 * 1024 * 1024
    await topic(c, "bigredo", 1)
    await send(c, "bigredo", 0, [f"{i}" * big for i in range(3)])
    b1 = c.url("b1")
    first = []
    for _ in range(3):
        first += await pop_all(c, b1, "bigredo", "gb", max=1, invisible_ms=1000)
    assert offsets(first) == [0, 1, 2]
    await asyncio.sleep(1.5)   # every one is due again
    again: list[dict] = []

    async def all_back() -> bool | None:
        again.extend(await pop_all(c, b1, "bigredo", "gb", max=3, invisible_ms=60_000))
        return sorted(m["offset"] for m in again) == [0, 1, 2] or None
    await wait_until(all_back, 20.0, "every message delivered again")
    assert all(m["attempt"] == 2 and len(m["body"]) == big for m in again), [(m["offset"], m["attempt"])
                                                                             for m in again]
    s = await stats(c, b1, "gb")
    assert sum(q["in_flight"] for q in s["queues"]) == 3, s


async def test_a_late_ack_on_the_old_head_never_answers_ok_for_a_delivery_the_new_head_will_make(cluster):
    """A delivery that came due on the old head after the queue moved is handed over to the new head, which delivers
    it again. b2 is stopped while b1 hands it over, and the consumer acks it on b1 meanwhile: b1 used to answer ok
    and b2, once it continued, adopted and delivered it again anyway. Now b1 answers HANDLE_EXPIRED."""
    c = cluster
    await topic(c, "handack", 1, messages=1)
    b1, b2 = c.url("b1"), c.url("b2")
    first = await pop_all(c, b1, "handack", "gh", max=1, invisible_ms=1000)
    await ok(c, "POST", "/v1/topics/handack/remap", json={"brokers": ["b2"]})
    await wait_route(c, "handack", lambda r: all_writable(r) and r["queues"][0]["broker"] == "b2")
    assert await pop_all(c, b2, "handack", "gh", wait_ms=0) == []   # b2 takes over the state: b1's is frozen
    pid = c.pid("b2")
    os.killpg(pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(1.6)   # due on b1, which hands it to b2 and waits for an answer that does not come
        result = (await ack(c, b1, "gh", [first[0]["handle"]]))[0]
    finally:
        os.killpg(pid, signal.SIGCONT)
    back = []
    deadline = time.monotonic() + 10.0
    while not back and time.monotonic() < deadline:
        back = await pop_all(c, b2, "handack", "gh", wait_ms=2000, invisible_ms=60_000)
    assert not result.get("ok") and result["code"] == "HANDLE_EXPIRED", (result, back)
    assert [(m["offset"], m["attempt"]) for m in back] == [(0, 2)], "delivered again by the new head"


async def test_an_old_head_restarted_after_handing_a_delivery_over_never_answers_its_ack_ok(cluster):
    """A restart empties the broker's memory of what became of each delivery no longer in flight: acked here, or
    handed over to the new head, which delivers it again once due. It used to answer such a handle's ack ok as done
    (the chaos runner's acked_pops_stay_acked: an ok ack, then the message delivered again); now HANDLE_EXPIRED."""
    c = cluster
    await topic(c, "ackmoved", 1, messages=1, replicas=1)
    b1, b2 = c.url("b1"), c.url("b2")
    [first] = await pop_all(c, b1, "ackmoved", "gm", max=1, invisible_ms=3000)
    # past the write delay: the delivery is on b1's disk when it is handed over, so the restart finds it there or
    # its removal after it (a delivery too young to be written is unknown to the restarted b1: INVALID_HANDLE)
    await asyncio.sleep(0.6)
    await ok(c, "POST", "/v1/topics/ackmoved/remap", json={"brokers": ["b2"]})
    await wait_route(c, "ackmoved", lambda r: all_writable(r) and r["queues"][0]["broker"] == "b2")
    assert await pop_all(c, b2, "ackmoved", "gm", wait_ms=0) == []   # b2 takes over: b1 freezes and hands over

    async def handed_over() -> bool:
        old = [q for q in (await stats(c, b1, "gm"))["queues"] if q["topic"] == "ackmoved"]
        return bool(old) and old[0]["frozen"] and old[0]["in_flight"] == 0

    await wait_until(handed_over, 15, "b1 handed its delivery to b2")
    c.kill9("b1")
    c.start("b1")
    await wait_until(lambda: _ready(c, b1), 30, "b1 ready again")
    result = (await ack(c, b1, "gm", [first["handle"]]))[0]
    back = []
    deadline = time.monotonic() + 15.0
    while not back and time.monotonic() < deadline:
        back = await pop_all(c, b2, "ackmoved", "gm", wait_ms=2000, invisible_ms=60_000)
    assert [(m["offset"], m["attempt"]) for m in back] == [(0, 2)], "the new head delivers it again once due"
    assert not result.get("ok") and result["code"] == "HANDLE_EXPIRED", result


async def test_a_pop_group_is_listed_and_described_by_meta(cluster):
    # A pop group keeps its state on brokers and never tells meta: meta finds it there, as it finds pull groups
    c = cluster
    await topic(c, "mailbox", 1, messages=3)
    assert len(await pop_all(c, c.url("b1"), "mailbox", "mailer", max=10)) == 3
    listed = await ok(c, "GET", "/v1/groups?include=brokers", role="client")
    assert [g["source"] for g in listed["groups"] if g["group"] == "mailer"] == ["brokers"], listed
    detail = await ok(c, "GET", "/v1/groups/mailer", role="client")
    assert (detail["group"], detail["source"]) == ("mailer", "brokers"), detail
    # where it pops, as the broker serving the queue says (issue 35: describe showed none of it)
    assert [(p["topic"], p["queue"], p["broker"], p["pop_offset"], p["in_flight"]) for p in detail["pop"]] == \
        [("mailbox", 0, "b1", 3, 3)], detail["pop"]

