"""The meta cluster's members: list them, and change them through the log one at a time (meta/raft/roles.py).

Changes go to the leader (forwarded as they came when this node follows) and answer once the membership entry is
committed: ``POST /v1/cluster/members`` adds a learner, ``POST /v1/cluster/members/{node}/promote`` makes a learner
that caught up a voter, ``DELETE /v1/cluster/members/{node}`` removes a member. A change while another is not
committed yet is 409 ``MEMBERSHIP_CHANGE_IN_PROGRESS``; one that would leave no live majority of voters is 409
``WOULD_LOSE_QUORUM``.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from ..raft import membership as raft_membership
from wire.names import NAME_RE
from ..raft.node import ProposeFailed
from ..raft.roles import HandingOver
from wire.errors import invalid, rejection
from runtime.server import requires

from . import models
from .cluster import members_view
from .http import body_of, on_the_leader, refuse_if_no_longer_leader, respond, service


@requires("client", "broker")
async def list_members(request: web.Request) -> web.Response:
    svc = service(request)
    await svc.reads.before_read(request.query)
    ours = svc.log.membership_status()
    return respond({"membership_index": ours["membership_index"], "members": members_view(svc, ours["members"])})


@requires("admin")
async def add_member(request: web.Request) -> web.Response:
    raw = await request.read()
    body = await body_of(request, models.AddMember)
    return await _change(request, raw, "add", body["node"], body["raft"], body["url"], ok_status=201)


@requires("admin")
async def promote_member(request: web.Request) -> web.Response:
    return await _change(request, b"", "promote", _node(request))


@requires("admin")
async def remove_member(request: web.Request) -> web.Response:
    return await _change(request, b"", "remove", _node(request))


def _node(request: web.Request) -> str:
    node = request.match_info["node"]
    if not raft_membership.valid_name(node) or not NAME_RE.fullmatch(node):
        raise invalid(f"a node name is 1-{raft_membership.NAME_CHARS_MAX} characters of A-Z a-z 0-9 _ -",
                      node=node[:200])
    return node


async def _change(request: web.Request, raw: bytes, op: str, node: str, raft: str | None = None,
                  url: str | None = None, ok_status: int = 200) -> web.Response:
    svc = service(request)
    refuse_if_no_longer_leader(request)

    async def here(left_s: float):
        answer = svc.log.change_membership(op, node, raft, url)
        try:
            members = await asyncio.wait_for(asyncio.wrap_future(answer), left_s)
        except HandingOver as e:   # the forwarder retries, on the new leader once there is one
            raise ProposeFailed(e.message, code="LEADER_CHANGED") from None
        except asyncio.TimeoutError:
            raise rejection(503, "UNKNOWN_OUTCOME", "the membership change was not committed in time; read the "
                            "members to learn whether it was") from None
        return ok_status, {"members": members_view(svc, members)}, None

    status, data, _ = await on_the_leader(request, here, raw)
    return respond(data, status)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/cluster/members", list_members)
    app.router.add_post("/v1/cluster/members", add_member)
    app.router.add_post("/v1/cluster/members/{node}/promote", promote_member)
    app.router.add_delete("/v1/cluster/members/{node}", remove_member)

