"""Tool rules: what a room or a Claude session allows or denies without asking.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Copied from bridge/store/tables.py at this revision, not imported (see 0001).
ID = 255


def upgrade() -> None:
    op.create_table(
        "tool_rules",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("transport", sa.String(32), nullable=False),
        sa.Column("room_id", sa.String(ID), nullable=False),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("session_id", sa.String(ID), nullable=True),
        sa.Column("effect", sa.String(16), nullable=False),
        sa.Column("rule", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(ID), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("revoked_by", sa.String(ID), nullable=True),
        sa.Column("revoked_at", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_tool_rules"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_tool_rules_room", "tool_rules", ["transport", "room_id"])


def downgrade() -> None:
    op.drop_index("ix_tool_rules_room", table_name="tool_rules")
    op.drop_table("tool_rules")
