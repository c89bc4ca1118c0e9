"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-30 10:16:50.692990
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "collector_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at_ns", sa.BigInteger(), nullable=False),
        sa.Column("revoked_at_ns", sa.BigInteger(), nullable=True),
        sa.Column("last_push_ns", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_collector_tokens")),
        sa.UniqueConstraint("name", name=op.f("uq_collector_tokens_name")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_collector_tokens_token_hash")),
    )
    op.create_table(
        "entries",
        sa.Column("time_created_ns", sa.BigInteger(), nullable=False),
        sa.Column("time_started_ns", sa.BigInteger(), nullable=True),
        sa.Column("time_completed_ns", sa.BigInteger(), nullable=True),
        sa.Column("record_id", sa.BigInteger(), nullable=False),
        sa.Column("duration_ms", sa.Float(), nullable=True),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("group_id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("p2p_seq", sa.Integer(), nullable=False),
        sa.Column("op_id", sa.Integer(), nullable=False),
        sa.Column("sig_id", sa.Integer(), nullable=False),
        sa.Column("stack_id", sa.Integer(), nullable=True),
        sa.Column("timeout_ms", sa.Integer(), nullable=True),
        sa.Column("peer", sa.Integer(), nullable=True),
        sa.Column("state", sa.SmallInteger(), nullable=False),
        sa.Column("retired", sa.Boolean(), nullable=False),
        sa.Column("thread_name", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "rank", "record_id", name="pk_entries"),
        sqlite_with_rowid=False,
    )
    op.create_index("ix_entries_job_group_seq", "entries", ["job_id", "group_id", "seq"], unique=False)
    op.create_table(
        "hosts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_hosts")),
        sa.UniqueConstraint("name", name=op.f("uq_hosts_name")),
    )
    op.create_table(
        "ingested_batches",
        sa.Column("batch_id", sa.String(length=128), nullable=False),
        sa.Column("received_at_ns", sa.BigInteger(), nullable=False),
        sa.Column("collector_id", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("batch_id", name=op.f("pk_ingested_batches")),
    )
    op.create_index("ix_ingested_batches_received", "ingested_batches", ["received_at_ns"], unique=False)
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=True),
        sa.Column("first_seen_ns", sa.BigInteger(), nullable=False),
        sa.Column("last_seen_ns", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("report", sa.JSON(), nullable=True),
        sa.Column("diagnosed_at_ns", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("name", "attempt", name="uq_jobs_name_attempt"),
    )
    op.create_table(
        "nixl_agents",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("agent", sa.String(length=255), nullable=False),
        sa.Column("source", sa.String(length=8), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("local_rank", sa.Integer(), nullable=True),
        sa.Column("run", sa.String(length=128), nullable=False),
        sa.Column("read_time_ns", sa.BigInteger(), nullable=False),
        sa.Column("sample", sa.JSON(), nullable=False),
        sa.Column("carried", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_nixl_agents")),
        sa.UniqueConstraint("host", "agent", "source", name="uq_nixl_agents_host_agent_source"),
    )
    op.create_table(
        "signatures",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("hash", sa.String(length=32), nullable=False),
        sa.Column("raw_op", sa.String(length=256), nullable=False),
        sa.Column("backend", sa.String(length=64), nullable=False),
        sa.Column("is_p2p", sa.Boolean(), nullable=False),
        sa.Column("input_sizes", sa.JSON(), nullable=False),
        sa.Column("output_sizes", sa.JSON(), nullable=False),
        sa.Column("input_dtypes", sa.JSON(), nullable=False),
        sa.Column("output_dtypes", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_signatures")),
        sa.UniqueConstraint("hash", name=op.f("uq_signatures_hash")),
    )
    op.create_table(
        "stacks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("hash", sa.String(length=32), nullable=False),
        sa.Column("frames", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stacks")),
        sa.UniqueConstraint("hash", name=op.f("uq_stacks_hash")),
    )
    op.create_table(
        "findings",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("group_key", sa.String(length=128), nullable=False),
        sa.Column("seq_key", sa.BigInteger(), nullable=False),
        sa.Column("rank_key", sa.Integer(), nullable=False),
        sa.Column("opened_at_ns", sa.BigInteger(), nullable=False),
        sa.Column("updated_at_ns", sa.BigInteger(), nullable=False),
        sa.Column("resolved_at_ns", sa.BigInteger(), nullable=True),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_findings_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_findings")),
    )
    op.create_index("ix_findings_job_opened", "findings", ["job_id", "opened_at_ns"], unique=False)
    op.create_index(
        "uq_findings_open_identity",
        "findings",
        ["job_id", "kind", "group_key", "seq_key", "rank_key"],
        unique=True,
        sqlite_where=sa.text("resolved_at_ns IS NULL"),
        postgresql_where=sa.text("resolved_at_ns IS NULL"),
    )
    op.create_table(
        "process_groups",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("desc", sa.String(length=256), nullable=False),
        sa.Column("ranks", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_process_groups_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_process_groups")),
        sa.UniqueConstraint("job_id", "name", name="uq_process_groups_job_name"),
    )
    op.create_table(
        "ranks",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("host_id", sa.Integer(), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("local_rank", sa.Integer(), nullable=True),
        sa.Column("world_size", sa.Integer(), nullable=True),
        sa.Column("last_snapshot_ns", sa.BigInteger(), nullable=False),
        sa.Column("received_ns", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("interval_s", sa.Float(), nullable=True),
        sa.Column("exception", sa.Text(), nullable=True),
        sa.Column("wrapped", sa.Boolean(), nullable=False),
        sa.Column("oldest_record_id", sa.BigInteger(), nullable=True),
        sa.Column("torch_version", sa.String(length=64), nullable=True),
        sa.Column("backend", sa.String(length=64), nullable=True),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("thread_stacks", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(["host_id"], ["hosts.id"], name=op.f("fk_ranks_host_id_hosts")),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_ranks_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "rank", name=op.f("pk_ranks")),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("ranks")
    op.drop_table("process_groups")
    op.drop_index("uq_findings_open_identity", table_name="findings")
    op.drop_index("ix_findings_job_opened", table_name="findings")
    op.drop_table("findings")
    op.drop_table("stacks")
    op.drop_table("signatures")
    op.drop_table("nixl_agents")
    op.drop_table("jobs")
    op.drop_index("ix_ingested_batches_received", table_name="ingested_batches")
    op.drop_table("ingested_batches")
    op.drop_table("hosts")
    op.drop_index("ix_entries_job_group_seq", table_name="entries")
    op.drop_table("entries")
    op.drop_table("collector_tokens")
