"""Group commit in the broker's writer (broker/writes.py) on a real broker node in this process (its real store and
writer threads; routes given directly, as the watch stream would): sends that wait for their queue while an append
runs are stored by one append and one fsync, each at its own offsets, each refused alone when it must be."""

from __future__ import annotations

import asyncio
import time

import pytest

from broker.config import BrokerConfig
from broker.node import BrokerNode
from broker.storage import limits
from client.wire import route as route_model
from client.wire.errors import ApiError


def route(budget_end: int) -> dict:
    seg = route_model.segment_json(gen=0, broker="b1", address="http://127.0.0.1:1", physical_queue="t.q0.g0",
                                   physical_start=0, logic_start=0, logic_end=None, state="active",
                                   budget_end=budget_end)
    return route_model.route_json(topic="t", version=5, slots=16, order="best_tried", config={},
                                  slot_table=[[0, 16, 0]], slot_table_version=5, barriers=[],
                                  queues=[route_model.queue_json(0, True, [seg])])


async def start_node(tmp_path, budget_end: int = 1_000_000) -> BrokerNode:
    n = BrokerNode(BrokerConfig(broker="b1", data_dir=str(tmp_path), http_host="127.0.0.1", http_port=1,
                                meta_urls=("http://127.0.0.1:9",), token="bt", client_token="ct"))
    n.session.epoch, n.session.state, n.session.last_ack_sent = 1, "active", time.monotonic() + 3600
    n.routes.update(route(budget_end))
    return n


def stop_node(n: BrokerNode) -> None:
    n.writer.stop()
    n.store.close()
    n.offsets.close()


@pytest.fixture
async def node(tmp_path):
    n = await start_node(tmp_path)
    try:
        yield n
    finally:
        stop_node(n)


def bodies(n: BrokerNode) -> list[str]:
    """Every stored message's body, by physical offset."""
    import json
    pq = n.store.get("t.q0.g0")
    return [json.loads(r.payload)["body"] for r in pq.read(0, 10_000)]


def count(n: BrokerNode, name: str, **labels: str) -> float:
    return n.registry.get_sample_value(name, labels) or 0.0


async def test_concurrent_sends_share_fsyncs_and_each_gets_its_own_offsets(node):
    sends = [[{"body": f"s{i}m{j}"} for j in range(1 + i % 5)] for i in range(40)]
    answers = await asyncio.wait_for(asyncio.gather(*(node.writer.send("t", 0, s) for s in sends)), 30)
    for s, offsets in zip(sends, answers):
        assert len(offsets) == len(s) and offsets == list(range(offsets[0], offsets[0] + len(s)))
    assert sorted(o for offsets in answers for o in offsets) == list(range(sum(map(len, sends))))
    stored = bodies(node)
    for s, offsets in zip(sends, answers):
        assert [stored[o] for o in offsets] == [m["body"] for m in s]
    # The first send appends alone; the 39 that waited meanwhile go in one more append and fsync.
    assert count(node, "stator_broker_append_seconds_count") == 40
    assert count(node, "stator_broker_fsync_seconds_count") <= 20
    assert count(node, "stator_broker_messages_in_total", topic="t") == sum(map(len, sends))
    assert node.writer._waiting == {}


async def test_a_batch_storage_refuses_is_refused_alone_in_its_group(node, monkeypatch):
    monkeypatch.setattr(limits, "RECORD_BYTES_MAX", 200)
    first = asyncio.create_task(node.writer.send("t", 0, [{"body": "lead"}]))
    await asyncio.sleep(0)   # the first send holds the queue's lock and appends; the next two wait together
    big = asyncio.create_task(node.writer.send("t", 0, [{"body": "ok"}, {"body": "x" * 300}]))
    small = asyncio.create_task(node.writer.send("t", 0, [{"body": "after"}]))
    assert await asyncio.wait_for(first, 30) == [0]
    with pytest.raises(ApiError) as e:
        await asyncio.wait_for(big, 30)
    assert (e.value.status, e.value.code) == (413, "TOO_LARGE")
    assert await asyncio.wait_for(small, 30) == [1]
    assert bodies(node) == ["lead", "after"]


async def test_the_offset_budget_refuses_a_waiting_batch_that_would_pass_it_as_alone(tmp_path):
    n = await start_node(tmp_path, budget_end=10)
    try:
        first = asyncio.create_task(n.writer.send("t", 0, [{"body": f"a{i}"} for i in range(6)]))
        await asyncio.sleep(0)
        over = asyncio.create_task(n.writer.send("t", 0, [{"body": f"b{i}"} for i in range(5)]))
        fits = asyncio.create_task(n.writer.send("t", 0, [{"body": f"c{i}"} for i in range(4)]))
        assert await asyncio.wait_for(first, 30) == list(range(6))
        with pytest.raises(ApiError) as e:
            await asyncio.wait_for(over, 30)
        assert (e.value.status, e.value.code) == (503, "BUDGET_EXHAUSTED")
        assert await asyncio.wait_for(fits, 30) == list(range(6, 10))
    finally:
        stop_node(n)


async def test_a_sender_cancelled_while_waiting_stores_nothing_and_holds_no_one_up(node):
    first = asyncio.create_task(node.writer.send("t", 0, [{"body": "lead"}]))
    await asyncio.sleep(0)
    gone = asyncio.create_task(node.writer.send("t", 0, [{"body": "gone"}]))
    last = asyncio.create_task(node.writer.send("t", 0, [{"body": "last"}]))
    await asyncio.sleep(0)
    gone.cancel()
    assert await asyncio.wait_for(first, 30) == [0]
    assert await asyncio.wait_for(last, 30) == [1]
    assert gone.cancelled()
    assert bodies(node) == ["lead", "last"]
    assert node.writer._waiting == {}


async def test_a_leader_cancelled_during_its_append_leaves_no_sender_unanswered(node):
    await node.writer.prepare(node.routes.head("t", 0))   # the queue exists: the leader is cancelled in its append
    lead = asyncio.create_task(node.writer.send("t", 0, [{"body": "lead"}]))
    await asyncio.sleep(0)   # the leader's append runs in a writer thread
    waiting = [asyncio.create_task(node.writer.send("t", 0, [{"body": f"w{i}"}])) for i in range(3)]
    await asyncio.sleep(0)
    lead.cancel()
    answers = await asyncio.wait_for(asyncio.gather(*waiting), 30)
    assert sorted(o for a in answers for o in a) in ([1, 2, 3], [0, 1, 2])   # before or after the leader's record
    node.writer._threads.shutdown(wait=True)   # the cancelled leader's append still ends, stored
    assert sorted(bodies(node)) == ["lead", "w0", "w1", "w2"]
    assert node.writer._waiting == {}
