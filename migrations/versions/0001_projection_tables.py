"""Projection tables: events, position, and the current state folded from them.

Revision ID: 0001
Revises:
Create Date: 2026-11-21

Written out in full rather than importing meta.projection.schema: a migration is a record of what the schema was
at that revision, and must not change when schema.py does.
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: Union[str, Sequence[str], None] = None
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("version", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=False,
                  nullable=False),
        sa.Column("ts", sa.BigInteger(), nullable=False),
        sa.Column("type", sa.String(), nullable=False),
        sa.Column("topic", sa.String(), nullable=True),
        sa.Column("data", JSON, nullable=False),
        sa.PrimaryKeyConstraint("version", name=op.f("pk_events")),
    )
    op.create_index(op.f("ix_events_topic_version"), "events", ["topic", "version"], unique=False)
    position = op.create_table(
        "projection_position",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_projection_position_single_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_projection_position")),
    )
    # The one position row exists from the start, so apply() only ever updates it.
    op.bulk_insert(position, [{"id": 1, "version": 0}])
    op.create_table(
        "brokers",
        sa.Column("broker", sa.String(), nullable=False),
        sa.Column("address", sa.String(), nullable=False),
        sa.Column("zone", sa.String(), nullable=True),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("updated_ms", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("state IN ('active', 'fenced')", name=op.f("ck_brokers_state")),
        sa.PrimaryKeyConstraint("broker", name=op.f("pk_brokers")),
    )
    op.create_table(
        "topics",
        sa.Column("topic", sa.String(), nullable=False),
        sa.Column("incarnation", sa.BigInteger(), nullable=False),
        sa.Column("queues", sa.Integer(), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("order", sa.String(), nullable=False),
        sa.Column("config", JSON, nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("topic", name=op.f("pk_topics")),
    )
    op.create_table(
        "segments",
        sa.Column("topic", sa.String(), nullable=False),
        sa.Column("queue", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("gen", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("broker", sa.String(), nullable=False),
        sa.Column("physical_queue", sa.String(), nullable=False),
        sa.Column("physical_start", sa.BigInteger(), nullable=False),
        sa.Column("logic_start", sa.BigInteger(), nullable=True),
        sa.Column("logic_end", sa.BigInteger(), nullable=True),
        sa.Column("budget_end", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("opened_version", sa.BigInteger(), nullable=False),
        sa.Column("opened_ms", sa.BigInteger(), nullable=False),
        sa.Column("sealed_ms", sa.BigInteger(), nullable=True),
        sa.CheckConstraint("state IN ('active', 'sealing', 'sealed')", name=op.f("ck_segments_state")),
        sa.PrimaryKeyConstraint("topic", "queue", "gen", name=op.f("pk_segments")),
    )
    op.create_table(
        "slot_ranges",
        sa.Column("topic", sa.String(), nullable=False),
        sa.Column("lo", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("hi", sa.Integer(), nullable=False),
        sa.Column("queue", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("topic", "lo", name=op.f("pk_slot_ranges")),
    )
    op.create_table(
        "barriers",
        sa.Column("topic", sa.String(), nullable=False),
        sa.Column("queue", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("after_queue", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("after_gen", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("after_offset", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("topic", "queue", "after_queue", "after_gen", name=op.f("pk_barriers")),
    )


def downgrade() -> None:
    for table in ("barriers", "slot_ranges", "segments", "topics", "brokers", "projection_position"):
        op.drop_table(table)
    op.drop_index(op.f("ix_events_topic_version"), table_name="events")
    op.drop_table("events")
