"""``stator route T [--watch]``: a topic's route as clients get it; ``--watch`` prints each new version (SSE)."""

from __future__ import annotations

import asyncio
from typing import Any

import click

from client import RouteSubscription

from . import output
from .options import Globals, global_options


def route_text(r: dict[str, Any]) -> str:
    head = output.fields([("topic", r["topic"]), ("version", r["version"]), ("slots", r["slots"]),
                          ("barriers", [f"{b['queue']} after {b['after_queue']}@{b['after_offset']}"
                                        for b in r.get("barriers", [])] or None)])
    return head + "\n" + output.table(r["queues"], [
        ("queue", "queue"), ("broker", "broker"), ("address", "address"), ("physical queue", "physical_queue"),
        ("gen", "gen"), ("writable", "writable"), ("segments", lambda q: len(q["segments"]))])


async def _watch(g: Globals, topic: str) -> None:
    """Print every new version until interrupted, or until the topic is deleted."""
    gone = asyncio.Event()

    def show(_topic: str, route: dict[str, Any] | None) -> None:
        if route is None:
            output.emit(g.json, {"topic": topic, "deleted": True}, lambda _: f"topic {topic} deleted")
            gone.set()
        elif g.json:
            output.emit_json_line(route)
        else:
            click.echo(route_text(route) + "\n")

    async with RouteSubscription(g.endpoints, g.need_token(), [topic], ssl_context=g.ssl_context) as routes:
        # Added before anything can arrive (no await since the stream's task was created): every version is shown.
        routes.add_listener(show)
        await routes.get(topic)   # TopicNotFound for a topic that does not exist
        await gone.wait()


@click.command("route")
@click.argument("topic")
@click.option("--watch", is_flag=True, help="print every new version as it arrives (SSE) until interrupted; "
                                            "with -w json, one JSON document per line")
@global_options(stream_flag="watch")
async def route(topic: str, watch: bool, g: Globals) -> None:
    """TOPIC's route: each queue's writable broker and newest segments."""
    if watch:
        await _watch(g, topic)
        return
    async with g.admin() as admin:
        data = await admin.route(topic)
    output.emit(g.json, data, route_text)
