"""The `stator` command line."""

from __future__ import annotations

import json
import sys

import click


@click.group()
def main() -> None:
    """Stator: the metadata service for message queues with static topics."""


@main.group()
def meta() -> None:
    """Meta nodes."""


@meta.command("serve")
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False))
def meta_serve(config_path: str) -> None:
    """Run a meta node in the foreground."""
    from meta.config import ConfigError
    from ops.serve import run_meta
    try:
        run_meta(config_path)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None


@meta.command("rebuild-projection")
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False))
def meta_rebuild_projection(config_path: str) -> None:
    """Drop the node's SQL projection and rebuild it from the node's log (the node must be stopped)."""
    from meta.config import load
    from meta.offline_log import rebuild_projection
    position = rebuild_projection(load(config_path))
    click.echo(json.dumps({"rebuilt": True, "position": position}))


@main.group()
def broker() -> None:
    """Data-only brokers."""


@broker.command("serve")
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False))
def broker_serve(config_path: str) -> None:
    """Run a broker in the foreground."""
    from broker.config import ConfigError
    from broker.serve import run_broker
    try:
        run_broker(config_path)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None


@main.group()
def dev() -> None:
    """A local cluster of real processes on loopback."""


@dev.command("up")
@click.option("--dir", "dir_", required=True, type=click.Path(file_okay=False))
@click.option("--meta", "metas", default=3, show_default=True, type=click.IntRange(1, 7))
@click.option("--brokers", default=3, show_default=True, type=click.IntRange(0, 32))
@click.option("--base-port", default=7100, show_default=True, type=click.IntRange(1024, 65000))
def dev_up(dir_: str, metas: int, brokers: int, base_port: int) -> None:
    """Start meta nodes and brokers in the background; return once all are ready."""
    from ops import devcluster
    try:
        cluster = devcluster.up(dir_, metas, brokers, base_port)
    except (RuntimeError, TimeoutError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(json.dumps({"meta": [m["url"] for m in cluster["meta"]],
                           "brokers": [b["url"] for b in cluster["brokers"]]}))


@dev.command("start")
@click.option("--dir", "dir_", required=True, type=click.Path(exists=True, file_okay=False))
@click.argument("name")
def dev_start(dir_: str, name: str) -> None:
    """Start a stopped member again on its own data."""
    from ops import devcluster
    try:
        m = devcluster.start(dir_, name)
    except (RuntimeError, KeyError, TimeoutError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(json.dumps({"started": name, "pid": m["pid"]}))


@dev.command("down")
@click.option("--dir", "dir_", required=True, type=click.Path(exists=True, file_okay=False))
def dev_down(dir_: str) -> None:
    """Stop every member."""
    from ops import devcluster
    devcluster.down(dir_)
    click.echo(json.dumps({"stopped": True}))


if __name__ == "__main__":
    sys.exit(main())
