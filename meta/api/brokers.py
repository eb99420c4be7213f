"""Broker sessions: registration, heartbeats (leader only), seal reports, listing."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator

import aiohttp
from aiohttp import web

from .. import chains, views
from ..commands import validate
from runtime.credentials import act_for
from runtime.server import requires
from wire.errors import invalid, rejection
from wire.params import int_in

from . import models
from .http import body_of, on_the_leader, refuse_if_no_longer_leader, respond, service, submit

HEARTBEATS_WAIT_S = 1.0   # a follower's listing asks the leader when it last heard each broker, this long at most


def _broker(request: web.Request) -> str:
    """The broker id in the path, which a broker caller must hold the token of (an admin acts for any)."""
    broker = request.match_info["broker"]
    act_for(request, broker)
    return broker


@requires("broker")
async def register(request: web.Request) -> web.Response:
    broker = _broker(request)
    body = await body_of(request, models.RegisterBroker)
    cmd = {"type": "RegisterBroker", "broker": broker, "address": body.get("address"),
           "zone": body.get("zone"), "cluster": body.get("cluster"), "disk": body.get("disk")}
    return await submit(request, cmd)


@requires("broker")
async def seal(request: web.Request) -> web.Response:
    broker = _broker(request)
    body = await body_of(request, models.Seal)
    cmd = {"type": "SealSegment", "broker": broker,
           **{k: body.get(k) for k in ("epoch", "topic", "queue", "gen", "end_offset")}}
    if body.get("physical_queue") is not None:
        cmd["physical_queue"] = body["physical_queue"]
    return await submit(request, cmd)


@requires("broker")
async def seal_many(request: web.Request) -> web.Response:
    """Many seal reports in one command: ``{"epoch", "seals": [{topic, queue, gen, end_offset, physical_queue}]}``
    answers ``{"results": [{"ok", "logic_end"} | {"ok": false, "code", "status"}], "version"}`` in order."""
    broker = _broker(request)
    body = await body_of(request, models.Seals)
    cmd = {"type": "SealSegments", "broker": broker, "epoch": body.get("epoch"),
           "seals": body.get("seals")}
    return await submit(request, cmd)


@requires("broker")
async def alter_in_sync(request: web.Request) -> web.Response:
    """A leader's changes of its heads' in-sync sets: ``{"epoch", "changes": [{topic, queue, gen, in_sync}]}``
    answers ``{"results": [{"ok", "in_sync"} | {"ok": false, "code", "status"}], "version"}`` in order."""
    broker = _broker(request)
    body = await body_of(request, models.AlterInSync)
    return await submit(request, {"type": "AlterInSync", "broker": broker, "epoch": body["epoch"],
                                  "changes": body["changes"]})


@requires("broker")
async def heartbeat(request: web.Request) -> web.Response:
    svc = service(request)
    broker = _broker(request)
    body = await body_of(request, models.BrokerHeartbeat)   # the epoch and the queues' offsets and their count
    queues = body.get("queues", {})
    # The broker's name comes from the path, which the model does not see: checked as the command it may unfence.
    validate({"type": "UnfenceBroker", "broker": broker, "epoch": body["epoch"]})
    refuse_if_no_longer_leader(request)

    async def here(_left_s: float):
        return 200, await svc.brokers.heartbeat(broker, body["epoch"], queues), None

    status, data, _ = await on_the_leader(request, here, await request.read())
    return respond(data, status)


@requires("broker")
async def peer_down(request: web.Request) -> web.Response:
    """A broker (the path's, at its session ``epoch``) could not reach ``peer``: ``{"epoch", "peer"}``. The leader
    probes the peer's address and fences it when the address refuses connections (its process is gone), well
    before its session would run out; any other outcome changes nothing. Answers ``{"peer", "probe", "state"}``:
    ``probe`` is ``refused``, ``answered``, ``silent``, or null when the peer was not active."""
    svc = service(request)
    broker = _broker(request)
    body = await body_of(request, models.PeerDown)
    validate({"type": "UnfenceBroker", "broker": broker, "epoch": body["epoch"]})
    refuse_if_no_longer_leader(request)

    async def here(_left_s: float):
        return 200, await svc.brokers.peer_down(broker, body["epoch"], body["peer"]), None

    status, data, _ = await on_the_leader(request, here, await request.read())
    return respond(data, status)


SEALED_COPIES_PAGE_MAX = 10_000   # segments one page of GET /v1/brokers/{b}/copies names


@requires("broker")
async def sealed_copies(request: web.Request) -> web.Response:
    """Every sealed segment the broker holds a copy of, oldest topic, queue and gen first, a page at a time:
    ``?after=TOPIC:QUEUE:GEN&limit=N`` answers ``{"version", "copies": [{"topic", "queue", "segment"}], "addresses",
    "next"}`` (``next``: the ``after`` of the next page, null on the last). A broker back on a new disk catches
    them up from the other copies: a route names only each queue's newest segments."""
    svc = service(request)
    broker = _broker(request)
    after = _cursor(request.query.get("after"))
    limit = int_in(request.query.get("limit"), "limit", SEALED_COPIES_PAGE_MAX, 1, SEALED_COPIES_PAGE_MAX)
    await svc.reads.before_read(request.query)

    def look(im):
        brokers = views.broker_states(im)
        page = list(itertools.islice(_sealed_copies_of(im, broker, after), limit + 1))
        more = len(page) > limit
        page = page[:limit]
        named = {b for _, _, _, seg in page for b in seg[chains.REPLICAS]}
        return {"version": im.version, "next": _cursor_text(page[-1][0]) if more else None,
                "copies": [{"topic": t["topic"], "queue": q, "segment": views.segment_ref(brokers, t, q, seg)}
                           for _, t, q, seg in page],
                "addresses": {b: brokers[b][0] for b in sorted(named) if b in brokers}}
    return respond(svc.read(look))


def _sealed_copies_of(im, broker: str, after: tuple[str, int, int] | None) -> Iterator[tuple]:
    """(key, topic, queue, segment) of each sealed segment ``broker`` holds a copy of, past the cursor ``after``,
    in key order (topic, queue, gen)."""
    for name in im.topics_on(broker):
        if after is not None and name < after[0]:
            continue
        t = im.topics[name]
        for q, entry in enumerate(t["chains"]):
            for seg in chains.segments(entry):
                key = (name, q, seg[chains.GEN])
                if seg[chains.STATE] == "sealed" and broker in seg[chains.REPLICAS] and (after is None or key > after):
                    yield key, t, q, seg


def _cursor(raw: str | None) -> tuple[str, int, int] | None:
    if raw is None:
        return None
    parts = raw.split(":")
    if len(parts) != 3 or not parts[0] or not parts[1].isdigit() or not parts[2].isdigit():
        raise invalid("after must be TOPIC:QUEUE:GEN, as a page's next names it", field="after")
    return parts[0], int(parts[1]), int(parts[2])


def _cursor_text(key: tuple[str, int, int] | None) -> str | None:
    return None if key is None else f"{key[0]}:{key[1]}:{key[2]}"


@requires("client", "broker")
async def list_brokers(request: web.Request) -> web.Response:
    svc = service(request)
    include = request.query.get("include")
    if include not in (None, "heads"):
        raise invalid("include must be heads", field="include")
    await svc.reads.before_read(request.query)
    heard = await _heartbeats(request)

    def look(im):
        brokers = [views.broker_view(im.brokers[b], heard(b)) for b in sorted(im.brokers)]
        if include == "heads":
            held = views.heads_held(im)
            for b in brokers:
                b["heads"] = held.get(b["broker"], 0)
        return brokers
    return respond({"brokers": svc.read(look)})


async def _heartbeats(request: web.Request) -> Callable[[str], int | None]:
    """When each broker's last heartbeat came, as the leader heard it: heartbeats go to the leader only and are not
    in the log, so a follower asks the leader (its own answer for a forwarded request). Asked, the registration time
    stood in and a healthy broker showed as heard from minutes ago. Unknown (no leader within HEARTBEATS_WAIT_S, or
    no heartbeat since it was elected): absent, and the broker's ``last_heartbeat_ms`` is null."""
    svc = service(request)
    if svc.is_leader() or "X-Forwarded-By" in request.headers:
        return svc.brokers.last_heartbeat_ms
    leader = svc.forwarder.leader_url()
    if leader is None:
        return lambda broker: None
    headers = {"X-Forwarded-By": svc.config.node, "Authorization": request.headers.get("Authorization", "")}
    try:
        status, data, _ = await asyncio.wait_for(
            svc.forwarder.http(leader, "GET", "/v1/brokers", b"", headers), HEARTBEATS_WAIT_S)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return lambda broker: None
    if status != 200 or not isinstance(data, dict):
        return lambda broker: None
    return {b["broker"]: b["last_heartbeat_ms"] for b in data.get("brokers", [])
            if isinstance(b, dict) and isinstance(b.get("last_heartbeat_ms"), int)
            and isinstance(b.get("broker"), str)}.get


@requires("broker")
async def copies_held(request: web.Request) -> web.Response:
    """The broker holds whole copies of sealed segments a drain placed on it (``SealedCopiesHeld``)."""
    broker = _broker(request)
    body = await body_of(request, models.CopiesHeld)
    return await submit(request, {"type": "SealedCopiesHeld", "broker": broker, "epoch": body["epoch"],
                                  "copies": body["copies"]})


@requires("admin")
async def drain(request: web.Request) -> web.Response:
    """Start or stop a drain of the broker (meta/drains.py); ``to``: the brokers its copies go to first."""
    body = await body_of(request, models.DrainBroker)
    return await submit(request, {"type": "DrainBroker", "broker": request.match_info["broker"],
                                  "draining": body["draining"], "to": body.get("to")})


@requires("client", "broker")
async def describe(request: web.Request) -> web.Response:
    svc = service(request)
    name = request.match_info["broker"]
    await svc.reads.before_read(request.query)
    heard = await _heartbeats(request)

    def look(im):
        b = im.brokers.get(name)
        if b is None:
            raise rejection(404, "BROKER_NOT_FOUND", f"broker {name!r} is not registered", broker=name)
        return {**views.broker_view(b, heard(name)), **views.broker_holdings(im, name)}
    return respond(svc.read(look))


def add_routes(app: web.Application) -> None:
    app.router.add_put("/v1/brokers/{broker}", register)
    app.router.add_get("/v1/brokers/{broker}", describe)
    app.router.add_post("/v1/brokers/{broker}/drain", drain)
    app.router.add_post("/v1/brokers/{broker}/copies-held", copies_held)
    app.router.add_post("/v1/brokers/{broker}/heartbeat", heartbeat)
    app.router.add_post("/v1/brokers/{broker}/seal", seal)
    app.router.add_post("/v1/brokers/{broker}/seals", seal_many)
    app.router.add_post("/v1/brokers/{broker}/in-sync", alter_in_sync)
    app.router.add_post("/v1/brokers/{broker}/peer-down", peer_down)
    app.router.add_get("/v1/brokers/{broker}/copies", sealed_copies)
    app.router.add_get("/v1/brokers", list_brokers)
