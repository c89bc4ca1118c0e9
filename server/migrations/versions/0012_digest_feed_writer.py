"""digest feed rows name the process that wrote them: an owner skips its own

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07 15:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision (rows already there get writer 0: no process has that id, so every
    owner reads them, as before; they are pruned within a minute)."""
    with op.batch_alter_table("digest_feed") as batch:
        batch.add_column(sa.Column("writer", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("digest_feed") as batch:
        batch.drop_column("writer")
