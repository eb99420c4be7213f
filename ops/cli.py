"""The `stator` command line."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator

import click
from click.core import ParameterSource

from ops.admin.options import GlobalOptionsGroup, IsoTime, global_options

EXIT_FAILED = 1   # the command could not do its work (an address in use, a member that did not start)
EXIT_CONFIG = 2   # like a usage error: the config file must be fixed before anything can run


@contextlib.contextmanager
def one_line_errors(*also: type[Exception]) -> Iterator[None]:
    """Errors the operator must act on become `error: <message>` on stderr and an exit code, never a traceback.

    Only the errors named here: anything else is a bug and keeps its traceback."""
    from runtime.config_file import ConfigError
    from runtime.serve import StartupError
    try:
        yield
    except ConfigError as e:
        _fail(str(e), EXIT_CONFIG)
    except (StartupError, *also) as e:
        _fail(str(e), EXIT_FAILED)


@contextlib.contextmanager
def dev_errors() -> Iterator[None]:
    """`stator dev`'s refusals and failures as ``error: CODE: message``, exit 1 (ops/devcluster.py DevError)."""
    from ops.devcluster import DevError
    try:
        yield
    except DevError as e:
        _fail(f"{e.code}: {e}", EXIT_FAILED)


def _fail(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


# The admin commands (ops/admin, one module per noun), the chaos runner and the simulator, each imported when named
ADMIN_COMMANDS = {"cluster": "ops.admin.cluster:cluster", "topic": "ops.admin.topic:topic",
                  "route": "ops.admin.route:route", "history": "ops.admin.history:history",
                  "group": "ops.admin.group:group", "snapshot": "ops.admin.snapshot:snapshot",
                  "produce": "ops.admin.messages:produce", "consume": "ops.admin.messages:consume",
                  "chaos": "ops.chaos.cli:chaos", "sim": "ops.sim.cli:sim"}


@click.group(cls=GlobalOptionsGroup, lazy=ADMIN_COMMANDS)
@click.version_option(package_name="stator", prog_name="stator", message="%(prog)s %(version)s")
def main() -> None:
    """Stator: the metadata service for message queues with static topics."""


@main.group()
def meta() -> None:
    """Meta nodes."""


@meta.command("serve")
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--unsafe-power-loss-ledger", "power_loss_ledger", is_flag=True,
              help="tests only: record every sync in a ledger, so that a kill -9 plus runtime/power_loss.lose_unsynced "
                   "loses what a power loss would")
def meta_serve(config_path: str, power_loss_ledger: bool) -> None:
    """Run a meta node in the foreground."""
    from meta.raft.journal import JournalDamaged
    from meta.serve import run_meta
    with one_line_errors(JournalDamaged):
        run_meta(config_path, power_loss_ledger)


@meta.command("rebuild-projection")
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--from-peer", "from_peer", metavar="URL",
              help="a meta node's URL: versions older than this node's log keeps are read from its /v1/history")
@click.option("--from-export", "from_export", metavar="DIR", type=click.Path(exists=True, file_okay=False),
              help="a `stator export` directory: versions older than this node's log keeps are read from it")
@click.option("--token", envvar="STATOR_TOKEN", help="a client token for --from-peer (env STATOR_TOKEN)")
@click.option("--token-file", type=click.Path(exists=True, dir_okay=False), help="a file holding the token")
def meta_rebuild_projection(config_path: str, from_peer: str | None, from_export: str | None, token: str | None,
                            token_file: str | None) -> None:
    """Drop the node's SQL projection and rebuild it from the node's log (the node must be stopped).

    The log keeps only the newest events (history_window): the older ones come from a peer or an export."""
    from wire.errors import StatorError
    from meta.config import load
    from meta.offline_log import rebuild_projection
    from meta.projection import ProjectionGap
    from meta.projection.sources import SourceError
    from meta.raft.snapshot_file import SnapshotFormatError
    if from_peer and from_export:
        raise click.UsageError("give --from-peer or --from-export, not both")
    if token_file:
        with open(token_file) as f:
            token = f.read().strip()
    with one_line_errors(SnapshotFormatError, SourceError, ProjectionGap, StatorError):
        result = rebuild_projection(load(config_path), from_peer=from_peer, token=token, from_export=from_export)
    click.echo(json.dumps({"rebuilt": True, **result}))


@main.group(cls=GlobalOptionsGroup, lazy={"list": "ops.admin.broker:list_brokers",
                                          "describe": "ops.admin.broker:describe",
                                          "drain": "ops.admin.broker:drain", "replace": "ops.admin.broker:replace"})
def broker() -> None:
    """Data-only brokers."""


@broker.command("serve")
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--unsafe-power-loss-ledger", "power_loss_ledger", is_flag=True,
              help="tests only: record every sync in a ledger, so that a kill -9 plus runtime/power_loss.lose_unsynced "
                   "loses what a power loss would")
def broker_serve(config_path: str, power_loss_ledger: bool) -> None:
    """Run a broker in the foreground."""
    from broker.serve import run_broker
    from broker.storage.errors import CorruptFile, UnsupportedFormat
    with one_line_errors(CorruptFile, UnsupportedFormat):
        run_broker(config_path, power_loss_ledger)


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
    with dev_errors():
        cluster = devcluster.up(dir_, metas, brokers, base_port)
    click.echo(json.dumps({"meta": [m["url"] for m in cluster["meta"]],
                           "brokers": [b["url"] for b in cluster["brokers"]]}))


@dev.command("start")
@click.option("--dir", "dir_", required=True, type=click.Path(exists=True, file_okay=False))
@click.argument("name")
def dev_start(dir_: str, name: str) -> None:
    """Start a stopped member again on its own data."""
    from ops import devcluster
    with dev_errors():
        m = devcluster.start(dir_, name)
    click.echo(json.dumps({"started": name, "pid": m["pid"]}))


@dev.command("down")
@click.option("--dir", "dir_", required=True, type=click.Path(exists=True, file_okay=False))
def dev_down(dir_: str) -> None:
    """Stop every member."""
    from ops import devcluster
    devcluster.down(dir_)
    click.echo(json.dumps({"stopped": True}))


@main.command("export")
@click.option("--out", required=True, metavar="DIR", help="where the export goes: a local directory or a URI pyarrow "
                                                          "opens (s3://, hdfs://)")
# The first spelling (API.md's example): kept working, hidden, now that the global --endpoints says the same.
@click.option("--meta", "meta_urls", hidden=True, metavar="URL[,URL...]")
@global_options
def export_history(out: str, meta_urls: str | None, g) -> None:
    """Append every event after the last exported version to Parquet under OUT (incremental, idempotent).

    Reads GET /v1/history, which takes the client token (or the admin token: `--dir` gives that one), then asks the
    broker heading each queue for its end (queue_ends: lineage locates only offsets written by then). Exports
    every event the leader acknowledged before the run (its read barrier), or with --consistency serializable
    every event the answering node applied (no leader needed). Prints exported_after, last_version, events, files,
    queue_ends and queues_unobserved: as a table, or with -w json as one JSON document."""
    from meta.export.exporter import ExportError, run
    from ops.admin import output
    from ops.admin.options import endpoint_list
    ctx = click.get_current_context()
    if meta_urls is not None:
        if ctx.get_parameter_source("endpoints") == ParameterSource.COMMANDLINE:
            raise click.UsageError("give --endpoints or --meta (its old name), not both")
        urls = endpoint_list(meta_urls)
    else:
        urls = g.endpoints
    # A progress bar for people at a terminal; scripts get only the JSON line and, on failure, one error line.
    bar = click.progressbar(length=0, label="events", file=sys.stderr, show_pos=True) if sys.stderr.isatty() \
        else contextlib.nullcontext(None)
    with one_line_errors(ExportError, OSError), bar as shown:
        result = run(urls, g.need_token(), out, progress=shown.update if shown is not None else None,
                     ssl_context=g.ssl_context, consistency=g.consistency)
    said = {"exported_after": result.exported_after, "last_version": result.last_version, "events": result.events,
            "files": result.files, "queue_ends": result.queue_ends, "queues_unobserved": result.queues_unobserved}
    output.emit(g.json, said, lambda d: output.fields([(k.replace("_", " "), v) for k, v in d.items()]))


# -- lineage on Spark (ops/lineage/) ----------------------------------------------------------------------------------
EXIT_FINDINGS = 3   # `stator lineage verify` ran and found something wrong in the export


def lineage_options(f):
    """--data, --master, --remote and --json (or -w json, as the admin commands say it), accepted before or after the
    subcommand (API.md puts them after)."""
    f = click.option("--json", "as_json", is_flag=True, help="print one JSON document (API.md's shapes)")(f)
    f = click.option("-w", "--write-out", "write_out", type=click.Choice(("table", "json")),
                     help="json: the same as --json; table (the default) for people")(f)
    f = click.option("--remote", help="a Spark Connect server instead of a master: sc://host:15002 (its client "
                                      "packages come with pip install 'stator[spark]')")(f)
    f = click.option("--master", help="a Spark master: local[*] (default), spark://host:7077, yarn, k8s://")(f)
    return click.option("--data", help="the export: the directory (or s3a://, hdfs:// URI) `stator export` wrote")(f)


@main.group()
@lineage_options
@click.pass_context
def lineage(ctx: click.Context, data: str | None, master: str | None, remote: str | None, as_json: bool,
            write_out: str | None) -> None:
    """Mapping and lock history from an export, on Spark."""
    ctx.obj = {"data": data, "master": master, "remote": remote, "as_json": as_json, "write_out": write_out}


def run_lineage(ctx: click.Context, command: str, args: dict, data: str | None, master: str | None,
                remote: str | None, as_json: bool, write_out: str | None) -> None:
    from ops.lineage.errors import LineageError
    from ops.lineage.output import for_people
    from ops.lineage.run import Request, answer
    shared = ctx.obj or {}
    data, master, remote = data or shared.get("data"), master or shared.get("master"), remote or shared.get("remote")
    if not data:
        raise click.UsageError("--data DIR is required: the directory (or URI) `stator export` wrote")
    if master and remote:
        raise click.UsageError("give --master or --remote, not both")
    with one_line_errors(LineageError):
        result = answer(Request(command, data, master, remote, args))
    write_out = write_out or shared.get("write_out")
    as_json = write_out == "json" or (write_out is None and (as_json or shared.get("as_json")))
    click.echo(json.dumps(result) if as_json else for_people(command, result))
    if command == "verify" and result:
        sys.exit(EXIT_FINDINGS)


@lineage.command("locate")
@click.option("--topic", required=True)
@click.option("--queue", required=True, type=click.IntRange(min=0))
@click.option("--offset", required=True, type=click.IntRange(min=0))
@lineage_options
@click.pass_context
def lineage_locate(ctx: click.Context, topic: str, queue: int, offset: int, **shared) -> None:
    """The broker, physical queue and physical offset that held a logic offset (in the topic's newest incarnation),
    and when its segment was written to."""
    run_lineage(ctx, "locate", {"topic": topic, "queue": queue, "offset": offset}, **shared)


@lineage.command("route-at")
@click.option("--topic", required=True)
@click.option("--at", required=True, type=IsoTime())
@lineage_options
@click.pass_context
def lineage_route_at(ctx: click.Context, topic: str, at: int, **shared) -> None:
    """The topic's route as it was at a time."""
    run_lineage(ctx, "route-at", {"topic": topic, "at": at}, **shared)


@lineage.command("moves")
@click.option("--topic")
@click.option("--broker", help="moves from or to this broker")
@click.option("--since", type=IsoTime())
@lineage_options
@click.pass_context
def lineage_moves(ctx: click.Context, topic: str | None, broker: str | None, since: int | None, **shared) -> None:
    """Every remap: queue, from, to, gen, version and time."""
    run_lineage(ctx, "moves", {"topic": topic, "broker": broker, "since": since}, **shared)


@lineage.command("locks")
@click.option("--group", required=True)
@click.option("--topic")
@click.option("--queue", type=click.IntRange(min=0))
@lineage_options
@click.pass_context
def lineage_locks(ctx: click.Context, group: str, topic: str | None, queue: int | None, **shared) -> None:
    """Who held each exclusive lock of a group, with token, from and to."""
    run_lineage(ctx, "locks", {"group": group, "topic": topic, "queue": queue}, **shared)


@lineage.command("verify")
@lineage_options
@click.pass_context
def lineage_verify(ctx: click.Context, **shared) -> None:
    """Version gaps, overlapping segments, two lock holders at once; exits 3 on any finding."""
    run_lineage(ctx, "verify", {}, **shared)


if __name__ == "__main__":
    sys.exit(main())
