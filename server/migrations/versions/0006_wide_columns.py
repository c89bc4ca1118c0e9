"""64-bit columns for values real jobs exceed 2^31 in: sequence / op ids, timeouts, pids

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 21:00:00

A month-long job passes 2^31 collectives; a collective timeout of 25 days is 2^31 ms; pids of
another namespace may be large. PostgreSQL rewrites the tables (`entries` is the big one: plan
the upgrade for a quiet moment on a large database). SQLite stores every INTEGER in up to 8
bytes already, so nothing changes there but the declared type, which is left as it was rather
than copying the whole table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

#: (table, column, nullable) widened from INTEGER to BIGINT.
WIDENED = (
    ("entries", "seq", False),
    ("entries", "p2p_seq", False),
    ("entries", "op_id", False),
    ("entries", "timeout_ms", True),
    ("ranks", "pid", True),
    ("nixl_agents", "pid", True),
)


def upgrade() -> None:
    """Apply this revision."""
    if op.get_bind().dialect.name == "sqlite":
        return
    for table, column, nullable in WIDENED:
        op.alter_column(
            table, column, type_=sa.BigInteger(), existing_type=sa.Integer(), existing_nullable=nullable
        )


def downgrade() -> None:
    """Revert this revision (values above 2^31 - 1 make it fail: nothing is cut silently)."""
    if op.get_bind().dialect.name == "sqlite":
        return
    for table, column, nullable in WIDENED:
        op.alter_column(
            table, column, type_=sa.Integer(), existing_type=sa.BigInteger(), existing_nullable=nullable
        )
