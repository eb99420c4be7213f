"""Bringing a projection database to the newest schema with the Alembic scripts shipped in the ``migrations`` package."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection

import migrations

ALEMBIC_INI = Path(migrations.__file__).resolve().with_name("alembic.ini")


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
