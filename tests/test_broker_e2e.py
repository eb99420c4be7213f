"""End to end with real processes: three meta nodes, three brokers, produce and consume across remaps.

The tests speak plain HTTP (as any-language clients would), with a tiny route-following producer below.
"""

from __future__ import annotations

import asyncio
import collections
import time

import aiohttp

from ops import devcluster
from tests.support.meta_http import wait_until
from tests.support.broker_http import admin, all_writable, read_all, route, send, wait_route


SESSION_MS = 3000  # the full_cluster fixture's broker session (tests/conftest.py)


async def test_topic_is_balanced_and_old_leader_refuses_writes_after_remap(full_cluster):
    c = full_cluster
    s, b = await admin(c, "POST", 1, "/v1/topics", json={"topic": "bal", "queues": 9})
    assert s == 201, b
    r = await wait_route(c, "bal", all_writable)
    counts = collections.Counter(q["broker"] for q in r["queues"])
    assert sorted(counts.values()) == [3, 3, 3], counts
    old = r["queues"][0]
    assert await send(c, "bal", 0, ["a"]) == [0]
    target = next(b for b in ("b1", "b2", "b3") if b != old["broker"])
    s, b = await admin(c, "POST", 2, "/v1/topics/bal/remap", json={"brokers": [target], "queues": [0]})
    assert s == 200 and b["moved"] == [{"queue": 0, "from": old["broker"], "to": target, "gen": 1}], b
    await wait_route(c, "bal", lambda r: r["queues"][0]["writable"] and r["queues"][0]["broker"] == target)
    s, b, h = await c.call("POST", f"{old['address']}/v1/messages/bal/0", "client", json={"messages": [{"body": "x"}]})
    assert s == 409 and b["error"]["code"] == "NOT_LEADER", b
    assert b["error"]["details"]["broker"] == target
    assert "X-Route-Version" in h
    assert await send(c, "bal", 0, ["b"]) == [1]


async def test_remaps_back_and_forth_under_load_lose_nothing_and_keep_order(full_cluster):
    c = full_cluster
    s, b = await admin(c, "POST", 0, "/v1/topics", json={"topic": "flow", "queues": 3})
    assert s == 201, b
    await wait_route(c, "flow", all_writable)
    acked: dict[int, list[tuple[int, str]]] = {q: [] for q in range(3)}
    stop = asyncio.Event()

    async def producer(q: int):
        i = 0
        while not stop.is_set():
            bodies = [f"q{q}-{i + k}" for k in range(5)]
            offsets = await send(c, "flow", q, bodies)
            acked[q] += list(zip(offsets, bodies))
            i += 5

    tasks = [asyncio.create_task(producer(q)) for q in range(3)]
    # group offsets committed before the remaps must survive them
    await asyncio.sleep(0.5)
    r = await route(c, "flow")
    s, b, _ = await c.call("PUT", f"{r['queues'][1]['address']}/v1/offsets/g1/flow/1", "client", json={"offset": 3})
    assert s == 200, b
    for target in (["b1"], ["b2", "b3"], ["b3"], ["b1", "b2"], ["b2"]):
        s, b = await admin(c, "POST", 1, "/v1/topics/flow/remap", json={"brokers": target})
        assert s in (200, 503), b  # 503 SEALING: a previous move of some queue is still completing
        await wait_route(c, "flow", all_writable)
        await asyncio.sleep(0.3)
    stop.set()
    await asyncio.gather(*tasks)
    r = await route(c, "flow")
    assert max(len(q["segments"]) for q in r["queues"]) >= 3, "the queues were not remapped several times"
    for q in range(3):
        got = await read_all(c, "flow", q)
        offsets = [m["offset"] for m in got]
        assert offsets == list(range(len(offsets))), f"queue {q}: offsets not continuous"
        assert [(m["offset"], m["body"]) for m in got] == acked[q], f"queue {q}: not every acked message, once, in order"
        for seg, nxt in zip(r["queues"][q]["segments"], r["queues"][q]["segments"][1:]):
            assert seg["logic_end"] == nxt["logic_start"], "graceful remaps keep logic offsets continuous"
    addr = r["queues"][1]["address"]
    s, b, _ = await c.call("GET", f"{addr}/v1/offsets/g1/flow/1", "client")
    assert (s, b) == (200, {"offset": 3}), "a group's committed offset must survive every remap"


async def test_remap_with_dead_old_broker_completes_after_session_expiry(full_cluster):
    c = full_cluster
    # one copy: with more, the dead broker's queue fails over (tests/test_replication_e2e.py)
    s, b = await admin(c, "POST", 0, "/v1/topics", json={"topic": "dead", "queues": 1, "brokers": ["b1"],
                                                         "replicas": 1})
    assert s == 201, b
    await wait_route(c, "dead", all_writable)
    acked = await send(c, "dead", 0, [f"m{i}" for i in range(20)])
    assert acked == list(range(20))
    c.kill9("b1")
    t0 = time.monotonic()
    s, b = await admin(c, "POST", 0, "/v1/topics/dead/remap", json={"brokers": ["b2"]})
    assert s == 200, b
    r = await wait_route(c, "dead", lambda r: r["queues"][0]["writable"], timeout_s=SESSION_MS / 1000 + 20)
    waited = time.monotonic() - t0
    seg0, seg1 = r["queues"][0]["segments"]
    assert seg0["state"] == "sealed" and seg1["logic_start"] == seg0["logic_end"]
    assert seg1["logic_start"] >= 20, "the new segment must start beyond every acknowledged offset (bounded jump)"
    print(f"remap with a dead old broker completed after {waited:.2f} s; jump to {seg1['logic_start']}")
    after = await send(c, "dead", 0, ["new"])
    assert after == [seg1["logic_start"]]
    c.start("b1")  # its data is reachable again by logic offset once its broker is back
    got = await read_all(c, "dead", 0)
    assert [(m["offset"], m["body"]) for m in got] == [(i, f"m{i}") for i in range(20)] + [(after[0], "new")]


async def test_kill9_of_a_broker_during_produce_loses_no_acknowledged_message(full_cluster):
    c = full_cluster
    s, b = await admin(c, "POST", 0, "/v1/topics", json={"topic": "crash", "queues": 1,
                                                                           "brokers": ["b2"]})
    assert s == 201, b
    r = await wait_route(c, "crash", all_writable)
    addr = r["queues"][0]["address"]
    acked: list[tuple[int, str]] = []

    async def producer():
        i = 0
        while True:
            try:
                s, b, _ = await c.call("POST", f"{addr}/v1/messages/crash/0", "client",
                                       json={"messages": [{"body": f"m{i + k}"} for k in range(10)]}, timeout_s=2.0)
            except (aiohttp.ClientError, asyncio.TimeoutError):
                return
            if s != 200:
                return
            acked.extend(zip(b["offsets"], [f"m{i + k}" for k in range(10)]))
            i += 10

    task = asyncio.create_task(producer())
    await asyncio.sleep(1.0)
    c.kill9("b2")
    await asyncio.wait_for(task, 10)
    assert len(acked) > 0
    c.start("b2")
    await wait_route(c, "crash", all_writable)
    got = await read_all(c, "crash", 0)
    have = {(m["offset"], m["body"]) for m in got}
    missing = [a for a in acked if a not in have]
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:3]}"


async def test_growing_keeps_every_existing_queues_data(full_cluster):
    c = full_cluster
    s, b = await admin(c, "POST", 0, "/v1/topics", json={"topic": "grow", "queues": 2, "slots": 16})
    assert s == 201, b
    await wait_route(c, "grow", all_writable)
    before = {q: await send(c, "grow", q, [f"q{q}-{i}" for i in range(7)]) for q in range(2)}
    s, b = await admin(c, "PATCH", 2, "/v1/topics/grow", json={"queues": 4})
    assert s == 200 and b["queues"] == 4, b
    r = await wait_route(c, "grow", lambda r: len(r["queues"]) == 4 and all_writable(r)
                         and all(x["after_offset"] is not None for x in r["barriers"]))
    assert sorted((x["queue"], x["after_queue"], x["after_offset"]) for x in r["barriers"]) == [(2, 0, 7), (3, 1, 7)]
    covered = sorted((lo, hi) for lo, hi, _ in r["slot_table"])
    assert covered[0][0] == 0 and covered[-1][1] == 16 and all(a[1] == b[0] for a, b in zip(covered, covered[1:]))
    for q in range(2):
        got = await read_all(c, "grow", q)
        assert [m["body"] for m in got] == [f"q{q}-{i}" for i in range(7)] and before[q] == list(range(7))
        assert await send(c, "grow", q, ["after"]) == [7]


async def test_bad_broker_requests_get_clear_4xx(full_cluster):
    c = full_cluster
    s, b = await admin(c, "POST", 0, "/v1/topics", json={"topic": "bad", "queues": 1, "brokers": ["b3"]})
    assert s == 201, b
    r = await wait_route(c, "bad", all_writable)
    addr = r["queues"][0]["address"]
    cases = [
        ("POST", "/v1/messages/bad/0", {"messages": "x"}, 400, "INVALID_ARGUMENT"),
        ("POST", "/v1/messages/bad/0", {"messages": []}, 400, "INVALID_ARGUMENT"),
        ("POST", "/v1/messages/bad/0", {"messages": [{"body": 1}]}, 400, "INVALID_ARGUMENT"),
        ("POST", "/v1/messages/bad/0", {"messages": [{"body": "a", "body_b64": "YQ=="}]}, 400, "INVALID_ARGUMENT"),
        ("POST", "/v1/messages/bad/0", {"messages": [{"body": "a", "props": {"k": 1}}]}, 400, "INVALID_ARGUMENT"),
        ("POST", "/v1/messages/bad/x", {"messages": [{"body": "a"}]}, 400, "INVALID_ARGUMENT"),
        ("POST", "/v1/messages/bad/5", {"messages": [{"body": "a"}]}, 404, "QUEUE_NOT_FOUND"),
        ("POST", "/v1/messages/nope/0", {"messages": [{"body": "a"}]}, 404, "TOPIC_NOT_FOUND"),
        ("GET", "/v1/messages/bad/0?offset=-1", None, 400, "INVALID_ARGUMENT"),
        ("GET", "/v1/messages/bad/0?max=100000", None, 400, "INVALID_ARGUMENT"),
        ("PUT", "/v1/offsets/g/bad/0", {"offset": "x"}, 400, "INVALID_ARGUMENT"),
        ("PUT", "/v1/offsets/g/bad/0", [1], 400, "INVALID_ARGUMENT"),
    ]
    for method, path, body, status, code in cases:
        s, b, h = await c.call(method, addr + path, "client", json=body)
        assert (s, b["error"]["code"]) == (status, code), (method, path, body, s, b)
        assert "X-Route-Version" in h
    s, b, _ = await c.call("POST", addr + "/v1/messages/bad/0", None, json={"messages": [{"body": "a"}]})
    assert s == 401 and b["error"]["code"] == "UNAUTHENTICATED"
    s, b, _ = await c.call("GET", addr + "/v1/physical/bad.q0.g0.i1", "client")
    assert s == 403 and b["error"]["code"] == "PERMISSION_DENIED"
    s, b, _ = await c.call("POST", addr + "/v1/messages/bad/0", "client", data=b"{not json")
    assert s == 400 and b["error"]["code"] == "INVALID_ARGUMENT"
    got = await read_all(c, "bad", 0)
    assert got == [], "no bad request may have written anything"


async def test_lookup_by_time_and_queue_bounds_span_the_whole_history(full_cluster):
    c = full_cluster
    s, b = await admin(c, "POST", 0, "/v1/topics", json={"topic": "tm", "queues": 1, "brokers": ["b1"]})
    assert s == 201, b
    await wait_route(c, "tm", all_writable)
    assert await send(c, "tm", 0, ["a", "b", "c"]) == [0, 1, 2]
    await asyncio.sleep(0.05)
    t_mid = int(time.time() * 1000)
    await asyncio.sleep(0.05)
    assert await send(c, "tm", 0, ["d", "e"]) == [3, 4]
    s, b = await admin(c, "POST", 1, "/v1/topics/tm/remap", json={"brokers": ["b2"]})
    assert s == 200, b
    await asyncio.sleep(0.05)
    t_late = int(time.time() * 1000)
    await asyncio.sleep(0.05)
    assert await send(c, "tm", 0, ["f"]) == [5]
    r = await wait_route(c, "tm", all_writable)
    addr = r["queues"][0]["address"]
    for ts, want in ((0, 0), (t_mid, 3), (t_late, 5), (t_late + 3_600_000, 6)):
        s, b, _ = await c.call("GET", f"{addr}/v1/queues/tm/0/offset?ts={ts}", "client")
        assert (s, b) == (200, {"queue": 0, "offset": want}), (ts, s, b)
    s, b, _ = await c.call("GET", f"{addr}/v1/queues/tm", "client")
    assert (s, b) == (200, {"queues": [{"queue": 0, "min_offset": 0, "max_offset": 6}]})


async def test_a_broker_cut_off_from_meta_stops_taking_writes_until_it_renews(full_cluster):
    """DESIGN.md invariant 4: with no meta session for longer than the session timeout, a broker refuses writes."""
    c = full_cluster
    s, b = await admin(c, "POST", 0, "/v1/topics", json={"topic": "cut", "queues": 1, "brokers": ["b1"]})
    assert s == 201, b
    r = await wait_route(c, "cut", all_writable)
    addr = r["queues"][0]["address"]
    assert await send(c, "cut", 0, ["before"]) == [0]
    offsets = f"{addr}/v1/offsets/g/cut/0"
    s, b, _ = await c.call("PUT", offsets, "client", json={"offset": 1})
    assert (s, b) == (200, {"offset": 1})
    for m in ("m1", "m2", "m3"):
        c.kill9(m)
    deadline = time.monotonic() + SESSION_MS / 1000 + 10
    while True:
        s, b, _ = await c.call("POST", f"{addr}/v1/messages/cut/0", "client", json={"messages": [{"body": "x"}]})
        if s == 503 and b["error"]["code"] == "FENCED":
            break
        assert s == 200, b  # until the session lapses the broker still takes writes
        assert time.monotonic() < deadline, "the broker kept taking writes without a meta session"
        await asyncio.sleep(0.2)
    s, b, _ = await c.call("GET", f"{addr}/readyz", None)
    assert s == 503
    # nor commits or answers for committed offsets: meta may have moved the queue, whose new head takes newer ones
    s, b, _ = await c.call("PUT", offsets, "client", json={"offset": 2})
    assert s == 503 and b["error"]["code"] in ("FENCED", "LOCKS_CATCHING_UP"), b   # the lock table's own check
    s, b, _ = await c.call("GET", offsets, "client")
    assert (s, b["error"]["code"]) == (503, "FENCED"), b
    for m in ("m1", "m2", "m3"):  # b1 renews its session with the restarted meta cluster
        devcluster.start(c.dir, m, wait=False)
    devcluster.wait_ready(c.meta_urls)
    c.reload()
    deadline = time.monotonic() + 30
    while True:
        s, b, _ = await c.call("POST", f"{addr}/v1/messages/cut/0", "client", json={"messages": [{"body": "after"}]})
        if s == 200:
            break
        assert time.monotonic() < deadline, (s, b)
        await asyncio.sleep(0.2)
    s, b, _ = await c.call("GET", offsets, "client")
    assert (s, b) == (200, {"offset": 1})


async def test_a_record_over_the_storage_limit_is_413_and_stores_nothing(full_cluster):
    c = full_cluster
    s, b = await admin(c, "POST", 0, "/v1/topics", json={"topic": "big", "queues": 1, "brokers": ["b2"]})
    assert s == 201, b
    r = await wait_route(c, "big", all_writable)
    addr = r["queues"][0]["address"]
    huge = "x" * (5 * 1024 * 1024)  # over storage's 4 MiB per record, under the broker's 32 MiB body limit
    s, b, _ = await c.call("POST", f"{addr}/v1/messages/big/0", "client", json={"messages": [{"body": huge}]},
                           headers={"X-Route-Version": str(r["version"])})   # b2 decides on the new topic's route
    assert (s, b["error"]["code"]) == (413, "TOO_LARGE"), (s, b)
    assert await send(c, "big", 0, ["small"]) == [0]


async def test_a_committed_offset_is_the_newest_whatever_path_the_queue_took(full_cluster):
    """Commit 5 on b1, remap to b2, commit 9 there, remap back to b1: the offset is 9 on b1 (it read its own 5, the
    value it had left behind: consumers rewound and a deliberate rewind made on b2 was lost). Then a rewind to 2 on
    b1 holds on every later head."""
    c = full_cluster
    # One copy: with more, every copy of a segment holds its commits (tests/test_replicated_offsets.py), and the
    # read below finds the newest on a copy while b1 is down
    s, b = await admin(c, "POST", 0, "/v1/topics", json={"topic": "offpath", "queues": 1, "brokers": ["b1"],
                                                         "replicas": 1})
    assert s == 201, b
    await wait_route(c, "offpath", all_writable)
    await send(c, "offpath", 0, [f"m{i}" for i in range(12)])

    async def commit(offset: int) -> str:
        r = await wait_route(c, "offpath", all_writable)
        addr = r["queues"][0]["address"]
        s, b, _ = await c.call("PUT", f"{addr}/v1/offsets/g/offpath/0", "client", json={"offset": offset})
        assert s == 200, b
        return addr

    async def committed() -> int:
        r = await wait_route(c, "offpath", all_writable)
        s, b, _ = await c.call("GET", f"{r['queues'][0]['address']}/v1/offsets/g/offpath/0", "client")
        assert s == 200, b
        return b["offset"]

    async def move(to: str) -> None:
        s, b = await admin(c, "POST", 1, "/v1/topics/offpath/remap", json={"brokers": [to]})
        assert s == 200, b
        await wait_route(c, "offpath", lambda r: all_writable(r) and r["queues"][0]["address"] == c.url(to))

    assert await commit(5) == c.url("b1")
    await move("b2")
    assert await committed() == 5            # read through from the older head
    assert await commit(9) == c.url("b2")
    await move("b1")
    assert await committed() == 9, "the queue came back to b1, which read the 5 it had left behind"
    await commit(2)                          # a deliberate rewind, on b1
    await move("b3")
    assert await committed() == 2
    # b3 took the queue's commits over from b1 as it came to lead (replication/offsets.py): with b1 down it answers
    # that newest commit itself, never the older 9 it could still read on b2. (The read of a commit whose one holder
    # is down, refused 503: tests/test_replicated_offsets.py.)

    async def b3_holds() -> bool:
        s, b, _ = await c.call("GET", f"{c.url('b3')}/v1/replica/offsets/offpath/0", "broker")
        return s == 200 and [(x["group"], x["offset"]) for x in b["commits"]] == [("g", 2)]
    await wait_until(b3_holds, 30.0, "b3 holding the commit b1 made")
    await asyncio.to_thread(c.kill9, "b1")
    s, b, _ = await c.call("GET", f"{c.url('b3')}/v1/offsets/g/offpath/0", "client")
    assert (s, b) == (200, {"offset": 2}), (s, b)
    await asyncio.to_thread(c.start, "b1")

    async def back() -> int | None:
        s, b, _ = await c.call("GET", f"{c.url('b3')}/v1/offsets/g/offpath/0", "client")
        return b["offset"] if s == 200 else None
    assert await wait_until(back, 30.0, "b1 answering for its commit again") == 2
    # A commit on the head settles it without the other brokers.
    await commit(4)
    await asyncio.to_thread(c.kill9, "b1")
    assert await committed() == 4


async def test_a_queue_moved_three_times_still_reaches_its_first_broker(full_cluster):
    """A route carries a queue's newest ROUTE_SEGMENTS_PER_QUEUE_MAX segments, and the addresses of the brokers they
    name were all it carried: moved b1 -> b2 -> b3 -> b2, the queue's first segment is on b1 alone, and its head
    could not ask b1 whether a group committed there. A read of a group that never committed walks every segment,
    and was refused 503 BROKER_UNAVAILABLE for ever (the simulator, seed 1 under hash seed 5)."""
    c = full_cluster
    s, b = await admin(c, "POST", 0, "/v1/topics", json={"topic": "far", "queues": 1, "brokers": ["b1"],
                                                         "replicas": 1})
    assert s == 201, b
    await wait_route(c, "far", all_writable)
    await send(c, "far", 0, ["m0", "m1"])
    for to in ("b2", "b3", "b2"):
        s, b = await admin(c, "POST", 1, "/v1/topics/far/remap", json={"brokers": [to]})
        assert s == 200, b
        r = await wait_route(c, "far", lambda r: all_writable(r) and r["queues"][0]["address"] == c.url(to))
    assert [x["broker"] for x in r["queues"][0]["segments"]] == ["b2", "b3", "b2"]   # b1's is no longer carried
    s, b, _ = await c.call("GET", f"{c.url('b2')}/v1/offsets/never/far/0", "client")
    assert (s, b) == (200, {"offset": -1}), (s, b)
    assert r["addresses"]["b1"] == c.url("b1")
    got = await read_all(c, "far", 0)
    assert [m["body"] for m in got] == ["m0", "m1"]
