"""``stator group list|describe``: consumer groups, their owners, tokens, leases and lag."""

from __future__ import annotations

from typing import Any

import click

from client import AdminClient

from . import output
from .options import Globals, GlobalOptionsGroup, emit_listing, global_options


@click.group(cls=GlobalOptionsGroup)
def group() -> None:
    """Consumer groups."""


@group.command("list")
@global_options
async def list_groups(g: Globals) -> None:
    """Every group with its mode, members, locks and version, and the groups only brokers know (committed offsets,
    never joined through meta: pull consumers)."""
    # Not AdminClient.list_groups(): the brokers are asked only on include=brokers, which an operator wants and
    # a program listing groups often need not pay for.
    async def read(admin: AdminClient) -> list[Any]:
        return (await admin._read("/v1/groups", {"include": "brokers"}))["groups"]
    await emit_listing(g, "groups", read, [
        ("group", "group"), ("mode", "mode"), ("members", "members"), ("locks", "locks"), ("version", "version"),
        ("known to", "source")])


def _describe_text(d: dict[str, Any]) -> str:
    head = output.fields([("group", d["group"]), ("mode", d["mode"]), ("version", d["version"]),
                          ("config", d.get("config")), ("known to", d.get("source"))])
    members = output.table(d["members"], [
        ("member", "member"), ("topics", "topics"), ("mode", "mode"), ("joined", lambda m: output.when(m["joined_ms"])),
        ("lease expires", lambda m: output.when(m.get("lease_expires_ms")))])
    assignments = output.table(d["assignments"], [
        ("topic", "topic"), ("queue", "queue"), ("member", "member"), ("token", "token"), ("state", "state"),
        ("lease expires", lambda a: output.when(a.get("lease_expires_ms"))), ("committed", "committed_offset"),
        ("max offset", "max_offset"), ("lag", "lag")])
    offsets = output.table(d.get("offsets", []), [
        ("topic", "topic"), ("queue", "queue"), ("committed", "committed_offset"), ("max offset", "max_offset"),
        ("lag", "lag")])
    pops = output.table(d.get("pop", []), [
        ("topic", "topic"), ("queue", "queue"), ("broker", "broker"), ("pop offset", "pop_offset"),
        ("in flight", "in_flight"), ("revive backlog", "revive_backlog")])
    return f"{head}\n\n{members}\n\n{assignments}\n\n{offsets}\n\n{pops}"


@group.command("describe")
@click.argument("name")
@global_options
async def describe(name: str, g: Globals) -> None:
    """Members, assignments with tokens and lease ends, committed offset and lag per queue: of every queue the
    group committed on, a pull group's too; and where a pop group pops each queue."""
    async with g.admin() as admin:
        data = await admin.describe_group(name)
    output.emit(g.json, data, _describe_text)
