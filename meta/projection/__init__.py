"""The SQL projection of the meta log (DESIGN.md invariant 8): derived, idempotent by version, droppable, rebuildable.

schema.py the tables; fold.py events -> named writes (pure); statements.py names -> SQL; engine.py SQLite/PostgreSQL
engines; migrate.py Alembic upgrade; store.py SqlProjection and rebuild; sources.py the events a projection lacks,
from a peer's /v1/history or a Parquet export, checked page by page.
"""

from meta.projection.store import APPLY_BATCH_MAX, HISTORY_LIMIT_MAX, ProjectionGap, SqlProjection, rebuild

__all__ = ["APPLY_BATCH_MAX", "HISTORY_LIMIT_MAX", "ProjectionGap", "SqlProjection", "rebuild"]
