"""Ordered consumption end to end (issue 7): meta decides the locks, brokers enforce the tokens, consumers obey leases.

Real processes: three meta nodes, two brokers, and exclusive consumers both in this test's process and in processes
of their own (tests/support/ordered_consumer_proc.py), which the tests pause with SIGSTOP or kill with SIGKILL.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict

import pytest

from client import AdminClient, ExclusiveConsumer, KeySelector, Producer, queue_for_key
from tests.support import cluster as cluster_mod
from tests.support.meta_http import ok, wait_until

LEASE_MS = 3000
HEARTBEAT_MS = 500
SETTLE_S = 30.0   # generous: a loaded 2-core machine


@pytest.fixture
async def cluster(tmp_path):
    async with cluster_mod.running(str(tmp_path), 3, 2,
                                   meta={"session_timeout_ms": 3000, "heartbeat_interval_ms": 500}) as c:
        yield c


async def setup_topic(c, topic: str, queues: int, group: str) -> None:
    async with AdminClient(c.meta_urls, c.token("admin")) as admin:
        await admin.create_topic(topic, queues=queues)
    await ok(c, "PUT", f"/v1/groups/{group}/config", "admin", {"lease_ms": LEASE_MS, "heartbeat_interval_ms": HEARTBEAT_MS})


async def describe(c, group: str) -> dict:
    # Linearizable: any node answers, and one that has not applied the group's setup yet said GROUP_NOT_FOUND (404)
    # to a test waiting for its first owner on a loaded machine
    return await ok(c, "GET", f"/v1/groups/{group}?consistency=linearizable", "client")


async def owned_by(c, group: str, member: str) -> dict[int, int]:
    d = await describe(c, group)
    return {a["queue"]: a["token"] for a in d["assignments"] if a["member"] == member and a["state"] == "owned"}


def start_proc(c, tmp_path, topic: str, group: str, member: str) -> tuple[subprocess.Popen, str]:
    out = str(tmp_path / f"{member}.jsonl")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.ordered_consumer_proc", os.path.join(c.dir, "cluster.json"),
                             topic, group, member, out], env=env, stderr=subprocess.PIPE)
    return proc, out


def handled(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def key(k: int) -> str:
    # Spread over the slot table: "k0".."k9" all fall in the lower half of 1,024 slots, so one queue of two.
    return f"customer-{k * 7919}"


async def produce(c, topic: str, keys: int, per_key: int, start: int = 0) -> list[tuple[str, int]]:
    """Sends (key, seq) in order per key (each send awaited); returns what was sent."""
    sent = []
    async with Producer(c.meta_urls, c.token("client"), topic, selector=KeySelector()) as p:
        for seq in range(start, start + per_key):
            for k in range(keys):
                await p.send(f"{seq}", key=key(k))
                sent.append((key(k), seq))
    return sent


async def broker_refuses_token(c, topic: str, group: str, queue: int, token: int) -> None:
    """Both a pull and a commit with ``token`` are 409 STALE_TOKEN at the queue's head broker."""
    route = await ok(c, "GET", f"/v1/routes/{topic}", "client")
    address = route["queues"][queue]["address"]
    s, body, _ = await c.call("GET", f"{address}/v1/messages/{topic}/{queue}?offset=0&group={group}&token={token}",
                              "client")
    assert s == 409 and body["error"]["code"] == "STALE_TOKEN", (s, body)
    s, body, _ = await c.call("PUT", f"{address}/v1/offsets/{group}/{topic}/{queue}", "client",
                              json={"offset": 0, "token": token})
    assert s == 409 and body["error"]["code"] == "STALE_TOKEN", (s, body)


async def test_a_paused_owner_keeps_its_stale_token_but_the_brokers_refuse_it(cluster, tmp_path):
    c = cluster
    await setup_topic(c, "o", 4, "g")
    paused, out = start_proc(c, tmp_path, "o", "g", "paused")
    try:
        await wait_until(lambda: _len_is(owned_by(c, "g", "paused"), 4), SETTLE_S, "the first member to own all")
        stale = await owned_by(c, "g", "paused")
        sent = await produce(c, "o", keys=8, per_key=3)
        await wait_until(lambda: _true(len(handled(out)) >= len(sent)), SETTLE_S, "the first member to handle all")
        os.kill(paused.pid, signal.SIGSTOP)
        paused_at = time.monotonic()
        got: list[tuple[int, int]] = []

        async def handle(m):
            got.append((m.queue, m.offset))
        async with ExclusiveConsumer(c.meta_urls, c.token("client"), "o", "g", handle, member="taker",
                                     idle_pause_s=0.05) as taker:
            await wait_until(lambda: _true(len(taker.held()) == 4), SETTLE_S, "the taker to own every queue")
            assert time.monotonic() - paused_at >= LEASE_MS / 1000 - 0.5, "the paused member lost its queues early"
            assert min(taker.held().values()) > max(stale.values()), "new grants carry larger tokens"
            for q, token in stale.items():
                await broker_refuses_token(c, "o", "g", q, token)
            more = await produce(c, "o", keys=8, per_key=2, start=3)
            await wait_until(lambda: _true(len(got) >= len(more)), SETTLE_S, "the taker to handle the new messages")
            before_resume = len(handled(out))
            os.kill(paused.pid, signal.SIGCONT)
            await asyncio.sleep(2 * LEASE_MS / 1000)   # the resumed member pulls and commits with its stale tokens
            assert len(handled(out)) == before_resume, "a member whose lease ended handled messages after resuming"
            # The resumed member's positions are older than the taker's: a commit of theirs would move offsets back.
            committed = {a["queue"]: a["committed_offset"] for a in (await describe(c, "g"))["assignments"]}
            moved_on = taker.positions()
            assert moved_on and all(committed[q] == p for q, p in moved_on.items()), (committed, moved_on)
    finally:
        os.kill(paused.pid, signal.SIGCONT)
        paused.terminate()
        paused.wait(15)


async def test_a_crashed_owner_s_queues_move_only_after_its_lease_and_nothing_is_lost(cluster, tmp_path):
    c = cluster
    await setup_topic(c, "o", 3, "g")
    crashed, out = start_proc(c, tmp_path, "o", "g", "crashed")
    got: list[dict] = []

    async def handle(m):
        got.append({"queue": m.queue, "offset": m.offset, "key": m.key, "body": m.text})
    try:
        await wait_until(lambda: _len_is(owned_by(c, "g", "crashed"), 3), SETTLE_S, "the first member to own all")
        sent = await produce(c, "o", keys=6, per_key=4)
        await wait_until(lambda: _true(len(handled(out)) >= len(sent) // 2), SETTLE_S, "handling under way")
        crashed.kill()
        killed_at = time.monotonic()
        async with ExclusiveConsumer(c.meta_urls, c.token("client"), "o", "g", handle, member="heir",
                                     idle_pause_s=0.05) as heir:
            await wait_until(lambda: _true(len(heir.held()) == 3), SETTLE_S, "the heir to own every queue")
            # meta may have heard the crashed member up to one heartbeat before the kill
            assert time.monotonic() - killed_at >= (LEASE_MS - HEARTBEAT_MS) / 1000 - 0.3
            await wait_until(lambda: _true(len(_distinct(handled(out) + got)) >= len(sent)), SETTLE_S,
                             "every sent message to be handled by one of them")
    finally:
        crashed.kill()
        crashed.wait(15)
    both = handled(out) + got
    assert {(m["key"], int(m["body"])) for m in both} == set(sent), "a message was lost"
    # Per queue the heir goes on in order from the crashed member's committed offset: it may repeat what was handled
    # but not yet committed, never skip past what was not handled.
    crashed_max = defaultdict(lambda: -1)
    for m in handled(out):
        crashed_max[m["queue"]] = max(crashed_max[m["queue"]], m["offset"])
    heir_offsets = defaultdict(list)
    for m in got:
        heir_offsets[m["queue"]].append(m["offset"])
    for q, offsets in heir_offsets.items():
        assert offsets == sorted(set(offsets)), f"queue {q}: the heir handled out of order: {offsets}"
        assert offsets[0] <= crashed_max[q] + 1, f"queue {q}: the heir skipped from {crashed_max[q]} to {offsets[0]}"


async def test_per_key_order_holds_across_handovers_and_growth(cluster):
    c = cluster
    await setup_topic(c, "k", 2, "g")
    seen: list[tuple[str, int, str]] = []   # (key, seq, member) in the order handlers ran

    def handler_of(member: str):
        async def handle(m):
            seen.append((m.key, int(m.text), member))
        return handle

    def consumer(member: str) -> ExclusiveConsumer:
        return ExclusiveConsumer(c.meta_urls, c.token("client"), "k", "g", handler_of(member), member=member,
                                 idle_pause_s=0.05)
    first, second = consumer("first"), consumer("second")
    await first.start()
    await second.start()
    await wait_until(lambda: _true(bool(first.held()) and bool(second.held())), SETTLE_S, "a queue for each")
    sent = await produce(c, "k", keys=10, per_key=5)
    await wait_until(lambda: _true(len({m for *_, m in seen}) == 2), SETTLE_S, "both members to be handling")
    await first.close()                                  # handover: first commits, then leaves
    sent += await produce(c, "k", keys=10, per_key=5, start=5)
    async with AdminClient(c.meta_urls, c.token("admin")) as admin:
        await admin.grow_topic("k", 4)                   # slots move to new queues behind barriers
    third = consumer("third")
    await third.start()                                  # and a join moves queues again
    sent += await produce(c, "k", keys=10, per_key=5, start=10)
    try:
        await wait_until(lambda: _true(len({(k, s) for k, s, _ in seen}) >= len(sent)), SETTLE_S * 2,
                         "every message to be handled")
    finally:
        await second.close()
        await third.close()
    per_key = defaultdict(list)
    for key, seq, _ in seen:
        per_key[key].append(seq)
    for key, seqs in per_key.items():
        assert seqs == sorted(seqs) == list(range(15)), f"{key} handled out of order or twice: {seqs}"
    assert {m for _, _, m in seen} >= {"first", "second"}, "the handover happened"


def _distinct(rows: list[dict]) -> set:
    return {(m["key"], m["body"]) for m in rows}


async def _len_is(awaitable, n: int) -> bool:
    return len(await awaitable) == n


async def _true(value: bool) -> bool:
    return value


async def test_a_keyed_send_chosen_with_a_slot_table_older_than_a_growth_is_refused(cluster):
    """After a growth a key may belong to a new queue. A sender whose route predates the growth would put the key's
    message into its old queue after the split point, to be consumed after the key's newer messages: the broker
    refuses it (NOT_LEADER: re-read the route and choose again)."""
    c = cluster
    async with AdminClient(c.meta_urls, c.token("admin")) as admin:
        await admin.create_topic("s", queues=1)
        before = await ok(c, "GET", "/v1/routes/s", "client")
        await admin.grow_topic("s", 2)
    after = await wait_until(lambda: _writable_route(c, "s"), SETTLE_S, "the grown topic to be writable")
    assert after["slot_table_version"] > before["version"] >= before["slot_table_version"]
    moved = next(k for k in (f"key{i}" for i in range(1000))
                 if queue_for_key(after, k) == 1)
    stays = next(k for k in (f"key{i}" for i in range(1000))
                 if queue_for_key(after, k) == 0)
    url = f"{after['queues'][0]['address']}/v1/messages/s/0"

    async def send(messages, version):
        headers = {} if version is None else {"X-Route-Version": str(version)}
        return await c.call("POST", url, "client", json={"messages": messages}, headers=headers)
    for key in (moved, stays):   # the broker cannot tell which key moved from a stale sender: any keyed message
        s, body, _ = await send([{"body": "late", "key": key}], before["version"])
        assert s == 409 and body["error"]["code"] == "NOT_LEADER", (s, body)
    for messages, version in (([{"body": "x", "key": stays}], after["version"]),   # fresh route: placement trusted
                              ([{"body": "x"}], before["version"]),                  # no key, no order to keep
                              ([{"body": "x", "key": stays}], None)):                # a sender naming no version
        s, body, _ = await send(messages, version)
        assert s == 200, (messages, version, s, body)


async def _writable_route(c, topic: str):
    r = await ok(c, "GET", f"/v1/routes/{topic}", "client")
    return r if all(q["writable"] for q in r["queues"]) else None


async def test_a_queue_revoked_before_its_member_ever_worked_it_moves_without_waiting_out_the_lease(cluster):
    """Granted to a member and revoked again before any answer listed it as owned: the member never worked it, so
    it releases it at its first answer instead of leaving it to wait out a whole lease."""
    c = cluster
    await setup_topic(c, "r", 4, "g")
    await ok(c, "PUT", "/v1/groups/g/config", "admin", {"lease_ms": 20000, "heartbeat_interval_ms": 500})
    for member in ("a", "b"):   # a gets every queue, then b's join revokes two of them: nobody works them yet
        await ok(c, "POST", "/v1/groups/g/heartbeat", "client", {"member": member, "topics": ["r"],
                                                                  "mode": "exclusive"})

    async def idle(m):
        return None
    started = time.monotonic()
    async with ExclusiveConsumer(c.meta_urls, c.token("client"), "r", "g", idle, member="a", idle_pause_s=0.05):
        await wait_until(lambda: _len_is(owned_by(c, "g", "b"), 2), SETTLE_S, "b to get its two queues")
    assert time.monotonic() - started < 10, "the revoked queues waited for the 20 s lease"
