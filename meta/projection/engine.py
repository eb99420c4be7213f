"""Engines for the projection: SQLite tuned for one writer with readers beside it, PostgreSQL as it comes."""

from __future__ import annotations

from sqlalchemy import Engine, create_engine, event, make_url

# Execution option marking a connection that will write: on SQLite it takes the write lock at BEGIN, so reading
# the position and writing after it happen under one lock (PostgreSQL locks the position row instead).
WRITE = "stator_projection_write"


def _sqlite_hooks(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn, _record) -> None:
        # sqlite3 otherwise opens transactions only before DML: a SELECT then an UPDATE would not be one
        # transaction, and DDL (migrations) would commit statement by statement. We emit BEGIN ourselves.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        # WAL: history and dashboard readers do not block the writer, nor it them.
        cur.execute("PRAGMA journal_mode=WAL")
        # NORMAL loses at most the last transactions on power failure, never consistency; the projection is
        # rebuilt from the log anyway, and FULL costs an fsync per apply.
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(WRITE) else "BEGIN")


def create(url: str) -> Engine:
    backend = make_url(url).get_backend_name()
    if backend == "sqlite":
        engine = create_engine(url)
        _sqlite_hooks(engine)
        return engine
    if backend == "postgresql":
        # pre_ping: the meta node outlives database restarts; a dead pooled connection is replaced, not raised.
        return create_engine(url, pool_pre_ping=True)
    raise ValueError(f"projection URL must be sqlite or postgresql, not {backend!r}")
