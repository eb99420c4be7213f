"""Every write the fold can ask for, by name, as one statement per name.

The fold names statements instead of building them so that runs of the same name become one executemany, and so that
it stays free of SQL. Parameters that select rows are prefixed ``k_``: SQLAlchemy reserves a column's own name for
the value being set.
"""

from __future__ import annotations

from sqlalchemy import Dialect, bindparam, delete, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql import Executable

from meta.projection import schema

DIALECT_INSERTS = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}


def _segment_update(**values) -> Executable:
    s = schema.segments.c
    return (update(schema.segments)
            .where(s.topic == bindparam("k_topic"), s.queue == bindparam("k_queue"), s.gen == bindparam("k_gen"))
            .values(**values))


def _topic_update(**values) -> Executable:
    return update(schema.topics).where(schema.topics.c.topic == bindparam("k_topic")).values(**values)


def _broker_upsert(dialect: str) -> Executable:
    # Re-registration is the normal life of a broker (every new session), so BrokerRegistered inserts or overwrites.
    stmt = DIALECT_INSERTS[dialect](schema.brokers)
    return stmt.on_conflict_do_update(
        index_elements=[schema.brokers.c.broker],
        set_={c: stmt.excluded[c] for c in ("address", "zone", "epoch", "state", "updated_ms")},
    )


def _barrier_insert() -> Executable:
    # after_offset is the logic_start of (after_queue, after_gen). Usually it is decided later (LogicStartDecided fills
    # it), but read it here too so the result does not depend on which of the two events comes first.
    s, b = schema.segments.c, schema.barriers
    decided = (select(s.logic_start)
               .where(s.topic == bindparam("topic"), s.queue == bindparam("after_queue"),
                      s.gen == bindparam("after_gen"))
               .scalar_subquery())
    return insert(b).values(topic=bindparam("topic"), queue=bindparam("queue"), after_queue=bindparam("after_queue"),
                            after_gen=bindparam("after_gen"), after_offset=decided)


# Inserts of many plain rows, a segment and a slot range per queue of a created topic, go to the driver as SQL text:
# SQLAlchemy's per-row parameter processing cost more than SQLite's own insert (8 against 5.4 ms per 1,000 segments)
# and was half of the projection writer's CPU during a burst of topic creations. Only tables whose columns need no
# bind processing (no JSON) qualify.
DRIVER_INSERTS = {"segment_insert": schema.segments, "slot_range_insert": schema.slot_ranges}


def driver_inserts(dialect: Dialect) -> dict[str, str]:
    """The DRIVER_INSERTS as SQL text with named parameters, for rows given as dicts (empty if the driver takes
    positional parameters only)."""
    if dialect.name == "sqlite":
        dialect = sqlite.dialect(paramstyle="named")   # sqlite3 takes :name as well as its default ?
    elif dialect.positional:
        return {}
    return {name: str(insert(table).compile(dialect=dialect)) for name, table in DRIVER_INSERTS.items()}


def build(dialect: str) -> dict[str, Executable]:
    """The statements for one SQL dialect ('sqlite' or 'postgresql')."""
    if dialect not in DIALECT_INSERTS:
        raise ValueError(f"the projection supports {sorted(DIALECT_INSERTS)}, not {dialect!r}")
    b, sr = schema.barriers.c, schema.brokers.c
    stmts: dict[str, Executable] = {
        "event_insert": insert(schema.events),
        "position_set": update(schema.projection_position).where(schema.projection_position.c.id == 1)
                        .values(version=bindparam("version")),
        "broker_upsert": _broker_upsert(dialect),
        "broker_state": update(schema.brokers)
                        .where(sr.broker == bindparam("k_broker"), sr.epoch == bindparam("k_epoch"))
                        .values(state=bindparam("state"), updated_ms=bindparam("updated_ms")),
        "topic_insert": insert(schema.topics),
        "topic_queues": _topic_update(queues=bindparam("queues")),
        "topic_config": _topic_update(config=bindparam("config")),
        "topic_version": _topic_update(version=bindparam("version")),
        "segment_insert": insert(schema.segments),
        "segment_sealing": _segment_update(state="sealing"),
        "segment_sealed": _segment_update(state="sealed", logic_end=bindparam("logic_end"),
                                          sealed_ms=bindparam("sealed_ms")),
        "segment_logic_start": _segment_update(logic_start=bindparam("logic_start")),
        "segment_budget": _segment_update(budget_end=bindparam("budget_end")),
        "slot_range_insert": insert(schema.slot_ranges),
        "barrier_insert": _barrier_insert(),
        "barrier_after_offset": update(schema.barriers)
                                .where(b.topic == bindparam("k_topic"), b.after_queue == bindparam("k_queue"),
                                       b.after_gen == bindparam("k_gen"))
                                .values(after_offset=bindparam("logic_start")),
    }
    for table in schema.TOPIC_STATE:
        stmts[f"{table.name}_delete"] = delete(table).where(table.c.topic == bindparam("k_topic"))
    return stmts
