"""Fakes of meta's route and history endpoints and of a broker's data API (API.md shapes), for testing the client's
producer and consumer logic (queue choice, retries, route refresh) without real brokers. tests/test_client_contract.py
runs one suite against these fakes and against real servers, so the fakes answer the way the real ones do.

A fake broker holds a queue when the newest route its meta has for the topic puts the queue's head on the broker's
address (the real one learns that from meta's watch stream); elsewhere it answers ``NOT_LEADER`` as the real one does.
It is also scripted: ``broker.fail(method, queue, status, code, times)`` makes the next ``times`` requests of that
kind answer with that error (``code="DROP"`` closes the connection without an answer).
A fake broker speaks both forms of a send and a pull, JSON and the binary batch (wire/batch.py), as the real one does:
a binary send is kept and logged in its JSON shape (``body`` for text, ``body_b64`` for bytes), so ``sent()`` reads
the same whichever form the client used.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import threading
import time
from collections import defaultdict
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from wire import batch, route as route_model
from wire.errors import ApiError
from meta import allocation, limits

TOKEN = "client-token"
DEAD_ADDRESS = "http://127.0.0.1:1"  # nothing listens there: connection refused


def error(status: int, code: str, message: str = "", headers: dict | None = None, **details) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message or code, "details": details}},
                             status=status, headers=headers)


def make_route(topic: str, placement: list[tuple[str, str]], *, order: str = "best_tried", slots: int = 64,
               unwritable: tuple[int, ...] = ()) -> route_model.RouteJson:
    """A route built by the same functions meta renders with: ``placement[q] = (broker, address)`` of queue q's
    head segment."""
    def head(q: int, broker: str, address: str) -> route_model.SegmentJson:
        return route_model.segment_json(gen=0, broker=broker, address=address,
                                        physical_queue=f"{topic}.q{q}.g0.i1", physical_start=0, logic_start=0,
                                        logic_end=None, state="active", budget_end=1_000_000)
    return route_model.route_json(
        topic=topic, version=0, slots=slots, order=order, config={}, barriers=[],
        slot_table=allocation.initial_slot_table(slots, len(placement)), slot_table_version=0,
        queues=[route_model.queue_json(q, q not in unwritable, [head(q, b, a)]) for q, (b, a) in enumerate(placement)])


def _authenticated(request: web.Request) -> bool:
    return request.headers.get("Authorization") == f"Bearer {TOKEN}"


def _int_param(query, name: str, default: int, lo: int = 0) -> int:
    """An integer query parameter, or a 400 INVALID_ARGUMENT as the real services answer a bad one."""
    try:
        v = int(query.get(name, default))
    except ValueError:
        v = lo - 1
    if v < lo:
        raise web.HTTPBadRequest(text=json.dumps({"error": {"code": "INVALID_ARGUMENT",
                                                            "message": f"{name} must be an integer >= {lo}",
                                                            "details": {"field": name}}}),
                                 content_type="application/json")
    return v


def _stamping(header: str, version):
    """Middleware: every answer (errors and 304s too) carries ``header``, and every call needs the client token."""
    @web.middleware
    async def stamp(request: web.Request, handler) -> web.StreamResponse:
        try:
            resp = await handler(request) if _authenticated(request) else error(401, "UNAUTHENTICATED")
        except web.HTTPException as e:
            resp = e
        if not resp.prepared:  # a stream (SSE) has sent its headers already
            resp.headers[header] = str(version())
        if isinstance(resp, web.HTTPException):
            raise resp
        return resp
    return stamp


class FakeMeta:
    """``GET /v1/routes/{t}`` (long poll, min_version), ``GET /v1/watch`` (SSE) and ``GET /v1/history`` (a bounded
    scan per topic-filtered call, as meta/api/cluster.py reads it) over routes and events the test sets."""

    def __init__(self) -> None:
        self.version = 10
        self.routes: dict[str, dict] = {}
        self.published: dict[str, dict] = {}   # what long polls and watch streams see (may lag self.routes)
        self.deleted: dict[str, int] = {}
        self.events: list[dict] = []           # in version order; one per version from 11 on
        self.history_scan_events_max = limits.HISTORY_SCAN_EVENTS_MAX
        self.requests: list[tuple[str, dict]] = []
        self._changed = asyncio.Event()
        self.streams: set[asyncio.Task] = set()
        app = web.Application(middlewares=[_stamping("X-Meta-Version", lambda: self.version)])
        app.router.add_get("/v1/routes/{topic}", self._route)
        app.router.add_get("/v1/watch", self._watch)
        app.router.add_get("/v1/history", self._history)
        self.server = TestServer(app, host="127.0.0.1")

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    def record(self, type_: str, topic: str | None, data: dict | None = None) -> int:
        """Append one event (a new version) to the history."""
        self.version += 1
        self.events.append({"version": self.version, "ts": int(time.time() * 1000), "type": type_, "v": 1,
                            "topic": topic, "data": data or {}})
        return self.version

    def set_route(self, route: dict, *, publish: bool = True) -> int:
        """Store a new version of a route. ``publish=False``: only a direct read (a refresh) sees it."""
        route = copy.deepcopy(route)
        route["version"] = self.record("TopicCreated" if route["topic"] not in self.routes else "FakeRouteChanged",
                                       route["topic"])
        self.routes[route["topic"]] = route
        if publish:
            self.published[route["topic"]] = route
            self._wake()
        return self.version

    def delete(self, topic: str) -> int:
        self.deleted[topic] = self.record("TopicDeleted", topic, {"topic": topic})
        self.routes.pop(topic, None)
        self.published.pop(topic, None)
        self._wake()
        return self.version

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _version_not_reached(self, q) -> web.Response | None:
        v = _int_param(q, "min_version", 0)
        if v > self.version:
            return error(503, "VERSION_NOT_REACHED", f"this node has applied {self.version}, not {v}",
                         applied_version=self.version, min_version=v)
        return None

    async def _route(self, request: web.Request) -> web.StreamResponse:
        topic = request.match_info["topic"]
        q = dict(request.query)
        self.requests.append((topic, q))
        refused = self._version_not_reached(q)
        if refused is not None:
            return refused
        wait = float(q.get("wait", 0))
        after = int(q.get("after", -1))
        table = self.published if "wait" in q else self.routes
        deadline = asyncio.get_running_loop().time() + wait
        while True:
            route = table.get(topic)
            if route is None:
                return error(404, "TOPIC_NOT_FOUND", f"topic {topic!r} does not exist", topic=topic)
            if route["version"] > after:
                return web.json_response(route)
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return web.Response(status=304)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    async def _history(self, request: web.Request) -> web.Response:
        q = request.query
        refused = self._version_not_reached(q)
        if refused is not None:
            return refused
        after = _int_param(q, "after", 0)
        limit = max(1, min(_int_param(q, "limit", 1000), limits.HISTORY_PAGE_MAX))
        topic = q.get("topic") or None
        # The real node scans at most history_scan_events_max events past 'after' per call; next_after says where
        # the scan stopped, so an empty filtered page may still have moved on.
        cursor, page = after, []
        for e in [e for e in self.events if e["version"] > after][:self.history_scan_events_max]:
            if len(page) >= limit:
                break
            cursor = e["version"]
            if topic is None or e["topic"] == topic:
                page.append(e)
        return web.json_response({"events": page, "next_after": cursor})

    async def _watch(self, request: web.Request) -> web.StreamResponse:
        topics = [t for t in request.query.get("topics", "").split(",") if t]
        after = int(request.query.get("after", -1))
        self.requests.append(("*watch*", dict(request.query)))
        refused = self._version_not_reached(request.query)
        if refused is not None:
            return refused
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Meta-Version": str(self.version)})
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

    def __init__(self, name: str, meta: FakeMeta) -> None:
        self.name = name
        self.meta = meta
        self.messages: dict[tuple[str, int], list[dict]] = defaultdict(list)
        self.min_offsets: dict[tuple[str, int], int] = {}
        self.committed: dict[tuple[str, str, int], int] = {}
        self.requests: list[tuple[str, str, int, Any]] = []   # (method, topic, queue, body or query)
        self.forms: list[tuple[str, str]] = []   # (method, "binary" or "json") of each send and pull
        self.route_version: int | None = None   # None: the newest version its meta has (brokers follow it closely)
        self._script: dict[tuple[str, int], list[tuple[int, str]]] = defaultdict(list)
        app = web.Application(middlewares=[_stamping("X-Route-Version", self._route_version)])
        app.router.add_post("/v1/messages/{topic}/{queue}", self._send)
        app.router.add_get("/v1/messages/{topic}/{queue}", self._pull)
        app.router.add_put("/v1/offsets/{group}/{topic}/{queue}", self._commit)
        app.router.add_get("/v1/offsets/{group}/{topic}/{queue}", self._committed)
        self.server = TestServer(app, host="127.0.0.1")

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    def _route_version(self) -> int:
        return self.meta.version if self.route_version is None else self.route_version

    def fail(self, method: str, queue: int, status: int, code: str, times: int = 1) -> None:
        self._script[(method, queue)] += [(status, code)] * times

    def load(self, topic: str, queue: int, bodies: list[str], start: int = 0) -> None:
        self.min_offsets[(topic, queue)] = start
        self.messages[(topic, queue)] = [{"offset": start + i, "ts": 1, "key": None, "props": {}, "body": b}
                                         for i, b in enumerate(bodies)]

    def sent(self, topic: str | None = None) -> list[tuple[int, list[dict]]]:
        return [(q, body["messages"]) for m, t, q, body in self.requests if m == "POST" and topic in (None, t)]

    def _scripted(self, request: web.Request, method: str, queue: int) -> web.Response | None:
        script = self._script[(method, queue)]
        if not script:
            return None
        status, code = script.pop(0)
        if code == "DROP":
            request.transport.close()
            raise ConnectionResetError("dropped on purpose")
        return error(status, code)

    def _not_holding(self, topic: str, queue: int) -> web.Response | None:
        """Why this broker cannot serve (topic, queue) now, as the real broker says it; None when it can."""
        route = self.meta.routes.get(topic)
        if route is None:
            return error(404, "TOPIC_NOT_FOUND", f"topic {topic!r} is unknown to this broker", topic=topic)
        if not 0 <= queue < len(route["queues"]):
            return error(404, "QUEUE_NOT_FOUND", f"queue {queue} does not exist", topic=topic, queue=queue)
        head = route["queues"][queue]
        if head["address"] != self.url:
            return error(409, "NOT_LEADER", "this broker does not hold the queue's writable segment", topic=topic,
                         queue=queue, broker=head["broker"], address=head["address"])
        return None

    def _refusal(self, request: web.Request, method: str, topic: str, queue: int) -> web.Response | None:
        return self._scripted(request, method, queue) or self._not_holding(topic, queue)

    async def _send(self, request: web.Request) -> web.Response:
        topic, q = request.match_info["topic"], int(request.match_info["queue"])
        binary = request.content_type == batch.CONTENT_TYPE
        self.forms.append(("POST", "binary" if binary else "json"))
        if binary:
            try:
                send = batch.check_send(await request.read(), count_max=1024, record_bytes_max=1 << 22)
                body = {"messages": [_json_message(batch.message(r))
                                     for r in batch.records_of(send.records, send.count)]}
            except ApiError as e:
                return error(e.status, e.code, str(e), **e.details)
        else:
            body = await request.json()
        self.requests.append(("POST", topic, q, body))
        refused = self._refusal(request, "POST", topic, q)
        if refused is not None:
            return refused
        msgs = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(msgs, list) or not msgs:
            return error(400, "INVALID_ARGUMENT", "messages must hold at least one message", field="messages")
        if any(not isinstance(m, dict) or (m.get("body") is None) == (m.get("body_b64") is None) for m in msgs):
            return error(400, "INVALID_ARGUMENT", "each message needs exactly one of body and body_b64")
        log = self.messages[(topic, q)]
        start = log[-1]["offset"] + 1 if log else self.min_offsets.get((topic, q), 0)
        ts = int(time.time() * 1000)
        for i, m in enumerate(msgs):
            field = "body" if m.get("body") is not None else "body_b64"
            log.append({"offset": start + i, "ts": ts, "key": m.get("key"), "props": m.get("props") or {},
                        field: m[field]})
        return web.json_response({"queue": q, "offsets": list(range(start, start + len(msgs)))})

    async def _pull(self, request: web.Request) -> web.Response:
        topic, q = request.match_info["topic"], int(request.match_info["queue"])
        self.requests.append(("GET", topic, q, dict(request.query)))
        self.forms.append(("GET", "binary" if batch_wanted(request) else "json"))
        refused = self._refusal(request, "GET", topic, q)
        if refused is not None:
            return refused
        offset, n = _int_param(request.query, "offset", 0), _int_param(request.query, "max", 32, lo=1)
        log = self.messages[(topic, q)]
        lo = self.min_offsets.get((topic, q), 0)
        hi = log[-1]["offset"] + 1 if log else lo
        page = [m for m in log if m["offset"] >= offset][:n] if lo <= offset < hi else []
        if offset < lo:
            nxt = lo                   # below the oldest kept message: move forward, never back
        elif offset >= hi:
            nxt = min(offset, hi)      # at or past the end: the end
        else:
            nxt = page[-1]["offset"] + 1
        fields = {"next_offset": nxt, "min_offset": lo, "max_offset": hi}
        if batch_wanted(request):
            return web.Response(body=batch.encode_stored(batch.Run(m["offset"], m["ts"], 1, batch.sized([batch.record(
                _batch_message(m))])) for m in page), content_type=batch.CONTENT_TYPE,
                headers={"X-Pull": json.dumps(fields, separators=(",", ":"))})
        return web.json_response({"messages": page, **fields})

    async def _commit(self, request: web.Request) -> web.Response:
        g, topic, q = request.match_info["group"], request.match_info["topic"], int(request.match_info["queue"])
        body = await request.json()
        self.requests.append(("PUT", topic, q, body))
        refused = self._refusal(request, "PUT", topic, q)
        if refused is not None:
            return refused
        offset = body.get("offset") if isinstance(body, dict) else None
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < -1:
            return error(400, "INVALID_ARGUMENT", "offset must be an integer >= -1", field="offset")
        self.committed[(g, topic, q)] = offset
        return web.json_response({"offset": offset})

    async def _committed(self, request: web.Request) -> web.Response:
        # Any broker answers a read of a committed offset (the real one asks the queue's other brokers if it has none).
        g, topic, q = request.match_info["group"], request.match_info["topic"], int(request.match_info["queue"])
        scripted = self._scripted(request, "GET_OFFSET", q)
        if scripted is not None:
            return scripted
        return web.json_response({"offset": self.committed.get((g, topic, q), -1)})


def batch_wanted(request: web.Request) -> bool:
    return batch.CONTENT_TYPE in request.headers.get("Accept", "")


def _json_message(m: batch.Message) -> dict:
    """A batch's message in the JSON shape of a send."""
    out: dict = {"body": m.body.decode()} if m.text else {"body_b64": base64.b64encode(m.body).decode()}
    if m.key is not None:
        out["key"] = m.key
    if m.props:
        out["props"] = dict(m.props)
    return out


def _batch_message(m: dict) -> batch.Message:
    """A stored JSON-shaped message as the batch carries it."""
    if m.get("body_b64") is not None:
        return batch.Message(m.get("key"), m.get("props"), base64.b64decode(m["body_b64"]), False)
    return batch.Message(m.get("key"), m.get("props"), m["body"].encode(), True)


class Fakes:
    """One fake meta and two fake brokers, started together."""

    def __init__(self) -> None:
        self.meta = FakeMeta()
        self.b1 = FakeBroker("b1", self.meta)
        self.b2 = FakeBroker("b2", self.meta)

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
