"""Alembic environment of the SQL projection.

Two ways in: SqlProjection.migrate() passes an open connection in ``config.attributes["connection"]`` and owns the
transaction and the logging; the alembic command line gets a URL (-x url=..., STATOR_PROJECTION_URL, or alembic.ini)
and sets up logging from alembic.ini.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection

from meta.projection import engine as engines
from meta.projection.schema import metadata

config = context.config


def _url() -> str:
    return (context.get_x_argument(as_dictionary=True).get("url")
            or os.environ.get("STATOR_PROJECTION_URL")
            or config.get_main_option("sqlalchemy.url"))


def _run(connection: Connection) -> None:
    # render_as_batch: SQLite cannot ALTER most things; batch mode copies the table instead, and is a no-op elsewhere.
    # transactional_ddl: our SQLite engine emits BEGIN itself, so DDL is transactional there too (alembic assumes not).
    context.configure(connection=connection, target_metadata=metadata, render_as_batch=True,
                      transactional_ddl=True)
    with context.begin_transaction():
        context.run_migrations()


def main() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        # Called from the meta node: its logging is its own, so alembic.ini's logging sections are not applied.
        _run(connection)
        return
    if config.config_file_name is not None:
        fileConfig(config.config_file_name)
    if context.is_offline_mode():
        context.configure(url=_url(), target_metadata=metadata, literal_binds=True, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    # The projection's own engine, so that SQLite runs the migration in one transaction as migrate() does.
    engine = engines.create(_url())
    try:
        with engine.execution_options(**{engines.WRITE: True}).begin() as conn:
            _run(conn)
    finally:
        engine.dispose()


main()
