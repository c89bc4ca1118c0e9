"""The jobs page: one line per job, the ones to act on first."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flightdeck.analysis.findings import MISMATCH_KINDS
from flightdeck.web.views.fmt import fmt_datetime_s, fmt_duration, fmt_ranks
from flightdeck.web.views.verdict import TITLES


@dataclass(frozen=True, slots=True)
class JobRow:
    """One line of the jobs page."""

    job: str
    attempt: int
    active: bool
    healthy: bool | None
    #: One of `JOB_STATUS_ORDER`.
    status: str
    ranks: str
    hosts: str
    #: Open findings (the root cause is the first).
    findings: int
    #: How long the job has been seen (first to last report), and when it last reported.
    age: str
    last_seen: str
    summary: str
    #: When the job ended (every rank final or gone); '' while it runs.
    ended: str = ""


@dataclass(frozen=True, slots=True)
class JobsView:
    """The jobs page: one page of the list, with the filters it was asked for."""

    jobs: list[JobRow]
    any_active: bool
    #: The status filter ('' for any) and the name search ('' for none).
    status: str = ""
    search: str = ""
    #: The statuses the filter offers.
    statuses: tuple[str, ...] = ()
    #: The `before` value of the next page, '' when this is the last.
    next_before: str = ""


#: Job statuses in the order the jobs page lists them: the ones to act on first.
JOB_STATUS_ORDER = (
    "hung",
    "mismatch",
    "lost",
    "failed",
    "fault",
    "slow",
    "no_data",
    "unknown",
    "running",
    "finished",
)

#: The statuses the server gives a job (`flightdeck.server.models.JOB_STATUSES`), the filter's choices.
FILTER_STATUSES = ("running", "slow", "hung", "mismatch", "lost", "no_data", "finished", "failed")

#: Jobs per page of the jobs page.
JOBS_PAGE = 100


def _job_status(j: Mapping[str, Any], rc: Any) -> str:
    """The server's job status when given (`FILTER_STATUSES`), else the one the verdict
    implies, as the server's `job_status` derives it."""
    given = j.get("status")
    if isinstance(given, str) and given in JOB_STATUS_ORDER:
        return given
    healthy = j.get("healthy")
    if healthy is None:
        return "unknown"
    if not healthy:
        kind = rc.get("kind") if isinstance(rc, Mapping) else None
        if kind in ("hang", "state_mismatch"):
            return "hung"
        if kind in MISMATCH_KINDS:
            return "mismatch"
        return "lost" if kind == "rank_lost" else "fault"
    return "running" if j.get("active") else "finished"


def jobs_view(
    jobs: list[dict[str, Any]], *, status: str = "", search: str = "", page: int | None = None
) -> JobsView:
    """The jobs page from `WebData.list_jobs()` items (unknown keys are ignored): hung jobs
    first, then mismatched, lost, failed, other faults, slow, without data, unknown, running and
    finished ones, each in the given (newest first) order. `page`: the page size asked for (a
    full page has a next one)."""
    rows = []
    for j in jobs:
        healthy = j.get("healthy")
        rc = j.get("root_cause")
        status = _job_status(j, rc)
        summary = ""
        if isinstance(rc, Mapping):
            where = [TITLES.get(str(rc.get("kind")), str(rc.get("kind")))]
            if rc.get("process_group") is not None:
                where.append(f"group {rc['process_group']}")
            if rc.get("collective_seq_id") is not None:
                where.append(f"seq {rc['collective_seq_id']}")
            if rc.get("op"):
                where.append(str(rc["op"]))
            if rc.get("culprit_ranks"):
                where.append(f"culprit {fmt_ranks(rc['culprit_ranks'], limit=4)}")
            summary = where[0] + (": " + ", ".join(where[1:]) if len(where) > 1 else "")
        expected, reporting = j.get("ranks_expected"), j.get("ranks_reporting")
        ranks = f"{reporting}/{expected}" if expected is not None else str(reporting or "")
        first, last = j.get("first_seen_s"), j.get("last_seen_s")
        rows.append(
            JobRow(
                job=str(j.get("job", "")),
                attempt=int(j.get("attempt") or 0),
                active=bool(j.get("active")),
                healthy=None if healthy is None else bool(healthy),
                status=status,
                ranks=ranks,
                hosts="" if j.get("hosts") is None else str(j["hosts"]),
                findings=int(j.get("open_findings") or 0),
                age=fmt_duration(float(last) - float(first))
                if first is not None and last is not None
                else "",
                last_seen=fmt_datetime_s(j.get("last_seen_s")),
                summary=summary,
                ended=fmt_datetime_s(j.get("ended_at_s")) if j.get("ended_at_s") is not None else "",
            )
        )
    rows.sort(key=lambda r: JOB_STATUS_ORDER.index(r.status))
    full = page is not None and len(jobs) >= page
    return JobsView(
        jobs=rows,
        any_active=any(r.active for r in rows),
        status=status,
        search=search,
        statuses=FILTER_STATUSES,
        next_before=str(jobs[-1].get("cursor") or "") if full and jobs else "",
    )
