"""job lifecycle: when a job ended, ranks reported gone, findings closed by the end

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 23:50:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision (existing jobs stay not ended: NULL ended_at_ns)."""
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("ended_at_ns", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("ranks") as batch:
        batch.add_column(sa.Column("gone_at_ns", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("findings") as batch:
        batch.add_column(sa.Column("resolution", sa.String(length=16), nullable=True))
    # The job list, newest first, of every status or of one (thousands of jobs in the store).
    op.create_index("ix_jobs_last_seen", "jobs", ["last_seen_ns", "id"])
    op.create_index("ix_jobs_status_last_seen", "jobs", ["status", "last_seen_ns", "id"])


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_jobs_status_last_seen", table_name="jobs")
    op.drop_index("ix_jobs_last_seen", table_name="jobs")
    with op.batch_alter_table("findings") as batch:
        batch.drop_column("resolution")
    with op.batch_alter_table("ranks") as batch:
        batch.drop_column("gone_at_ns")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("ended_at_ns")
