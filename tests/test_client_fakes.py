"""Fakes of meta's route endpoints and of a broker's data API (API.md shapes), for testing the client's producer and
consumer logic (queue choice, retries, route refresh) without real brokers. End-to-end tests against real brokers live
elsewhere; the tests at the bottom only check that the fakes answer the way the contract says.

A fake broker is scripted: ``broker.fail(method, queue, status, code, times)`` makes the next ``times`` requests of
that kind answer with that error (``code="DROP"`` closes the connection without an answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import threading
from collections import defaultdict
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from meta import allocation

TOKEN = "client-token"
DEAD_ADDRESS = "http://127.0.0.1:1"  # nothing listens there: connection refused


def error(status: int, code: str, message: str = "", headers: dict | None = None, **details) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message or code, "details": details}},
                             status=status, headers=headers)


def make_route(topic: str, placement: list[tuple[str, str]], *, order: str = "best_tried", slots: int = 64,
               unwritable: tuple[int, ...] = ()) -> dict[str, Any]:
    """A route in meta/views.py's shape: ``placement[q] = (broker, address)`` of queue q's head segment."""
    return {"topic": topic, "version": 0, "slots": slots, "order": order, "config": {},
            "slot_table": allocation.initial_slot_table(slots, len(placement)), "barriers": [],
            "queues": [{"queue": q, "broker": b, "address": a, "physical_queue": f"{topic}.q{q}.g0.i1", "gen": 0,
                        "writable": q not in unwritable,
                        "segments": [{"gen": 0, "broker": b, "address": a, "physical_queue": f"{topic}.q{q}.g0.i1",
                                      "physical_start": 0, "logic_start": 0, "logic_end": None, "state": "active"}]}
                       for q, (b, a) in enumerate(placement)]}


class FakeMeta:
    """``GET /v1/routes/{t}`` (long poll, min_version) and ``GET /v1/watch`` (SSE) over routes the test sets."""

    def __init__(self) -> None:
        self.version = 10
        self.routes: dict[str, dict] = {}
        self.published: dict[str, dict] = {}   # what long polls and watch streams see (may lag self.routes)
        self.deleted: dict[str, int] = {}
        self.requests: list[tuple[str, dict]] = []
        self._changed = asyncio.Event()
        self.streams: set[asyncio.Task] = set()
        app = web.Application()
        app.router.add_get("/v1/routes/{topic}", self._route)
        app.router.add_get("/v1/watch", self._watch)
        self.server = TestServer(app, host="127.0.0.1")

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    def set_route(self, route: dict, *, publish: bool = True) -> int:
        """Store a new version of a route. ``publish=False``: only a direct read (a refresh) sees it."""
        self.version += 1
        route = copy.deepcopy(route)
        route["version"] = self.version
        self.routes[route["topic"]] = route
        if publish:
            self.published[route["topic"]] = route
            self._changed.set()
            self._changed = asyncio.Event()
        return self.version

    def delete(self, topic: str) -> int:
        self.version += 1
        self.routes.pop(topic, None)
        self.published.pop(topic, None)
        self.deleted[topic] = self.version
        self._changed.set()
        self._changed = asyncio.Event()
        return self.version

    async def _route(self, request: web.Request) -> web.StreamResponse:
        topic = request.match_info["topic"]
        q = dict(request.query)
        self.requests.append((topic, q))
        if int(q.get("min_version", 0)) > self.version:
            return error(503, "VERSION_NOT_REACHED")
        wait = float(q.get("wait", 0))
        after = int(q.get("after", -1))
        table = self.published if "wait" in q else self.routes
        deadline = asyncio.get_running_loop().time() + wait
        while True:
            route = table.get(topic)
            if route is None:
                return error(404, "TOPIC_NOT_FOUND", headers={"X-Meta-Version": str(self.version)})
            if route["version"] > after:
                return web.json_response(route, headers={"X-Meta-Version": str(self.version)})
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return web.Response(status=304)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    async def _watch(self, request: web.Request) -> web.StreamResponse:
        topics = [t for t in request.query.get("topics", "").split(",") if t]
        after = int(request.query.get("after", -1))
        self.requests.append(("*watch*", dict(request.query)))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        sent: dict[str, int] = {}
        self.streams.add(asyncio.current_task())
        try:
            while True:
                for t in topics:
                    r = self.published.get(t)
                    if r is not None and r["version"] > max(after, sent.get(t, -1)):
                        await resp.write(f"event: route\nid: {r['version']}\ndata: {json.dumps(r)}\n\n".encode())
                        sent[t] = r["version"]
                    elif r is None and t in self.deleted and sent.get(t, -1) >= 0:
                        v = self.deleted[t]
                        await resp.write(f"event: deleted\nid: {v}\ndata: {json.dumps({'topic': t, 'version': v})}\n\n"
                                         .encode())
                        sent[t] = -1
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), 1.0)
                await resp.write(b": keepalive\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.streams.discard(asyncio.current_task())
        return resp


class FakeBroker:
    """The broker data API over in-memory logic queues: messages and offsets; scripted failures."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.messages: dict[tuple[str, int], list[dict]] = defaultdict(list)
        self.min_offsets: dict[tuple[str, int], int] = {}
        self.committed: dict[tuple[str, str, int], int] = {}
        self.requests: list[tuple[str, str, int, Any]] = []   # (method, topic, queue, body or query)
        self.route_version = 0
        self._script: dict[tuple[str, int], list[tuple[int, str]]] = defaultdict(list)
        app = web.Application()
        app.router.add_post("/v1/messages/{topic}/{queue}", self._send)
        app.router.add_get("/v1/messages/{topic}/{queue}", self._pull)
        app.router.add_put("/v1/offsets/{group}/{topic}/{queue}", self._commit)
        app.router.add_get("/v1/offsets/{group}/{topic}/{queue}", self._committed)
        self.server = TestServer(app, host="127.0.0.1")

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    def fail(self, method: str, queue: int, status: int, code: str, times: int = 1) -> None:
        self._script[(method, queue)] += [(status, code)] * times

    def load(self, topic: str, queue: int, bodies: list[str], start: int = 0) -> None:
        self.min_offsets[(topic, queue)] = start
        self.messages[(topic, queue)] = [{"offset": start + i, "body": b, "key": None, "props": {}, "ts": 1}
                                         for i, b in enumerate(bodies)]

    def sent(self, topic: str | None = None) -> list[tuple[int, list[dict]]]:
        return [(q, body["messages"]) for m, t, q, body in self.requests if m == "POST" and topic in (None, t)]

    def _scripted(self, request: web.Request, method: str, queue: int) -> web.Response | None:
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return error(401, "UNAUTHENTICATED")
        script = self._script[(method, queue)]
        if not script:
            return None
        status, code = script.pop(0)
        if code == "DROP":
            request.transport.close()
            raise ConnectionResetError("dropped on purpose")
        return error(status, code, headers={"X-Route-Version": str(self.route_version)})

    async def _send(self, request: web.Request) -> web.Response:
        topic, q = request.match_info["topic"], int(request.match_info["queue"])
        body = await request.json()
        self.requests.append(("POST", topic, q, body))
        scripted = self._scripted(request, "POST", q)
        if scripted is not None:
            return scripted
        log = self.messages[(topic, q)]
        start = log[-1]["offset"] + 1 if log else self.min_offsets.get((topic, q), 0)
        offsets = []
        for i, m in enumerate(body["messages"]):
            log.append({"offset": start + i, "body": m.get("body"), "body_b64": m.get("body_b64"),
                        "key": m.get("key"), "props": m.get("props", {}), "ts": 1})
            offsets.append(start + i)
        return web.json_response({"queue": q, "offsets": offsets}, headers={"X-Route-Version": str(self.route_version)})

    async def _pull(self, request: web.Request) -> web.Response:
        topic, q = request.match_info["topic"], int(request.match_info["queue"])
        self.requests.append(("GET", topic, q, dict(request.query)))
        scripted = self._scripted(request, "GET", q)
        if scripted is not None:
            return scripted
        offset, n = int(request.query["offset"]), int(request.query["max"])
        log = self.messages[(topic, q)]
        lo = self.min_offsets.get((topic, q), 0)
        batch = [m for m in log if m["offset"] >= max(offset, lo)][:n]
        hi = log[-1]["offset"] + 1 if log else lo
        nxt = batch[-1]["offset"] + 1 if batch else max(offset, lo)
        return web.json_response({"messages": batch, "next_offset": nxt, "min_offset": lo, "max_offset": hi},
                                 headers={"X-Route-Version": str(self.route_version)})

    async def _commit(self, request: web.Request) -> web.Response:
        g, topic, q = request.match_info["group"], request.match_info["topic"], int(request.match_info["queue"])
        body = await request.json()
        self.requests.append(("PUT", topic, q, body))
        scripted = self._scripted(request, "PUT", q)
        if scripted is not None:
            return scripted
        self.committed[(g, topic, q)] = body["offset"]
        return web.json_response({"offset": body["offset"]})

    async def _committed(self, request: web.Request) -> web.Response:
        g, topic, q = request.match_info["group"], request.match_info["topic"], int(request.match_info["queue"])
        scripted = self._scripted(request, "GET_OFFSET", q)
        if scripted is not None:
            return scripted
        return web.json_response({"offset": self.committed.get((g, topic, q), -1)})


class Fakes:
    """One fake meta and two fake brokers, started together."""

    def __init__(self) -> None:
        self.meta = FakeMeta()
        self.b1 = FakeBroker("b1")
        self.b2 = FakeBroker("b2")

    async def __aenter__(self) -> Fakes:
        for s in (self.meta.server, self.b1.server, self.b2.server):
            await s.start_server()
        return self

    async def __aexit__(self, *exc) -> None:
        for t in list(self.meta.streams):  # a client left open would keep its stream (and the server) alive
            t.cancel()
        for s in (self.meta.server, self.b1.server, self.b2.server):
            await s.close()


@contextlib.contextmanager
def fakes_in_thread():
    """``Fakes`` served by an event loop in another thread, for tests of the blocking wrappers."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def make() -> Fakes:
        return await Fakes().__aenter__()

    fakes = asyncio.run_coroutine_threadsafe(make(), loop).result(10)
    try:
        yield fakes, loop
    finally:
        asyncio.run_coroutine_threadsafe(fakes.__aexit__(None, None, None), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


# -- the fakes keep the contract's shapes ---------------------------------------------------------------------
async def test_fake_meta_long_poll_answers_304_then_the_new_route():
    import aiohttp
    async with Fakes() as f, aiohttp.ClientSession() as s:
        v = f.meta.set_route(make_route("t", [("b1", f.b1.url)]))
        async with s.get(f"{f.meta.url}/v1/routes/t", params={"after": v, "wait": "0.1"}) as r:
            assert r.status == 304
        async with s.get(f"{f.meta.url}/v1/routes/nope") as r:
            assert r.status == 404 and (await r.json())["error"]["code"] == "TOPIC_NOT_FOUND"


async def test_fake_broker_send_then_pull():
    import aiohttp
    async with Fakes() as f, aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as s:
        async with s.post(f"{f.b1.url}/v1/messages/t/0", json={"messages": [{"body": "a"}, {"body": "b"}]}) as r:
            assert await r.json() == {"queue": 0, "offsets": [0, 1]}
        async with s.get(f"{f.b1.url}/v1/messages/t/0", params={"offset": "1", "max": "5"}) as r:
            body = await r.json()
        assert [m["offset"] for m in body["messages"]] == [1] and body["next_offset"] == 2
