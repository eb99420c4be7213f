"""The projection's tables: the meta log as SQL rows, for history, export and dashboards, never for decisions.

migrations/versions/ creates exactly these tables; tests/test_projection.py compares the two so they cannot drift.
"""

from __future__ import annotations

from sqlalchemy import JSON, BigInteger, CheckConstraint, Column, Index, Integer, MetaData, String, Table
from sqlalchemy.dialects.postgresql import JSONB

# JSONB on PostgreSQL so dashboards can query and index inside data and config; JSON text on SQLite.
Json = JSON().with_variant(JSONB(), "postgresql")
# On SQLite a column declared exactly INTEGER PRIMARY KEY is the rowid itself: events are stored in version order
# with no second index. SQLite's INTEGER is 64-bit, so nothing is lost against BIGINT.
EventVersion = BigInteger().with_variant(Integer(), "sqlite")

metadata = MetaData(naming_convention={
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "pk": "pk_%(table_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
})

events = Table(
    "events", metadata,
    Column("version", EventVersion, primary_key=True, autoincrement=False),
    Column("ts", BigInteger, nullable=False),
    Column("type", String, nullable=False),
    Column("v", Integer, nullable=False, server_default="1"),  # the event's schema version (meta/events.py)
    Column("topic", String, nullable=True),
    Column("data", Json, nullable=False),
    # history(topic=...) reads one topic's events in version order: this index answers it without a sort.
    Index(None, "topic", "version"),
)

projection_position = Table(
    "projection_position", metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("version", BigInteger, nullable=False),
    CheckConstraint("id = 1", name="single_row"),
)

brokers = Table(
    "brokers", metadata,
    Column("broker", String, primary_key=True),
    Column("address", String, nullable=False),
    Column("zone", String, nullable=True),
    Column("epoch", BigInteger, nullable=False),
    Column("state", String, nullable=False),
    Column("updated_ms", BigInteger, nullable=False),
    CheckConstraint("state IN ('active', 'fenced')", name="state"),
)

topics = Table(
    "topics", metadata,
    Column("topic", String, primary_key=True),
    Column("incarnation", BigInteger, nullable=False),
    Column("queues", Integer, nullable=False),
    Column("slots", Integer, nullable=False),
    Column("order", String, nullable=False),
    Column("config", Json, nullable=False),
    Column("version", BigInteger, nullable=False),
    Column("created_ms", BigInteger, nullable=False),
)

segments = Table(
    "segments", metadata,
    Column("topic", String, primary_key=True),
    Column("queue", Integer, primary_key=True, autoincrement=False),
    Column("gen", Integer, primary_key=True, autoincrement=False),
    Column("broker", String, nullable=False),
    Column("physical_queue", String, nullable=False),
    Column("physical_start", BigInteger, nullable=False),
    Column("logic_start", BigInteger, nullable=True),
    Column("logic_end", BigInteger, nullable=True),
    Column("budget_end", BigInteger, nullable=False),
    Column("state", String, nullable=False),
    Column("opened_version", BigInteger, nullable=False),
    Column("opened_ms", BigInteger, nullable=False),
    Column("sealed_ms", BigInteger, nullable=True),
    CheckConstraint("state IN ('active', 'sealing', 'sealed')", name="state"),
)

slot_ranges = Table(
    "slot_ranges", metadata,
    Column("topic", String, primary_key=True),
    Column("lo", Integer, primary_key=True, autoincrement=False),
    Column("hi", Integer, nullable=False),
    Column("queue", Integer, nullable=False),
)

barriers = Table(
    "barriers", metadata,
    Column("topic", String, primary_key=True),
    Column("queue", Integer, primary_key=True, autoincrement=False),
    Column("after_queue", Integer, primary_key=True, autoincrement=False),
    Column("after_gen", Integer, primary_key=True, autoincrement=False),
    Column("after_offset", BigInteger, nullable=True),
)

# Tables that hold the current state of a topic; TopicDeleted empties them for that topic, events stay.
TOPIC_STATE = (segments, slot_ranges, barriers, topics)
