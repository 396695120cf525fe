"""Initial schema: runs, messages, run_messages, rooms, audit.

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001_initial"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Column lengths as in bridge/store/tables.py at this revision. Copied, not
# imported: a migration must keep describing the schema it created even after
# the models move on.
ID = 255


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("transport", sa.String(32), nullable=False),
        sa.Column("room_id", sa.String(ID), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("started_at", sa.Double(), nullable=False),
        sa.Column("ended_at", sa.Double(), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("session_id", sa.String(ID), nullable=True),
        sa.Column("cost_usd", sa.Double(), nullable=True),
        sa.Column("num_turns", sa.Integer(), nullable=True),
        sa.Column("duration_ms", sa.Integer(), nullable=True),
        sa.Column("session_not_found", sa.Boolean(), nullable=False),
        sa.Column("result_excerpt", sa.Text(), nullable=False),
        sa.Column("error_excerpt", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("seq", name="pk_runs"),
        sa.UniqueConstraint("id", name="uq_runs_id"),
        # Ids are never reused (see bridge/store/tables.py).
        sqlite_autoincrement=True,
    )
    op.create_index("ix_runs_status", "runs", ["status"])
    op.create_index("ix_runs_room", "runs", ["transport", "room_id", "seq"])

    op.create_table(
        "messages",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("transport", sa.String(32), nullable=False),
        sa.Column("room_id", sa.String(ID), nullable=False),
        sa.Column("external_id", sa.String(ID), nullable=False),
        sa.Column("sender", sa.String(ID), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("thread", sa.String(ID), nullable=True),
        sa.Column("received_at", sa.Double(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_messages"),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name="fk_messages_run_id_runs", ondelete="SET NULL"
        ),
        sa.UniqueConstraint(
            "transport", "room_id", "external_id", name="uq_messages_transport_room_external"
        ),
        # Ids are never reused (see bridge/store/tables.py).
        sqlite_autoincrement=True,
    )
    op.create_index("ix_messages_received_at", "messages", ["received_at"])
    op.create_index("ix_messages_state", "messages", ["state"])
    op.create_index("ix_messages_run_id", "messages", ["run_id"])

    op.create_table(
        "run_messages",
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("message_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "message_id", name="pk_run_messages"),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name="fk_run_messages_run_id_runs", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["message_id"],
            ["messages.id"],
            name="fk_run_messages_message_id_messages",
            ondelete="CASCADE",
        ),
    )
    op.create_index("ix_run_messages_message_id", "run_messages", ["message_id"])

    op.create_table(
        "rooms",
        sa.Column("transport", sa.String(32), nullable=False),
        sa.Column("room_id", sa.String(ID), nullable=False),
        sa.Column("session_id", sa.String(ID), nullable=True),
        sa.PrimaryKeyConstraint("transport", "room_id", name="pk_rooms"),
    )

    op.create_table(
        "audit",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("transport", sa.String(32), nullable=True),
        sa.Column("room_id", sa.String(ID), nullable=True),
        sa.Column("actor", sa.String(ID), nullable=True),
        sa.Column("message_id", sa.Integer(), nullable=True),
        sa.Column("run_id", sa.String(64), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_audit"),
        # Ids are never reused (see bridge/store/tables.py).
        sqlite_autoincrement=True,
    )
    op.create_index("ix_audit_at", "audit", ["at"])
    op.create_index("ix_audit_message_id", "audit", ["message_id"])
    op.create_index("ix_audit_run_id", "audit", ["run_id"])
    op.create_index("ix_audit_room", "audit", ["transport", "room_id"])


def downgrade() -> None:
    # Reverse order of creation: children before the tables they refer to.
    op.drop_table("audit")
    op.drop_table("rooms")
    op.drop_table("run_messages")
    op.drop_table("messages")
    op.drop_table("runs")
