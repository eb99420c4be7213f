"""Cluster status, health, readiness, metrics and the history of events."""

from __future__ import annotations

import asyncio
import hashlib
import json

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .. import history_lines, limits
from wire.errors import rejection
from wire.params import nonneg_int
from runtime.server import public, requires

from .http import respond, service
from .keys import METRICS


@requires("client", "broker")
async def cluster(request: web.Request) -> web.Response:
    svc = service(request)
    await svc.reads.before_read(request.query)
    leader = svc.leader()
    ours = svc.log.membership_status()
    return respond({
        "node": svc.config.node, "role": svc.role(), "leader": leader.node if leader else None,
        "term": svc.term(), "commit_index": svc.commit_index(), "applied_version": svc.applied_version,
        # The raft index of the last entry in the image: what commit_index is to be compared with (both count raft
        # entries), unlike applied_version, which counts events (an entry may carry several commands, or none
        # that makes an event: a membership change, a leader's no-op).
        "applied_index": svc.log.applied_index,
        # The disk this node runs on, and whether the membership in its log counts it as a voter (a learner
        # catches up first: a wiped or replaced disk, a member just added; meta/raft/roles.py).
        "disk": ours["disk"], "voter": ours["voter"], "membership_index": ours["membership_index"],
        "members": members_view(svc, ours["members"]),
    })


def members_view(svc, recorded: list[dict]) -> list[dict]:
    """The members as the log records them (before the first membership entry: the config's), each with the raft
    address and URL this node reaches it at, its disk, and whether it votes."""
    config = {m.node: m for m in svc.config.members}
    if not recorded:
        return [{"node": m.node, "raft": m.raft, "url": m.url, "disk": None, "voter": True}
                for m in svc.config.members]
    return [{"node": m["name"], "raft": config[m["name"]].raft if m["name"] in config else m["raft"],
             "url": config[m["name"]].url if m["name"] in config else m["url"], "disk": m["disk"],
             "voter": m["voter"]} for m in recorded]


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


@requires("admin")
async def image(request: web.Request) -> web.Response:
    """This node's whole image at its applied version, as canonical JSON (what ``image_digest`` hashes), for a
    backup (`stator snapshot save`). ``X-Image-Version`` and ``X-Image-Sha256`` name the bytes sent. Costs a full
    serialisation and the image's size in memory once more: an operator's call, not a hot path."""
    svc = service(request)
    await svc.reads.before_read(request.query)
    version, raw = svc.read(lambda im: (im.version, im.canonical_bytes()))
    digest = await asyncio.get_running_loop().run_in_executor(None, lambda: hashlib.sha256(raw).hexdigest())
    return web.Response(body=raw, content_type="application/json",
                        headers={"X-Image-Version": str(version), "X-Image-Sha256": digest})


@public
async def healthz(request: web.Request) -> web.Response:
    return respond({"status": "ok", "node": service(request).config.node})


@public
async def readyz(request: web.Request) -> web.Response:
    svc = service(request)
    ok = svc.ready()
    # The projection's gap does not make a node unready: every read but old history is served from the image, and
    # old history is refused by name (HISTORY_UNAVAILABLE) until the gap is filled. It is reported here and in metrics.
    gap = svc.projection.gap_versions()
    return respond({"ready": ok, "role": svc.role(), "applied_version": svc.applied_version,
                    "routes_warm": svc.route_warmer.warm,
                    "projection_position": svc.projection.position, "projection_gap_versions": gap,
                    "projection_complete": svc.projection.opened and gap == 0}, 200 if ok else 503)


@public
async def metrics(request: web.Request) -> web.Response:
    svc = service(request)
    m = request.app[METRICS]
    m.applied_version.set(svc.applied_version)
    m.term.set(svc.term())
    m.is_leader.set(1 if svc.is_leader() else 0)
    m.topics.set(len(svc.reads.image.topics))
    m.projection_position.set(svc.projection.position)
    m.projection_gap.set(svc.projection.gap_versions())
    return web.Response(body=generate_latest(m.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


@public
async def openapi(request: web.Request) -> web.Response:
    # Imported at the first request: building the document's schemas costs ~80 ms of CPU, which every node start
    # paid at import (a test run starts several hundred)
    from .openapi import SPEC
    return respond(SPEC)


@requires("client", "broker")
async def history(request: web.Request) -> web.Response:
    """Events in version order, every version exactly once, never a silent skip.

    From the image while it holds them (versions from its history_start on), else from the SQL projection, which
    holds every version 1..its position (meta/projection/store.py). A version in neither (the projection is still
    filling its gap from peers: meta/projection_gap.py) is refused with 503 HISTORY_UNAVAILABLE naming the missing
    range: another node, or this one a little later, can serve it, so the client fails over rather than this node
    forwarding (a forward could loop between two nodes with the same gap)."""
    svc = service(request)
    await svc.reads.before_read(request.query)
    after = nonneg_int(request.query.get("after"), "after", 0)
    limit = nonneg_int(request.query.get("limit"), "limit", 1000)
    limit = max(1, min(limit, limits.HISTORY_PAGE_MAX))
    topic = request.query.get("topic") or None
    if not svc.projection.opened and after + 1 < svc.read(lambda im: im.data["history_start"]):
        await svc.projection.wait_opened(limits.PROJECTION_OPEN_WAIT_S)   # older than the image: from the projection
    # The projection's position first: it only grows, and versions 1..through stay in it whatever the image does next.
    through = svc.projection.served_through()
    start, version = svc.read(lambda im: (im.data["history_start"], im.version))
    if after + 1 >= start:
        events, next_after = _image_page(svc, after, topic, limit, version)
    elif after + 1 <= through:
        events = await asyncio.get_running_loop().run_in_executor(None, svc.projection.history, after, topic, limit,
                                                                    through)
        # A short page read the projection through ``through``: the next page starts there (maybe in the image).
        next_after = events[-1]["version"] if len(events) >= limit else through
    else:
        why = ("not in its projection yet: it fills them from peers" if svc.projection.opened
               else "its projection is still opening")
        raise rejection(503, "HISTORY_UNAVAILABLE",
                        f"this node holds versions 1..{through} and {start}..{version}, not {after + 1}..{start - 1} "
                        f"({why}): ask another node",
                        node=svc.config.node, missing_first=after + 1, missing_last=start - 1)
    return respond({"events": events, "next_after": next_after})


def _image_page(svc, after: int, topic: str | None, limit: int, version: int) -> tuple[list[dict], int]:
    events = []
    cursor = after
    # A topic filter may skip many events: scan a bounded stretch per call (next_after says where to go on),
    # so one request never parses the whole retained history on the event loop.
    scan_end = after + limits.HISTORY_SCAN_EVENTS_MAX
    while len(events) < limit and cursor < min(version, scan_end):
        # Taken as kept under the image lock, unpacked after it (a creation's line is packed: meta/history_lines.py).
        kept = svc.read(lambda im: im.history_kept_after(cursor, min(limits.HISTORY_PAGE_MAX, scan_end - cursor)))
        if not kept:
            break
        for line in map(history_lines.unpack, kept):   # lazily: the loop may stop early
            e = json.loads(line)
            cursor = e["version"]
            if topic is None or e["topic"] == topic:
                events.append(e)
                if len(events) >= limit:
                    break
    return events, cursor


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/cluster", cluster)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/openapi.json", openapi)
    app.router.add_get("/v1/history", history)
    app.router.add_get("/v1/admin/image-digest", image_digest)
    app.router.add_get("/v1/admin/image", image)
