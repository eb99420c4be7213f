"""Bringing a projection database to the newest schema with the Alembic scripts shipped in the ``migrations`` package.

A node restarted on a database at HEAD and a new node on an empty one need none of Alembic: importing it and running
its machinery cost a meta node a third of a second of CPU at every start (half its start-up), and a test suite
starts hundreds. So ``upgrade`` leaves a database at HEAD as it is, and gives an empty one the tables of
``schema.metadata`` and the rows the scripts seed, with HEAD stamped, as Alembic's cookbook makes a new database
("create_all, then stamp head"); tests/test_projection.py holds HEAD to the scripts' head, and the scripts' tables
and rows to these, so the two ways give one database. Any other database (an older revision) is upgraded by the scripts.
"""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

from sqlalchemy import Connection, inspect, text

from . import schema

# The scripts' files are located, not imported: migrations/env.py imports the schema from here, and the migrations
# package stands above meta.
ALEMBIC_INI = Path(find_spec("migrations").origin).resolve().with_name("alembic.ini")
HEAD = "0002"                      # the newest script's revision
VERSION_TABLE = "alembic_version"  # Alembic's own, with its own shape: a stamped database is Alembic's to upgrade


def config():
    from alembic.config import Config
    cfg = Config(str(ALEMBIC_INI))
    # Absolute, so migrate() works whatever the meta node's working directory; '%' would start an ini interpolation.
    cfg.set_main_option("script_location", str(ALEMBIC_INI.parent).replace("%", "%%"))
    return cfg


def upgrade(connection: Connection) -> None:
    """Bring the database to HEAD inside the caller's transaction."""
    tables = set(inspect(connection).get_table_names())
    if VERSION_TABLE in tables:
        if connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all() == [HEAD]:
            return
    elif not tables:
        schema.metadata.create_all(connection)
        connection.execute(schema.projection_position.insert(), [{"id": 1, "version": 0}])   # as 0001 seeds it
        connection.execute(text(f"CREATE TABLE {VERSION_TABLE} (version_num VARCHAR(32) NOT NULL, "
                                f"CONSTRAINT {VERSION_TABLE}_pkc PRIMARY KEY (version_num))"))
        connection.execute(text(f"INSERT INTO {VERSION_TABLE} (version_num) VALUES (:head)"), {"head": HEAD})
        return
    upgrade_with_scripts(connection)


def upgrade_with_scripts(connection: Connection, revision: str = "head") -> None:
    """Alembic's upgrade to ``revision`` inside the caller's transaction (env.py uses this connection instead of
    opening its own)."""
    from alembic import command
    cfg = config()
    cfg.attributes["connection"] = connection
    command.upgrade(cfg, revision)
