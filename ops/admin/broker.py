"""``stator broker list``: a command of the ``broker`` group that ops/cli.py defines (beside ``broker serve``)."""

from __future__ import annotations

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
