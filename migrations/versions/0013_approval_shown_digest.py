"""Approvals keep a digest of the request as the room was shown it: an allow applies
only to that (docs/live-runs.md, "What a person sees").

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "approvals", sa.Column("shown_digest", sa.String(64), nullable=False, server_default="")
    )


def downgrade() -> None:
    with op.batch_alter_table("approvals") as batch:
        batch.drop_column("shown_digest")
