"""``stator history [--topic T] [--after V] [--limit N] [--follow]``: the log's events in version order."""

from __future__ import annotations

from typing import Any

import click

from client import AdminClient

from . import output
from .options import Globals, global_options

HISTORY_LIMIT_DEFAULT = 100
HISTORY_LIMIT_MAX = 100_000   # a bigger dump is `stator export`'s job


def event_row(e: dict[str, Any]) -> dict[str, Any]:
    return {**e, "time": output.when(e["ts"])}


COLUMNS: list[output.Column] = [("version", "version"), ("time", "time"), ("type", "type"), ("topic", "topic"),
                                ("data", "data")]


async def _follow(admin: AdminClient, g: Globals, topic: str | None, after: int) -> None:
    """Every event after ``after``, then each new one as it is applied, until interrupted."""
    while True:
        page = await admin.history_after(after, topic=topic)
        for e in page["events"]:
            if g.json:
                output.emit_json_line(e)
            else:
                # One line per event as it comes: no table to align against.
                row = event_row(e)
                click.echo("  ".join(output.cell(row.get(k)) for _, k in COLUMNS))
        after = max(after, page["next_after"])


@click.command("history")
@click.option("--topic", help="only this topic's events")
@click.option("--after", type=click.IntRange(min=0), default=0, show_default=True, help="events after this version")
@click.option("--limit", type=click.IntRange(1, HISTORY_LIMIT_MAX), default=HISTORY_LIMIT_DEFAULT, show_default=True,
              help="at most this many events (without --follow)")
@click.option("--follow", is_flag=True, help="then print each new event as it is applied, until interrupted; "
                                             "with -w json, one JSON document per line")
@global_options(stream_flag="follow")
async def history(topic: str | None, after: int, limit: int, follow: bool, g: Globals) -> None:
    """Events in version order, each with the time the leader stamped on it."""
    async with g.admin() as admin:
        if follow:
            await _follow(admin, g, topic, after)
            return
        events: list[dict[str, Any]] = []
        next_after = after
        async for e in admin.iter_history(topic=topic, after=after, page=min(limit, 1000)):
            events.append(e)
            next_after = e["version"]
            if len(events) >= limit:
                break
    data = {"events": events, "next_after": next_after}
    output.emit(g.json, data, lambda d: output.table([event_row(e) for e in d["events"]], COLUMNS))
