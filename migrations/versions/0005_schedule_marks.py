"""The latest firing each schedule has dealt with.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Copied from bridge/store/tables.py at this revision, not imported (see 0001).
ID = 255


def upgrade() -> None:
    op.create_table(
        "schedule_marks",
        sa.Column("name", sa.String(ID), nullable=False),
        sa.Column("fired_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_schedule_marks"),
    )


def downgrade() -> None:
    op.drop_table("schedule_marks")
