"""``stator group list|describe``: consumer groups, their owners, tokens, leases and lag."""

from __future__ import annotations

from typing import Any

import click


from . import output
from .options import Globals, GlobalOptionsGroup, global_options


@click.group(cls=GlobalOptionsGroup)
def group() -> None:
    """Consumer groups."""


@group.command("list")
@global_options
async def list_groups(g: Globals) -> None:
    """Every group with its mode, members, locks and version."""
    async with g.admin() as admin:
        data = {"groups": await admin.list_groups()}
    output.emit(g.json, data, lambda d: output.table(d["groups"], [
        ("group", "group"), ("mode", "mode"), ("members", "members"), ("locks", "locks"), ("version", "version")]))


def _describe_text(d: dict[str, Any]) -> str:
    head = output.fields([("group", d["group"]), ("mode", d["mode"]), ("version", d["version"]),
                          ("config", d.get("config"))])
    members = output.table(d["members"], [
        ("member", "member"), ("topics", "topics"), ("mode", "mode"), ("joined", lambda m: output.when(m["joined_ms"])),
        ("lease expires", lambda m: output.when(m.get("lease_expires_ms")))])
    assignments = output.table(d["assignments"], [
        ("topic", "topic"), ("queue", "queue"), ("member", "member"), ("token", "token"), ("state", "state"),
        ("lease expires", lambda a: output.when(a.get("lease_expires_ms"))), ("committed", "committed_offset"),
        ("max offset", "max_offset"), ("lag", "lag")])
    return f"{head}\n\n{members}\n\n{assignments}"


@group.command("describe")
@click.argument("name")
@global_options
async def describe(name: str, g: Globals) -> None:
    """Members, assignments with tokens and lease ends, committed offset and lag per queue."""
    async with g.admin() as admin:
        data = await admin.describe_group(name)
    output.emit(g.json, data, _describe_text)
