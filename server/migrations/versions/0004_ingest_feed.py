"""ingest feed: recent batches, for the process that owns a job's diagnosis (cluster mode)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 11:05:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "ingest_feed",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("received_ns", sa.BigInteger(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ingest_feed")),
    )
    op.create_index("ix_ingest_feed_received", "ingest_feed", ["received_ns"], unique=False)


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_ingest_feed_received", table_name="ingest_feed")
    op.drop_table("ingest_feed")
