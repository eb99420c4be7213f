"""``stator snapshot save FILE`` / ``stator snapshot restore FILE --data-dir DIR --node N`` (meta/backup.py)."""

from __future__ import annotations

import click


from . import output
from .options import WRITE_OUT, CliError, Globals, GlobalOptionsGroup, global_options, run

BACKUP_ERROR = "BACKUP_INVALID"   # a client-side code: the file (or what the cluster sent) is not a whole backup


@click.group(cls=GlobalOptionsGroup)
def snapshot() -> None:
    """Backup and restore of the meta state with its whole history."""


@snapshot.command("save")
@click.argument("file", type=click.Path(dir_okay=False, writable=True))
@global_options
async def save(file: str, g: Globals) -> None:
    """Write the image and the whole history, checksummed, to FILE (replaced atomically)."""
    from meta.backup import BackupError, save as save_backup
    # One node's image and the history up to it, read from that node's own state: a linearizable read would pass a
    # barrier through the log for every page, and each barrier changes the image the backup was just taken of.
    async with g.admin(consistency="serializable") as admin:
        try:
            header = await save_backup(admin, file)
        except BackupError as e:
            raise CliError(BACKUP_ERROR, str(e)) from None
    output.emit(g.json, header, lambda h: output.fields(list(h.items())))


@snapshot.command("restore")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--data-dir", required=True, type=click.Path(file_okay=False),
              help="the new node's data directory (its config's data_dir): must be new or empty")
@click.option("--node", required=True, help="the node this directory is for (every member is restored in turn)")
@click.option("--projection-url", help="the node's projection_url if it is not SQLite in the data directory")
@click.option("-w", "--write-out", type=click.Choice(WRITE_OUT), default="table", show_default=True)
def restore(file: str, data_dir: str, node: str, projection_url: str | None, write_out: str) -> None:
    """Seed a new cluster's node from FILE; start every node restored from the same file."""
    from meta.backup import BackupError, restore as restore_backup

    def go() -> None:
        try:
            result = restore_backup(file, data_dir, node, projection_url)
        except BackupError as e:
            raise CliError(BACKUP_ERROR, str(e)) from None
        output.emit(write_out == "json", result, lambda r: output.fields(list(r.items())))
    run(go)
