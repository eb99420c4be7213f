"""The SQL projection of the meta log: stored events in, rows and a position out, both in one transaction.

The position is the version of the last event applied. Writing it with the rows is what makes apply idempotent:
an event at or below the position is already in, whatever happened between two calls (eventsourcing's followers).

The position is also the projection's contiguous-through marker: apply takes only the event right after the position
(an event past it raises ProjectionGap naming the missing versions), so the events table holds exactly versions
1..position, every one. That is how a node knows its projection is complete, without a second marker to keep in step:
it is complete up to where its image's history starts when position >= history_start - 1. Events are also folded
strictly in log order, so the state tables are never built over a hole and never need a re-fold when one is filled.
(Projections written before this rule may hold holes: ``first_hole()`` finds one, and the node serves history from
such a projection only up to it, keeps every event it holds, and asks the operator to rebuild it.)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from itertools import islice
from typing import Any

from sqlalchemy import Connection, func, select, text

from meta import history_lines, limits
from meta.projection import engine as engines
from meta.projection import fold, migrate, schema, statements
from wire.json_body import canonical, decode

log = logging.getLogger(__name__)

APPLY_BATCH_MAX = 10_000    # events per apply() call: one transaction, held in memory while it is planned
HISTORY_LIMIT_MAX = limits.HISTORY_PAGE_MAX  # events per history() call: the API's page bound


def _check_ascending(events: list[dict[str, Any]]) -> None:
    for before, after in zip(events, events[1:]):
        if after["version"] <= before["version"]:
            raise ValueError(f"events must have ascending versions: {before['version']} then {after['version']}")


def _event_row(e: dict[str, Any]) -> dict[str, Any]:
    # Data as the image's line holds it (canonical JSON), so that a row's text is the same whichever way its event came:
    # from the image (apply_lines), a peer, an export or a rebuild.
    return {"version": e["version"], "ts": e["ts"], "type": e["type"], "v": e.get("v", 1), "topic": e["topic"],
            "data": e["data"], "data_json": canonical(e["data"]).decode()}


def _line_event(line: str) -> dict[str, Any]:
    """The stored event of a canonical line, with data's own text as ``data_json`` for the events row (dumping the
    parsed data again cost the writer a fifth of its CPU). Data is parsed only for a type whose fold reads it (None
    otherwise): it is most of the line, and a history-only event needs none of it."""
    e, data_json = history_lines.split(line)
    e["data_json"] = data_json
    e["data"] = decode(data_json) if e["type"] in fold.READS_DATA else None
    return e


class ProjectionGap(ValueError):
    """Events that would leave versions out of the projection: ``first..last`` are missing before them."""

    def __init__(self, first: int, last: int):
        super().__init__(f"the projection lacks versions {first}..{last}: apply them first")
        self.first, self.last = first, last

    def __reduce__(self):  # it crosses from the writer process (meta/projection/writer_process.py)
        return ProjectionGap, (self.first, self.last)


def _last_per_key(params: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # Each key at its first place with its last values: rows of different keys are different rows, in any order.
    keys = [k for k in params[0] if k.startswith("k_")]
    return list({tuple(p[k] for k in keys): p for p in params}.values())


def _check_size(batch: list[Any]) -> None:
    if len(batch) > APPLY_BATCH_MAX:
        raise ValueError(f"{len(batch)} events in one apply; at most APPLY_BATCH_MAX={APPLY_BATCH_MAX}")


def _check_contiguous(events: list[dict[str, Any]], position: int) -> None:
    for expected, e in enumerate(events, position + 1):
        if e["version"] != expected:
            raise ProjectionGap(expected, e["version"] - 1)


class SqlProjection:
    def __init__(self, url: str):
        self._engine = engines.create(url)
        self._writer = self._engine.execution_options(**{engines.WRITE: True})
        self._stmts = statements.build(self._engine.dialect.name)
        self._driver_sql = statements.driver_inserts(self._engine.dialect)
        self._warned: set[str] = set()

    def migrate(self) -> None:
        """Create or upgrade the tables (alembic upgrade head), atomically on both backends."""
        with self._writer.begin() as conn:
            migrate.upgrade(conn)

    def position(self) -> int:
        """Version of the last event applied; 0 when none is."""
        with self._engine.connect() as conn:
            return self._position(conn)

    def apply(self, events: list[dict[str, Any]]) -> int:
        """Apply stored events (ascending versions), skipping those at or below the position; return the new position."""
        _check_size(events)
        return self._apply([_event_row(e) for e in events])

    def apply_lines(self, lines: list[str]) -> int:
        """``apply`` of stored events as the image keeps them (canonical JSON lines), each row's data the line's own
        text."""
        _check_size(lines)
        return self._apply([_line_event(line) for line in lines])

    def _apply(self, events: list[dict[str, Any]]) -> int:
        _check_ascending(events)
        with self._writer.begin() as conn:
            position = self._position(conn, for_update=True)
            new = [e for e in events if e["version"] > position]
            if not new:
                return position
            _check_contiguous(new, position)
            plan = fold.plan(new)
            conn.exec_driver_sql(self._driver_sql["event_insert"], new)
            for name, params in fold.runs(plan.ops):
                if name in statements.LAST_WINS:
                    params = _last_per_key(params)
                sql = self._driver_sql.get(name)
                if sql is not None:
                    conn.exec_driver_sql(sql, params)
                else:
                    conn.execute(self._stmts[name], params)
            if plan.topic_versions:
                conn.execute(self._stmts["topic_version"],
                             [{"k_topic": t, "version": v} for t, v in plan.topic_versions.items()])
            position = new[-1]["version"]
            conn.execute(self._stmts["position_set"], {"version": position})
        self._warn_unknown(plan.unknown)
        return position

    def first_hole(self) -> tuple[int, int] | None:
        """The first run of versions missing below the position, or None when it holds every version 1..position
        (as apply keeps it; projections written by older code may not)."""
        e = schema.events.c
        with self._engine.connect() as conn:
            position = self._position(conn)
            if conn.execute(select(func.count()).select_from(schema.events)).scalar_one() == position:
                return None
            # The end of the run starting at version 1 (0 when version 1 is missing), then the next version held.
            nxt = schema.events.alias("nxt")
            ends = (select(e.version.label("v"))
                    .where(~select(nxt.c.version).where(nxt.c.version == e.version + 1).exists()).subquery())
            has_first = conn.execute(select(e.version).where(e.version == 1)).first() is not None
            run_end = conn.execute(select(func.min(ends.c.v))).scalar_one() if has_first else 0
            resumes = conn.execute(select(func.min(e.version)).where(e.version > run_end)).scalar_one()
            return run_end + 1, (resumes or position + 1) - 1

    def history(self, after: int = 0, topic: str | None = None, limit: int = 1000,
                through: int | None = None) -> list[dict[str, Any]]:
        """Stored events with after < version (<= through), ascending, optionally of one topic only."""
        if not 1 <= limit <= HISTORY_LIMIT_MAX:
            raise ValueError(f"history limit {limit} outside 1..HISTORY_LIMIT_MAX={HISTORY_LIMIT_MAX}")
        e = schema.events.c
        query = select(e.version, e.ts, e.type, e.v, e.topic, e.data).where(e.version > after)
        if through is not None:
            query = query.where(e.version <= through)
        if topic is not None:
            query = query.where(e.topic == topic)
        query = query.order_by(e.version).limit(limit)
        with self._engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(query)]

    def drop(self) -> None:
        """Drop every projection table, alembic's included, so that migrate() starts from nothing."""
        with self._writer.begin() as conn:
            schema.metadata.drop_all(conn, checkfirst=True)
            conn.execute(text("DROP TABLE IF EXISTS alembic_version"))

    def close(self) -> None:
        self._engine.dispose()

    def _position(self, conn: Connection, for_update: bool = False) -> int:
        p = schema.projection_position
        query = select(p.c.version).where(p.c.id == 1)
        if for_update:
            # PostgreSQL: a second writer waits here instead of inserting the same versions and failing.
            query = query.with_for_update()
        return conn.execute(query).scalar_one_or_none() or 0

    def _warn_unknown(self, types: set[str]) -> None:
        # Once per type and process: a newer node's event type can come by the thousand, the log must not.
        for t in sorted(types - self._warned):
            log.warning("projection: unknown event type %r stored in history, not folded into state", t)
        self._warned |= types


def rebuild(url: str, events: Iterable[dict[str, Any]]) -> int:
    """Drop the projection at url, recreate it and apply events (versions 1, 2, ...) in batches; return the position.

    A missing version raises ProjectionGap: a rebuild never leaves a hole (meta/offline_log.py takes what the
    node's image lacks from a peer or an export)."""
    projection = SqlProjection(url)
    try:
        projection.drop()
        projection.migrate()
        it = iter(events)
        while batch := list(islice(it, APPLY_BATCH_MAX)):
            projection.apply(batch)
        return projection.position()
    finally:
        projection.close()
