"""client/exclusive.py against real processes (3 meta nodes, 2 brokers): exclusive groups split a topic's queues,
keep each key's order across a handover, and apply the topic's order strategy to a failing message.

One cluster serves the module (each test has its own topic and group); groups get 2 s leases and 0.5 s heartbeats so
queues move quickly. Bounds on time are generous for a loaded 2-core machine.
"""

from __future__ import annotations

import asyncio
import collections
import time

import pytest
import pytest_asyncio

from client import (AdminClient, Closed, ExclusiveConsumer, Producer, PullConsumer, ReceivedMessage, StatorError,
                    SyncExclusiveConsumer)
from client.exclusive import lease_margin_s, retry_props
from client.selection import KeySelector
from tests.support import cluster as cluster_mod
from tests.support.meta_http import wait_until

live = pytest.mark.asyncio(loop_scope="module")   # the tests that share the module's cluster

FAST_GROUP = {"lease_ms": 2000, "heartbeat_interval_ms": 500}
SETTLE_S = 30.0


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory):
    async with cluster_mod.running(str(tmp_path_factory.mktemp("exclusive")), 3, 2) as c:
        yield c


async def setup(c, topic: str, group: str, queues: int, order: str = "best_tried") -> None:
    async with AdminClient(c.meta_urls, c.token("admin")) as admin:
        await admin.create_topic(topic, queues=queues, order=order)
        await admin.set_group_config(group, FAST_GROUP)


def consumer(c, topic: str, group: str, handler, member: str, **kw) -> ExclusiveConsumer:
    return ExclusiveConsumer(c.meta_urls, c.token("client"), topic, group, handler, member=member, **kw)


async def send_keyed(c, topic: str, keys: int, per_key: int, start: int = 0) -> None:
    async with Producer(c.meta_urls, c.token("client"), topic, selector=KeySelector()) as p:
        for i in range(start, start + per_key):
            for k in range(keys):
                await p.send(f"k{k}:{i}", key=f"k{k}")


async def _true(v: bool) -> bool:
    """A plain condition as the async predicate ``wait_until`` polls."""
    return v


def parse(m: ReceivedMessage) -> tuple[str, int]:
    key, seq = m.text.split(":")
    return key, int(seq)


# -- offline pieces -------------------------------------------------------------------------------------------------
def test_lease_margin_is_at_least_a_second_and_never_more_than_half_the_lease():
    assert lease_margin_s(2.0, None) == 1.0
    assert lease_margin_s(30.0, None) == 3.0
    assert lease_margin_s(1.0, None) == 0.5
    assert lease_margin_s(10.0, 0.2) == 0.2


def test_retry_props_name_the_first_origin_and_add_up_attempts():
    m = ReceivedMessage("t", 3, 17, "x", "k", {"a": "b"})
    first = retry_props(m, 1)
    assert first == {"a": "b", "origin_topic": "t", "origin_queue": "3", "origin_offset": "17", "attempt": "1"}
    again = retry_props(ReceivedMessage("g-retry", 0, 5, "x", "k", first), 2)
    assert again["origin_topic"] == "t" and again["origin_offset"] == "17" and again["attempt"] == "3"


def test_bad_arguments_are_refused_at_once():
    with pytest.raises(ValueError):
        ExclusiveConsumer(["http://x"], "t", "t", "g", lambda m: None, member="no spaces")
    with pytest.raises(ValueError):
        ExclusiveConsumer(["http://x"], "t", "t", "g", lambda m: None, order="sometimes")


# -- real processes -------------------------------------------------------------------------------------------------
@live
async def test_two_members_split_the_queues_disjointly_and_a_handover_keeps_every_key_in_order(cluster):
    c = cluster
    await setup(c, "orders", "billing", queues=4)
    seen: dict[str, list[int]] = collections.defaultdict(list)
    by_member: dict[str, set[int]] = collections.defaultdict(set)

    def handler_of(member: str):
        async def handle(m: ReceivedMessage) -> None:
            key, seq = parse(m)
            seen[key].append(seq)
            by_member[member].add(m.queue)
            await asyncio.sleep(0.01)  # slow enough that revoking and closing stop a worker mid-batch
        return handle

    await send_keyed(c, "orders", keys=8, per_key=25)
    a = consumer(c, "orders", "billing", handler_of("a"), "a")
    b = consumer(c, "orders", "billing", handler_of("b"), "b")
    await a.start()
    await b.start()

    async def split():
        ha, hb = a.held(), b.held()
        return ha and hb and not set(ha) & set(hb) and set(ha) | set(hb) == {0, 1, 2, 3}
    await wait_until(split, SETTLE_S, "two members holding disjoint halves covering every queue")
    assert len(a.held()) == 2 and len(b.held()) == 2
    assert min(a.held().values()) > 0 and set(a.held().values()).isdisjoint(b.held().values())

    await send_keyed(c, "orders", keys=8, per_key=25, start=25)
    await a.close()                     # commits, then leaves: b takes every queue over from the committed offsets
    await wait_until(lambda: _true(set(b.held()) == {0, 1, 2, 3}), SETTLE_S, "b holding every queue")
    await send_keyed(c, "orders", keys=8, per_key=25, start=50)
    await wait_until(lambda: _true(sum(map(len, seen.values())) >= 8 * 75), SETTLE_S, "every message handled")
    await asyncio.sleep(0.5)            # anything handled twice would show up now
    await b.close()
    for key, seqs in seen.items():
        assert seqs == list(range(75)), f"{key}: handled in order, each once"
    assert by_member["a"] and by_member["b"], "both members handled messages"

    async with AdminClient(c.meta_urls, c.token("admin")) as admin:
        described = await admin.describe_group("billing")
        assert described["assignments"] == [] and described["members"] == [], "both left"
        assert "billing" in {g["group"] for g in await admin.list_groups()}


@live
async def test_strict_retries_a_failing_message_in_place_and_blocks_its_queue(cluster):
    c = cluster
    await setup(c, "ledger", "posting", queues=1, order="strict")
    async with Producer(c.meta_urls, c.token("client"), "ledger") as p:
        for i in range(6):
            await p.send(f"m{i}", queue=0)
    calls: list[str] = []
    failures_left = 3

    async def handle(m: ReceivedMessage) -> None:
        nonlocal failures_left
        calls.append(m.text)
        if m.text == "m2" and failures_left:
            failures_left -= 1
            raise RuntimeError("not yet")

    async with consumer(c, "ledger", "posting", handle, "s1") as ex:
        await wait_until(lambda: _true("m5" in calls), SETTLE_S, "the queue handled past the failing message")
        await wait_until(lambda: _true(ex.positions().get(0) == 6), SETTLE_S, "position past the last message")
    assert calls == ["m0", "m1", "m2", "m2", "m2", "m2", "m3", "m4", "m5"], "retried in place; nothing after it ran"
    async with PullConsumer(c.meta_urls, c.token("client"), "ledger", "posting") as pc:
        assert await pc.committed(0) == 6, "closing committed the position"


@live
async def test_best_tried_moves_a_failing_message_to_the_retry_topic_and_goes_on(cluster):
    c = cluster
    await setup(c, "clicks", "stats", queues=1, order="best_tried")
    async with AdminClient(c.meta_urls, c.token("admin")) as admin:
        await admin.create_topic("stats-retry", queues=1)
    async with Producer(c.meta_urls, c.token("client"), "clicks") as p:
        offsets = [(await p.send(f"c{i}", key="user-1", queue=0)).offsets[0] for i in range(5)]
    handled: list[str] = []

    async def handle(m: ReceivedMessage) -> None:
        if m.text == "c1":
            raise ValueError("poison")
        handled.append(m.text)

    async with consumer(c, "clicks", "stats", handle, "b1") as ex:
        await wait_until(lambda: _true(ex.positions().get(0) == offsets[-1] + 1), SETTLE_S, "all of the queue done")
        assert ex.config["retry_topic"] == "stats-retry"
    assert handled == ["c0", "c2", "c3", "c4"], "the failing message did not block its queue"
    async with PullConsumer(c.meta_urls, c.token("client"), "stats-retry", "inspect") as pc:
        retried = (await pc.pull(0, offset=0)).messages
    assert [m.text for m in retried] == ["c1"]
    assert retried[0].is_text, "resent as the text it was sent as"
    assert retried[0].key == "user-1"
    assert dict(retried[0].props) == {"origin_topic": "clicks", "origin_queue": "0",
                                      "origin_offset": str(offsets[1]), "attempt": "1"}


@live
async def test_best_tried_without_a_retry_topic_retries_in_place_and_loses_nothing(cluster):
    c = cluster
    await setup(c, "views", "nowhere", queues=1, order="best_tried")
    async with Producer(c.meta_urls, c.token("client"), "views") as p:
        for i in range(3):
            await p.send(f"v{i}", queue=0)
    calls: list[str] = []

    async def handle(m: ReceivedMessage) -> None:
        calls.append(m.text)
        if m.text == "v1" and calls.count("v1") < 3:
            raise ValueError("flaky")

    async with consumer(c, "views", "nowhere", handle, "n1"):   # "nowhere-retry" does not exist
        await wait_until(lambda: _true("v2" in calls), SETTLE_S, "the queue moved past the flaky message")
    assert calls == ["v0", "v1", "v1", "v1", "v2"]


@live
async def test_a_member_whose_grant_ended_behind_its_back_restarts_with_its_new_token_in_order(cluster):
    """Someone else's ``leave`` for this member ends its grant at once; its next heartbeat joins it again with a new
    token. Meanwhile the old token is refused by the broker: the consumer drops it and goes on from the committed
    offset with the new one."""
    c = cluster
    await setup(c, "stream", "mirror", queues=1)
    async with Producer(c.meta_urls, c.token("client"), "stream") as p:
        await p.send_batch([f"s{i}" for i in range(150)], queue=0)
    bodies: list[str] = []

    async def handle(m: ReceivedMessage) -> None:
        bodies.append(m.text)
        await asyncio.sleep(0.01)

    async with consumer(c, "stream", "mirror", handle, "r1") as ex:
        await wait_until(lambda: _true(len(bodies) >= 20), SETTLE_S, "handling under way")
        old = ex.held()[0]
        status, _, _ = await c.call("POST", c.meta_urls[0] + "/v1/groups/mirror/leave", "client", {"member": "r1"})
        assert status == 200
        await wait_until(lambda: _true(ex.held().get(0, old) > old), SETTLE_S, "a new grant")
        await wait_until(lambda: _true(set(bodies) == {f"s{i}" for i in range(150)}), SETTLE_S, "all handled")
    assert list(dict.fromkeys(bodies)) == [f"s{i}" for i in range(150)], "in order"
    assert ex.failure is None


@live
async def test_keys_keep_their_order_when_the_topic_grows_under_the_consumer(cluster):
    """Growing 2 -> 4 queues moves some keys to new queues; their new messages are handled only after the old
    queue's were (the broker holds the new queue back: DESIGN.md invariant 7), though the old queue is slow."""
    c = cluster
    await setup(c, "growing", "follow", queues=2)
    seen: dict[str, list[int]] = collections.defaultdict(list)

    async def handle(m: ReceivedMessage) -> None:
        key, seq = parse(m)
        seen[key].append(seq)
        if m.queue < 2:  # the old queues lag: without the barrier the new ones would overtake them
            await asyncio.sleep(0.03)

    await send_keyed(c, "growing", keys=8, per_key=20)
    async with consumer(c, "growing", "follow", handle, "g1") as ex:
        await wait_until(lambda: _true(sum(map(len, seen.values())) >= 8), SETTLE_S, "handling under way")
        async with AdminClient(c.meta_urls, c.token("admin")) as admin:
            await admin.grow_topic("growing", 4)
        await send_keyed(c, "growing", keys=8, per_key=20, start=20)
        await wait_until(lambda: _true(sorted(ex.held()) == [0, 1, 2, 3]), SETTLE_S, "the new queues held")
        await wait_until(lambda: _true(sum(map(len, seen.values())) >= 8 * 40), SETTLE_S, "every message handled")
    for key, seqs in seen.items():
        assert seqs == list(range(40)), f"{key}: handled in order across the growth"
    async with Producer(c.meta_urls, c.token("client"), "growing", selector=KeySelector()) as p:
        moved = {(await p.send("probe", key=f"k{k}")).queue for k in range(8)}
    assert moved & {2, 3}, "some keys moved to the new queues"


@live
async def test_a_group_of_the_other_mode_refuses_the_join_and_run_raises_it_closed(cluster):
    c = cluster
    await setup(c, "tasks", "sharers", queues=1)
    async with AdminClient(c.meta_urls, c.token("admin")) as admin:
        await admin.set_group_config("sharers", {"mode": "shared"})
    ex = consumer(c, "tasks", "sharers", lambda m: None, "x1")
    with pytest.raises(StatorError) as refused:
        await asyncio.wait_for(ex.run(), SETTLE_S)
    assert refused.value.status == 409 and refused.value.code == "GROUP_MODE_MISMATCH"
    with pytest.raises(Closed):
        await ex.start()


class Fatal(BaseException):
    """Not an ``Exception``: a handler raising it means to stop the consumer, not to fail one message."""


@live
async def test_a_failure_of_a_background_task_is_raised_from_run_and_close(cluster):
    c = cluster
    await setup(c, "alerts", "pager", queues=1)
    async with Producer(c.meta_urls, c.token("client"), "alerts") as p:
        await p.send("boom", queue=0)

    async def handle(m: ReceivedMessage) -> None:
        raise Fatal(m.text)

    ex = consumer(c, "alerts", "pager", handle, "f1")
    with pytest.raises(Fatal):
        await asyncio.wait_for(ex.run(), SETTLE_S)
    with pytest.raises(Fatal):
        await ex.close()
    async with AdminClient(c.meta_urls, c.token("admin")) as admin:
        assert (await admin.describe_group("pager"))["members"] == [], "run() closed and left on its way out"


@live
async def test_sync_wrapper_runs_a_plain_handler_in_the_background(cluster):
    c = cluster
    await setup(c, "jobs", "workers", queues=2)
    await send_keyed(c, "jobs", keys=2, per_key=5)
    got: list[str] = []

    def sync_flow() -> dict[int, int]:
        with SyncExclusiveConsumer(c.meta_urls, c.token("client"), "jobs", "workers", lambda m: got.append(m.text),
                                   member="sync1") as ex:
            ex.start()
            for _ in range(300):
                if len(got) == 10:
                    break
                time.sleep(0.05)
            return ex.held()
    held = await asyncio.to_thread(sync_flow)
    assert sorted(held) == [0, 1]
    assert sorted(got) == sorted(f"k{k}:{i}" for k in range(2) for i in range(5))


async def test_a_member_cut_off_from_meta_stops_within_its_lease_and_resumes_when_meta_is_back(tmp_path):
    """Own cluster: it loses its meta quorum on purpose. The brokers keep serving pulls meanwhile, so only the
    consumer's own lease clock can stop it."""
    async with cluster_mod.running(str(tmp_path), 3, 2) as c:
        await setup(c, "feed", "watchers", queues=1)
        async with Producer(c.meta_urls, c.token("client"), "feed") as p:
            for i in range(40):
                await p.send(f"m{i}", queue=0)
        loop = asyncio.get_running_loop()
        calls: list[tuple[float, str]] = []

        async def handle(m: ReceivedMessage) -> None:
            calls.append((loop.time(), m.text))
            await asyncio.sleep(0.1)

        async with consumer(c, "feed", "watchers", handle, "w1"):
            await wait_until(lambda: _true(len(calls) >= 5), SETTLE_S, "handling under way")
            cut = [m["node"] for m in c.info["meta"]][:2]
            for name in cut:
                c.kill9(name)
            cut_at = loop.time()
            # A surviving leader may renew for about a second more before it steps down; then lease 2 s - margin 1 s.
            await asyncio.sleep(3.5)
            stopped = len(calls)
            await asyncio.sleep(1.5)
            assert len(calls) == stopped < 40, "no message is handled once the lease ran out by the local clock"
            assert calls[-1][0] < cut_at + 3.0
            for name in cut:
                c.start(name)
            await wait_until(lambda: _true({b for _, b in calls} == {f"m{i}" for i in range(40)}), SETTLE_S * 2,
                             "every message handled once meta is back")
        bodies = [b for _, b in calls]
        assert list(dict.fromkeys(bodies)) == [f"m{i}" for i in range(40)], "in order"
        assert max(collections.Counter(bodies).values()) <= 2
