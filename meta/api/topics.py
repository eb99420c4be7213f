"""Topic admin: create, describe, grow, configure, remap, delete."""

from __future__ import annotations

from aiohttp import web

from .. import chains, limits, views
from wire.params import int_in
from wire.errors import invalid, rejection
from runtime.server import requires
from wire.shapes import validate

from . import models
from .http import body_object, body_of, respond, service, submit, with_expected_version


def _topic_not_found(name: str):
    return rejection(404, "TOPIC_NOT_FOUND", f"topic {name!r} does not exist", topic=name)


@requires("admin")
async def create_topic(request: web.Request) -> web.Response:
    body = await body_of(request, models.CreateTopic)
    config = service(request).config
    cmd = {"type": "CreateTopic", **{k: v for k, v in body.items() if v is not None},
           "default_replicas": config.default_replicas, "default_min_insync": config.default_min_insync}
    return await submit(request, with_expected_version(request, cmd), 201)


@requires("client", "broker")
async def list_topics(request: web.Request) -> web.Response:
    svc = service(request)
    await svc.reads.before_read(request.query)
    topics = svc.read(lambda im: [views.topic_summary(im.topics[n]) for n in sorted(im.topics)])
    return respond({"topics": topics})


@requires("client", "broker")
async def get_topic(request: web.Request) -> web.Response:
    svc = service(request)
    await svc.reads.before_read(request.query)
    name = request.match_info["topic"]
    detail = svc.read(lambda im: views.topic_detail(im.topics[name]) if name in im.topics else None)
    if detail is None:
        raise _topic_not_found(name)
    return respond(detail)


def _topic_cmd(request: web.Request, type_: str, **fields) -> dict:
    return with_expected_version(request, {"type": type_, "topic": request.match_info["topic"], **fields})


@requires("admin")
async def grow_topic(request: web.Request) -> web.Response:
    body = await body_object(request)
    if set(body) != {"queues"}:
        raise invalid("PATCH takes exactly {\"queues\": N}; a static topic only grows")
    validate(models.GrowTopic, body)
    return await submit(request, _topic_cmd(request, "GrowTopic", queues=body["queues"]))


@requires("admin")
async def set_config(request: web.Request) -> web.Response:
    body = await body_of(request, models.TopicConfig)
    return await submit(request, _topic_cmd(request, "SetTopicConfig", config=body))


@requires("admin")
async def remap_topic(request: web.Request) -> web.Response:
    body = await body_of(request, models.Remap)
    fields = {"brokers": body.get("brokers")}
    if body.get("queues") is not None:
        fields["queues"] = body["queues"]
    return await submit(request, _topic_cmd(request, "RemapTopic", **fields))


@requires("admin")
async def elect_leaders(request: web.Request) -> web.Response:
    """Elect leaders for queues whose leader is fenced and which no in-sync copy took over; ``unclean`` elects an
    out-of-sync copy and names, per queue, what may be lost (meta/deciders/replicas.elect)."""
    body = await body_of(request, models.Elect)
    fields = {"unclean": bool(body.get("unclean", False))}
    if body.get("queues") is not None:
        fields["queues"] = body["queues"]
    return await submit(request, _topic_cmd(request, "ElectLeaders", **fields))


@requires("client", "broker")
async def queue_segments(request: web.Request) -> web.Response:
    """Every segment of one logic queue, oldest first (a route carries only the newest ones)."""
    svc = service(request)
    await svc.reads.before_read(request.query)
    name = request.match_info["topic"]
    queue = int_in(request.match_info["queue"], "queue", None, 0, limits.QUEUES_PER_TOPIC_MAX - 1)

    def look(im):
        t = im.topics.get(name)
        if t is None:
            raise _topic_not_found(name)
        if queue >= t["queues"]:
            raise rejection(404, "QUEUE_NOT_FOUND", f"topic {name!r} has {t['queues']} queues", topic=name, queue=queue)
        return {"topic": name, "queue": queue, "version": t["version"],
                "segments": [views.segment_ref(views.broker_states(im), t, queue, s)
                             for s in chains.segments(t["chains"][queue])]}
    return respond(svc.read(look))


@requires("admin")
async def delete_topic(request: web.Request) -> web.Response:
    return await submit(request, _topic_cmd(request, "DeleteTopic"))


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/topics", create_topic)
    app.router.add_get("/v1/topics", list_topics)
    app.router.add_get("/v1/topics/{topic}", get_topic)
    app.router.add_patch("/v1/topics/{topic}", grow_topic)
    app.router.add_put("/v1/topics/{topic}/config", set_config)
    app.router.add_post("/v1/topics/{topic}/remap", remap_topic)
    app.router.add_post("/v1/topics/{topic}/elect", elect_leaders)
    app.router.add_delete("/v1/topics/{topic}", delete_topic)
    app.router.add_get("/v1/topics/{topic}/queues/{queue}/segments", queue_segments)
