"""collector token scope: the host a token may write ranks of, and optional job name patterns

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 21:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision (existing tokens stay unscoped: NULL host, NULL patterns)."""
    op.add_column("collector_tokens", sa.Column("host", sa.String(length=255), nullable=True))
    op.add_column("collector_tokens", sa.Column("job_patterns", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("collector_tokens") as batch:
        batch.drop_column("job_patterns")
        batch.drop_column("host")
