"""Bringing a projection database to the newest schema with the Alembic scripts shipped in the ``migrations`` package."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection

# The scripts' files are located, not imported: migrations/env.py imports the schema from here, and the migrations
# package stands above meta.
ALEMBIC_INI = Path(find_spec("migrations").origin).resolve().with_name("alembic.ini")


def config() -> Config:
    cfg = Config(str(ALEMBIC_INI))
    # Absolute, so migrate() works whatever the meta node's working directory; '%' would start an ini interpolation.
    cfg.set_main_option("script_location", str(ALEMBIC_INI.parent).replace("%", "%%"))
    return cfg


def upgrade(connection: Connection) -> None:
    """Upgrade to head inside the caller's transaction (env.py uses this connection instead of opening its own)."""
    cfg = config()
    cfg.attributes["connection"] = connection
    command.upgrade(cfg, "head")
