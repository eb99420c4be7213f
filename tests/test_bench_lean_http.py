"""ops/bench/lean_http.py, the fan-out benchmark's long-poll client, against a real aiohttp server: answers framed by
Content-Length are read whole, one after another on one connection; what it does not speak is refused, not guessed."""

from __future__ import annotations

import json

import pytest
from aiohttp import web

from ops.bench import lean_http
from ops.devcluster import free_base_port

TIMEOUT_S = 10


@pytest.fixture
async def server():
    async def route(request: web.Request) -> web.Response:
        if request.query.get("after") == "7":
            return web.Response(status=304)
        assert request.headers["Authorization"] == "Bearer t"
        return web.json_response({"version": 7, "pad": "x" * 100_000})   # read over several reads

    async def chunked(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await resp.write(b"{}")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/route", route)
    app.router.add_get("/chunked", chunked)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_base_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield port
    await runner.cleanup()


async def test_answers_are_read_whole_one_after_another_on_one_connection(server):
    conn = await lean_http.LeanConnection.open("127.0.0.1", server, {"Authorization": "Bearer t"}, TIMEOUT_S)
    try:
        status, body = await conn.get("/route?after=1", TIMEOUT_S)
        assert status == 200 and json.loads(body)["version"] == 7 and len(body) > 100_000
        assert await conn.get("/route?after=7", TIMEOUT_S) == (304, b"")
        status, again = await conn.get("/route?after=1", TIMEOUT_S)
        assert (status, again) == (200, body)
    finally:
        conn.close()


async def test_a_chunked_answer_is_refused_and_a_closed_connection_says_so(server):
    conn = await lean_http.LeanConnection.open("127.0.0.1", server, {}, TIMEOUT_S)
    with pytest.raises(lean_http.LeanHttpError, match="transfer-encoding"):
        await conn.get("/chunked", TIMEOUT_S)
    with pytest.raises(lean_http.LeanHttpError, match="closed"):
        await conn.get("/route?after=1", TIMEOUT_S)
