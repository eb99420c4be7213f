"""Consumer groups: member heartbeats and leave (clients), settings (admin), list and describe."""

from __future__ import annotations

from aiohttp import web

from .. import chains, group_lag, views
from .. import groups as groups_model
from ..commands import validate
from wire.errors import invalid, rejection
from runtime.server import requires

from . import models
from .http import (body_of, on_the_leader, refuse_if_no_longer_leader, respond, service, submit,
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

    status, data, _ = await on_the_leader(request, here, raw)
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


INCLUDE = ("brokers",)


def _active_broker_addresses(image) -> list[str]:
    # A fenced broker holds no head (its queues moved), so it has no offsets to report; asking it would only wait.
    return [b["address"] for b in image.brokers.values() if b["state"] == "active" and b.get("address")]


def _heads(image, topics) -> dict[tuple[str, int], str | None]:
    """(topic, queue) -> the address of the broker holding the queue's newest segment, for every queue of ``topics``
    that exist."""
    heads = {}
    for topic in topics:
        t = image.topic(topic)
        if t is None:
            continue
        for q in range(t["queues"]):
            b = image.brokers.get(chains.head(t["chains"][q])[chains.BROKER])
            heads[(topic, q)] = b["address"] if b else None
    return heads


@requires("client", "broker")
async def list_groups(request: web.Request) -> web.Response:
    """The image's groups; with ``include=brokers`` also the groups only brokers know (a pull group commits offsets
    and never joins through meta): each broker lists its own (GET /v1/offsets), asked only by who wants them (the CLI)."""
    svc = service(request)
    include = request.query.get("include")
    if include is not None and include not in INCLUDE:
        raise invalid(f"include must be one of {', '.join(INCLUDE)}", field="include")
    await svc.reads.before_read(request.query)
    groups, addresses = svc.read(lambda im: ([views.group_summary(im.groups[g]) for g in sorted(im.groups)],
                                             _active_broker_addresses(im)))
    if include == "brokers":
        known = {g["group"] for g in groups}
        for g in groups:
            g["source"] = "meta"
        committed = await group_lag.committed_on_brokers(svc.forwarder.http_session(), svc.config.tokens.client,
                                                             addresses)
        groups += [{"group": name, "mode": None, "members": 0, "locks": 0, "version": 0, "source": "brokers"}
                   for name in committed if name not in known]
        groups.sort(key=lambda g: g["group"])
    return respond({"groups": groups})


def _detail_of_committed_only(name: str) -> dict:
    """A group meta has no record of, whose offsets the brokers hold (a pull group): no members, no locks."""
    return {"group": name, "mode": None, "config": groups_model.effective_config(name, None), "version": 0,
            "members": [], "assignments": [], "source": "brokers"}


@requires("client", "broker")
async def describe(request: web.Request) -> web.Response:
    """Members and assignments from the image; lease ends from the leader's memory, so the call goes to the leader
    (a follower forwards it); committed offsets and lag from the brokers holding each queue's head, for the assigned
    queues and (``offsets``) every queue the group committed on, whether or not meta knows the group; and (``pop``)
    where it pops each queue, from every active broker."""
    svc = service(request)
    name = request.match_info["group"]
    refuse_if_no_longer_leader(request)

    async def here(_left_s: float):
        await svc.reads.before_read(request.query)   # on the leader: a read like any other (API.md)
        await svc.groups.applied()   # a leave or join a follower answered is in what the leader shows

        def look(image):
            g = image.groups.get(name)
            detail = None if g is None else views.group_detail(
                g, lambda m, lease_ms: svc.groups.lease_expires_ms(name, m, lease_ms))
            topics = set() if g is None else {t for m in g["members"].values() for t in m["topics"]} | set(g["locks"])
            return detail, topics, _active_broker_addresses(image)
        detail, topics, addresses = svc.read(look)
        http = svc.forwarder.http_session()
        topics |= (await group_lag.committed_on_brokers(http, svc.config.tokens.client, addresses, name)).get(
            name, set())
        if detail is None and not topics:
            raise _group_not_found(name)
        heads = svc.read(lambda image: _heads(image, sorted(topics)))
        found = await group_lag.committed_offsets(http, svc.config.tokens.client, name, heads)
        if detail is None:
            if not heads:
                raise _group_not_found(name)   # every topic it committed on was deleted since
            # Even when no head answered in time: the brokers said the group committed, so it exists.
            detail = _detail_of_committed_only(name)
        else:
            detail["source"] = "meta"
        unknown = {"committed_offset": None, "max_offset": None, "lag": None}
        for a in detail["assignments"]:
            a.update(found.get((a["topic"], a["queue"]), unknown))
        detail["offsets"] = [{"topic": t, "queue": q, **o} for (t, q), o in sorted(found.items())
                             if o["committed_offset"] is not None and o["committed_offset"] >= 0]
        detail["pop"] = await group_lag.pop_positions(http, svc.config.tokens.client, name, addresses)
        return 200, detail, None

    status, data, _ = await on_the_leader(request, here, b"")
    return respond(data, status)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/groups/{group}/heartbeat", heartbeat)
    app.router.add_post("/v1/groups/{group}/leave", leave)
    app.router.add_put("/v1/groups/{group}/config", set_config)
    app.router.add_get("/v1/groups", list_groups)
    app.router.add_get("/v1/groups/{group}", describe)
