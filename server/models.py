"""The database schema as SQLAlchemy 2 typed ORM classes (the migrations in `migrations/` create it).

Times are epoch nanoseconds in BIGINT columns (the unit the records carry). The hot table is
`entries`: one row per collective per rank, kept narrow (integers and ids only) because a 1,024-rank
job with 2,000-entry rings is two million rows. What repeats is stored once and referenced:
stacks (by content hash), entry signatures (op, sizes, dtypes; by content hash) and process groups.
`entries` has no foreign keys on purpose: the store writes parents first, and PostgreSQL would
check four keys per upserted row on the hottest path.
"""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

#: Deterministic constraint names, so migrations can refer to them on SQLite and PostgreSQL alike.
NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: Entry states as small integers (the entries table stays narrow).
STATE_CODES: dict[str, int] = {"scheduled": 0, "started": 1, "completed": 2}
STATE_NAMES: dict[int, str] = {v: k for k, v in STATE_CODES.items()}

#: 64-bit integer, declared INTEGER on SQLite (whose INTEGER already holds 8 bytes: migration 0006
#: widened these columns on PostgreSQL only, without copying SQLite's tables).
WIDE_INT = BigInteger().with_variant(Integer, "sqlite")

#: Job statuses, also the `status` label values of `flightdeck_jobs`. While the job runs: running,
#: slow (a slow_rank or straggler finding is open), hung, mismatch, lost, no_data (its collectors
#: still report but none of its ranks has sent a snapshot for `no_data_after_s`). Once every rank
#: is final or gone the job has ended (`Job.ended_at_ns`) as finished or failed (an open fault at
#: the end, or a rank killed: see `flightdeck.analysis.lifecycle.end_state`).
JOB_STATUSES = ("running", "slow", "hung", "mismatch", "lost", "no_data", "finished", "failed")
#: The statuses of an ended job.
ENDED_STATUSES = ("finished", "failed")
#: `FindingRow.resolution` of a finding closed because its job ended (kept, elapsed frozen).
RESOLUTION_ENDED = "ended"


class Base(DeclarativeBase):
    """Declarative base with the naming convention."""

    metadata = MetaData(naming_convention=NAMING)
    # none_as_null: a Python None is SQL NULL, not the JSON literal null (COALESCE must see it).
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dict[str, Any]: JSON(none_as_null=True),
        list[Any]: JSON(none_as_null=True),
    }


class Host(Base):
    """A machine that runs ranks (as named by the collector)."""

    __tablename__ = "hosts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)


class Job(Base):
    """One attempt of one distributed job."""

    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("name", "attempt", name="uq_jobs_name_attempt"),
        # The job list: newest first, optionally of one status (store.list_jobs pages through them).
        Index("ix_jobs_last_seen", "last_seen_ns", "id"),
        Index("ix_jobs_status_last_seen", "status", "last_seen_ns", "id"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(256))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    world_size: Mapped[int | None] = mapped_column(Integer)
    first_seen_ns: Mapped[int] = mapped_column(BigInteger)
    last_seen_ns: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16), default="running")
    #: The last diagnosis as `Report.to_json()` (its findings are the open ones).
    report: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    diagnosed_at_ns: Mapped[int | None] = mapped_column(BigInteger)
    #: When the job ended (every rank final or gone: the latest of those times); None while it
    #: runs. `status` is then its end state (`ENDED_STATUSES`).
    ended_at_ns: Mapped[int | None] = mapped_column(BigInteger)


class Rank(Base):
    """The latest snapshot metadata of one rank of one job."""

    __tablename__ = "ranks"
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    host_id: Mapped[int | None] = mapped_column(ForeignKey("hosts.id"))
    pid: Mapped[int | None] = mapped_column(WIDE_INT)
    local_rank: Mapped[int | None] = mapped_column(Integer)
    world_size: Mapped[int | None] = mapped_column(Integer)
    last_snapshot_ns: Mapped[int] = mapped_column(BigInteger)
    received_ns: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(16))
    interval_s: Mapped[float | None] = mapped_column(Float)
    exception: Mapped[str | None] = mapped_column(Text)
    wrapped: Mapped[bool] = mapped_column(Boolean, default=False)
    oldest_record_id: Mapped[int | None] = mapped_column(BigInteger)
    torch_version: Mapped[str | None] = mapped_column(String(64))
    backend: Mapped[str | None] = mapped_column(String(64))
    version: Mapped[str] = mapped_column(String(64), default="")
    #: When its collector reported the rank's process gone (collector clock); None: not reported.
    gone_at_ns: Mapped[int | None] = mapped_column(BigInteger)
    #: `[[thread_name, thread_id, stack_id or null], ...]` from the latest snapshot that had any.
    thread_stacks: Mapped[list[Any] | None] = mapped_column(JSON)
    #: Whether the main thread is working: `flightdeck.records.progress_to_dict` of the latest
    #: snapshot that carried it, its frames as `stk`, a stack id.
    progress: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class RankConfigRow(Base):
    """The latest configuration report of one rank (versions, flight-recorder settings, group
    timeouts, `TORCH_*` / `NCCL_*` env), as `flightdeck.records.config_to_dict`.

    Rewritten only when the report changes (`config_hash`). `torch_version` and `checkpoint_dir`
    are copied out of the JSON for the cross-job checkpoint rule, which looks jobs up by directory.
    """

    __tablename__ = "rank_configs"
    __table_args__ = (Index("ix_rank_configs_checkpoint_dir", "checkpoint_dir"),)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    config_hash: Mapped[str] = mapped_column(String(32))
    #: Snapshot time (epoch ns) of the snapshot that carried this report.
    reported_ns: Mapped[int] = mapped_column(BigInteger)
    torch_version: Mapped[str | None] = mapped_column(String(64))
    checkpoint_dir: Mapped[str | None] = mapped_column(String(512))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)


class ProcessGroup(Base):
    """A process group of a job: `name` is `process_group[0]`, the cross-rank identity."""

    __tablename__ = "process_groups"
    __table_args__ = (UniqueConstraint("job_id", "name", name="uq_process_groups_job_name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    desc: Mapped[str] = mapped_column(String(256), default="")
    ranks: Mapped[list[Any] | None] = mapped_column(JSON)


class StackRow(Base):
    """A distinct stack (frames innermost first), stored once, keyed by its content hash."""

    __tablename__ = "stacks"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    hash: Mapped[str] = mapped_column(String(32), unique=True)
    frames: Mapped[list[Any]] = mapped_column(JSON)


class Signature(Base):
    """What an entry is apart from where and when: op, backend, sizes, dtypes (content-hashed)."""

    __tablename__ = "signatures"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    hash: Mapped[str] = mapped_column(String(32), unique=True)
    raw_op: Mapped[str] = mapped_column(String(256))
    backend: Mapped[str] = mapped_column(String(64))
    is_p2p: Mapped[bool] = mapped_column(Boolean)
    input_sizes: Mapped[list[Any]] = mapped_column(JSON)
    output_sizes: Mapped[list[Any]] = mapped_column(JSON)
    input_dtypes: Mapped[list[Any]] = mapped_column(JSON)
    output_dtypes: Mapped[list[Any]] = mapped_column(JSON)


class EntryRow(Base):
    """One collective / p2p op as recorded by one rank; upserted by (job, rank, record_id)."""

    __tablename__ = "entries"
    __table_args__ = (
        # The key leads with (job, rank) so one rank's ring is one contiguous range.
        PrimaryKeyConstraint("job_id", "rank", "record_id", name="pk_entries"),
        Index("ix_entries_job_group_seq", "job_id", "group_id", "seq"),
        # SQLite: the table is the primary-key B-tree itself, no separate rowid tree and index.
        {"sqlite_with_rowid": False},
    )
    # 8-byte columns first: PostgreSQL aligns them, so this order wastes no padding.
    time_created_ns: Mapped[int] = mapped_column(BigInteger)
    time_started_ns: Mapped[int | None] = mapped_column(BigInteger)
    time_completed_ns: Mapped[int | None] = mapped_column(BigInteger)
    record_id: Mapped[int] = mapped_column(BigInteger)
    duration_ms: Mapped[float | None] = mapped_column(Float)
    job_id: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer)
    group_id: Mapped[int] = mapped_column(Integer)
    # 64-bit (migration 0006): a month-long job passes 2^31 collectives, a timeout of 25 days
    # 2^31 ms (flightdeck.server.validation checks every value against its column).
    seq: Mapped[int] = mapped_column(WIDE_INT)
    p2p_seq: Mapped[int] = mapped_column(WIDE_INT)
    op_id: Mapped[int] = mapped_column(WIDE_INT)
    sig_id: Mapped[int] = mapped_column(Integer)
    stack_id: Mapped[int | None] = mapped_column(Integer)
    timeout_ms: Mapped[int | None] = mapped_column(WIDE_INT)
    peer: Mapped[int | None] = mapped_column(Integer)
    state: Mapped[int] = mapped_column(SmallInteger)
    retired: Mapped[bool] = mapped_column(Boolean)
    thread_name: Mapped[str] = mapped_column(String(64), default="")


class NixlAgent(Base):
    """A NIXL agent with its latest cumulative sample and the totals of its earlier counter runs."""

    __tablename__ = "nixl_agents"
    __table_args__ = (UniqueConstraint("host", "agent", "source", name="uq_nixl_agents_host_agent_source"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    agent: Mapped[str] = mapped_column(String(255))
    source: Mapped[str] = mapped_column(String(8))
    pid: Mapped[int | None] = mapped_column(WIDE_INT)
    local_rank: Mapped[int | None] = mapped_column(Integer)
    run: Mapped[str] = mapped_column(String(128))
    read_time_ns: Mapped[int] = mapped_column(BigInteger)
    #: The latest `NixlSample.to_wire()`.
    sample: Mapped[dict[str, Any]] = mapped_column(JSON)
    #: Counters of the runs before `run` (a restart resets NIXL's counters), same keys as sample.
    carried: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class NixlSampleRow(Base):
    """An earlier sample of a NIXL agent: the history rates are computed from (`nixl_rates`).

    Thinned on write (at most one per `store.NIXL_HISTORY_STEP_NS` per agent, plus the last sample
    of every counter run) and deleted by the retention task like collective entries.
    """

    __tablename__ = "nixl_samples"
    __table_args__ = (Index("ix_nixl_samples_agent_time", "agent_id", "read_time_ns"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    agent_id: Mapped[int] = mapped_column(ForeignKey("nixl_agents.id", ondelete="CASCADE"))
    read_time_ns: Mapped[int] = mapped_column(BigInteger)
    run: Mapped[str] = mapped_column(String(128))
    #: The `NixlSample.to_wire()` as received.
    sample: Mapped[dict[str, Any]] = mapped_column(JSON)


class FindingRow(Base):
    """One episode of a finding: opened, updated by every diagnosis that still sees it, resolved.

    Identity is (job, kind, group, seq, rank); at most one open episode per identity (a partial unique
    index). `group_key` / `seq_key` are '' / -1 when the finding has none, so the index sees them.
    """

    __tablename__ = "findings"
    __table_args__ = (
        Index(
            "uq_findings_open_identity",
            "job_id",
            "kind",
            "group_key",
            "seq_key",
            "rank_key",
            unique=True,
            sqlite_where=text("resolved_at_ns IS NULL"),
            postgresql_where=text("resolved_at_ns IS NULL"),
        ),
        Index("ix_findings_job_opened", "job_id", "opened_at_ns"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(32))
    group_key: Mapped[str] = mapped_column(String(128), default="")
    seq_key: Mapped[int] = mapped_column(BigInteger, default=-1)
    #: The culprit rank for findings about one rank without a sequence id (lost rank, straggler,
    #: p2p hang): two ranks lost at the same collective are two findings.
    rank_key: Mapped[int] = mapped_column(Integer, default=-1)
    opened_at_ns: Mapped[int] = mapped_column(BigInteger)
    updated_at_ns: Mapped[int] = mapped_column(BigInteger)
    resolved_at_ns: Mapped[int | None] = mapped_column(BigInteger)
    #: How it closed: None while open or when the diagnosis stopped seeing it, `RESOLUTION_ENDED`
    #: when its job ended with it open (its `data` then holds the elapsed times at the end).
    resolution: Mapped[str | None] = mapped_column(String(16))
    #: The finding as `Finding.to_json()`, from the latest diagnosis that saw it.
    data: Mapped[dict[str, Any]] = mapped_column(JSON)


class CollectorToken(Base):
    """A collector's bearer token; only its SHA-256 is stored."""

    __tablename__ = "collector_tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at_ns: Mapped[int] = mapped_column(BigInteger)
    revoked_at_ns: Mapped[int | None] = mapped_column(BigInteger)
    last_push_ns: Mapped[int | None] = mapped_column(BigInteger)
    #: The only host whose ranks (and NIXL agents) the token may write; None: any (unscoped).
    host: Mapped[str | None] = mapped_column(String(255))
    #: Shell-style patterns (`fnmatch`) of the job names it may write; None: any job.
    job_patterns: Mapped[list[Any] | None] = mapped_column(JSON)


class FeedRow(Base):
    """A batch as ingested, kept for a few minutes so that the process owning the job's diagnosis
    (several servers on one PostgreSQL) sees what the other processes ingested, in commit order."""

    __tablename__ = "ingest_feed"
    __table_args__ = (Index("ix_ingest_feed_received", "received_ns"), Index("ix_ingest_feed_xid", "xid"))
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    job_id: Mapped[int] = mapped_column(Integer)
    #: Server clock (epoch ns) at the end of the ingest transaction.
    received_ns: Mapped[int] = mapped_column(BigInteger)
    #: The batch as sent (gzip JSON, flightdeck.wire).
    body: Mapped[bytes] = mapped_column(LargeBinary)
    #: PostgreSQL's id of the transaction that wrote the row (`pg_current_xact_id()`): a reader
    #: takes each row once, as the first of its snapshots that sees that transaction committed
    #: (`store.feed_after`). NULL on SQLite, which has no cluster mode.
    xid: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class DigestFeedRow(Base):
    """Progress digests as one process of a cluster took them (`flightdeck.digest`), kept a few
    seconds for the process that owns their job's diagnosis (`flightdeck.server.digest_share`)."""

    __tablename__ = "digest_feed"
    __table_args__ = (Index("ix_digest_feed_received", "received_ns"),)
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    job: Mapped[str] = mapped_column(String(256))
    attempt: Mapped[int] = mapped_column(Integer)
    #: Server clock (epoch ns) when the row was written.
    received_ns: Mapped[int] = mapped_column(BigInteger)
    #: The writing process's random id (`DigestShare.writer`): an owner folds the digests it took
    #: itself at once, and skips its own rows.
    writer: Mapped[int] = mapped_column(BigInteger, server_default="0")
    #: The job's digests of the interval, as checked columns (JSON: `digest_share.encode_blocks`).
    body: Mapped[bytes] = mapped_column(LargeBinary)


class DigestRound(Base):
    """An open request for a digest job's entries (`server.live.boards`), as its owner opened it:
    whichever process a collector's digests reach answers it with the round."""

    __tablename__ = "digest_rounds"
    __table_args__ = (PrimaryKeyConstraint("job", "attempt"),)
    job: Mapped[str] = mapped_column(String(256))
    attempt: Mapped[int] = mapped_column(Integer)
    #: Server clock (epoch ns) until which the round is open.
    until_ns: Mapped[int] = mapped_column(BigInteger)
    #: What the round asks for besides the ranks' newest entries (JSON: `Detail.asks`).
    asks: Mapped[str] = mapped_column(Text, default="{}")


class IngestedBatch(Base):
    """A batch id already applied: the same batch again changes nothing (idempotent ingest)."""

    __tablename__ = "ingested_batches"
    __table_args__ = (Index("ix_ingested_batches_received", "received_at_ns"),)
    batch_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    received_at_ns: Mapped[int] = mapped_column(BigInteger)
    collector_id: Mapped[int | None] = mapped_column(Integer)


#: States of a webhook delivery (`WebhookDelivery.state`).
WEBHOOK_STATES = ("pending", "delivered", "dropped")


class WebhookDelivery(Base):
    """One finding event for one webhook URL: the durable outbox the webhook sender delivers from.

    Written in the transaction that opens or resolves the finding, so an event is neither lost by a
    crash nor sent for a change that was rolled back. `event_id` is the same for every URL of one
    event (receivers de-duplicate on it: delivery is at least once). Times are the sender's wall
    clock (epoch ns); while a sender holds a row, `due_ns` is its lease and `claim` its token.
    """

    __tablename__ = "webhook_outbox"
    __table_args__ = (
        UniqueConstraint("event_id", "url", name="uq_webhook_outbox_event_url"),
        Index("ix_webhook_outbox_state_due", "state", "due_ns"),
    )
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    event_id: Mapped[str] = mapped_column(String(36))
    url: Mapped[str] = mapped_column(String(2048))
    #: The JSON body as sent.
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_ns: Mapped[int] = mapped_column(BigInteger)
    #: Next attempt not before this time; while claimed, when the claim expires.
    due_ns: Mapped[int] = mapped_column(BigInteger)
    #: Given up (state `dropped`) when not delivered by this time.
    deadline_ns: Mapped[int] = mapped_column(BigInteger)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    #: One of `WEBHOOK_STATES`.
    state: Mapped[str] = mapped_column(String(16), default="pending")
    claim: Mapped[str | None] = mapped_column(String(32))
    #: When it was delivered or dropped (the retention task deletes such rows after retention_days).
    done_ns: Mapped[int | None] = mapped_column(BigInteger)
    last_error: Mapped[str | None] = mapped_column(String(256))
