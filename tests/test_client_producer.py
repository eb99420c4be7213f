"""client/producer.py against fake brokers and a fake meta (tests/support/client_fakes.py): queue choice, retries,
route refresh on NOT_LEADER, strict order, fault avoidance, bounds."""

from __future__ import annotations

import asyncio
import base64
import time

import pytest

from client import (Fenced, LatencyFaultAvoidance, NotLeader, Producer, RoundRobinSelector, Sealing, StatorError,
                    SyncProducer, TopicNotFound, Unavailable, queue_for_key)
from wire.caller import Backoff
from tests.support.client_fakes import DEAD_ADDRESS, TOKEN, Fakes, fakes_in_thread, make_route

FAST = Backoff(0.01, 0.05)


@pytest.fixture
async def fakes():
    async with Fakes() as f:
        yield f


def producer(f: Fakes, **kw) -> Producer:
    kw.setdefault("backoff", FAST)
    kw.setdefault("sealing_wait_s", 0.1)
    return Producer([f.meta.url], TOKEN, kw.pop("topic", "t"), **kw)


@pytest.mark.parametrize("mode,form", [("sse", "binary"), ("long_poll", "binary"), ("sse", "json")])
async def test_key_goes_to_its_queue_and_bodies_are_encoded(fakes, mode, form):
    route = make_route("t", [("b1", fakes.b1.url), ("b2", fakes.b2.url), ("b1", fakes.b1.url)])
    fakes.meta.set_route(route)
    async with producer(fakes, route_mode=mode, wire_format=form) as p:
        for key in ("a", "b", "c", "d", "e"):
            r = await p.send("hello", key=key, props={"k": "v"})
            assert r.queue == queue_for_key(route, key)
            assert r.broker == ("b2" if r.queue == 1 else "b1") and r.attempts == 1
        r = await p.send(b"\x00\x01", key="a")
    sent = fakes.b1.sent() + fakes.b2.sent()
    assert len(sent) == 6
    assert sent[0][1] == [{"body": "hello", "key": "a", "props": {"k": "v"}}]
    last = next(m for q, ms in sent for m in ms if "body_b64" in m)
    assert base64.b64decode(last["body_b64"]) == b"\x00\x01"
    assert {f for _, f in fakes.b1.forms + fakes.b2.forms} == {form}


async def test_wire_format_is_binary_or_json(fakes):
    assert producer(fakes).wire_format == "binary"
    with pytest.raises(ValueError, match="wire_format"):
        producer(fakes, wire_format="xml")


async def test_not_leader_refreshes_the_route_with_min_version_and_retries(fakes):
    fakes.meta.set_route(make_route("t", [("b1", fakes.b1.url)]))
    async with producer(fakes) as p:
        await p.send("warm-up")
        # The queue moved to b2; only a direct read of meta sees it yet (the push has not arrived).
        v = fakes.meta.set_route(make_route("t", [("b2", fakes.b2.url)]), publish=False)
        fakes.b1.route_version = v
        fakes.b1.fail("POST", 0, 409, "NOT_LEADER")
        r = await p.send("after-move", key="k")
    assert (r.broker, r.queue, r.attempts) == ("b2", 0, 2)
    assert [ms[0]["body"] for _, ms in fakes.b2.sent()] == ["after-move"]
    assert ("t", {"min_version": str(v)}) in fakes.meta.requests


async def test_a_not_leader_that_brought_a_newer_route_is_retried_without_a_backoff_pause(fakes):
    fakes.meta.set_route(make_route("t", [("b1", fakes.b1.url)]))
    async with producer(fakes, backoff=Backoff(5.0, 5.0)) as p:   # any pause would show as seconds
        await p.send("warm-up")
        v = fakes.meta.set_route(make_route("t", [("b2", fakes.b2.url)]), publish=False)
        fakes.b1.route_version = v
        fakes.b1.fail("POST", 0, 409, "NOT_LEADER")
        started = time.monotonic()
        r = await p.send("after-move")
        took = time.monotonic() - started
    assert (r.broker, r.attempts) == ("b2", 2)
    assert took < 2.0, f"the retry waited {took:.2f} s after the route had moved"


async def test_sealing_waits_for_the_route_and_stays_on_the_queue(fakes):
    fakes.meta.set_route(make_route("t", [("b1", fakes.b1.url), ("b2", fakes.b2.url)]))
    fakes.b1.fail("POST", 0, 503, "SEALING", times=2)
    async with producer(fakes) as p:
        r = await p.send("x", queue=0)
    assert (r.queue, r.broker, r.attempts) == (0, "b1", 3)
    assert fakes.b2.sent() == []


async def test_strict_order_retries_only_the_same_queue(fakes):
    fakes.meta.set_route(make_route("t", [("dead", DEAD_ADDRESS), ("b2", fakes.b2.url)], order="strict"))
    async with producer(fakes, selector=RoundRobinSelector(start=0), attempts_max=3) as p:
        with pytest.raises(Unavailable):
            await p.send("must-stay-on-q0")
    assert fakes.b2.sent() == []
    assert not p.fault.is_available("dead")


async def test_best_tried_without_key_moves_to_a_healthy_broker_and_avoids_the_failed_one(fakes):
    fakes.meta.set_route(make_route("t", [("dead", DEAD_ADDRESS), ("b2", fakes.b2.url)]))
    async with producer(fakes, selector=RoundRobinSelector(start=0), fault_avoidance=False) as p:
        r = await p.send("moves")   # round robin says q0; its broker refuses; the retry skips that broker
        assert (r.queue, r.attempts) == (1, 2)
    async with producer(fakes, selector=RoundRobinSelector(start=0)) as p:
        r = await p.send("moves")
        assert (r.queue, r.attempts) == (1, 2)
        results = [await p.send(f"m{i}") for i in range(4)]  # the dead broker is avoided for 10 s: no more tries
    assert [(r.queue, r.attempts) for r in results] == [(1, 1)] * 4


async def test_best_tried_with_key_stays_on_the_keys_queue(fakes):
    route = make_route("t", [("dead", DEAD_ADDRESS), ("b2", fakes.b2.url)])
    fakes.meta.set_route(route)
    key = next(k for k in (f"k{i}" for i in range(100)) if queue_for_key(route, k) == 0)
    async with producer(fakes, attempts_max=2) as p:
        with pytest.raises(Unavailable):
            await p.send("x", key=key)
    assert fakes.b2.sent() == []


async def test_fenced_broker_is_avoided_and_the_route_refreshed(fakes):
    fakes.meta.set_route(make_route("t", [("b1", fakes.b1.url)]))
    fault = LatencyFaultAvoidance()
    async with producer(fakes, fault_avoidance=fault) as p:
        await p.start()
        fakes.meta.set_route(make_route("t", [("b2", fakes.b2.url)]), publish=False)
        fakes.b1.fail("POST", 0, 503, "FENCED")
        r = await p.send("x", key="k")
    assert (r.broker, r.attempts) == ("b2", 2)
    assert not fault.is_available("b1") and fault.is_available("b2")


async def test_attempts_and_deadline_are_bounds(fakes):
    fakes.meta.set_route(make_route("t", [("b1", fakes.b1.url)]))
    fakes.b1.fail("POST", 0, 503, "SEALING", times=1000)
    async with producer(fakes, attempts_max=4) as p:
        with pytest.raises(Sealing):
            await p.send("x")
        assert len(fakes.b1.sent()) == 4
        started = time.monotonic()
        p.attempts_max, p.deadline_s = 1000, 1.0
        with pytest.raises(Sealing):
            await p.send("x")
        assert time.monotonic() - started < 3.0


async def test_client_errors_are_not_retried(fakes):
    fakes.meta.set_route(make_route("t", [("b1", fakes.b1.url)]))
    fakes.b1.fail("POST", 0, 413, "TOO_LARGE")
    async with producer(fakes) as p:
        with pytest.raises(StatorError) as e:
            await p.send("x" * 10)
    assert e.value.code == "TOO_LARGE" and e.value.status == 413
    assert len(fakes.b1.sent()) == 1


async def test_deleted_topic_is_reported(fakes):
    with pytest.raises(TopicNotFound):
        async with producer(fakes, topic="gone"):
            pass
    p = producer(fakes, topic="gone")
    with pytest.raises(TopicNotFound):
        await p.send("x")
    await p.close()
    fakes.meta.set_route(make_route("t", [("b1", fakes.b1.url)]))
    async with producer(fakes) as p:
        await p.start()
        del fakes.meta.routes["t"]   # deleted: the broker no longer knows it, and meta agrees
        fakes.b1.fail("POST", 0, 404, "TOPIC_NOT_FOUND")
        with pytest.raises(TopicNotFound):
            await p.send("x")


async def test_batches(fakes):
    route = make_route("t", [("b1", fakes.b1.url), ("b2", fakes.b2.url)])
    fakes.meta.set_route(route)
    async with producer(fakes) as p:
        r = await p.send_batch(["a", {"body": "b", "key": "k"}, b"c"], queue=1)
        assert (r.queue, r.offsets, r.broker) == (1, [0, 1, 2], "b2")
        keys = [k for k in (f"k{i}" for i in range(100))]
        k0 = next(k for k in keys if queue_for_key(route, k) == 0)
        k1 = next(k for k in keys if queue_for_key(route, k) == 1)
        with pytest.raises(ValueError):
            await p.send_batch([{"body": "a", "key": k0}, {"body": "b", "key": k1}])
        with pytest.raises(ValueError):
            await p.send_batch([])
        r = await p.send_batch([{"body": "a", "key": k0}, {"body": "b", "key": k0}])
        assert r.queue == 0


async def test_route_push_moves_sends_without_any_error(fakes):
    """With SSE the producer learns of a remap before its next send: no NOT_LEADER round trip at all."""
    fakes.meta.set_route(make_route("t", [("b1", fakes.b1.url)]))
    async with producer(fakes) as p:
        await p.send("before", key="k")
        v = fakes.meta.set_route(make_route("t", [("b2", fakes.b2.url)]))
        await p.routes.wait_for("t", lambda r: r["version"] >= v, 5.0)
        r = await p.send("after", key="k")
    assert (r.broker, r.attempts) == ("b2", 1)


def test_blocking_producer():
    with fakes_in_thread() as (f, loop):
        asyncio.run_coroutine_threadsafe(_set(f), loop).result(5)
        with SyncProducer([f.meta.url], TOKEN, "t", backoff=FAST) as p:
            r = p.send("hi", key="k")
            assert (r.queue, r.offsets) == (0, [0])
            assert p.send_batch(["a", "b"]).offsets == [1, 2]
        with pytest.raises(RuntimeError):
            p.send("closed")


async def _set(f: Fakes) -> None:
    f.meta.set_route(make_route("t", [("b1", f.b1.url)]))


def test_error_classes():
    assert issubclass(NotLeader, StatorError) and issubclass(Fenced, StatorError)
