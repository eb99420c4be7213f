"""Consumer groups: member heartbeats and leave (clients), settings (admin), list and describe."""

from __future__ import annotations

from aiohttp import web

from .. import chains, group_lag, views
from ..commands import validate
from client.wire.errors import rejection
from client.wire.server import requires

from . import models
from .http import (body_of, refuse_if_no_longer_leader, replay_on_leader, respond, service, submit,
                   with_expected_version)


def _group_not_found(name: str):
    return rejection(404, "GROUP_NOT_FOUND", f"group {name!r} does not exist", group=name)


@requires("client")
async def heartbeat(request: web.Request) -> web.Response:
    """Joins or renews a member; only a join, a change of topics or a release enters the log (group_sessions.py)."""
    svc = service(request)
    raw = await request.read()
    body = await body_of(request, models.GroupHeartbeat)
    group = request.match_info["group"]
    join = {"type": "JoinGroup", "group": group, "member": body.get("member"), "topics": body.get("topics"),
            "mode": body.get("mode")}
    validate(join)
    released = body.get("released") or []
    if released:
        validate({"type": "ReleaseLocks", "group": group, "member": body["member"], "locks": released})
    refuse_if_no_longer_leader(request)

    async def here(_left_s: float):
        return 200, await svc.groups.heartbeat(group, body["member"], body["topics"], body["mode"], released), None

    status, data, _ = await svc.forwarder.to_leader(here, replay_on_leader(request, raw))
    return respond(data, status)


@requires("client")
async def leave(request: web.Request) -> web.Response:
    body = await body_of(request, models.LeaveGroup)
    cmd = with_expected_version(request, {"type": "LeaveGroup", "group": request.match_info["group"],
                                           "member": body.get("member")})
    return await submit(request, cmd)  # the leader's lease table drops members the image no longer has


@requires("admin")
async def set_config(request: web.Request) -> web.Response:
    body = await body_of(request, models.GroupConfig)
    cmd = with_expected_version(request, {"type": "SetGroupConfig", "group": request.match_info["group"],
                                           "config": body})
    return await submit(request, cmd)


@requires("client", "broker")
async def list_groups(request: web.Request) -> web.Response:
    svc = service(request)
    await svc.reads.before_read(request.query)
    return respond({"groups": svc.read(lambda im: [views.group_summary(im.groups[g]) for g in sorted(im.groups)])})


@requires("client", "broker")
async def describe(request: web.Request) -> web.Response:
    """Members and assignments from the image; lease ends from the leader's memory, so the call goes to the leader
    (a follower forwards it); committed offsets and lag from the brokers holding each queue's head."""
    svc = service(request)
    name = request.match_info["group"]
    refuse_if_no_longer_leader(request)

    async def here(_left_s: float):
        def look(image):
            g = image.groups.get(name)
            if g is None:
                return None, {}
            detail = views.group_detail(g, lambda m, lease_ms: svc.groups.lease_expires_ms(name, m, lease_ms))
            heads = {}
            for a in detail["assignments"]:
                t = image.topic(a["topic"])
                if t is not None and a["queue"] < t["queues"]:
                    b = image.brokers.get(chains.head(t["chains"][a["queue"]])[chains.BROKER])
                    heads[(a["topic"], a["queue"])] = b["address"] if b else None
            return detail, heads
        detail, heads = svc.read(look)
        if detail is None:
            raise _group_not_found(name)
        await group_lag.fill_offsets(svc.forwarder.http_session(), svc.config.tokens.client, name,
                                     detail["assignments"], heads)
        return 200, detail, None

    status, data, _ = await svc.forwarder.to_leader(here, replay_on_leader(request, b""))
    return respond(data, status)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/groups/{group}/heartbeat", heartbeat)
    app.router.add_post("/v1/groups/{group}/leave", leave)
    app.router.add_put("/v1/groups/{group}/config", set_config)
    app.router.add_get("/v1/groups", list_groups)
    app.router.add_get("/v1/groups/{group}", describe)
