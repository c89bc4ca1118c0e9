"""A job's summaries rebuilt from the store: after a restart, for a job another server ingested,
or for an ended job whose summaries were released and that newer data brought back.

The store merged the job's snapshots as it ingested them, by the rules `flightdeck.analysis.merge`
lists, spelled out in SQL (`store/ingest_sql.py`, `store/ingest_ids.py`): each rank's row holds
its newest snapshot's metadata, each entry its furthest state and its frames once seen. The
rebuild reads those rows back into summaries and folds the entries in with `add_entries`.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.exc import OperationalError

from flightdeck.analysis import RankSummary, add_entries
from flightdeck.analysis.packed import pack_track
from flightdeck.records import GroupInfo
from flightdeck.server import store
from flightdeck.server.cluster import Cluster
from flightdeck.server.db import Database
from flightdeck.server.live.fold import bound_track
from flightdeck.server.live.state import JobState
from flightdeck.wire import MEMBER_LISTS


def rebuild_summaries(
    js: JobState,
    *,
    db: Database,
    cluster: Cluster | None,
    on_db_error: Callable[[], None],
    max_seqs: int,
    max_times: int,
    entries: bool = True,
    awaiting_since: float = 0.0,
) -> int:
    """Summaries of every rank of the job from the database (restart, or another server's job),
    each track cut as the fold cuts it (`fold.bound_track`: `max_seqs` collectives, the enqueue
    times of the newest `max_times`).

    `entries`: False for a job on progress digests: the ranks' metadata only. Its board (from the
    digests) finds its hangs, and the round of every rank its new board opens brings the entries
    the rest of its diagnosis reads; reading back every stored entry of a 16,384-rank job held
    the diagnosis worker for 20–30 s (the load generator, `--kill-owner-at`). The job is then
    awaiting its entries from `awaiting_since` (`JobState.awaiting_entries_since`).

    The entries are read and folded in a few ranks at a time (`store.rank_entries`): all of a
    1,024-rank x 2,000-collective job's entries as records at once took 1.2 GB. Returns how many
    entries were folded in (for the worker's `malloc_trim`), also when the database failed midway
    (`on_db_error` is called, the job's summaries stay as they were)."""
    folded = 0
    summaries: dict[int, RankSummary] = {}
    gone: dict[int, int] = {}
    seen: dict[int, int] = {}
    try:
        with db.read() as session:
            if cluster is not None:
                # One snapshot for the rows and the feed ids they include (cluster.py).
                session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
                cluster.mark_seen(session, js.job_id)
            job = store.get_job_by_id(session=session, job_id=js.job_id)
            if job is None:
                return folded
            js.world_size = job.world_size
            js.ended_at_ns = job.ended_at_ns
            if job.ended_at_ns is not None:
                js.status = job.status
            js.last_seen_ns = max(js.last_seen_ns, job.last_seen_ns)
            ranks = store.job_ranks(session=session, job_id=js.job_id)
            groups = {g.name: g for g in store.job_groups(session=session, job_id=js.job_id)}
            sids = {sid for r, _ in ranks for _, _, sid in (r.thread_stacks or []) if sid is not None}
            sids |= store.progress_stack_ids(r for r, _ in ranks)
            stacks = store.stacks_by_id(session=session, ids=sids)
            configs = store.rank_configs(session=session, job_id=js.job_id)
            # The job's groups, one object each, shared by their members (a world-sized member
            # list per rank would be ranks x world ints; diagnosis counts member lists by object).
            js.member_lists, js.lowest_member = {}, {}
            infos = {
                n: GroupInfo(
                    n,
                    g.desc,
                    None if g.ranks is None else js.intern_members(MEMBER_LISTS.as_sent(tuple(g.ranks))),
                )
                for n, g in groups.items()
            }
            of_rank = _groups_of_ranks(infos, [r.rank for r, _ in ranks])
            for r, host in ranks:
                summaries[r.rank] = RankSummary(
                    rank=r.rank,
                    source="db",
                    job=js.name,
                    attempt=js.attempt,
                    world_size=r.world_size,
                    local_rank=r.local_rank,
                    host=host,
                    pid=r.pid,
                    torch_version=r.torch_version,
                    backend=r.backend,
                    version=r.version,
                    snapshot_time_ns=r.last_snapshot_ns,
                    kind=r.kind,
                    interval_s=r.interval_s,
                    exception=r.exception,
                    wrapped=r.wrapped,
                    groups=of_rank[r.rank],
                    thread_stacks=store.thread_stacks_of(r, stacks),
                    config=configs.get(r.rank),
                    progress=store.progress_of(r, stacks),
                )
                seen[r.rank] = r.last_snapshot_ns
                if r.gone_at_ns is not None:
                    gone[r.rank] = r.gone_at_ns
            held_by_rank = (
                store.rank_entries(session=session, job_id=js.job_id, ranks=list(summaries))
                if entries
                else ()
            )
            for rank, held in held_by_rank:
                s = summaries[rank]
                add_entries(s, held)
                folded += len(held)
                for t in s.tracks.values():
                    pack_track(t)
                    bound_track(t, max_seqs=max_seqs, max_times=max_times)
    except OperationalError:
        on_db_error()
        return folded
    js.gone = gone
    js.rank_seen_ns.update(seen)
    js.summaries = summaries
    js.released = False
    js.agreed = {}
    js.dirty = True
    js.awaiting_entries_since = None if entries else awaiting_since
    return folded


def _groups_of_ranks(infos: dict[str, GroupInfo], ranks: list[int]) -> dict[int, dict[str, GroupInfo]]:
    """Each of `ranks`' groups, as its own snapshots said them: those it is a member of, and
    those whose members no rank said (given to every rank). Not every group to every rank: a job
    of 16,384 ranks in 3,081 groups made that 50 M dict entries, 2.7 GB, and a diagnosis walking
    them for more than 30 s after a takeover (the load generator, `--kill-owner-at`)."""
    unknown = {n: i for n, i in infos.items() if i.ranks is None}
    out = {r: dict(unknown) for r in ranks}
    for name, info in infos.items():
        for r in info.ranks or ():
            mine = out.get(r)
            if mine is not None:
                mine[name] = info
    return out
