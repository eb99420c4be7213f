"""The simulator's virtual net (ops/sim/vnet.py): aiohttp's real server and client, unchanged, on a VirtualLoop with
in-memory connections. Requests, a streamed response (the SSE watch's shape) and a WebSocket (the replica stream's)
arrive whole and in order on virtual time; a cut link holds bytes until it heals; a reset ends the connection; a
port nobody listens on is refused; the same run gives the same trace.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp import web

from ops.sim import vnet
from ops.sim.clock import VirtualLoop

REAL_S_MAX = 5.0          # a whole test's wall time: virtual sleeps of minutes must cost none of it
URL = "http://10.9.0.1:8080"


def app(log: list) -> web.Application:
    async def hello(request: web.Request) -> web.Response:
        log.append(("hello", request.remote))
        return web.json_response({"hello": request.query.get("name")})

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(float(request.query["s"]))
        return web.Response(text="late")

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(5):
            await response.write(f"data: {i}\n\n".encode())
            await asyncio.sleep(1.0)
        return response

    async def echo(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            await ws.send_bytes(msg.data[::-1])
        return ws

    a = web.Application()
    a.router.add_get("/hello", hello)
    a.router.add_get("/slow", slow)
    a.router.add_get("/stream", stream)
    a.router.add_get("/echo", echo)
    return a


@pytest.fixture
def on_vnet(monkeypatch):
    """run(scenario): ``scenario(loop, net, session)`` on a fresh VirtualLoop, the app served at URL; returns what
    the scenario returned and the server's log."""

    def run(scenario):
        loop = VirtualLoop()
        net = loop.net = vnet.VirtualNet(loop, seed=7)
        monkeypatch.setattr(aiohttp.connector, "aiohappyeyeballs", vnet.happy_eyeballs())
        log: list = []

        async def main():
            runner = web.AppRunner(app(log))
            await runner.setup()
            await vnet.VirtualSite(runner, net, "10.9.0.1", 8080).start()
            session = aiohttp.ClientSession()
            try:
                return await scenario(loop, net, session)
            finally:
                await session.close()
                await runner.cleanup()

        started = time.monotonic()
        try:
            out = loop.run_until_complete(main())
        finally:
            loop.close()
        assert time.monotonic() - started < REAL_S_MAX
        return out, log

    return run


def test_a_request_is_served_and_a_handler_s_sleep_costs_virtual_time_only(on_vnet):
    async def scenario(loop, net, session):
        async with session.get(f"{URL}/hello", params={"name": "b1"}) as r:
            first = (r.status, await r.json())
        t0 = loop.time()
        async with session.get(f"{URL}/slow", params={"s": "120"}) as r:
            second = (r.status, await r.text(), loop.time() - t0)
        return first, second

    (first, (status, text, took)), log = on_vnet(scenario)
    assert first == (200, {"hello": "b1"})
    assert (status, text) == (200, "late") and 120 <= took < 120.1
    assert log == [("hello", "client")]   # the connecting host, by vnet.HOST


def test_a_streamed_response_arrives_piece_by_piece_in_order_on_virtual_time(on_vnet):
    async def scenario(loop, net, session):
        got = []
        async with session.get(f"{URL}/stream") as r:
            async for line in r.content:
                if line.startswith(b"data:"):
                    got.append((line.strip().decode(), round(loop.time())))
        return got

    got, _ = on_vnet(scenario)
    assert got == [(f"data: {i}", i) for i in range(5)]


def test_a_websocket_carries_messages_both_ways(on_vnet):
    async def scenario(loop, net, session):
        async with session.ws_connect(f"{URL}/echo") as ws:
            out = []
            for word in (b"abc", b"stator"):
                await ws.send_bytes(word)
                out.append((await ws.receive(timeout=5)).data)
            return out

    out, _ = on_vnet(scenario)
    assert out == [b"cba", b"rotats"]


def test_a_connect_where_nobody_listens_is_refused(on_vnet):
    async def scenario(loop, net, session):
        with pytest.raises(aiohttp.ClientConnectorError) as e:
            await session.get("http://10.9.0.2:8080/hello")
        return str(e.value)

    message, _ = on_vnet(scenario)
    assert "10.9.0.2:8080" in message


def test_a_cut_link_holds_the_request_until_it_heals_and_a_timeout_ends_a_wait(on_vnet):
    async def scenario(loop, net, session):
        async with session.get(f"{URL}/hello") as r:   # the connection is open and kept
            await r.read()
        net.cut.add(("client", "10.9.0.1"))
        with pytest.raises(asyncio.TimeoutError):
            await session.get(f"{URL}/hello", timeout=aiohttp.ClientTimeout(total=3))
        loop.call_later(10, net.heal)
        t0 = loop.time()
        async with session.get(f"{URL}/hello", params={"name": "after"}) as r:
            return await r.json(), loop.time() - t0

    (body, waited), log = on_vnet(scenario)
    assert body == {"hello": "after"} and 10 <= waited < 10.1


def test_mending_one_cut_link_releases_its_bytes_and_holds_the_others(on_vnet):
    async def scenario(loop, net, session):
        async with session.get(f"{URL}/hello") as r:   # the connection is open and kept
            await r.read()
        net.cut |= {("client", "10.9.0.1"), ("10.9.0.1", "client")}
        loop.call_later(5, net.mend, {("client", "10.9.0.1")})    # the request goes at 5 s, the answer is held
        loop.call_later(12, net.mend, {("10.9.0.1", "client")})
        t0 = loop.time()
        async with session.get(f"{URL}/hello", params={"name": "mended"}) as r:
            return await r.json(), loop.time() - t0, set(net.cut)

    (body, waited, cut), log = on_vnet(scenario)
    assert body == {"hello": "mended"} and 12 <= waited < 12.1 and cut == set()
    assert ("hello", "client") in log


def test_a_reset_ends_a_streamed_response_with_a_connection_error(on_vnet):
    async def scenario(loop, net, session):
        got = []
        with pytest.raises(aiohttp.ClientError):
            async with session.get(f"{URL}/stream") as r:
                loop.call_later(2.5, net.reset, "10.9.0.1")
                async for line in r.content:
                    if line.startswith(b"data:"):
                        got.append(line.strip().decode())
        return got

    got, _ = on_vnet(scenario)
    assert got == ["data: 0", "data: 1", "data: 2"]


def test_the_same_scenario_runs_to_the_same_times(on_vnet):
    async def scenario(loop, net, session):
        times = []
        for i in range(20):
            async with session.get(f"{URL}/hello", params={"name": str(i)}) as r:
                await r.read()
            times.append(loop.time())
        return times

    first, _ = on_vnet(scenario)
    second, _ = on_vnet(scenario)
    assert first == second and first[-1] > first[0]


@pytest.mark.parametrize("earlier", range(6))
def test_timers_due_at_one_instant_fire_in_the_order_they_were_set(earlier):
    # asyncio's own timers sort by time alone: a tie came out of the heap in an order its shape decided, which every
    # earlier push and pop shapes (abcdefgh fired as acgfhbde, bfehgacd, ... here), so a harmless swap anywhere
    # before changed which of two faults planned for one instant ran first (a broker schedule's trace hash differed
    # between two runs in one process)
    loop = VirtualLoop()
    fired: list[str] = []
    try:
        for i in range(earlier):
            loop.call_at(0.5 + i / 100, lambda: None)
        for name in "abcdefgh":
            loop.call_later(1.0, fired.append, name)
        loop.run_until_complete(asyncio.sleep(2))
    finally:
        loop.close()
    assert "".join(fired) == "abcdefgh"
