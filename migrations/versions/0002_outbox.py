"""Outbox: replies recorded with a run's outcome, delivered durably.

Revision ID: 0002
Revises: 0001_initial
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Copied from bridge/store/tables.py at this revision, not imported (see 0001).
ID = 255


def upgrade() -> None:
    op.create_table(
        "outbox",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("transport", sa.String(32), nullable=False),
        sa.Column("room_id", sa.String(ID), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=True),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("in_reply_to", sa.String(ID), nullable=True),
        sa.Column("thread", sa.String(ID), nullable=True),
        sa.Column("anchor", sa.String(ID), nullable=True),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("parts_done", sa.Integer(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.Double(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_outbox"),
        sa.UniqueConstraint("key", name="uq_outbox_key"),
        # Ids are never reused (see bridge/store/tables.py).
        sqlite_autoincrement=True,
    )
    op.create_index("ix_outbox_state", "outbox", ["state"])


def downgrade() -> None:
    op.drop_table("outbox")
