"""`WebData` over flight-recorder dumps on disk, analysed in process (no server, no database).

The same path `flightdeck analyze` takes: read each file with the reader, merge a rank's
snapshots, summarize, diagnose. It serves the web tests (real dumps of real gloo jobs, rendered
from it and from the server's `StoreData` alike) and the benchmarks; the product's pages read the
server's store (`flightdeck.server.page_data.StoreData`).
"""

from __future__ import annotations

import bisect
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from flightdeck.analysis import Options, Report, diagnose, summarize
from flightdeck.readers.fr.files import discover, read_dump_file
from flightdeck.readers.fr.merge import merge
from flightdeck.records import Entry, RankDump
from flightdeck.spool import rank_from_name
from flightdeck.web.data import Detail, RankDetail, RankTrack, ThreadStackData, TimelineData

Snapshots = Literal["all", "live"]


@dataclass(slots=True)
class _GroupEntries:
    """One rank's entries of one group, sorted by seq (with the seqs alongside, for bisect)."""

    seqs: list[int] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)


@dataclass(slots=True)
class _Job:
    name: str
    attempt: int
    active: bool
    report: Report
    dumps: dict[int, RankDump]
    tracks: dict[int, dict[str, _GroupEntries]]
    groups: list[dict[str, Any]]
    last_seen_s: float | None


class DumpData:
    """Jobs analysed from `RankDump`s; build it with `from_dirs` or `from_dumps`."""

    def __init__(self, jobs: Iterable[_Job], nixl: Sequence[Mapping[str, Any]] = ()) -> None:
        self._jobs = {j.name: j for j in jobs}
        self._nixl = [dict(a) for a in nixl]

    @classmethod
    def from_dirs(
        cls,
        dirs: Mapping[str, Path],
        *,
        options: Options | None = None,
        snapshots: Snapshots = "all",
        active: Iterable[str] = (),
        nixl: Sequence[Mapping[str, Any]] = (),
    ) -> DumpData:
        """One job per directory (`{job name: dir}`).

        `snapshots="live"` leaves out each rank's `final` snapshot: what a live server saw while
        the job was still up, before a gloo timeout retired every pending op on the way out.
        """
        jobs = []
        on = set(active)
        for name, d in dirs.items():
            by_rank: dict[int, list[RankDump]] = defaultdict(list)
            for p in discover([d]):
                if snapshots == "live" and ".final." in p.name:
                    continue
                dump = read_dump_file(p)
                rank = dump.rank if dump.rank is not None else rank_from_name(p.name)
                if rank is not None:
                    by_rank[rank].append(dump)
            merged = [merge(ds) for _, ds in sorted(by_rank.items())]
            jobs.append(build_job(name, merged, options=options, active=name in on))
        return cls(jobs, nixl)

    @classmethod
    def from_dumps(
        cls,
        jobs: Mapping[str, Sequence[RankDump]],
        *,
        options: Options | None = None,
        active: Iterable[str] = (),
        nixl: Sequence[Mapping[str, Any]] = (),
    ) -> DumpData:
        """Jobs from merged dumps already in memory (one per rank)."""
        on = set(active)
        return cls([build_job(n, ds, options=options, active=n in on) for n, ds in jobs.items()], nixl)

    # --- WebData --------------------------------------------------------------------------------

    def list_jobs(
        self,
        *,
        status: str | None = None,
        search: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """All jobs, newest first (a folder of dumps holds few: the filters apply to the name only,
        and the status filter to none; no pages)."""
        out = []
        for j in sorted(self._jobs.values(), key=lambda j: (-(j.last_seen_s or 0), j.name)):
            if search and search.lower() not in j.name.lower():
                continue
            rep = j.report.to_json()
            out.append(
                {
                    "job": j.name,
                    "attempt": j.attempt,
                    "active": j.active,
                    "healthy": rep["healthy"],
                    "ranks_expected": rep["ranks"]["expected"],
                    "ranks_reporting": len(rep["ranks"]["with_dump"]),
                    "hosts": len({d.host for d in j.dumps.values()}),
                    # The oldest collective the rings still hold: a lower bound of the job's start.
                    "first_seen_s": min(
                        (
                            e.time_created_ns / 1e9
                            for d in j.dumps.values()
                            for e in d.entries
                            if e.time_created_ns
                        ),
                        default=None,
                    ),
                    "last_seen_s": j.last_seen_s,
                    "open_findings": len(rep["findings"]),
                    "root_cause": rep["findings"][0] if rep["findings"] else None,
                }
            )
        return out

    def job_report(self, job: str) -> dict[str, Any] | None:
        """The verdict (`Report.to_json()`)."""
        j = self._jobs.get(job)
        return None if j is None else j.report.to_json()

    def job_meta(self, job: str) -> dict[str, Any] | None:
        """Groups with their seq ranges, liveness."""
        j = self._jobs.get(job)
        if j is None:
            return None
        return {
            "job": j.name,
            "attempt": j.attempt,
            "active": j.active,
            "world_size": j.report.expected_ranks,
            "last_seen_s": j.last_seen_s,
            "groups": j.groups,
        }

    def job_version(self, job: str) -> str | None:
        """None: the dumps are analysed per request, nothing is cached."""
        return None

    def timeline(
        self,
        job: str,
        *,
        group: str,
        ranks: Sequence[int] | None,
        seqs: tuple[int, int] | None,
        detail: Detail = "entries",
    ) -> TimelineData:
        """The group's entries per rank in the seq window (bisect: cost follows the window); whole
        entries whatever the `detail` (they are in memory already)."""
        j = self._jobs.get(job)
        if j is None:
            return TimelineData(group=group, ranks=[])
        wanted = sorted(j.dumps) if ranks is None else [r for r in sorted(set(ranks)) if r in j.dumps]
        out = []
        for r in wanted:
            d = j.dumps[r]
            ge = j.tracks[r].get(group)
            if ge is None or not ge.seqs:
                out.append(RankTrack(rank=r, host=d.host, pid=d.pid))
                continue
            if seqs is None:
                chosen: Sequence[Entry] = ge.entries
            else:
                lo = bisect.bisect_left(ge.seqs, seqs[0])
                hi = bisect.bisect_right(ge.seqs, seqs[1])
                chosen = ge.entries[lo:hi]
            out.append(
                RankTrack(
                    rank=r, host=d.host, pid=d.pid, entries=chosen, first_seq=ge.seqs[0], last_seq=ge.seqs[-1]
                )
            )
        return TimelineData(group=group, ranks=out)

    def rank_detail(self, job: str, rank: int) -> RankDetail | None:
        """The rank's newest snapshot: recent entries and thread stacks."""
        j = self._jobs.get(job)
        d = None if j is None else j.dumps.get(rank)
        if d is None:
            return None
        recent = sorted(d.entries, key=lambda e: (e.time_created_ns, e.record_id))[-50:]
        return RankDetail(
            rank=rank,
            host=d.host,
            pid=d.pid,
            snapshot_time_ns=d.snapshot_time_ns,
            snapshot_kind=d.kind,
            exception=d.exception,
            recent=recent,
            thread_stacks=[
                ThreadStackData(
                    thread_name=s.thread_name,
                    frames=[{"name": f.name, "filename": f.filename, "line": f.line} for f in s.frames],
                )
                for s in d.thread_stacks
            ],
        )

    def nixl_agents(self) -> list[dict[str, Any]]:
        """The NIXL samples given at construction."""
        return [dict(a) for a in self._nixl]


def build_job(name: str, dumps: Sequence[RankDump], *, options: Options | None, active: bool) -> _Job:
    """Diagnose merged dumps (one per rank) at the newest snapshot's time and index their entries."""
    summaries = [summarize(d) for d in dumps]
    times = [d.snapshot_time_ns for d in dumps if d.snapshot_time_ns]
    now_ns = max(times) if times else time.time_ns()
    report = diagnose(summaries, now_ns=now_ns, options=options or Options(), job=name)
    tracks: dict[int, dict[str, _GroupEntries]] = {}
    ranges: dict[str, list[int]] = {}
    descs: dict[str, str] = {}
    members: dict[str, tuple[int, ...] | None] = {}
    for d in dumps:
        per: dict[str, _GroupEntries] = defaultdict(_GroupEntries)
        for e in sorted((e for e in d.entries if not e.is_p2p), key=lambda e: e.collective_seq_id):
            ge = per[e.group]
            if ge.seqs and ge.seqs[-1] == e.collective_seq_id:
                ge.entries[-1] = e  # a merged dump may repeat a seq: keep the newest
                continue
            ge.seqs.append(e.collective_seq_id)
            ge.entries.append(e)
        tracks[d.rank] = dict(per)
        for g, ge in per.items():
            lo_hi = ranges.setdefault(g, [ge.seqs[0], ge.seqs[-1]])
            lo_hi[0], lo_hi[1] = min(lo_hi[0], ge.seqs[0]), max(lo_hi[1], ge.seqs[-1])
        for g, info in d.groups.items():
            descs.setdefault(g, info.desc)
            members.setdefault(g, info.ranks)
    groups = [
        {
            "name": g,
            "desc": descs.get(g, ""),
            "ranks": None if members.get(g) is None else list(members[g] or ()),
            "min_seq": lo,
            "max_seq": hi,
        }
        for g, (lo, hi) in sorted(ranges.items(), key=lambda kv: _group_key(kv[0]))
    ]
    return _Job(
        name=name,
        attempt=max((d.attempt for d in dumps), default=0),
        active=active,
        report=report,
        dumps={d.rank: d for d in dumps},
        tracks=tracks,
        groups=groups,
        last_seen_s=now_ns / 1e9 if times else None,
    )


def _group_key(name: str) -> tuple[int, int | str]:
    # Group names are "0", "1", ... in creation order: sort them numerically, the default first.
    return (0, int(name)) if name.isdigit() else (1, name)


def replicate_dumps(dumps: Sequence[RankDump], n_ranks: int) -> list[RankDump]:
    """Scale a real job up to `n_ranks`: rank i is a copy of real rank `i % len(dumps)`, on host
    `<host>-<i // 8>` (eight ranks a host), in world-spanning groups of `n_ranks` members.

    The entries, frames and timings are the real ones, so the diagnosis sees the real fault,
    repeated: for load tests, benchmarks and the "1,024 ranks fold into a handful of rows" test.
    """
    if not dumps:
        raise ValueError("need at least one dump to replicate")
    src = sorted(dumps, key=lambda d: d.rank)
    members = tuple(range(n_ranks))
    out = []
    for i in range(n_ranks):
        d = src[i % len(src)]
        groups = {
            name: replace(info, ranks=members if info.ranks and len(info.ranks) == len(src) else info.ranks)
            for name, info in d.groups.items()
        }
        out.append(
            replace(
                d,
                rank=i,
                host=f"{d.host or 'host'}-{i // 8}",
                pid=(d.pid or 0) * 10_000 + i,
                world_size=n_ranks,
                groups=groups,
                entries=list(d.entries),
            )
        )
    return out
