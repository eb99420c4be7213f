"""client/routes.py against the fake meta: versions never go back, deletes, shared refreshes, listeners, shutdown.
(The same class against the real meta cluster, with failover, is in tests/test_client_meta.py.)"""

from __future__ import annotations

import asyncio
import copy

import pytest

from client import Closed, RouteSubscription, TopicNotFound
from tests.support.client_fakes import TOKEN, Fakes, make_route


@pytest.fixture
async def fakes():
    async with Fakes() as f:
        yield f


@pytest.mark.parametrize("mode", ["sse", "long_poll"])
async def test_pushes_changes_and_deletes_in_version_order(fakes, mode):
    fakes.meta.set_route(make_route("t", [("b1", fakes.b1.url)]))
    events = []
    async with RouteSubscription([fakes.meta.url], TOKEN, ["t"], mode, poll_wait_s=2) as sub:
        remove = sub.add_listener(lambda topic, r: events.append((topic, r and r["version"])))
        await sub.wait_for("t", lambda r: True, 5)
        v2 = fakes.meta.set_route(make_route("t", [("b2", fakes.b2.url)]))
        r = await sub.wait_for("t", lambda r: r["version"] == v2, 5)
        assert r["queues"][0]["broker"] == "b2"
        vdel = fakes.meta.delete("t")
        for _ in range(100):
            if sub.route("t") is None:
                break
            await asyncio.sleep(0.05)
        assert sub.route("t") is None and sub.version("t") >= vdel
        remove()
        v3 = fakes.meta.set_route(make_route("t", [("b1", fakes.b1.url)]))   # created again
        assert (await sub.wait_for("t", lambda r: True, 5))["version"] == v3
    versions = [v for _, v in events if v is not None]
    assert versions == sorted(versions) and v2 in versions
    assert ("t", None) in events and v3 not in versions   # the listener was removed before v3


async def test_an_older_route_is_never_taken(fakes):
    fakes.meta.set_route(make_route("t", [("b1", fakes.b1.url)]))
    v = fakes.meta.set_route(make_route("t", [("b2", fakes.b2.url)]))
    async with RouteSubscription([fakes.meta.url], TOKEN, [], "sse") as sub:
        held = await sub.get("t")
        assert held["version"] == v
        older = copy.deepcopy(held)
        older["version"] = v - 1
        fakes.meta.routes["t"] = older          # a node that is behind answers with an older route
        assert (await sub.refresh("t")) is held
        assert not sub._offer(older) and sub.route("t") is held
        assert not sub._offer_deleted("t", v - 1) and sub.route("t") is held
        # refresh asks for at least the version held, so a lagging node cannot even answer
        assert fakes.meta.requests[-1] == ("t", {"min_version": str(v)})


async def test_concurrent_refreshes_share_one_request(fakes):
    fakes.meta.set_route(make_route("t", [("b1", fakes.b1.url)]))
    async with RouteSubscription([fakes.meta.url], TOKEN, [], "long_poll") as sub:
        await sub.get("t")
        before = sum(1 for t, q in fakes.meta.requests if t == "t" and "wait" not in q)
        routes = await asyncio.gather(*(sub.refresh("t") for _ in range(20)))
        after = sum(1 for t, q in fakes.meta.requests if t == "t" and "wait" not in q)
    assert len({id(r) for r in routes}) == 1
    assert after - before == 1


async def test_unknown_topic_and_wait_for_timeout(fakes):
    async with RouteSubscription([fakes.meta.url], TOKEN, [], "sse") as sub:
        with pytest.raises(TopicNotFound):
            await sub.get("nope")
        with pytest.raises(TimeoutError):
            await sub.wait_for("nope", lambda r: True, 0.2)
        v = fakes.meta.set_route(make_route("nope", [("b1", fakes.b1.url)]))   # created while watched
        assert (await sub.wait_for("nope", lambda r: True, 5))["version"] == v


async def test_close_stops_everything(fakes):
    fakes.meta.set_route(make_route("t", [("b1", fakes.b1.url)]))
    sub = RouteSubscription([fakes.meta.url], TOKEN, ["t"], "sse")
    sub.start()
    await sub.wait_for("t", lambda r: True, 5)
    tasks = list(sub._tasks)
    assert tasks
    await sub.close()
    assert all(t.done() for t in tasks)
    with pytest.raises(Closed):
        await sub.get("t")
    await sub.close()  # twice is fine


async def test_sse_reconnects_to_the_next_node_after_an_idle_stream(fakes):
    """A stream that stays silent past idle_timeout_s is treated as dead: the next node takes over."""
    fakes.meta.set_route(make_route("t", [("b1", fakes.b1.url)]))
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    async def silent(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(30)
        return resp
    app = web.Application()
    app.router.add_get("/v1/watch", silent)
    mute = TestServer(app, host="127.0.0.1")
    await mute.start_server()
    try:
        urls = [str(mute.make_url("")).rstrip("/"), fakes.meta.url]
        async with RouteSubscription(urls, TOKEN, ["t"], "sse", idle_timeout_s=0.3) as sub:
            r = await sub.wait_for("t", lambda r: True, 5)
            assert r["topic"] == "t" and sub.reconnects >= 1
            assert sub.connected_url == fakes.meta.url
    finally:
        await mute.close()
