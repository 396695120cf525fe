"""Replicas and leases: several chatbridge processes on one database (docs/replicas.md).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Copied from bridge/store/tables.py at this revision, not imported (see 0001).
ID = 255


def upgrade() -> None:
    op.add_column("runs", sa.Column("replica", sa.String(64), nullable=True))
    op.create_table(
        "replicas",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("instance", sa.String(36), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Double(), nullable=False),
        sa.Column("heartbeat_at", sa.Double(), nullable=False),
        sa.Column("runs", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("capacity", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("draining", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("state_dir", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_replicas"),
    )
    op.create_table(
        "leases",
        sa.Column("transport", sa.String(32), nullable=False),
        sa.Column("room_id", sa.String(ID), nullable=False),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.Column("acquired_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("transport", "room_id", name="pk_leases"),
    )
    op.create_index("ix_leases_owner", "leases", ["owner"])


def downgrade() -> None:
    op.drop_index("ix_leases_owner", table_name="leases")
    op.drop_table("leases")
    op.drop_table("replicas")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("replica")
