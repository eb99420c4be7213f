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


# Inserts of many rows go to the driver as SQL text: SQLAlchemy's per-row parameter processing cost more than SQLite's
# own insert (8 against 5.4 ms per 1,000 segments), half of the projection writer's CPU during a burst of topic
# creations and 40% of it under small writes (the events insert, where re-dumping each event's data for its JSON
# column took another 20%). The rows are dicts of the columns' plain values; the driver sees no Python JSON type.
DRIVER_INSERTS = {
    "segment_insert": insert(schema.segments),
    "slot_range_insert": insert(schema.slot_ranges),
    # data is bound as JSON text (the event's own, from its line: store.py), stored as it is on SQLite and cast by
    # the compiled statement on PostgreSQL (%(data_json)s::JSONB, as SQLAlchemy casts its own). Named apart from
    # ``data``, which holds the parsed data the fold reads, so that one dict per event serves both.
    "event_insert": insert(schema.events).values({c.name: bindparam(c.name) for c in schema.events.c}
                                                 | {"data": bindparam("data_json")}),
}


# Updates that set columns to values given with each row where the k_ parameters match, and set no k_ column: of a
# run of one of them (fold.runs), only the last for each key leaves a trace, so store.py executes that one alone.
# Small writes come as runs of hundreds (config changes of one topic, budget grants of a few queues), and each row
# through SQLAlchemy's executemany cost more than its event's insert.
LAST_WINS = frozenset({"broker_state", "topic_queues", "topic_config", "topic_version", "segment_sealing",
                       "segment_sealed", "segment_logic_start", "segment_budget", "barrier_after_offset"})


def driver_inserts(dialect: Dialect) -> dict[str, str]:
    """The DRIVER_INSERTS as SQL text with named parameters, for rows given as dicts."""
    if dialect.name == "sqlite":
        dialect = sqlite.dialect(paramstyle="named")   # sqlite3 takes :name as well as its default ?
    elif dialect.positional:
        raise ValueError(f"the projection needs a driver taking named parameters (psycopg), not {dialect.driver!r}")
    return {name: str(stmt.compile(dialect=dialect)) for name, stmt in DRIVER_INSERTS.items()}


def build(dialect: str) -> dict[str, Executable]:
    """The statements for one SQL dialect ('sqlite' or 'postgresql')."""
    if dialect not in DIALECT_INSERTS:
        raise ValueError(f"the projection supports {sorted(DIALECT_INSERTS)}, not {dialect!r}")
    b, sr = schema.barriers.c, schema.brokers.c
    stmts: dict[str, Executable] = {
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
        "segment_sealing": _segment_update(state="sealing"),
        "segment_sealed": _segment_update(state="sealed", logic_end=bindparam("logic_end"),
                                          sealed_ms=bindparam("sealed_ms")),
        "segment_logic_start": _segment_update(logic_start=bindparam("logic_start")),
        "segment_budget": _segment_update(budget_end=bindparam("budget_end")),
        "barrier_insert": _barrier_insert(),
        "barrier_after_offset": update(schema.barriers)
                                .where(b.topic == bindparam("k_topic"), b.after_queue == bindparam("k_queue"),
                                       b.after_gen == bindparam("k_gen"))
                                .values(after_offset=bindparam("logic_start")),
    }
    for table in schema.TOPIC_STATE:
        stmts[f"{table.name}_delete"] = delete(table).where(table.c.topic == bindparam("k_topic"))
    return stmts
