"""Approvals of tool uses asked in chat, and per-room model/mode overrides.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Copied from bridge/store/tables.py at this revision, not imported (see 0001).
ID = 255


def upgrade() -> None:
    op.add_column("rooms", sa.Column("model", sa.String(ID), nullable=True))
    op.add_column("rooms", sa.Column("permission_mode", sa.String(32), nullable=True))
    # Existing rooms start counting at 1.
    op.add_column(
        "rooms",
        sa.Column("last_approval", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    op.create_table(
        "approvals",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("transport", sa.String(32), nullable=False),
        sa.Column("room_id", sa.String(ID), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("request_id", sa.String(ID), nullable=False),
        sa.Column("tool_name", sa.Text(), nullable=False),
        sa.Column("input_json", sa.Text(), nullable=False),
        sa.Column("asked_at", sa.Double(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.Column("message_id", sa.String(ID), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("decided_by", sa.String(ID), nullable=True),
        sa.Column("decided_at", sa.Double(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_approvals"),
        sa.UniqueConstraint("run_id", "request_id", name="uq_approvals_run_request"),
        sa.UniqueConstraint("transport", "room_id", "number", name="uq_approvals_room_number"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_approvals_state_expires", "approvals", ["state", "expires_at"])
    op.create_index("ix_approvals_message", "approvals", ["transport", "room_id", "message_id"])


def downgrade() -> None:
    op.drop_index("ix_approvals_message", table_name="approvals")
    op.drop_index("ix_approvals_state_expires", table_name="approvals")
    op.drop_table("approvals")
    # Batch mode: SQLite rebuilds the table where it cannot drop a column in place.
    with op.batch_alter_table("rooms") as batch:
        batch.drop_column("last_approval")
        batch.drop_column("permission_mode")
        batch.drop_column("model")
