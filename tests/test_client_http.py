"""wire/errors.py and wire/caller.py: the error shape, failover across meta nodes, bounded retries."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from wire.errors import NoLeader, NotLeader, StatorError, Unavailable, VersionMismatch
from wire.caller import Backoff, MetaCaller
from tests.support.client_fakes import DEAD_ADDRESS

FAST = Backoff(0.01, 0.02)


def test_error_shape_is_parsed_into_the_specific_class():
    e = StatorError.from_response(409, {"error": {"code": "VERSION_MISMATCH", "message": "m",
                                                  "details": {"current_version": 12}}})
    assert isinstance(e, VersionMismatch) and e.current_version == 12 and e.status == 409 and e.message == "m"
    assert isinstance(StatorError.from_response(409, {"error": {"code": "NOT_LEADER"}}), NotLeader)
    odd = StatorError.from_response(502, "<html>bad gateway</html>")
    assert type(odd) is StatorError and odd.code == "INTERNAL" and odd.retriable_on_meta
    assert StatorError.from_response(401, None).code == "UNAUTHENTICATED"
    assert StatorError.from_response(503, {"error": {"code": "NO_LEADER"}}).retriable_on_meta
    assert not StatorError.from_response(404, {"error": {"code": "TOPIC_NOT_FOUND"}}).retriable_on_meta


def test_backoff_grows_with_jitter_up_to_its_cap():
    b = Backoff(0.1, 1.0, rng=lambda: 1.0)
    assert [b.delay_s(n) for n in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    low = Backoff(0.1, 1.0, rng=lambda: 0.0)
    assert low.delay_s(2) == pytest.approx(0.2)


class ScriptedNode:
    """A meta node that answers each request with the next scripted (status, body); keys and paths are recorded."""

    def __init__(self, script: list[tuple[int, dict]]):
        self.script = list(script)
        self.keys: list[str | None] = []
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        self.server = TestServer(app, host="127.0.0.1")

    async def _answer(self, request: web.Request) -> web.Response:
        self.keys.append(request.headers.get("Idempotency-Key"))
        status, body = self.script.pop(0) if self.script else (200, {"ok": True})
        return web.json_response(body, status=status, headers={"X-Meta-Version": "42"})

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")


@pytest.fixture
async def nodes():
    made = []

    async def make(script):
        n = ScriptedNode(script)
        await n.server.start_server()
        made.append(n)
        return n
    yield make
    for n in made:
        await n.server.close()


async def test_fails_over_on_no_answer_and_on_no_leader(nodes):
    no_leader = await nodes([(503, {"error": {"code": "NO_LEADER", "message": "election"}})])
    good = await nodes([])
    async with MetaCaller([DEAD_ADDRESS, no_leader.url, good.url], "tok", backoff=FAST) as m:
        answer = await m.call("POST", "/v1/x", json={}, headers={"Idempotency-Key": "k1"})
        assert answer.body == {"ok": True} and answer.url.startswith(good.url)
        assert m.url == good.url and m.max_version_seen == 42
        await m.call("GET", "/v1/y")      # sticks to the node that answered
    assert no_leader.keys == ["k1"] and good.keys == ["k1", None]


async def test_other_errors_are_raised_at_once(nodes):
    node = await nodes([(409, {"error": {"code": "VERSION_MISMATCH", "message": "no", "details": {"current_version": 3}}})])
    spare = await nodes([])
    async with MetaCaller([node.url, spare.url], "tok", backoff=FAST) as m:
        with pytest.raises(VersionMismatch):
            await m.call("PUT", "/v1/topics/t/config", json={})
    assert len(node.keys) == 1 and spare.keys == []


async def test_attempts_and_deadline_bound_the_retries(nodes):
    node = await nodes([(503, {"error": {"code": "NO_LEADER"}})] * 100)
    async with MetaCaller([node.url], "tok", attempts_max=5, backoff=FAST) as m:
        with pytest.raises(NoLeader):
            await m.call("GET", "/v1/cluster")
    assert len(node.keys) == 5
    async with MetaCaller([DEAD_ADDRESS], "tok", attempts_max=1000, deadline_s=0.5,
                          backoff=Backoff(0.05, 0.1)) as m:
        t0 = time.monotonic()
        with pytest.raises(Unavailable):
            await m.call("GET", "/v1/cluster")
        assert time.monotonic() - t0 < 2.0


async def test_per_request_timeout():
    async def slow(request):
        await asyncio.sleep(5)
        return web.json_response({})
    app = web.Application()
    app.router.add_get("/v1/cluster", slow)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with MetaCaller([str(server.make_url("")).rstrip("/")], "tok", timeout_s=0.2, attempts_max=2,
                              backoff=FAST) as m:
            t0 = time.monotonic()
            with pytest.raises(Unavailable):
                await m.call("GET", "/v1/cluster")
            assert time.monotonic() - t0 < 2.0
    finally:
        await server.close()


async def test_the_version_of_a_refusal_counts_as_seen(nodes):
    # A 404 states its node's version as well as a 200 does; a later read must not show anything older.
    node = await nodes([(404, {"error": {"code": "TOPIC_NOT_FOUND", "message": "gone"}})])
    async with MetaCaller([node.url], "tok", backoff=FAST) as m:
        with pytest.raises(StatorError):
            await m.call("GET", "/v1/topics/t")
        assert m.max_version_seen == 42
        m.note_version(7)
        assert m.max_version_seen == 42
