"""What a message carries besides its text: files, the sender's name, the replied-to text.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # All nullable: messages accepted before this revision carry none of it.
    op.add_column("messages", sa.Column("attachments", sa.JSON(), nullable=True))
    op.add_column("messages", sa.Column("sender_name", sa.Text(), nullable=True))
    op.add_column("messages", sa.Column("reply_to_text", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("messages", "reply_to_text")
    op.drop_column("messages", "sender_name")
    op.drop_column("messages", "attachments")
