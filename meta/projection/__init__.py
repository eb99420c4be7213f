"""The SQL projection of the meta log (DESIGN.md invariant 8): derived, idempotent by version, droppable, rebuildable.

schema.py the tables; fold.py events -> named writes (pure); statements.py names -> SQL; engine.py SQLite/PostgreSQL
engines; migrate.py Alembic upgrade; store.py SqlProjection and rebuild; sources.py the events a projection lacks,
from a peer's /v1/history or a Parquet export, checked page by page.
"""

from __future__ import annotations

from typing import Any

__all__ = ["APPLY_BATCH_MAX", "HISTORY_LIMIT_MAX", "ProjectionGap", "SqlProjection", "rebuild"]


def __getattr__(name: str) -> Any:
    # The names of store.py, imported on first use (PEP 562): the node imports writer_process.py at start, which
    # must not bring SQLAlchemy into the node's process with it (the writer child imports it on its own).
    if name in __all__:
        from meta.projection import store
        return getattr(store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
