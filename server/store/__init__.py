"""All SQL of the server: keyword-only functions that take a Session and never commit.

The caller (ingest, diagnosis, routes) owns the transaction: one batch is one transaction, so a
batch is applied completely or not at all, and its id is recorded in the same transaction
(idempotency). Upserts use the dialect's INSERT ... ON CONFLICT (SQLite and PostgreSQL spell it
the same way) and executemany, so a batch of 50,000 entries is a handful of statements.

Callers use this package as one namespace (`from flightdeck.server import store`,
`store.ingest_batches(...)`); each module holds one aggregate:

- `common`: shared helpers (the dialect's INSERT, chunking, driver-level reads).
- `ingest`: the ingest transaction (`ingest_batches`, `claim_batches`, `upsert_job`).
- `ingest_ids`: the row ids an ingest refers to, and their per-process cache (`IngestCache`).
- `ingest_rows`: the entries and ranks rows and their upserts; their statements in
  `ingest_sql` (shared parts), `ingest_pg` and `ingest_sqlite` (per dialect).
- `configs`: rank configuration reports.
- `nixl`: NIXL agents and their sample history.
- `jobs`: reads of jobs, ranks, groups and stacks; `entries`: reads of entries and windows.
- `findings`, `tokens` (collector tokens), `cluster` (several servers on one PostgreSQL),
  `digests` (the progress digests and rounds those servers share),
  `retention`, `outbox` (webhook deliveries).

Only what callers use is re-exported here (the public names, and `_upsert_entries`, which the
ingest tests and benchmarks call directly); everything else lives in its module.
"""

from __future__ import annotations

from flightdeck.server.store.cluster import (
    add_feed,
    disown_job,
    feed_after,
    feed_bodies,
    feed_snapshot,
    ping,
    prune_feed,
    try_lead,
    try_own_job,
)
from flightdeck.server.store.configs import checkpoint_peers, rank_configs
from flightdeck.server.store.digests import add_digests, digests_after, open_round, open_rounds, prune_digests
from flightdeck.server.store.entries import (
    count_entries,
    group_seq_ranges,
    load_entries,
    rank_entries,
    rank_seq_ranges,
    recent_entries,
    timeline,
    window_cells,
    window_entries,
)
from flightdeck.server.store.findings import (
    FindingEvent,
    apply_findings,
    finding_row_key,
    findings_history,
    open_finding_counts,
    open_findings,
)
from flightdeck.server.store.ingest import (
    AppliedGone,
    AppliedSnapshot,
    IngestResult,
    claim_batches,
    ingest_batches,
    upsert_job,
)
from flightdeck.server.store.ingest_ids import CacheUpdate, IngestCache
from flightdeck.server.store.ingest_rows import _upsert_entries
from flightdeck.server.store.ingest_sql import ENTRY_COLUMNS
from flightdeck.server.store.jobs import (
    JobBrief,
    active_jobs,
    get_job,
    get_job_by_id,
    gone_ranks,
    host_counts,
    job_groups,
    job_rank_hosts,
    job_ranks,
    list_jobs,
    list_jobs_plan,
    progress_of,
    progress_stack_ids,
    rank_counts,
    recent_jobs,
    stacks_by_id,
    table_counts,
    thread_stacks_of,
)
from flightdeck.server.store.nixl import (
    NIXL_COUNTERS,
    NIXL_HISTOGRAMS,
    NIXL_HISTORY_STEP_NS,
    nixl_agents,
    nixl_history,
    nixl_totals,
    upsert_nixl,
)
from flightdeck.server.store.outbox import (
    ClaimedDelivery,
    add_webhook_deliveries,
    claim_webhook_deliveries,
    prune_webhook_outbox,
    release_webhook_deliveries,
    settle_webhook_delivery,
    webhook_deliveries,
    webhook_outbox_status,
)
from flightdeck.server.store.retention import (
    db_size_bytes,
    delete_entries_before,
    delete_nixl_samples_before,
    trim_entries,
)
from flightdeck.server.store.tokens import active_token, create_token, list_tokens, revoke_token

__all__ = [
    "ENTRY_COLUMNS",
    "NIXL_COUNTERS",
    "NIXL_HISTOGRAMS",
    "NIXL_HISTORY_STEP_NS",
    "AppliedGone",
    "AppliedSnapshot",
    "CacheUpdate",
    "ClaimedDelivery",
    "FindingEvent",
    "IngestCache",
    "IngestResult",
    "JobBrief",
    "_upsert_entries",
    "active_jobs",
    "active_token",
    "add_digests",
    "add_feed",
    "add_webhook_deliveries",
    "apply_findings",
    "checkpoint_peers",
    "claim_batches",
    "claim_webhook_deliveries",
    "count_entries",
    "create_token",
    "db_size_bytes",
    "delete_entries_before",
    "delete_nixl_samples_before",
    "digests_after",
    "disown_job",
    "feed_after",
    "feed_bodies",
    "feed_snapshot",
    "finding_row_key",
    "findings_history",
    "get_job",
    "get_job_by_id",
    "gone_ranks",
    "group_seq_ranges",
    "host_counts",
    "ingest_batches",
    "job_groups",
    "job_rank_hosts",
    "job_ranks",
    "list_jobs",
    "list_jobs_plan",
    "list_tokens",
    "load_entries",
    "nixl_agents",
    "nixl_history",
    "nixl_totals",
    "open_finding_counts",
    "open_findings",
    "open_round",
    "open_rounds",
    "ping",
    "progress_of",
    "progress_stack_ids",
    "prune_digests",
    "prune_feed",
    "prune_webhook_outbox",
    "rank_configs",
    "rank_counts",
    "rank_entries",
    "rank_seq_ranges",
    "recent_entries",
    "recent_jobs",
    "release_webhook_deliveries",
    "revoke_token",
    "settle_webhook_delivery",
    "stacks_by_id",
    "table_counts",
    "thread_stacks_of",
    "timeline",
    "trim_entries",
    "try_lead",
    "try_own_job",
    "upsert_job",
    "upsert_nixl",
    "webhook_deliveries",
    "webhook_outbox_status",
    "window_cells",
    "window_entries",
]
