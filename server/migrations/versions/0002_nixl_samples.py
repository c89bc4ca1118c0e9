"""nixl samples: a bounded history of NIXL agent samples, for rates and recent quantiles

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 11:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "nixl_samples",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("agent_id", sa.Integer(), nullable=False),
        sa.Column("read_time_ns", sa.BigInteger(), nullable=False),
        sa.Column("run", sa.String(length=128), nullable=False),
        sa.Column("sample", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["nixl_agents.id"],
            name=op.f("fk_nixl_samples_agent_id_nixl_agents"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_nixl_samples")),
    )
    op.create_index("ix_nixl_samples_agent_time", "nixl_samples", ["agent_id", "read_time_ns"], unique=False)


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_nixl_samples_agent_time", table_name="nixl_samples")
    op.drop_table("nixl_samples")
