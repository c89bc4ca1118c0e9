"""progress digests shared by the processes of a cluster, and the open rounds of digest jobs

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07 05:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "digest_feed",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("job", sa.String(length=256), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("received_ns", sa.BigInteger(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_digest_feed")),
    )
    op.create_index("ix_digest_feed_received", "digest_feed", ["received_ns"], unique=False)
    op.create_table(
        "digest_rounds",
        sa.Column("job", sa.String(length=256), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("until_ns", sa.BigInteger(), nullable=False),
        sa.Column("asks", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("job", "attempt", name=op.f("pk_digest_rounds")),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("digest_rounds")
    op.drop_index("ix_digest_feed_received", table_name="digest_feed")
    op.drop_table("digest_feed")
