"""The budget ledger (spend per run) and the retries waiting for a usage limit to reset.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Copied from bridge/store/tables.py at this revision, not imported (see 0001).
ID = 255


def upgrade() -> None:
    op.create_table(
        "spend",
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("transport", sa.String(32), nullable=False),
        sa.Column("room_id", sa.String(ID), nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("cost_usd", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", name="pk_spend"),
    )
    op.create_index("ix_spend_room_at", "spend", ["transport", "room_id", "at"])
    op.create_index("ix_spend_at", "spend", ["at"])
    op.create_table(
        "limit_resumes",
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("transport", sa.String(32), nullable=False),
        sa.Column("room_id", sa.String(ID), nullable=False),
        sa.Column("resets_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", name="pk_limit_resumes"),
    )


def downgrade() -> None:
    op.drop_table("limit_resumes")
    op.drop_index("ix_spend_at", table_name="spend")
    op.drop_index("ix_spend_room_at", table_name="spend")
    op.drop_table("spend")
