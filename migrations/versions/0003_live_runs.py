"""Registry of live runs: where each running run's detached supervisor is reached.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Copied from bridge/store/tables.py at this revision, not imported (see 0001).
ID = 255


def upgrade() -> None:
    op.create_table(
        "live_runs",
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("transport", sa.String(32), nullable=False),
        sa.Column("room_id", sa.String(ID), nullable=False),
        sa.Column("supervisor_pid", sa.Integer(), nullable=False),
        sa.Column("supervisor_start", sa.BigInteger(), nullable=False),
        sa.Column("claude_pid", sa.Integer(), nullable=False),
        sa.Column("run_dir", sa.Text(), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("delivered_offset", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("registered_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", name="pk_live_runs"),
        # The row goes with its run (a run is pruned only once it ended, and
        # its end deletes the row already: this is the backstop).
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name="fk_live_runs_run_id_runs", ondelete="CASCADE"
        ),
    )


def downgrade() -> None:
    op.drop_table("live_runs")
