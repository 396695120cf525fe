"""Seen marks: the newest message a transport saw in each room and thread, so Slack
reads what it missed while chatbridge was down (docs/conversations.md).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Copied from bridge/store/tables.py at this revision, not imported (see 0001).
ID = 255


def upgrade() -> None:
    op.create_table(
        "seen_marks",
        sa.Column("transport", sa.String(32), nullable=False),
        sa.Column("room_id", sa.String(ID), nullable=False),
        sa.Column("last_id", sa.String(ID), nullable=False),
        sa.Column("seen_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("transport", "room_id", name="pk_seen_marks"),
    )


def downgrade() -> None:
    op.drop_table("seen_marks")
