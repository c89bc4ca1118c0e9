"""`WebData` over the server's SQL store and its live diagnosis (what `flightdeck server` serves).

Data flows store -> web: the verdict is the live diagnosis' latest `Report` (no re-diagnosis per
page view), else the report stored with the job (a job no worker has diagnosed since a restart),
else an empty one. Entries are read per window (`store.window_cells` for the timeline, `store.window_entries`
where whole entries are shown) and seq ranges come from index seeks (`store.group_seq_ranges`,
`store.rank_seq_ranges`), so no page loads a whole ring.
Every method opens its own read session: safe from FastAPI's worker threads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.orm import Session

from flightdeck.analysis import Report
from flightdeck.analysis.diagnose import missing_ranks
from flightdeck.nixl_rates import RATE_WINDOW_S
from flightdeck.server import store
from flightdeck.server.db import Database
from flightdeck.server.live import LiveDiagnosis
from flightdeck.server.models import Job
from flightdeck.web.data import Detail, RankDetail, RankTrack, ThreadStackData, TimelineData
from flightdeck.web.views import seq_of, verdict_fingerprint

NS = 1_000_000_000

#: Entries shown on a rank page.
RECENT_ENTRIES = 50


def _group_key(name: str) -> tuple[int, int | str]:
    # Group names are "0", "1", ... in creation order: sort them numerically, the default first.
    return (0, int(name)) if name.isdigit() else (1, name)


class StoreData:
    """The pages' data from the database (`db`) and the in-memory diagnosis (`live`)."""

    def __init__(
        self, *, db: Database, live: LiveDiagnosis, clock: Callable[[], int], job_idle_s: float
    ) -> None:
        self._db = db
        self._live = live
        self._clock = clock
        self._job_idle_s = job_idle_s

    # --- helpers --------------------------------------------------------------------------------

    def _active(self, j: Job) -> bool:
        return j.ended_at_ns is None and (self._clock() - j.last_seen_ns) / NS <= self._job_idle_s

    def _report(self, session: Session, j: Job) -> dict[str, Any]:
        js = self._live.jobs.get(j.id)
        if js is not None and js.report is not None:
            return js.report.to_json()
        if j.report is not None:
            return dict(j.report)
        ranks = [r.rank for r, _ in store.job_ranks(session=session, job_id=j.id)]
        expected = j.world_size or (max(ranks) + 1 if ranks else 0)
        without, missing = missing_ranks(ranks, expected)
        return Report(
            expected_ranks=expected,
            with_dump=ranks,
            without_dump=without,
            without_dump_count=missing,
            findings=[],
            job=j.name,
            now_s=j.last_seen_ns / NS,
        ).to_json()

    # --- WebData --------------------------------------------------------------------------------

    def list_jobs(
        self,
        *,
        status: str | None = None,
        search: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """The latest attempt of each job on a page of the job list (`store.list_jobs`), most
        recently seen first."""
        out = []
        seen: set[str] = set()
        cursor = None
        if before:
            t, _, i = before.partition(".")
            cursor = (int(t), int(i)) if t.isdigit() and i.isdigit() else None
        with self._db.read() as session:
            jobs = store.list_jobs(session=session, status=status, name=search, before=cursor, limit=limit)
            ids = [j.id for j in jobs]
            counts = store.rank_counts(session=session, job_ids=ids)
            hosts = store.host_counts(session=session, job_ids=ids)
            newest: dict[str, int] = {}
            for j in jobs:
                newest[j.name] = max(newest.get(j.name, j.attempt), j.attempt)
            for j in jobs:
                if j.name in seen or j.attempt != newest[j.name]:
                    continue  # one row per job: its latest attempt, as /jobs/{job} shows
                seen.add(j.name)
                rep = self._report(session, j)
                findings = rep.get("findings") or []
                out.append(
                    {
                        "job": j.name,
                        "attempt": j.attempt,
                        "active": self._active(j),
                        "status": j.status,
                        "healthy": rep.get("healthy"),
                        "ranks_expected": (rep.get("ranks") or {}).get("expected") or j.world_size,
                        "ranks_reporting": counts.get(j.id, 0),
                        "hosts": hosts.get(j.id, 0),
                        "first_seen_s": j.first_seen_ns / NS,
                        "last_seen_s": j.last_seen_ns / NS,
                        "ended_at_s": None if j.ended_at_ns is None else j.ended_at_ns / NS,
                        "open_findings": len(findings),
                        "root_cause": findings[0] if findings else None,
                        "cursor": f"{j.last_seen_ns}.{j.id}",
                    }
                )
        return out

    def job_report(self, job: str) -> dict[str, Any] | None:
        """The verdict of the job's latest attempt (`Report.to_json()`)."""
        with self._db.read() as session:
            j = store.get_job(session=session, name=job)
            return None if j is None else self._report(session, j)

    def job_meta(self, job: str) -> dict[str, Any] | None:
        """Groups with their seq ranges (aggregated in SQL), liveness."""
        with self._db.read() as session:
            j = store.get_job(session=session, name=job)
            if j is None:
                return None
            ranges = store.group_seq_ranges(session=session, job_id=j.id)
            groups = []
            for g in sorted(store.job_groups(session=session, job_id=j.id), key=lambda g: _group_key(g.name)):
                if g.id not in ranges:
                    continue  # a group without collectives has no timeline
                lo, hi = ranges[g.id]
                groups.append(
                    {
                        "name": g.name,
                        "desc": g.desc,
                        "ranks": None if g.ranks is None else [int(r) for r in g.ranks],
                        "min_seq": lo,
                        "max_seq": hi,
                    }
                )
            world = j.world_size
            if world is None:
                world = (self._report(session, j).get("ranks") or {}).get("expected")
            return {
                "job": j.name,
                "attempt": j.attempt,
                "active": self._active(j),
                "status": j.status,
                "world_size": world,
                "last_seen_s": j.last_seen_ns / NS,
                "groups": groups,
            }

    def job_version(self, job: str) -> str | None:
        """The job's row (last seen, status, liveness) and its verdict's fingerprint: one indexed
        read and the in-memory verdict, so a quiet page's poll answers 304 in milliseconds."""
        with self._db.read() as session:
            j = store.get_job(session=session, name=job)
            if j is None:
                return None
            shown = (j.id, j.last_seen_ns, j.status, j.world_size, self._active(j))
            return repr((shown, verdict_fingerprint(self._report(session, j))))

    def timeline(
        self,
        job: str,
        *,
        group: str,
        ranks: Sequence[int] | None,
        seqs: tuple[int, int] | None,
        detail: Detail = "entries",
    ) -> TimelineData:
        """The group's entries per rank in the seq window, with each rank's whole seq range:
        records, or for "cells" and "spans" plain dicts of what the timeline shows."""
        with self._db.read() as session:
            j = store.get_job(session=session, name=job)
            if j is None:
                return TimelineData(group=group, ranks=[])
            grow = next((g for g in store.job_groups(session=session, job_id=j.id) if g.name == group), None)
            known = store.job_rank_hosts(session=session, job_id=j.id)
            wanted = set(ranks) if ranks is not None else None
            rows = [row for row in known if wanted is None or row[0] in wanted]
            if grow is None:
                return TimelineData(group=group, ranks=[RankTrack(rank=r, host=h, pid=p) for r, p, h in rows])
            only = None if wanted is None else sorted(wanted)
            seq_from, seq_to = (None, None) if seqs is None else seqs
            entries: dict[int, list[Any]]
            if detail == "entries":
                entries = store.window_entries(
                    session=session,
                    job_id=j.id,
                    group_id=grow.id,
                    group_name=group,
                    ranks=only,
                    seq_from=seq_from,
                    seq_to=seq_to,
                )
            else:
                entries = store.window_cells(
                    session=session,
                    job_id=j.id,
                    group_id=grow.id,
                    ranks=only,
                    seq_from=seq_from,
                    seq_to=seq_to,
                    spans=detail == "spans",
                )
            bounds = store.rank_seq_ranges(
                session=session, job_id=j.id, group_id=grow.id, ranks=self._gaps(rows, entries, grow, seqs)
            )
            tracks = []
            for r, p, h in rows:
                mine = entries.get(r, [])
                lo_hi = bounds.get(r)
                if lo_hi is None and mine:
                    lo_hi = (seq_of(mine[0]), seq_of(mine[-1]))
                tracks.append(
                    RankTrack(
                        rank=r,
                        host=h,
                        pid=p,
                        entries=mine,
                        first_seq=None if lo_hi is None else lo_hi[0],
                        last_seq=None if lo_hi is None else lo_hi[1],
                    )
                )
            return TimelineData(group=group, ranks=tracks)

    @staticmethod
    def _gaps(
        rows: Sequence[tuple[int, int | None, str | None]],
        entries: dict[int, list[Any]],
        group: Any,
        seqs: tuple[int, int] | None,
    ) -> list[int]:
        """The member ranks whose window misses a seq: only theirs need the whole ring's bounds
        (to tell "never entered" from "not recorded"); the others' come from their window."""
        members = None if group.ranks is None else {int(x) for x in group.ranks}
        size = None if seqs is None else seqs[1] - seqs[0] + 1
        return [
            r
            for r, _, _ in rows
            if (members is None or r in members) and (size is None or len(entries.get(r, ())) < size)
        ]

    def rank_detail(self, job: str, rank: int) -> RankDetail | None:
        """The rank's latest snapshot: where it runs, its thread stacks, its recent entries."""
        with self._db.read() as session:
            j = store.get_job(session=session, name=job)
            if j is None:
                return None
            found = next(
                ((r, h) for r, h in store.job_ranks(session=session, job_id=j.id) if r.rank == rank), None
            )
            if found is None:
                return None
            row, host = found
            ids = [sid for _, _, sid in (row.thread_stacks or []) if sid is not None]
            stacks = store.stacks_by_id(session=session, ids=ids)
            threads = store.thread_stacks_of(row, stacks)
            recent = store.recent_entries(session=session, job_id=j.id, rank=rank, limit=RECENT_ENTRIES)
            return RankDetail(
                rank=rank,
                host=host,
                pid=row.pid,
                snapshot_time_ns=row.last_snapshot_ns,
                snapshot_kind=row.kind,
                exception=row.exception,
                recent=recent,
                thread_stacks=[
                    ThreadStackData(
                        thread_name=t.thread_name,
                        frames=[{"name": f.name, "filename": f.filename, "line": f.line} for f in t.frames],
                    )
                    for t in threads
                ],
            )

    def nixl_agents(self) -> list[dict[str, Any]]:
        """The latest stored sample of every NIXL agent, with its totals over all counter runs and
        its kept samples of the rate window before the latest (`store.nixl_history`), and how
        old the latest is by the server's clock."""
        with self._db.read() as session:
            history = store.nixl_history(session=session, window_ns=int(RATE_WINDOW_S * NS))
            now = self._clock()
            return [
                {
                    **a.sample,
                    "totals": store.nixl_totals(a),
                    "history": history.get(a.id, []),
                    "age_s": max(0.0, (now - a.read_time_ns) / NS),
                }
                for a in store.nixl_agents(session=session)
            ]
