"""Events keep their schema version ("v"), so readers of stored history can tell old and new shapes apart.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22

Rows written before this revision were all schema version 1, which the server default records.
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: Union[str, Sequence[str], None] = "0001"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.add_column(sa.Column("v", sa.Integer(), nullable=False, server_default="1"))


def downgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.drop_column("v")
