"""rank configuration reports: what each rank runs, for the version and configuration skew findings

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 11:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "rank_configs",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("config_hash", sa.String(length=32), nullable=False),
        sa.Column("reported_ns", sa.BigInteger(), nullable=False),
        sa.Column("torch_version", sa.String(length=64), nullable=True),
        sa.Column("checkpoint_dir", sa.String(length=512), nullable=True),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_rank_configs_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "rank", name=op.f("pk_rank_configs")),
    )
    op.create_index("ix_rank_configs_checkpoint_dir", "rank_configs", ["checkpoint_dir"], unique=False)


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index("ix_rank_configs_checkpoint_dir", table_name="rank_configs")
    op.drop_table("rank_configs")
