"""The statement parts both dialects' entries and ranks upserts share: the column
orders and the ON CONFLICT clauses (what a re-sent row may change)."""

from __future__ import annotations

#: Column order of the entry columns `_upsert_entries` takes.
ENTRY_COLUMNS = (
    "job_id",
    "rank",
    "record_id",
    "group_id",
    "seq",
    "p2p_seq",
    "op_id",
    "sig_id",
    "state",
    "retired",
    "time_created_ns",
    "time_started_ns",
    "time_completed_ns",
    "duration_ms",
    "timeout_ms",
    "thread_name",
    "peer",
    "stack_id",
)
_COLS = ", ".join(ENTRY_COLUMNS)
#: Whether a re-sent entry is at least as far along as the stored row: a higher state
#: (scheduled 0 < started 1 < completed 2), or the same one and not un-retired (a row-value
#: comparison is exactly that order, in SQLite and PostgreSQL alike). An older
#: snapshot arriving after a newer one (a retried or re-queued batch) is not: it must not move
#: the row back.
_FORWARD = "((excluded.state, excluded.retired) >= (entries.state, entries.retired))"  # row order
#: What a re-sent entry may change: its progress, only forward, and frames once a stall
#: snapshot brings them (even an older one: frames are never taken away). A row neither moves
#: nor gains frames is not written at all (the WHERE).
_ON_CONFLICT = (
    "ON CONFLICT (job_id, rank, record_id) DO UPDATE SET "
    + ", ".join(
        f"{c} = CASE WHEN {_FORWARD} THEN excluded.{c} ELSE entries.{c} END"
        for c in ("state", "retired", "time_started_ns", "time_completed_ns", "duration_ms")
    )
    + f", stack_id = COALESCE(CASE WHEN {_FORWARD} THEN excluded.stack_id END, entries.stack_id, "
    "excluded.stack_id) "
    f"WHERE {_FORWARD} OR (entries.stack_id IS NULL AND excluded.stack_id IS NOT NULL)"
)


_RANK_COLUMNS = (
    "job_id", "rank", "host_id", "pid", "local_rank", "world_size", "last_snapshot_ns", "received_ns",
    "kind", "interval_s", "exception", "wrapped", "oldest_record_id", "torch_version", "backend",
    "version", "thread_stacks", "progress",
)  # fmt: skip


_RANK_KEEP = ("host_id", "pid", "local_rank", "world_size", "interval_s", "exception", "oldest_record_id",
              "torch_version", "backend", "thread_stacks", "progress")  # fmt: skip
_RANK_UPSERT = (
    f"INSERT INTO ranks ({', '.join(_RANK_COLUMNS)}) {{values}} "
    "ON CONFLICT (job_id, rank) DO UPDATE SET "
    + ", ".join(
        f"{c} = COALESCE(excluded.{c}, ranks.{c})" if c in _RANK_KEEP else f"{c} = excluded.{c}"
        for c in _RANK_COLUMNS[2:]
    )
    # A rank seen again after its process was reported gone (same pid, a later snapshot) is back.
    + ", gone_at_ns = CASE WHEN ranks.gone_at_ns < excluded.last_snapshot_ns THEN NULL "
    "ELSE ranks.gone_at_ns END"
    # A late, older snapshot (a retried batch overtaken by a newer one) must not roll back, and
    # the same snapshot again (a replay) changes nothing.
     + " WHERE ranks.last_snapshot_ns < excluded.last_snapshot_ns"
)
