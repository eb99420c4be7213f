"""Committed offsets on every copy (issue 37, broker/replication/offsets.py), on real processes: three brokers, topics
of several copies, groups committing while their queue's leader is killed with kill -9 and its data directory
removed. No acknowledged commit goes back, the new leader answers them without the dead one, a copy back on an
empty disk gets every commit before it joins the in-sync set, and the client's exclusive group carries on."""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import time

import aiohttp

from client import AdminClient, ExclusiveConsumer, Producer, PullConsumer, ReceivedMessage, StatorError
from client.selection import KeySelector
from tests.support.broker_http import admin, route, wait_route
from tests.support.cluster import running
from tests.support.meta_http import wait_until

SESSION_TIMEOUT_MS = 3_000
EXTRA_META = {"session_timeout_ms": SESSION_TIMEOUT_MS, "heartbeat_interval_ms": 500}
GROUPS = 3
QUEUES = 2
KEYS = 32
CALL_TIMEOUT_S = 5.0
ANSWER_WAIT_S = SESSION_TIMEOUT_MS / 1000 + 20.0   # a failover on a loaded 2-core machine, generously


def lose(c, broker: str) -> None:
    c.kill9(broker)
    shutil.rmtree(os.path.join(c.dir, broker, "data"))


async def commit_at_head(c, topic: str, group: str, queue: int, offset: int) -> bool:
    """One commit to the queue's head as the route names it: True when acknowledged, False when refused for a
    moved or fenced head, or unanswered (then it may or may not stand)."""
    q = (await route(c, topic))["queues"][queue]
    try:
        s, b, _ = await c.call("PUT", f"{q['address']}/v1/offsets/{group}/{topic}/{queue}", "client",
                               json={"offset": offset}, timeout_s=CALL_TIMEOUT_S)
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return False
    assert s in (200, 409, 503), (s, b)
    return s == 200


async def committed(c, topic: str, group: str, queue: int) -> int:
    """The committed offset as the queue's head answers it, asking again while the head moves (503, 409)."""
    deadline = time.monotonic() + ANSWER_WAIT_S
    while True:
        q = (await route(c, topic))["queues"][queue]
        try:
            s, b, _ = await c.call("GET", f"{q['address']}/v1/offsets/{group}/{topic}/{queue}", "client",
                                   timeout_s=CALL_TIMEOUT_S)
            if s == 200:
                return b["offset"]
            assert s in (409, 503), (s, b)
            last = b
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            last = repr(e)
        assert time.monotonic() < deadline, f"{group} {topic}/{queue}: no answer from its head; last {last}"
        await asyncio.sleep(0.1)


async def test_commits_acknowledged_before_their_leader_is_lost_with_its_disk_never_go_back(tmp_path):
    async with running(str(tmp_path), 3, 3, meta=EXTRA_META) as c:
        s, b = await admin(c, "POST", 0, "/v1/topics", {"topic": "o", "queues": QUEUES, "replicas": 3})
        assert s == 201 and b["min_insync"] == 2, b
        r = await wait_route(c, "o", lambda r: all(len(q["in_sync"]) == 3 and q["writable"] for q in r["queues"]))
        victim = r["queues"][0]["broker"]
        acked: dict[tuple[str, int], int] = {}       # the newest acknowledged commit per (group, queue)
        tried: dict[tuple[str, int], int] = {}       # the newest one sent, acknowledged or not
        stop = asyncio.Event()

        async def committer(group: str, queue: int) -> None:
            offset = 0
            while not stop.is_set():
                offset += 1
                tried[(group, queue)] = offset
                if await commit_at_head(c, "o", group, queue, offset):
                    acked[(group, queue)] = offset
                else:
                    await asyncio.sleep(0.05)

        async def first_commit_after(queue: int, since: float) -> float:
            """Seconds from ``since`` to the first acknowledged commit of another group on the queue."""
            while not await commit_at_head(c, "o", "probe", queue, 1):
                assert time.monotonic() - since < ANSWER_WAIT_S, f"o/{queue} took no commit after the kill"
                await asyncio.sleep(0.05)
            return time.monotonic() - since

        tasks = [asyncio.create_task(committer(f"g{i}", q)) for i in range(GROUPS) for q in range(QUEUES)]
        await asyncio.sleep(1.5)
        assert len(acked) == GROUPS * QUEUES, acked
        lose(c, victim)
        killed_at = time.monotonic()
        stop.set()   # the groups stop here: what the new heads answer must hold what was acknowledged before
        await asyncio.gather(*tasks)
        again = await asyncio.gather(*(first_commit_after(q, killed_at) for q in range(QUEUES)))
        led = [q for q in range(QUEUES) if r["queues"][q]["broker"] == victim]
        for q in led:   # commits go on within the session timeout + 2 s, with no operator command
            assert again[q] <= SESSION_TIMEOUT_MS / 1000 + 2.0, (q, again)
        after = await route(c, "o")
        assert all(q["broker"] != victim for q in after["queues"])
        for (group, q), offset in sorted(acked.items()):
            # answered by the new head alone: the dead leader is never waited for
            got = await committed(c, "o", group, q)
            assert offset <= got <= tried[(group, q)], f"{group} o/{q}: acknowledged {offset}, read {got}"
        for q in led:
            # nor for a group that never committed: the copy elected held every commit the dead leader acknowledged
            assert await committed(c, "o", "never", q) == -1


async def test_a_copy_back_on_an_empty_disk_gets_every_commit_before_it_is_in_sync_again(tmp_path):
    """Two copies: the leader is lost, the other leads and takes new commits alone; the lost one comes back on an
    empty disk, catches up and joins the in-sync set; then the other is lost too. Only the snapshot the leader sent
    before asking meta to add it (replication/offsets.py ``ready``) brought it the commits made while it was away."""
    async with running(str(tmp_path), 3, 3, meta=EXTRA_META) as c:
        s, b = await admin(c, "POST", 0, "/v1/topics", {"topic": "o", "queues": 1, "replicas": 2, "min_insync": 1})
        assert s == 201, b
        r = await wait_route(c, "o", lambda r: len(r["queues"][0]["in_sync"]) == 2 and r["queues"][0]["writable"])
        first, second = r["queues"][0]["replicas"]
        for i in range(GROUPS):
            assert await commit_at_head(c, "o", f"g{i}", 0, 10 + i)
        assert await commit_at_head(c, "o", "old", 0, 5)   # never again: the snapshot carries it at gen 0
        lose(c, first)
        await wait_route(c, "o", lambda r: r["queues"][0]["broker"] == second and r["queues"][0]["writable"],
                         timeout_s=ANSWER_WAIT_S)
        expected = {f"g{i}": 20 + i for i in range(GROUPS + 1)}   # every group moves on, and a new one commits
        for group, offset in expected.items():
            assert await commit_at_head(c, "o", group, 0, offset)
        # a leader the failover deposed cannot push to a copy that knows the new head
        stale = {"topic": "o", "queue": 0, "leader_gen": 0, "commits": [{"group": "g0", "offset": 0, "gen": 0,
                                                                          "seq": 2**62}]}
        s, b, _ = await c.call("PUT", f"{c.url(second)}/v1/replica/offsets", "broker", json=stale)
        assert s == 409 and b["error"]["code"] == "NOT_LEADER", (s, b)
        c.start(first)
        await wait_route(c, "o", lambda r: set(r["queues"][0]["in_sync"]) == {first, second}, timeout_s=60.0)
        lose(c, second)
        await wait_route(c, "o", lambda r: r["queues"][0]["broker"] == first and r["queues"][0]["writable"],
                         timeout_s=ANSWER_WAIT_S)
        assert {g: await committed(c, "o", g, 0) for g in [*expected, "old"]} == {**expected, "old": 5}


async def test_an_exclusive_group_carries_on_when_its_queue_s_leader_is_lost_and_its_commits_never_go_back(tmp_path):
    """The client's ExclusiveConsumer consuming keyed sends, its queue's leader lost with its disk: the group's
    committed offsets, read through the heads all along, never go back; it handles the queue's new messages again
    within the session timeout + 2 s; every acknowledged message is handled, each key in order."""
    async with running(str(tmp_path), 3, 3, meta=EXTRA_META) as c:
        async with AdminClient(c.meta_urls, c.token("admin")) as admin:
            await admin.create_topic("x", queues=QUEUES, replicas=3)
            await admin.set_group_config("grp", {"lease_ms": 2000, "heartbeat_interval_ms": 500})
        r = await wait_route(c, "x", lambda r: all(len(q["in_sync"]) == 3 and q["writable"] for q in r["queues"]))
        victim = r["queues"][0]["broker"]
        handled: list[tuple[float, int, int, str]] = []   # (monotonic time, queue, offset, body)
        sent: dict[str, tuple[float, int]] = {}           # body -> (monotonic time acknowledged, queue)
        commits: dict[int, list[int]] = {q: [] for q in range(QUEUES)}
        stop = asyncio.Event()

        async def handle(m: ReceivedMessage) -> None:
            handled.append((time.monotonic(), m.queue, m.offset, m.text))

        async def produce() -> None:
            async with Producer(c.meta_urls, c.token("client"), "x", selector=KeySelector()) as p:
                for i in itertools.count():
                    if stop.is_set():
                        return
                    for k in range(KEYS):
                        out = await p.send(f"k{k}:{i}", key=f"k{k}")
                        sent[f"k{k}:{i}"] = (time.monotonic(), out.queue)
                    await asyncio.sleep(0.02)

        async def sample_commits() -> None:
            async with PullConsumer(c.meta_urls, c.token("client"), "x", "grp") as reader:
                while not stop.is_set():
                    for q in range(QUEUES):
                        try:
                            commits[q].append(await reader.committed(q))
                        except StatorError:
                            pass   # the head is moving: no answer is no value
                    await asyncio.sleep(0.05)

        member = ExclusiveConsumer(c.meta_urls, c.token("client"), "x", "grp", handle, member="a")
        await member.start()
        tasks = [asyncio.create_task(produce()), asyncio.create_task(sample_commits())]
        try:
            await wait_until(lambda: _committed_past(commits, 0, 10), ANSWER_WAIT_S, "commits on queue 0")
            lose(c, victim)
            killed_at = time.monotonic()
            await wait_until(lambda: _handled_sent_after(handled, sent, 0, killed_at), ANSWER_WAIT_S,
                             "a message sent to queue 0 after the kill handled")
            again = min(t for t, q, _, body in handled if q == 0 and sent.get(body, (0.0,))[0] > killed_at) - killed_at
            await asyncio.sleep(1.0)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        await wait_until(lambda: _handled_all(handled, sent), ANSWER_WAIT_S, "every acknowledged message handled")
        await member.close()
        assert again <= SESSION_TIMEOUT_MS / 1000 + 2.0, f"queue 0 carried on {again:.2f} s after its leader was lost"
        for q, values in commits.items():
            assert values == sorted(values), f"queue {q}: a committed offset went back: {values}"
        by_key: dict[str, list[int]] = {}
        for _, _, _, body in handled:
            key, seq = body.split(":")
            by_key.setdefault(key, []).append(int(seq))
        for key, seqs in by_key.items():   # at least once, in order: a repeat goes back, nothing is skipped
            assert seqs[0] == 0 and all(b <= a + 1 for a, b in zip(seqs, seqs[1:])), f"{key}: out of order: {seqs}"


async def _committed_past(commits: dict[int, list[int]], queue: int, offset: int) -> bool:
    return bool(commits[queue]) and commits[queue][-1] > offset


async def _handled_sent_after(handled: list, sent: dict, queue: int, since: float) -> bool:
    return any(q == queue and sent.get(body, (0.0,))[0] > since for _, q, _, body in handled)


async def _handled_all(handled: list, sent: dict) -> bool:
    return set(sent) <= {body for _, _, _, body in handled}


async def _committed_then_moved(c) -> tuple[str, str, str]:
    """Topic "o" of one queue and two copies (first and second), group "g" committing 50 there, then the queue
    remapped to the third broker: (first, second, third)."""
    s, b = await admin(c, "POST", 0, "/v1/topics", {"topic": "o", "queues": 1, "replicas": 2, "min_insync": 1})
    assert s == 201, b
    r = await wait_route(c, "o", lambda r: len(r["queues"][0]["in_sync"]) == 2 and r["queues"][0]["writable"])
    first, second = r["queues"][0]["replicas"]
    third = next(b["broker"] for b in c.info["brokers"] if b["broker"] not in (first, second))
    assert await commit_at_head(c, "o", "g", 0, 50)
    s, b = await admin(c, "POST", 0, "/v1/topics/o/remap", {"brokers": [third]})
    assert s == 200, b
    await wait_route(c, "o", lambda r: r["queues"][0]["broker"] == third and r["queues"][0]["writable"])
    return first, second, third


async def test_a_commit_is_found_on_a_copy_when_its_leader_lost_its_disk_after_the_queue_moved_on(tmp_path):
    """Found by the chaos runner (broker_wipe with remaps, seed 9): a read walked the queue's segments asking each
    one's leader only; the leader of the segment a commit was made on had lost its disk since, answered -1, and the
    copy that held the commit was never asked."""
    async with running(str(tmp_path), 3, 3, meta=EXTRA_META) as c:
        first, second, third = await _committed_then_moved(c)
        # Its leader down, gen 0 is settled by its copy, whose disk holds its commits (offset_witness.py): answered
        # at once, not refused 503 for want of a holder
        c.kill9(first)
        q = (await route(c, "o"))["queues"][0]
        s, b, _ = await c.call("GET", f"{q['address']}/v1/offsets/g/o/0", "client", timeout_s=CALL_TIMEOUT_S)
        assert (s, b) == (200, {"offset": 50}), (s, b)
        lose(c, first)
        c.start(first)   # back on an empty disk: it answers that it holds no commit
        deadline = time.monotonic() + ANSWER_WAIT_S
        while (await c.call("GET", f"{c.url(first)}/readyz", None))[0] != 200:
            assert time.monotonic() < deadline, f"{first} not ready again"
            await asyncio.sleep(0.1)
        assert await committed(c, "o", "g", 0) == 50


async def test_a_head_takes_its_queue_s_commits_over_so_they_outlive_the_disks_they_were_made_on(tmp_path):
    """Found by the chaos runner (seed 20): a commit made on b3 and b2 stayed on those two after the queue moved on,
    the new head and its copies never holding it; b3 then b2 lost their disks, and the group read -1. A head this
    broker comes to lead takes the queue's commits from its older segments' holders (replication/offsets.py), so
    the disks of the segment a commit was made on may all go."""
    async with running(str(tmp_path), 3, 3, meta=EXTRA_META) as c:
        first, second, third = await _committed_then_moved(c)   # 50, on first and second

        async def third_holds() -> bool:
            s, b, _ = await c.call("GET", f"{c.url(third)}/v1/replica/offsets/o/0", "broker")
            return s == 200 and any(x["group"] == "g" and x["offset"] == 50 for x in b["commits"])
        await wait_until(third_holds, ANSWER_WAIT_S, f"{third} holding the commit made before the remap")
        for lost in (first, second):   # every disk the commit was made on
            lose(c, lost)
        for lost in (first, second):
            c.start(lost)
        assert await committed(c, "o", "g", 0) == 50


async def test_holders_back_on_empty_disks_never_settle_a_commit_whose_one_holder_is_down(tmp_path):
    """Found by the chaos runner (seed 7): a read settled a segment on the first holder that answered; the two
    named in its in-sync set were back on empty disks and answered "nothing" while the one holding the commit was
    down, and the group read -1. A holder's answer now settles only the segments whose commits its disk holds
    (broker/offset_witness.py); until one of those answers, the read is refused 503 (retry), and it answers the
    commit once that broker is back."""
    async with running(str(tmp_path), 3, 3, meta=EXTRA_META) as c:
        s, b = await admin(c, "POST", 0, "/v1/topics", {"topic": "o", "queues": 1, "replicas": 3, "min_insync": 1})
        assert s == 201, b
        r = await wait_route(c, "o", lambda r: len(r["queues"][0]["in_sync"]) == 3 and r["queues"][0]["writable"])
        first = r["queues"][0]["broker"]
        second, third = r["queues"][0]["replicas"][1:]
        assert await commit_at_head(c, "o", "g", 0, 50)   # on all three
        s, b = await admin(c, "POST", 0, "/v1/topics/o/remap", {"brokers": [second]})
        assert s == 200, b   # gen 0, sealed, names all three in sync
        await wait_route(c, "o", lambda r: r["queues"][0]["broker"] == second and r["queues"][0]["writable"])
        c.kill9(first)   # down, its disk kept: the one holder left once the others lose theirs
        await wait_route(c, "o", lambda r: first not in r["queues"][0]["in_sync"], timeout_s=ANSWER_WAIT_S)
        # Each back on an empty disk, the head's leader first. Both lost before either starts: third, back while
        # second still held its disk, could copy the commit from second's head and settle the read (rightly: 50)
        for lost in (third, second):
            lose(c, lost)
        for lost in (second, third):
            c.start(lost)
        # whichever of the two leads now (the order meta hears them in decides), it leads on an empty disk
        await wait_route(c, "o", lambda r: r["queues"][0]["broker"] in (second, third) and r["queues"][0]["writable"]
                         and r["queues"][0]["gen"] >= 2, timeout_s=ANSWER_WAIT_S)
        q = (await route(c, "o"))["queues"][0]
        s, b, _ = await c.call("GET", f"{q['address']}/v1/offsets/g/o/0", "client", timeout_s=CALL_TIMEOUT_S)
        assert (s, b["error"]["code"] if s != 200 else b) == (503, "BROKER_UNAVAILABLE"), (s, b)
        c.start(first)
        assert await committed(c, "o", "g", 0) == 50
