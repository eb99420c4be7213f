"""``stator cluster status|members``: the meta nodes as each one sees itself, and changes of the members."""

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
    applied_index = view.get("applied_index")   # absent from a node not upgraded yet
    return {"url": url, "node": view["node"], "role": view["role"], "leader": view["leader"], "term": view["term"],
            "commit_index": view["commit_index"], "applied_index": applied_index,
            "apply_lag": None if applied_index is None else max(0, view["commit_index"] - applied_index),
            "applied_version": view["applied_version"], "health": "ready" if ready.get("ready") else "not ready"}


async def status_of(g: Globals) -> dict[str, Any]:
    token = g.need_token()
    async with g.admin(monotonic_reads=False) as admin:
        members = (await admin.cluster())["members"]
    nodes = await asyncio.gather(*(_node(m["url"], token, g.ssl_context) for m in members))
    leaders = [n for n in nodes if n.get("role") == "leader"]
    newest = max((n["applied_version"] for n in leaders), default=None)
    for n in nodes:
        # Versions against versions: how many events the node has yet to apply to be where the leader is. The raft
        # figures are compared only with each other (apply_lag): a raft index and a version count different things.
        n["lag"] = max(0, newest - n["applied_version"]) if newest is not None and "applied_version" in n else None
    return {"nodes": list(nodes)}


@cluster.command("status")
@global_options
async def status(g: Globals) -> None:
    """Each node's role, term, raft commit and applied index (apply lag: committed entries not applied yet), applied
    version, lag behind the leader (versions) and health."""
    data = await status_of(g)
    # Raft entries under RAFT, events under VERSION: two columns are subtracted only within a group.
    output.emit(g.json, data, lambda d: output.table(d["nodes"], [
        ("node", "node"), ("url", "url"), ("role", "role"), ("term", "term"), ("raft commit", "commit_index"),
        ("raft applied", "applied_index"), ("apply lag", "apply_lag"), ("version", "applied_version"),
        ("lag", "lag"), ("health", "health"), ("error", "error")]))


@cluster.group("members", cls=GlobalOptionsGroup, invoke_without_command=True)
@click.option("--serializable", is_flag=True,
              help="answer from the node's applied state, without the leader (as when no leader can be elected)")
@global_options
async def members(g: Globals, serializable: bool) -> None:
    """The members as the log records them, with their raft and HTTP addresses, disk and vote; with a subcommand,
    change them (one change at a time: add a learner, promote it once it caught up, remove a member)."""
    if click.get_current_context().invoked_subcommand is not None:
        return
    async with g.admin() as admin:
        view = await admin.cluster()
        listed = await admin.members("serializable" if serializable else g.consistency)
    data = {"membership_index": listed.get("membership_index"),
            "members": [{**m, "leader": m["node"] == view["leader"]} for m in listed["members"]]}
    output.emit(g.json, data, lambda d: output.table(d["members"], [
        ("node", "node"), ("raft", "raft"), ("url", "url"), ("voter", "voter"), ("disk", "disk"),
        ("leader", "leader")]))


def _changed(g: Globals, answer: dict[str, Any]) -> None:
    output.emit(g.json, answer, lambda d: output.table(d["members"], [
        ("node", "node"), ("raft", "raft"), ("url", "url"), ("voter", "voter"), ("disk", "disk")]))


@members.command("add")
@click.argument("node")
@click.option("--raft", required=True, metavar="HOST:PORT", help="where the other meta nodes reach its raft port")
@click.option("--url", required=True, metavar="URL", help="its HTTP API")
@global_options
async def add(g: Globals, node: str, raft: str, url: str) -> None:
    """Add meta node NODE as a learner: it gets the log, never votes, until promoted."""
    async with g.admin() as admin:
        _changed(g, await admin.add_member(node, raft, url))


@members.command("promote")
@click.argument("node")
@global_options
async def promote(g: Globals, node: str) -> None:
    """Make learner NODE a voter, once it has caught up with the log."""
    async with g.admin() as admin:
        _changed(g, await admin.promote_member(node))


@members.command("remove")
@click.argument("node")
@global_options
async def remove(g: Globals, node: str) -> None:
    """Remove NODE from the members (the leader hands over first when it is the one removed)."""
    async with g.admin() as admin:
        _changed(g, await admin.remove_member(node))
