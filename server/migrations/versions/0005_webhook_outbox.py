"""webhook outbox: finding events kept until each webhook URL has them (durable delivery)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 11:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "webhook_outbox",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("event_id", sa.String(length=36), nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("created_ns", sa.BigInteger(), nullable=False),
        sa.Column("due_ns", sa.BigInteger(), nullable=False),
        sa.Column("deadline_ns", sa.BigInteger(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("claim", sa.String(length=32), nullable=True),
        sa.Column("done_ns", sa.BigInteger(), nullable=True),
        sa.Column("last_error", sa.String(length=256), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_outbox")),
        sa.UniqueConstraint("event_id", "url", name="uq_webhook_outbox_event_url"),
    )
    op.create_index("ix_webhook_outbox_state_due", "webhook_outbox", ["state", "due_ns"], unique=False)


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_webhook_outbox_state_due", table_name="webhook_outbox")
    op.drop_table("webhook_outbox")
