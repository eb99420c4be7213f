"""Route subscriptions: long poll (``GET /v1/routes/{topic}?after=V&wait=S``) and SSE (``GET /v1/watch``).

Both wait on the change feed per topic and send the route rendered once per version, so a change reaches a
thousand subscribers with a thousand writes of the same bytes and no per-subscriber work.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from .. import limits
from ..changefeed import ANY
from client.wire.errors import invalid, rejection
from client.wire.params import nonneg_int, seconds
from .http import JSON, requires, service
from .keys import ADMISSIONS

SSE_KEEPALIVE_S = 15.0



@requires("client", "broker")
async def long_poll_route(request: web.Request) -> web.Response:
    svc = service(request)
    topic = request.match_info["topic"]
    after = nonneg_int(request.query.get("after"), "after", -1)
    wait_s = seconds(request.query.get("wait"), "wait", 0.0, limits.LONG_POLL_WAIT_S_MAX)
    await svc.before_read({k: v for k, v in request.query.items() if k in ("min_version", "consistency")})
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    waiting = False
    try:
        while True:
            route = svc.route_bytes(topic)
            if route is None:
                raise rejection(404, "TOPIC_NOT_FOUND", f"topic {topic!r} does not exist", topic=topic)
            if route[0] > after:
                return web.Response(body=route[1], content_type=JSON)
            left = deadline - loop.time()
            if left <= 0:
                return web.Response(status=304)
            if not waiting:
                request.app[ADMISSIONS]["long_polls"].enter()
                waiting = True
            await svc.feed.wait(topic, left)
    finally:
        if waiting:
            request.app[ADMISSIONS]["long_polls"].leave()


@requires("client", "broker")
async def watch(request: web.Request) -> web.StreamResponse:
    svc = service(request)
    raw_topics = request.query.get("topics", "")
    topics = sorted({t for t in raw_topics.split(",") if t})
    if len(topics) > limits.WATCH_TOPICS_PER_STREAM_MAX:
        raise invalid(f"at most {limits.WATCH_TOPICS_PER_STREAM_MAX} topics per watch stream")
    after = nonneg_int(request.query.get("after") or request.headers.get("Last-Event-ID"), "after", -1)
    request.app[ADMISSIONS]["watch_streams"].enter()
    try:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
        await resp.prepare(request)
        await _watch_loop(svc, resp, topics, after, {})
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        request.app[ADMISSIONS]["watch_streams"].leave()
    return resp


async def _watch_loop(svc, resp: web.StreamResponse, topics: list[str], after: int, sent: dict[str, int]) -> None:
    """Send each watched topic's route whenever its version passes what this stream last sent."""
    all_topics = not topics
    while True:
        names = svc.read(lambda im: sorted(im.topics)) if all_topics else topics
        wrote = False
        for name in names:
            route = svc.route_bytes(name)
            if route is None:
                if sent.get(name, -1) >= 0:  # it existed and is gone
                    v = svc.applied_version
                    await resp.write(_sse("deleted", v, json.dumps({"topic": name, "version": v}).encode()))
                    sent[name] = -1
                    wrote = True
                continue
            if route[0] > max(after, sent.get(name, -1)):
                await resp.write(_sse("route", route[0], route[1]))
                sent[name] = route[0]
                wrote = True
        if not wrote:
            key = ANY if all_topics or len(topics) > 1 else topics[0]
            if not await svc.feed.wait(key, SSE_KEEPALIVE_S):
                await resp.write(b": keepalive\n\n")


def _sse(event: str, version: int, data: bytes) -> bytes:
    return b"event: " + event.encode() + b"\nid: " + str(version).encode() + b"\ndata: " + data + b"\n\n"


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/routes/{topic}", long_poll_route)
    app.router.add_get("/v1/watch", watch)
