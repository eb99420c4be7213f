"""``stator cluster status|members``: the meta nodes as each one sees itself."""

from __future__ import annotations

import asyncio
from typing import Any

import click

from client import AdminClient, StatorError

from . import output
from .options import Globals, GlobalOptionsGroup, global_options

NODE_TIMEOUT_S = 3.0    # one node's answer to status: a slow node is reported as such, not waited for


@click.group(cls=GlobalOptionsGroup)
def cluster() -> None:
    """The meta cluster."""


async def _node(url: str, token: str, ssl_context: Any) -> dict[str, Any]:
    """One node's own view (``GET /v1/cluster`` and ``/readyz`` of that node only, no fail-over)."""
    async with AdminClient(url, token, timeout_s=NODE_TIMEOUT_S, attempts_max=1, deadline_s=NODE_TIMEOUT_S,
                           monotonic_reads=False, ssl_context=ssl_context) as admin:
        try:
            view = await admin.cluster()
            ready = await admin.readiness()
        except StatorError as e:
            return {"url": url, "health": "unreachable" if e.code == "UNAVAILABLE" else "error",
                    "error": f"{e.code}: {e.message}"}
    return {"url": url, "node": view["node"], "role": view["role"], "leader": view["leader"], "term": view["term"],
            "commit_index": view["commit_index"], "applied_version": view["applied_version"],
            "health": "ready" if ready.get("ready") else "not ready"}


async def status_of(g: Globals) -> dict[str, Any]:
    token = g.need_token()
    async with g.admin(monotonic_reads=False) as admin:
        members = (await admin.cluster())["members"]
    nodes = await asyncio.gather(*(_node(m["url"], token, g.ssl_context) for m in members))
    leaders = [n for n in nodes if n.get("role") == "leader"]
    newest = max((n["applied_version"] for n in leaders), default=None)
    for n in nodes:
        # Versions, not raft indexes: how many events the node has yet to apply to be where the leader is.
        n["lag"] = max(0, newest - n["applied_version"]) if newest is not None and "applied_version" in n else None
    return {"nodes": list(nodes)}


@cluster.command("status")
@global_options
async def status(g: Globals) -> None:
    """Each node's role, term, commit index, applied version, lag behind the leader and health."""
    data = await status_of(g)
    output.emit(g.json, data, lambda d: output.table(d["nodes"], [
        ("node", "node"), ("url", "url"), ("role", "role"), ("term", "term"), ("commit", "commit_index"),
        ("applied", "applied_version"), ("lag", "lag"), ("health", "health"), ("error", "error")]))


@cluster.command("members")
@global_options
async def members(g: Globals) -> None:
    """Members with their raft and HTTP addresses."""
    async with g.admin() as admin:
        view = await admin.cluster()
    data = {"members": [{**m, "leader": m["node"] == view["leader"]} for m in view["members"]]}
    output.emit(g.json, data, lambda d: output.table(d["members"], [
        ("node", "node"), ("raft", "raft"), ("url", "url"), ("leader", "leader")]))
