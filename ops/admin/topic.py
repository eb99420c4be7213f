"""``stator topic create|list|describe|grow|config|remap|delete``."""

from __future__ import annotations

from typing import Any

import click

from wire.errors import INVALID_ARGUMENT

from . import output
from .options import CliError, Globals, GlobalOptionsGroup, emit_listing, global_options
from .remap_wait import REMAP_WAIT_S_DEFAULT, wait_writable

ORDERS = ("best_tried", "strict")


@click.group(cls=GlobalOptionsGroup)
def topic() -> None:
    """Static topics: their queues, segments and placement."""


def _names(raw: str | None) -> list[str] | None:
    return None if raw is None else [b.strip() for b in raw.split(",") if b.strip()]


def _queue_ids(raw: str | None) -> list[int] | None:
    if raw is None:
        return None
    try:
        return [int(q) for q in raw.split(",") if q.strip()]
    except ValueError:
        raise click.BadParameter("must be queue numbers, comma-separated, like 0,1,5", param_hint="--queues") from None


def _written(d: dict[str, Any]) -> str:
    return output.fields([(k, v) for k, v in d.items()])


@topic.command("create")
@click.argument("name")
@click.option("--queues", type=click.IntRange(min=1), required=True, help="logic queues")
@click.option("--brokers", metavar="B1[,B2...]", help="brokers to place the queues on (default: every active one)")
@click.option("--slots", type=click.IntRange(min=1), help="key slots (default 1024)")
@click.option("--order", type=click.Choice(ORDERS), help="ordering strategy (default best_tried)")
@click.option("--replicas", type=click.IntRange(1, 5),
              help="copies of each queue on distinct brokers (default: the cluster's, 3 where 3 brokers exist)")
@click.option("--min-insync", "min_insync", type=click.IntRange(1, 5),
              help="in-sync copies below which sends are refused (default: the cluster's, at most replicas - 1)")
@click.option("--scope", metavar="C1[,C2...]|global",
              help="the broker clusters its queues and copies stay in (RocketMQ's updateStaticTopic -c); "
                   "default global: any broker")
@global_options
async def create(name: str, queues: int, brokers: str | None, slots: int | None, order: str | None,
                 replicas: int | None, min_insync: int | None, scope: str | None, g: Globals) -> None:
    """Create topic NAME (POST /v1/topics). --brokers says where the queues are led; their copies go to any active
    broker of its scope, spread over zones."""
    async with g.admin() as admin:
        data = await admin.create_topic(name, queues, brokers=_names(brokers), slots=slots, order=order,
                                        replicas=replicas, min_insync=min_insync,
                                        scope=scope if scope in (None, "global") else _names(scope))
    output.emit(g.json, data, _written)


@topic.command("elect")
@click.argument("name")
@click.option("--queues", metavar="Q1[,Q2...]", help="only these queues (default: every queue)")
@click.option("--unclean", is_flag=True,
              help="elect a copy that is not in sync when no in-sync one is left: what it misses is lost")
@global_options
async def elect(name: str, queues: str | None, unclean: bool, g: Globals) -> None:
    """Elect leaders for queues of NAME whose leader is fenced and that no in-sync copy took over (POST
    /v1/topics/NAME/elect). Meta does this by itself whenever an in-sync copy is left; --unclean is an operator's
    choice to lose what the elected copy misses rather than wait for the old leader's broker."""
    async with g.admin() as admin:
        data = await admin.elect_leaders(name, queues=_queue_ids(queues), unclean=unclean)
    output.emit(g.json, data, lambda d: output.table(d["queues"], [
        ("queue", "queue"), ("leader", "leader"), ("gen", "gen"), ("outcome", "outcome"), ("to", "to"),
        ("may lose", "may_lose")]))


@topic.command("list")
@global_options
async def list_topics(g: Globals) -> None:
    """Every topic with its queues and version."""
    await emit_listing(g, "topics", lambda admin: admin.list_topics(), [
        ("topic", "topic"), ("queues", "queues"), ("version", "version")])


def _describe_text(t: dict[str, Any]) -> str:
    head = output.fields([("topic", t["topic"]), ("queues", t["queues"]), ("slots", t["slots"]),
                          ("order", t["order"]), ("replicas", t["replicas"]), ("min in sync", t["min_insync"]),
                          ("scope", t["scope"] if isinstance(t["scope"], str) else ",".join(t["scope"])),
                          ("version", t["version"]), ("config", t.get("config") or None)])
    rows = [{"queue": q["queue"], "slots": " ".join(f"[{lo},{hi})" for lo, hi in q["slot_ranges"]), **s,
             "copies": ",".join(s["replicas"]), "in sync": ",".join(s["in_sync"])}
            for q in t["logic_queues"] for s in q["segments"]]
    return head + "\n\n" + output.table(rows, [
        ("queue", "queue"), ("slots", "slots"), ("gen", "gen"), ("broker", "broker"), ("copies", "copies"),
        ("in sync", "in sync"), ("physical queue", "physical_queue"), ("physical start", "physical_start"),
        ("logic start", "logic_start"), ("logic end", "logic_end"), ("state", "state")])


@topic.command("describe")
@click.argument("name")
@global_options
async def describe(name: str, g: Globals) -> None:
    """One topic: settings, then each queue's segment chain (oldest first)."""
    async with g.admin() as admin:
        data = await admin.describe_topic(name)
    output.emit(g.json, data, _describe_text)


@topic.command("grow")
@click.argument("name")
@click.option("--queues", type=click.IntRange(min=1), required=True, help="the new number of logic queues")
@global_options
async def grow(name: str, queues: int, g: Globals) -> None:
    """Raise NAME's number of logic queues (PATCH /v1/topics/NAME)."""
    async with g.admin() as admin:
        data = await admin.grow_topic(name, queues)
    output.emit(g.json, data, _written)


def _settings(pairs: tuple[str, ...], unset: tuple[str, ...]) -> dict[str, str | None]:
    config: dict[str, str | None] = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{p!r} is not key=value", param_hint="SETTINGS")
        config[key] = value
    for key in unset:
        config[key] = None
    if not config:
        raise click.UsageError("give at least one key=value or --unset KEY")
    return config


@topic.command("config")
@click.argument("name")
@click.argument("settings", nargs=-1)
@click.option("--unset", multiple=True, metavar="KEY", help="remove KEY from the config (repeatable)")
@global_options
async def config(name: str, settings: tuple[str, ...], unset: tuple[str, ...], g: Globals) -> None:
    """Set config keys of NAME: key=value ... (PUT /v1/topics/NAME/config)."""
    values = _settings(settings, unset)
    async with g.admin() as admin:
        data = await admin.set_config(name, values)
    output.emit(g.json, data, _written)


def _remap_text(d: dict[str, Any]) -> str:
    return f"version: {d['version']}\n" + output.table(d["moved"], [
        ("queue", "queue"), ("from", "from"), ("to", "to"), ("gen", "gen")])


@topic.command("remap")
@click.argument("name")
@click.option("--brokers", required=True, metavar="B1[,B2...]", help="brokers to move the queues onto")
@click.option("--queues", "queue_list", metavar="Q1[,Q2...]", help="queues to move (default: all)")
@click.option("--wait", is_flag=True, help="return once every moved queue is writable again (progress on stderr)")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1, max=3600), default=REMAP_WAIT_S_DEFAULT,
              show_default=True, help="seconds --wait waits at most")
@global_options
async def remap(name: str, brokers: str, queue_list: str | None, wait: bool, timeout_s: float, g: Globals) -> None:
    """Move NAME's queues onto other brokers (seal, then switch)."""
    targets = _names(brokers)
    if not targets:
        raise CliError(INVALID_ARGUMENT, "--brokers needs at least one broker name")
    async with g.admin() as admin:
        data = await admin.remap(name, targets, queues=_queue_ids(queue_list))
    if wait and data["moved"]:
        await wait_writable(g, name, data["version"], data["moved"], timeout_s)
    output.emit(g.json, data, _remap_text)


@topic.command("delete")
@click.argument("name")
@global_options
async def delete(name: str, g: Globals) -> None:
    """Delete topic NAME (DELETE /v1/topics/NAME)."""
    async with g.admin() as admin:
        data = await admin.delete_topic(name)
    output.emit(g.json, data, _written)
