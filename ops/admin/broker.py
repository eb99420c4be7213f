"""``stator broker list``, ``describe``, ``drain`` and ``replace``: commands of the ``broker`` group that ops/cli.py defines
(beside ``broker serve``)."""

from __future__ import annotations

import asyncio
import dataclasses

import click

from . import output
from .options import Globals, emit_listing, global_options


@click.command("list")
@click.option("--serializable", is_flag=True,
              help="answer from the node's applied state, without the leader (as when no leader can be elected); "
                   "the same as --consistency serializable, as `cluster members --serializable` is")
@global_options
async def list_brokers(g: Globals, serializable: bool) -> None:
    """Brokers with address, epoch, state, last heartbeat and cluster."""
    if serializable:
        g = dataclasses.replace(g, consistency="serializable")
    await emit_listing(g, "brokers", lambda admin: admin.brokers(), [
        ("broker", "broker"), ("address", "address"), ("epoch", "epoch"), ("state", "state"),
        ("last heartbeat", lambda b: output.when(b.get("last_heartbeat_ms"))), ("cluster", "cluster")])


DRAIN_POLL_S = 0.5


def _holdings_text(b: dict) -> str:
    return output.fields([("broker", b["broker"]), ("cluster", b["cluster"]), ("address", b["address"]),
                          ("state", b["state"]), ("epoch", b["epoch"]),
                          ("draining", f"yes, onto {','.join(b['drain_to'])} first" if b["draining"] and b["drain_to"]
                           else "yes" if b["draining"] else "no"),
                          ("heads led", b["heads"]), ("head copies held", b["holding"]),
                          ("older segments held", b["sealed_copies"])])


@click.command("describe")
@click.argument("name")
@global_options
async def describe(name: str, g: Globals) -> None:
    """Broker NAME: its cluster and state, whether it is being drained, the heads it leads and holds a copy of (what
    a drain still moves), and the older segments it holds a copy of (read there; a drain leaves them)."""
    async with g.admin() as admin:
        data = await admin.broker(name)
    output.emit(g.json, data, _holdings_text)


async def _drain(name: str, draining: bool, to: list[str] | None, wait: float | None, g: Globals) -> None:
    async with g.admin() as admin:
        data = await admin.drain_broker(name, draining, to)
        data["sealed_remaining"] = (await admin.broker(name))["sealed_copies"]
        if wait is not None and draining:
            deadline = asyncio.get_running_loop().time() + wait
            while (data["remaining"] or data["sealed_remaining"]) and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(DRAIN_POLL_S)
                now = await admin.broker(name)
                data = {**data, "remaining": now["holding"], "sealed_remaining": now["sealed_copies"]}
            if data["remaining"] or data["sealed_remaining"]:
                raise click.ClickException(f"{name} still holds {data['remaining']} head copies and "
                                           f"{data['sealed_remaining']} older segments after {wait:g} s; the drain "
                                           "goes on (stator broker describe shows how far)")
    output.emit(g.json, data, lambda d: output.fields([
        ("broker", d["broker"]), ("draining", "yes" if d["draining"] else "stopped"), ("onto first", d.get("to")),
        ("head copies left", d["remaining"]), ("older segments left", d["sealed_remaining"])]))


@click.command("drain")
@click.argument("name")
@click.option("--stop", is_flag=True, help="stop the drain (what moved stays moved); run again without it to resume")
@click.option("--wait", type=click.FloatRange(min=0), help="return once it holds no head copy, at most this many s")
@global_options
async def drain(name: str, stop: bool, wait: float | None, g: Globals) -> None:
    """Drain broker NAME: every head it holds a copy of moves, a few queues at a time, to a new gen copied on other
    brokers of the topic's scope (each queue pauses as for a remap's seal), and each older segment it holds is copied
    to another broker, which then holds it instead; no new copy is placed on it meanwhile. Refused when a topic could
    not keep its count of copies without it. Drained (describe: 0 and 0), it can be taken away."""
    await _drain(name, not stop, None, wait, g)


@click.command("replace")
@click.argument("name")
@click.option("--with", "with_", metavar="B1[,B2...]", required=True, help="the brokers its copies go to first")
@click.option("--wait", type=click.FloatRange(min=0), help="return once it holds no head copy, at most this many s")
@global_options
async def replace(name: str, with_: str, wait: float | None, g: Globals) -> None:
    """Replace broker NAME: a drain whose copies go to the brokers named first (a queue NAME led is led by the first
    of them)."""
    await _drain(name, True, [b.strip() for b in with_.split(",") if b.strip()], wait, g)
