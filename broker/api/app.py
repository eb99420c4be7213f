"""The broker's aiohttp application: data API handlers, auth, errors, X-Route-Version on every answer."""

from __future__ import annotations

import hmac

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from client.wire import json_body
from client.wire.errors import ApiError, invalid
from client.wire.params import int_in

from ..config import BrokerConfig
from ..codec import dumps_with_raw
from ..node import BrokerNode

log = structlog.get_logger("broker.http")
NODE = web.AppKey("node", BrokerNode)
REQUEST_BODY_BYTES_MAX = 32 * 1024 * 1024
NAME_CHARS_MAX = 255


def _respond(data, status: int = 200) -> web.Response:
    return web.Response(body=dumps_with_raw(data), status=status, content_type="application/json")


def _role(request: web.Request) -> str:
    cfg = request.app[NODE].config
    auth = request.headers.get("Authorization", "")
    if not auth.startswith("Bearer "):
        raise ApiError("missing bearer token", code="UNAUTHENTICATED", status=401)
    token = auth[7:].strip().encode()
    found = None
    for role, value in (("admin", cfg.admin_token), ("broker", cfg.token), ("client", cfg.client_token)):
        if value and hmac.compare_digest(token, value.encode()):
            found = found or role
    if found is None:
        raise ApiError("unknown token", code="UNAUTHENTICATED", status=401)
    return found


def _name(raw: str, what: str) -> str:
    if not raw or len(raw) > NAME_CHARS_MAX or not json_body.is_scalar_text(raw):
        raise invalid(f"{what} must be 1-{NAME_CHARS_MAX} characters of valid Unicode", field=what)
    return raw


async def _json(request: web.Request) -> dict:
    return json_body.parse_object(await request.read())


@web.middleware
async def middleware(request: web.Request, handler):
    node = request.app[NODE]
    try:
        if request.path not in ("/healthz", "/readyz", "/metrics", "/v1/openapi.json"):
            request["role"] = _role(request)
        resp = await handler(request)
    except ApiError as e:
        resp = _respond(e.to_dict(), e.status)
    except web.HTTPRequestEntityTooLarge:
        resp = _respond(ApiError("request body too large", code="TOO_LARGE", status=413).to_dict(), 413)
    except web.HTTPException as e:
        if e.status not in (404, 405):
            raise
        resp = _respond(ApiError(f"{request.method} {request.path}: {e.reason}",
                                  code="NOT_FOUND" if e.status == 404 else "METHOD_NOT_ALLOWED",
                                  status=e.status).to_dict(), e.status)
    except Exception:
        log.exception("handler_failed", path=request.path)
        resp = _respond(ApiError("internal error; see the broker's log", code="INTERNAL", status=500).to_dict(), 500)
    node.metrics_requests.labels(str(resp.status)).inc()
    return resp


async def _route_version(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["X-Route-Version"] = str(request.app[NODE].routes.version)


async def send(request: web.Request) -> web.Response:
    node = request.app[NODE]
    topic = _name(request.match_info["topic"], "topic")
    queue = int_in(request.match_info["queue"], "queue")
    body = await _json(request)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise invalid("messages must be a list", field="messages")
    offsets = await node.writer.send(topic, queue, messages)
    return _respond({"queue": queue, "offsets": offsets})


async def pull(request: web.Request) -> web.Response:
    node = request.app[NODE]
    q = request.query
    topic = _name(request.match_info["topic"], "topic")
    queue = int_in(request.match_info["queue"], "queue")
    offset = int_in(q.get("offset"), "offset", 0)
    max_n = int_in(q.get("max"), "max", 32, 1, 1000)
    return _respond(await node.reader.pull(topic, queue, offset, max_n))


async def commit_offset(request: web.Request) -> web.Response:
    node = request.app[NODE]
    body = await _json(request)
    offset = int_in(body.get("offset"), "offset", None, -1)
    group = _name(request.match_info["group"], "group")
    topic = _name(request.match_info["topic"], "topic")
    queue = int_in(request.match_info["queue"], "queue")
    return _respond({"offset": await node.writer.commit_offset(group, topic, queue, offset)})


async def read_offset(request: web.Request) -> web.Response:
    node = request.app[NODE]
    group = _name(request.match_info["group"], "group")
    topic = _name(request.match_info["topic"], "topic")
    queue = int_in(request.match_info["queue"], "queue")
    local = request.query.get("local") == "1"
    return _respond({"offset": await node.reader.read_offset(group, topic, queue, local)})


async def queues(request: web.Request) -> web.Response:
    node = request.app[NODE]
    return _respond({"queues": await node.reader.queue_stats(_name(request.match_info["topic"], "topic"))})


async def physical(request: web.Request) -> web.Response:
    if request["role"] not in ("broker", "admin"):
        raise ApiError("physical reads are for brokers", code="PERMISSION_DENIED", status=403)
    node = request.app[NODE]
    offset = int_in(request.query.get("offset"), "offset", 0)
    max_n = int_in(request.query.get("max"), "max", 32, 0, 1000)
    ts = request.query.get("ts")
    return _respond(await node.reader.physical_read(request.match_info["pq"], offset, max_n,
                                            None if ts is None else int_in(ts, "ts")))


async def offset_for_time(request: web.Request) -> web.Response:
    node = request.app[NODE]
    topic = _name(request.match_info["topic"], "topic")
    queue = int_in(request.match_info["queue"], "queue")
    ts = int_in(request.query.get("ts"), "ts")
    return _respond({"queue": queue, "offset": await node.reader.offset_for_time(topic, queue, ts)})


async def healthz(request: web.Request) -> web.Response:
    return _respond({"status": "ok", "broker": request.app[NODE].config.broker})


async def readyz(request: web.Request) -> web.Response:
    node = request.app[NODE]
    ok = node.session.writable(node.routes.version)
    return _respond({"ready": ok, "state": node.session.state, "epoch": node.session.epoch,
                     "route_version": node.routes.version}, 200 if ok else 503)


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(request.app[NODE].registry),
                        headers={"Content-Type": CONTENT_TYPE_LATEST})


def make_app(config: BrokerConfig) -> web.Application:
    app = web.Application(middlewares=[middleware], client_max_size=REQUEST_BODY_BYTES_MAX)
    node = BrokerNode(config)
    app[NODE] = node

    async def node_ctx(app):
        await node.start()
        yield
        await node.stop()

    app.cleanup_ctx.append(node_ctx)
    app.on_response_prepare.append(_route_version)
    r = app.router
    r.add_post("/v1/messages/{topic}/{queue}", send)
    r.add_get("/v1/messages/{topic}/{queue}", pull)
    r.add_put("/v1/offsets/{group}/{topic}/{queue}", commit_offset)
    r.add_get("/v1/offsets/{group}/{topic}/{queue}", read_offset)
    r.add_get("/v1/queues/{topic}", queues)
    r.add_get("/v1/queues/{topic}/{queue}/offset", offset_for_time)
    r.add_get("/v1/physical/{pq}", physical)
    r.add_get("/healthz", healthz)
    r.add_get("/readyz", readyz)
    r.add_get("/metrics", metrics)
    return app
