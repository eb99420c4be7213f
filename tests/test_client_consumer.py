"""client/consumer.py against fake brokers and a fake meta: start position, offset order, commits, NOT_LEADER."""

from __future__ import annotations

import asyncio
import json

import pytest

from client import PullConsumer, SyncPullConsumer
from wire.caller import Backoff
from tests.support.client_fakes import DEAD_ADDRESS, TOKEN, Fakes, fakes_in_thread, make_route

FAST = Backoff(0.01, 0.05)


@pytest.fixture
async def fakes():
    async with Fakes() as f:
        yield f


def consumer(f: Fakes, **kw) -> PullConsumer:
    kw.setdefault("backoff", FAST)
    return PullConsumer([f.meta.url], TOKEN, "t", kw.pop("group", "g"), **kw)


async def test_reads_from_min_offset_in_order_commits_and_resumes(fakes):
    fakes.meta.set_route(make_route("t", [("b1", fakes.b1.url), ("b2", fakes.b2.url)]))
    fakes.b1.load("t", 0, [f"a{i}" for i in range(10)], start=5)   # older offsets are gone
    fakes.b2.load("t", 1, ["b0", "b1", "b2"])
    async with consumer(fakes, max_messages=4) as c:
        assert await c.committed(0) == -1
        assert await c.position(0) == 5
        got = []
        while True:
            batch = await c.poll()
            if not batch:
                break
            got += batch
        by_queue = {q: [(m.offset, m.text) for m in got if m.queue == q] for q in (0, 1)}
        assert by_queue[0] == [(5 + i, f"a{i}") for i in range(10)]
        assert by_queue[1] == [(0, "b0"), (1, "b1"), (2, "b2")]
        assert await c.commit_positions() == {0: 15, 1: 3}
    assert fakes.b1.committed[("g", "t", 0)] == 15
    fakes.b1.load("t", 0, [f"a{i}" for i in range(12)], start=5)
    async with consumer(fakes, queues=[0]) as c:
        assert await c.position(0) == 15
        assert [m.text for m in await c.poll()] == ["a10", "a11"]
        assert await c.queues() == [0]


async def test_not_leader_on_pull_refreshes_the_route(fakes):
    fakes.meta.set_route(make_route("t", [("b1", fakes.b1.url)]))
    async with consumer(fakes) as c:
        await c.start()
        v = fakes.meta.set_route(make_route("t", [("b2", fakes.b2.url)]), publish=False)  # moved; not pushed yet
        fakes.b1.route_version = v
        fakes.b1.fail("GET", 0, 409, "NOT_LEADER")
        fakes.b2.load("t", 0, ["x", "y"])
        r = await c.pull(0, offset=0)
    assert [m.text for m in r.messages] == ["x", "y"] and r.next_offset == 2
    assert ("t", {"min_version": str(v)}) in fakes.meta.requests


async def test_a_dead_broker_does_not_stop_the_other_queues(fakes):
    fakes.meta.set_route(make_route("t", [("dead", DEAD_ADDRESS), ("b2", fakes.b2.url)]))
    fakes.b2.load("t", 1, ["ok"])
    async with consumer(fakes, attempts_max=2) as c:
        c.seek(0, 0)
        assert [m.text for m in await c.poll()] == ["ok"]


async def test_no_lock_token_api_until_a_server_enforces_tokens(fakes):
    # Exclusive lock tokens come with the server side (ordered consumption); until then the client must not offer
    # a stub that claims to send them, and it sends none.
    assert not hasattr(PullConsumer, "set_lock_token") and not hasattr(SyncPullConsumer, "set_lock_token")
    fakes.meta.set_route(make_route("t", [("b1", fakes.b1.url)]))
    fakes.b1.load("t", 0, ["x"])
    async with consumer(fakes) as c:
        c.seek(0, 0)
        assert [m.text for m in await c.poll()] == ["x"]
        assert "token" not in fakes.b1.requests[-1][3]
        await c.commit(0, 1)
        assert fakes.b1.requests[-1][3] == {"offset": 1}


@pytest.mark.parametrize("send_form", ["binary", "json"])
@pytest.mark.parametrize("pull_form", ["binary", "json"])
async def test_binary_bodies_and_iteration(fakes, send_form, pull_form):
    fakes.meta.set_route(make_route("t", [("b1", fakes.b1.url)]))
    async with consumer(fakes, wire_format=pull_form) as c:
        from client import Producer
        async with Producer([fakes.meta.url], TOKEN, "t", wire_format=send_form) as p:
            await p.send(b"\x00bin")
            await p.send("text")
        got = []
        async for m in c:
            got.append(m)
            if len(got) == 2:
                break
    assert [m.body for m in got] == [b"\x00bin", b"text"]   # bytes out, whichever form carried them
    assert [m.is_text for m in got] == [False, True] and got[1].text == "text"
    assert set(fakes.b1.forms) == {("POST", send_form), ("GET", pull_form)}


async def test_poll_waits_at_most_its_timeout(fakes):
    fakes.meta.set_route(make_route("t", [("b1", fakes.b1.url)]))
    async with consumer(fakes, idle_pause_s=0.05) as c:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        assert await c.poll(timeout_s=0.3) == []
        assert 0.2 <= loop.time() - t0 < 2.0


def test_blocking_consumer():
    with fakes_in_thread() as (f, loop):
        async def setup():
            f.meta.set_route(make_route("t", [("b1", f.b1.url)]))
            f.b1.load("t", 0, ["a", "b"])
        asyncio.run_coroutine_threadsafe(setup(), loop).result(5)
        with SyncPullConsumer([f.meta.url], TOKEN, "t", "g", backoff=FAST) as c:
            assert [m.text for m in c.poll(timeout_s=1.0)] == ["a", "b"]
            assert c.commit(0, 2) == 2
            assert c.committed(0) == 2
            c.seek(0, 1)
            assert c.position(0) == 1


def test_a_pull_answer_reads_the_same_in_either_form_and_a_damaged_batch_is_unavailable():
    from multidict import CIMultiDict

    from client.formats import pulled
    from client import Unavailable
    from wire import batch
    from wire.caller import Answer
    fields = {"next_offset": 9, "min_offset": 0, "max_offset": 9}
    raw = batch.encode_stored([
        batch.Run(7, 5, 1, batch.sized([batch.record(batch.Message("k", {"p": "1"}, b"\xff", False))])),
        batch.Run(8, 6, 1, batch.sized([batch.record(batch.Message(None, None, "é".encode(), True))]))])
    as_batch = pulled(Answer(200, raw, CIMultiDict({"X-Pull": json.dumps(fields)}), "http://b"))
    as_json = pulled(Answer(200, {**fields, "messages": [
        {"offset": 7, "ts": 5, "key": "k", "props": {"p": "1"}, "body_b64": "/w=="},
        {"offset": 8, "ts": 6, "key": None, "props": {}, "body": "é"}]}, CIMultiDict(), "http://b"))
    assert as_batch[1] == as_json[1] and as_batch[0] == fields and as_json[0]["next_offset"] == 9
    assert [(m.body, m.text) for m in as_batch[1]] == [(b"\xff", False), ("é".encode(), True)]
    damaged = raw[:-1] + bytes([raw[-1] ^ 1])
    with pytest.raises(Unavailable, match="cannot be read"):
        pulled(Answer(200, damaged, CIMultiDict({"X-Pull": json.dumps(fields)}), "http://b"))
    with pytest.raises(Unavailable, match="cannot be read"):
        pulled(Answer(200, raw, CIMultiDict(), "http://b"))   # no X-Pull
