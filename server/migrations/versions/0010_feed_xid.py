"""ingest feed rows carry their transaction id: each is read once, when it commits

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03 11:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision (feed rows already there keep a NULL xid: they are read by no process
    that runs this revision, and pruned within minutes)."""
    with op.batch_alter_table("ingest_feed") as batch:
        batch.add_column(sa.Column("xid", sa.BigInteger(), nullable=True))
    op.create_index("ix_ingest_feed_xid", "ingest_feed", ["xid"])


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_ingest_feed_xid", table_name="ingest_feed")
    with op.batch_alter_table("ingest_feed") as batch:
        batch.drop_column("xid")
