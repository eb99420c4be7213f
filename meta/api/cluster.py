"""Cluster status, health, readiness, metrics and the history of events."""

from __future__ import annotations

import asyncio
import hashlib
import json

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .. import limits
from client.wire.params import nonneg_int
from client.wire.server import public, requires

from .http import respond, service
from .keys import METRICS
from .openapi import SPEC


@requires("client", "broker")
async def cluster(request: web.Request) -> web.Response:
    svc = service(request)
    await svc.reads.before_read(request.query)
    leader = svc.leader()
    return respond({
        "node": svc.config.node, "role": svc.role(), "leader": leader.node if leader else None,
        "term": svc.term(), "commit_index": svc.commit_index(), "applied_version": svc.applied_version,
        "members": [{"node": m.node, "raft": m.raft, "url": m.url} for m in svc.config.members],
    })


@requires("admin")
async def image_digest(request: web.Request) -> web.Response:
    """SHA-256 of this node's image bytes at its applied version: replicas at one version must agree
    (DESIGN.md invariant 1). Costs a full serialisation of the image: an operator's check, not a hot path."""
    svc = service(request)
    await svc.reads.before_read(request.query)
    version, commands, raw = svc.read(lambda im: (im.version, im.data["commands"], im.canonical_bytes()))
    digest = await asyncio.get_running_loop().run_in_executor(None, lambda: hashlib.sha256(raw).hexdigest())
    return respond({"node": svc.config.node, "version": version, "commands": commands, "sha256": digest,
                    "bytes": len(raw)})


@public
async def healthz(request: web.Request) -> web.Response:
    return respond({"status": "ok", "node": service(request).config.node})


@public
async def readyz(request: web.Request) -> web.Response:
    svc = service(request)
    ok = svc.ready()
    return respond({"ready": ok, "role": svc.role(), "applied_version": svc.applied_version}, 200 if ok else 503)


@public
async def metrics(request: web.Request) -> web.Response:
    svc = service(request)
    m = request.app[METRICS]
    m.applied_version.set(svc.applied_version)
    m.term.set(svc.term())
    m.is_leader.set(1 if svc.is_leader() else 0)
    m.topics.set(len(svc.reads.image.topics))
    m.projection_position.set(svc.projection.position)
    return web.Response(body=generate_latest(m.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


@public
async def openapi(request: web.Request) -> web.Response:
    return respond(SPEC)


@requires("client", "broker")
async def history(request: web.Request) -> web.Response:
    """Events in version order: from the image while it still holds them, else from the SQL projection."""
    svc = service(request)
    await svc.reads.before_read(request.query)
    after = nonneg_int(request.query.get("after"), "after", 0)
    limit = nonneg_int(request.query.get("limit"), "limit", 1000)
    limit = max(1, min(limit, limits.HISTORY_PAGE_MAX))
    topic = request.query.get("topic") or None
    start, version = svc.read(lambda im: (im.data["history_start"], im.version))
    if after + 1 >= start:
        events = []
        cursor = after
        # A topic filter may skip many events: scan a bounded stretch per call (next_after says where to go on),
        # so one request never parses the whole retained history on the event loop.
        scan_end = after + limits.HISTORY_SCAN_EVENTS_MAX
        while len(events) < limit and cursor < min(version, scan_end):
            raw = svc.read(lambda im: im.history_after(cursor, min(limits.HISTORY_PAGE_MAX, scan_end - cursor)))
            if not raw:
                break
            for line in raw:
                e = json.loads(line)
                cursor = e["version"]
                if topic is None or e["topic"] == topic:
                    events.append(e)
                    if len(events) >= limit:
                        break
        next_after = cursor
    else:
        events = await asyncio.get_running_loop().run_in_executor(None, svc.projection.history, after, topic, limit)
        next_after = events[-1]["version"] if events else after
    return respond({"events": events, "next_after": next_after})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/cluster", cluster)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/openapi.json", openapi)
    app.router.add_get("/v1/history", history)
    app.router.add_get("/v1/admin/image-digest", image_digest)
