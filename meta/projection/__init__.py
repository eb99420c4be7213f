"""The SQL projection of the meta log (DESIGN.md invariant 8): derived, idempotent by version, droppable, rebuildable.

schema.py the tables; fold.py events -> named writes (pure); statements.py names -> SQL; engine.py SQLite/PostgreSQL
engines; migrate.py Alembic upgrade; store.py SqlProjection and rebuild.
"""

from meta.projection.store import APPLY_BATCH_MAX, HISTORY_LIMIT_MAX, SqlProjection, rebuild

__all__ = ["APPLY_BATCH_MAX", "HISTORY_LIMIT_MAX", "SqlProjection", "rebuild"]
