"""rank progress evidence: whether each rank's main thread is working (busy or stuck)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 21:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    # `flightdeck.records.progress_to_dict` of the rank's newest snapshot, frames as a stack id.
    with op.batch_alter_table("ranks") as batch:
        batch.add_column(sa.Column("progress", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("ranks") as batch:
        batch.drop_column("progress")
