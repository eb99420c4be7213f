"""Consumer groups on a real three-node meta cluster (issue 7, part 1): heartbeats, leases, revocation, expiry,
settings, the operators' views, and the lock tables brokers read from the watch stream.

Leases are short (2 s) so that expiry is quick; the bounds on time are generous for a loaded 2-core machine.
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp

from wire.sse import SseParser
from tests.support.meta_http import assert_error_shape, call_any, ok, wait_until
from tests.support.group_members import HEARTBEAT_MS, LEASE_MS, beat, held, short_leases


async def brokerless_topic(c, name: str, queues: int) -> None:
    """Groups need only the topic's queue count: a topic needs a broker, so register one that never heartbeats."""
    await ok(c, "PUT", "/v1/brokers/bx", "broker", {"address": "http://127.0.0.1:9"})
    await ok(c, "POST", "/v1/topics", "admin", {"topic": name, "queues": queues}, expect=(201,))


async def test_members_share_the_queues_and_a_revoked_queue_moves_only_after_its_release(meta_cluster):
    c = meta_cluster
    await brokerless_topic(c, "t", 6)
    await short_leases(c)
    a = await beat(c, "a")
    assert sorted(held(a)) == list(range(6)) and a["lease_ms"] == LEASE_MS
    assert a["heartbeat_interval_ms"] == HEARTBEAT_MS and a["config"]["retry_topic"] == "g-retry"
    first_tokens = held(a)
    b = await beat(c, "b", url=c.meta_urls[2])   # any node: a follower forwards to the leader
    assert held(b) == {}, "b gets nothing while a still owns the queues it must give up"
    a2 = await beat(c, "a")
    kept, revoked = held(a2), set(first_tokens) - set(held(a2))
    assert len(kept) == 3 and len(revoked) == 3
    assert {(r["queue"], r["token"]) for r in a2["revoking"]} == {(q, first_tokens[q]) for q in revoked}, \
        "the answer names what the member must give up"
    assert all(kept[q] == first_tokens[q] for q in kept), "kept queues keep their tokens"
    b2 = await beat(c, "b")
    assert held(b2) == {}, "still not released"
    await beat(c, "a", released=[{"topic": "t", "queue": q, "token": first_tokens[q]} for q in sorted(revoked)])
    b3 = await beat(c, "b")
    assert set(held(b3)) == revoked
    assert min(held(b3).values()) > max(first_tokens.values()), "every new grant has a larger token"
    assert not set(held(b3)) & set(held(await beat(c, "a"))), "assignments are disjoint"


async def test_leave_releases_at_once_and_a_silent_member_loses_its_queues_when_its_lease_ends(meta_cluster):
    c = meta_cluster
    await brokerless_topic(c, "t", 4)
    await short_leases(c)
    await beat(c, "a")
    await beat(c, "b")
    await ok(c, "POST", "/v1/groups/g/leave", "client", {"member": "b"})
    assert sorted(held(await beat(c, "a"))) == [0, 1, 2, 3], "b left: a owns everything again"
    await beat(c, "b")
    assert len(held(await beat(c, "a"))) == 2, "b is back: half of a's queues are being revoked"
    # a goes silent now (and never releases): its queues stay its own until its lease ends, then move to b.
    silent_since = time.monotonic()
    await asyncio.sleep(LEASE_MS / 2000)
    b = await beat(c, "b")
    assert len(held(b)) < 4, "a's queues moved before its lease ended"

    async def b_owns_all():
        return len(held(await beat(c, "b"))) == 4
    await wait_until(b_owns_all, 15, "b to own every queue after a's lease")
    assert time.monotonic() - silent_since >= LEASE_MS / 1000
    _, hist, _ = await call_any(c, "GET", "/v1/history?after=0&limit=1000&consistency=linearizable", "client")
    reasons = [e["data"]["reason"] for e in hist["events"] if e["type"] in ("LockReleased", "GroupMemberLeft")]
    assert "left" in reasons and "lease_expired" in reasons
    granted = [e for e in hist["events"] if e["type"] == "LockGranted"]
    assert [e["data"]["token"] for e in granted] == sorted(e["data"]["token"] for e in granted)
    assert all(e["topic"] == "t" for e in granted), "lock events name their topic, for history filters"


async def test_operators_see_groups_and_brokers_get_lock_tables_on_the_watch_stream(meta_cluster):
    c = meta_cluster
    await brokerless_topic(c, "t", 3)
    await short_leases(c)
    a = await beat(c, "a")
    listed = await ok(c, "GET", f"/v1/groups?min_version={a['version']}", "client")   # any node: read my write
    assert [(g["group"], g["mode"], g["members"], g["locks"]) for g in listed["groups"]] == [("g", "exclusive", 1, 3)]
    for url in c.meta_urls:   # followers forward: lease ends live in the leader's memory
        d = await ok(c, "GET", "/v1/groups/g", "client", url=url)
        assert [m["member"] for m in d["members"]] == ["a"]
        assert {x["queue"]: x["token"] for x in d["assignments"]} == held(a)
        assert all(x["state"] == "owned" and x["lease_expires_ms"] for x in d["assignments"])
        assert all(x["committed_offset"] is None for x in d["assignments"]), "no broker to ask"
    s, body, _ = await call_any(c, "GET", "/v1/groups/nope", "client")
    assert s == 404 and body["error"]["code"] == "GROUP_NOT_FOUND"
    # The all-topic stream (what brokers read) carries the group's lock table; a topic stream does not.
    events = await sse_events(c, "/v1/watch?after=0", lambda evs: any(
        e["event"] == "group" and json.loads(e["data"])["version"] >= d["version"] for e in evs))
    group = [json.loads(e["data"]) for e in events if e["event"] == "group"][-1]
    assert group["group"] == "g" and group["mode"] == "exclusive"
    assert group["locks"] == {"t": [held(a)[q] for q in range(3)]}
    topic_events = await sse_events(c, "/v1/watch?topics=t&after=0", lambda evs: len(evs) >= 1)
    assert {e["event"] for e in topic_events} == {"route"}


async def test_bad_group_input_is_a_clear_4xx_and_changes_nothing(meta_cluster):
    c = meta_cluster
    await brokerless_topic(c, "t", 2)
    await beat(c, "a")
    _, before, _ = await call_any(c, "GET", "/v1/groups/g", "client")
    bad = [
        ("POST", "/v1/groups/g/heartbeat", "client", {"member": "a", "topics": ["t"], "mode": "shared"}, 409,
         "GROUP_MODE_MISMATCH"),
        ("POST", "/v1/groups/g/heartbeat", "client", {"member": "", "topics": ["t"], "mode": "exclusive"}, 400, None),
        ("POST", "/v1/groups/g/heartbeat", "client", {"member": "a", "topics": "t", "mode": "exclusive"}, 400, None),
        ("POST", "/v1/groups/g/heartbeat", "client", {"member": "a", "topics": ["t"], "mode": "exclusive",
                                                      "released": [{"topic": "t", "queue": -1, "token": 1}]}, 400, None),
        ("POST", "/v1/groups/g/heartbeat", "client", {"member": "a", "topics": ["t"], "mode": "exclusive", "x": 1},
         400, None),
        ("POST", "/v1/groups/g/heartbeat", "broker", {"member": "a", "topics": ["t"], "mode": "exclusive"}, 403, None),
        ("PUT", "/v1/groups/g/config", "admin", {"lease_ms": 1000, "heartbeat_interval_ms": 900}, 400, None),
        ("PUT", "/v1/groups/g/config", "admin", {"lease_ms": "15000"}, 400, None),
        ("PUT", "/v1/groups/g/config", "client", {"lease_ms": 15000}, 403, None),
        ("POST", "/v1/groups/nope/leave", "client", {"member": "a"}, 404, "GROUP_NOT_FOUND"),
    ]
    for method, path, role, body, status, code in bad:
        s, answer, _ = await call_any(c, method, path, role, body)
        assert s == status, (path, body, s, answer)
        assert_error_shape(answer, path)
        if code:
            assert answer["error"]["code"] == code
    _, after, _ = await call_any(c, "GET", "/v1/groups/g", "client")
    assert after["version"] == before["version"] and after["assignments"] == before["assignments"]


async def sse_events(c, path: str, enough, timeout_s: float = 10.0) -> list[dict]:
    parser = SseParser()
    got: list[dict] = []
    async with c.session.get(c.meta_urls[1] + path, headers=c.headers("broker"),
                             timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
        assert r.status == 200
        async for chunk in r.content.iter_any():
            got += [{"event": e.event, "id": e.id, "data": e.data} for e in parser.feed(chunk)]
            if enough(got):
                return got
    raise AssertionError(f"stream ended with {got}")


async def test_a_leader_change_keeps_every_live_member_s_queues_and_tokens(meta_cluster):
    """A new leader cannot know when the old one last heard each member: it starts every lease afresh, so members
    that keep heartbeating through the election keep their queues and tokens (nothing expires, nothing moves)."""
    c = meta_cluster
    await brokerless_topic(c, "t", 4)
    await ok(c, "PUT", "/v1/groups/g/config", "admin", {"lease_ms": 6000, "heartbeat_interval_ms": 500})
    for m in ("a", "b"):
        await beat(c, m)
    # a never releases here: b gets its share once the revocations' lease ended.

    async def settled():
        now = {m: held(await beat(c, m)) for m in ("a", "b")}
        return now if len(now["a"]) == 2 and len(now["b"]) == 2 else None
    tokens = await wait_until(settled, 20, "the revoked queues to move after their lease")
    old_leader = await c.leader()
    _, hist, _ = await call_any(c, "GET", "/v1/history?after=0&limit=1000&consistency=linearizable", "client")
    expired_before = sum(e["type"] == "LockReleased" and e["data"]["reason"] == "lease_expired" for e in hist["events"])
    # a's two revoked queues reached b by expiry (a never released them); read linearizably, since a follower's
    # image may not hold those expiries yet (CI read 0 here from a lagging node, then 2 after the election)
    assert expired_before == 2, hist["events"]
    c.kill9(old_leader)
    deadline = time.monotonic() + 12
    while time.monotonic() < deadline:   # keep both members heartbeating, through the election, for two leases
        for m in ("a", "b"):
            s, answer, _ = await call_any(c, "POST", "/v1/groups/g/heartbeat", "client",
                                          {"member": m, "topics": ["t"], "mode": "exclusive"}, timeout_s=5)
            assert s == 200, answer
            assert held(answer) == tokens[m], f"{m} lost or changed queues across the leader change"
        await asyncio.sleep(0.4)
    assert await c.leader() != old_leader
    _, hist, _ = await call_any(c, "GET", "/v1/history?after=0&limit=1000&consistency=linearizable", "client")
    assert sum(e["type"] == "LockReleased" and e["data"]["reason"] == "lease_expired"
               for e in hist["events"]) == expired_before
    assert not [e for e in hist["events"] if e["type"] == "GroupMemberLeft"]


async def test_a_shorter_lease_applies_from_the_next_answer_never_to_a_lease_already_promised(meta_cluster):
    """a holds the queue under a 6 s lease; the admin shortens lease_ms to 2 s and a goes silent: by a's clock it
    keeps the queue until its answer's lease end, so nobody may be granted it before then (the leader used to expire
    a by the new 2 s and hand the queue to b while a still held it). After that end, b gets it."""
    c = meta_cluster
    promised_end_ms = await promised_then_shortened(c, "promised", "gp")
    await b_waits_out(c, "promised", "gp", promised_end_ms - 500)
    assert (await beat(c, "b", topics=("promised",), group="gp"))["lease_ms"] == LEASE_MS


async def test_a_lease_promised_before_it_was_shortened_outlives_the_leader_that_promised_it(meta_cluster):
    """As above, and the leader that promised a's 6 s is then lost. The new leader cannot know when the old one last
    heard a, so it starts every lease afresh; it must count a's silence against the longest lease an answer of
    the old leader may still carry, not the group's new 2 s (it used to, and b got a's queue seconds early: found by
    the chaos runner's leases_never_overlap)."""
    c = meta_cluster
    leader = await c.leader()
    promised_end_ms = await promised_then_shortened(c, "promised2", "gl")
    await asyncio.to_thread(c.kill9, leader)
    try:
        # b's heartbeats go to any node: the election's 503s are skipped
        await b_waits_out(c, "promised2", "gl", promised_end_ms - 300)
    finally:
        await asyncio.to_thread(c.start, leader)


async def test_a_revoked_queue_waits_out_the_longest_lease_its_holder_was_promised(meta_cluster):
    """a holds both queues under a 6 s lease; lease_ms is shortened to 2 s, b joins and one of a's queues is revoked.
    a heartbeats on (each answer now carries 2 s) but never releases it: b may be granted it only once a's 6 s
    ended. The leader used to count the revoked queue against the last answer's 2 s, which hid the 6 s before it
    (the chaos runner's leases_never_overlap, one run in four at seed 884)."""
    c = meta_cluster
    await brokerless_topic(c, "revoked", 2)
    await ok(c, "PUT", "/v1/groups/gr/config", "admin", {"lease_ms": 6000, "heartbeat_interval_ms": HEARTBEAT_MS})
    a = await beat(c, "a", topics=("revoked",), group="gr")
    assert len(held(a)) == 2 and a["lease_ms"] == 6000
    promised_end_ms = a["assignments"][0]["lease_expires_ms"]
    await ok(c, "PUT", "/v1/groups/gr/config", "admin", {"lease_ms": LEASE_MS, "heartbeat_interval_ms": HEARTBEAT_MS})
    assert (await beat(c, "a", topics=("revoked",), group="gr"))["lease_ms"] == LEASE_MS
    stop = asyncio.Event()

    async def a_beats_on() -> None:   # a keeps its member lease alive, and its revoked queue unreleased
        while not stop.is_set():
            await beat(c, "a", topics=("revoked",), group="gr")
            await asyncio.sleep(HEARTBEAT_MS / 1000)

    beating = asyncio.create_task(a_beats_on())
    try:
        await b_waits_out(c, "revoked", "gr", promised_end_ms - 500)
    finally:
        stop.set()
        await beating   # an assertion of a's heartbeats fails the test here


async def promised_then_shortened(c, topic: str, group: str) -> int:
    """a holds ``topic``'s one queue under a 6 s lease, then lease_ms is shortened to LEASE_MS: a's lease end."""
    await brokerless_topic(c, topic, 1)
    await ok(c, "PUT", f"/v1/groups/{group}/config", "admin", {"lease_ms": 6000, "heartbeat_interval_ms": HEARTBEAT_MS})
    a = await beat(c, "a", topics=(topic,), group=group)
    assert held(a) and a["lease_ms"] == 6000
    await ok(c, "PUT", f"/v1/groups/{group}/config", "admin", {"lease_ms": LEASE_MS,
                                                                "heartbeat_interval_ms": HEARTBEAT_MS})
    return a["assignments"][0]["lease_expires_ms"]


async def b_waits_out(c, topic: str, group: str, refused_until_ms: float) -> None:
    """b heartbeats and holds nothing until ``refused_until_ms``, then is granted a's queue within 20 s."""
    while time.time() * 1000 < refused_until_ms:
        b = await beat(c, "b", topics=(topic,), group=group)
        early_ms = refused_until_ms - time.time() * 1000
        assert held(b) == {}, f"b was granted a's queue {early_ms:.0f} ms before a's lease end (less the margin)"
        await asyncio.sleep(0.2)

    async def granted():
        b = await beat(c, "b", topics=(topic,), group=group)
        return held(b) or None
    await wait_until(granted, 20.0, "b granted the queue after a's lease ended")
