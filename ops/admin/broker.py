"""``stator broker list``: a command of the ``broker`` group that ops/cli.py defines (beside ``broker serve``)."""

from __future__ import annotations

import click


from . import output
from .options import Globals, emit_listing, global_options


@click.command("list")
@global_options
async def list_brokers(g: Globals) -> None:
    """Brokers with address, epoch, state and last heartbeat."""
    await emit_listing(g, "brokers", lambda admin: admin.brokers(), [
        ("broker", "broker"), ("address", "address"), ("epoch", "epoch"), ("state", "state"),
        ("last heartbeat", lambda b: output.when(b.get("last_heartbeat_ms")))])
