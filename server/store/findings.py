"""Findings: the open ones and the history of a job, and the reconciliation of a diagnosis with
the stored findings (`apply_findings`); a finding's identity across diagnoses is
`flightdeck.analysis.findings.finding_key`."""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from flightdeck.analysis import Finding
from flightdeck.analysis.findings import FindingKey, finding_key
from flightdeck.server.models import RESOLUTION_ENDED, FindingRow, Job


@dataclass(frozen=True, slots=True)
class FindingEvent:
    """A finding that was opened or resolved by one diagnosis (for webhooks and counters)."""

    event: str  # "finding.opened" | "finding.resolved"
    row_id: int
    kind: str
    data: dict[str, Any]


def open_findings(*, session: Session, job_id: int) -> list[FindingRow]:
    """The job's open findings, oldest first."""
    q = (
        select(FindingRow)
        .where(FindingRow.job_id == job_id, FindingRow.resolved_at_ns.is_(None))
        .order_by(FindingRow.opened_at_ns, FindingRow.id)
    )
    return list(session.execute(q).scalars())


def finding_row_key(row: FindingRow) -> FindingKey:
    """A stored finding's identity, as `finding_key` gives it for a diagnosed one."""
    return (row.kind, row.group_key, row.seq_key, row.rank_key)


def open_finding_counts(*, session: Session, job_ids: Sequence[int] | None = None) -> dict[int, int]:
    """job id -> number of open findings (jobs without any are absent); of `job_ids` only when
    given."""
    q = (
        select(FindingRow.job_id, func.count())
        .where(FindingRow.resolved_at_ns.is_(None))
        .group_by(FindingRow.job_id)
    )
    if job_ids is not None:
        q = q.where(FindingRow.job_id.in_(list(job_ids)))
    return {j: int(n) for j, n in session.execute(q).tuples()}


def findings_history(*, session: Session, job_id: int) -> list[FindingRow]:
    """Every finding episode of a job (open and resolved), oldest first."""
    q = select(FindingRow).where(FindingRow.job_id == job_id).order_by(FindingRow.opened_at_ns, FindingRow.id)
    return list(session.execute(q).scalars())


def apply_findings(
    *,
    session: Session,
    job_id: int,
    findings: Sequence[Finding],
    report: dict[str, Any],
    status: str,
    now_ns: int,
    last_seen_ns: int | None = None,
    ended_at_ns: int | None = None,
    keep: Container[FindingKey] = (),
) -> list[FindingEvent]:
    """Reconcile a diagnosis with the stored findings: open new ones, update the ones still seen,
    resolve the ones that disappeared; store the report and the job status.

    `last_seen_ns`: the newest snapshot time the diagnosis holds (the job row's never moves back).
    With `ended_at_ns` the job has ended: every open finding this diagnosis (made as of the end)
    still sees is closed at that time with resolution `ended`, its data (elapsed times) as of the
    end; the others resolve as usual; one it sees for the first time is stored closed (`ended`)
    at once, without an event (nothing pages for a job that is over). Without it, a job that had
    ended is running again (a newer snapshot). An open finding whose key is in `keep` and that
    the diagnosis does not see stays as stored (a diagnosis that cannot judge it yet)."""
    current: dict[FindingKey, Finding] = {}
    for f in findings:
        current.setdefault(finding_key(f), f)  # identical identities in one report: keep the first
    existing = {finding_row_key(r): r for r in open_findings(session=session, job_id=job_id)}
    events: list[FindingEvent] = []
    for key, row in existing.items():
        seen = current.get(key)
        if ended_at_ns is not None and seen is not None:
            row.data = seen.to_json()
            row.resolved_at_ns = max(ended_at_ns, row.opened_at_ns)
            row.updated_at_ns = now_ns
            row.resolution = RESOLUTION_ENDED
            events.append(FindingEvent("finding.resolved", row.id, row.kind, row.data))
        elif seen is None and key in keep:
            continue
        elif seen is None:
            row.resolved_at_ns = now_ns
            row.updated_at_ns = now_ns
            events.append(FindingEvent("finding.resolved", row.id, row.kind, row.data))
        else:
            row.data = seen.to_json()
            row.updated_at_ns = now_ns
    new_rows = []
    closed: set[FindingKey] = set()
    if ended_at_ns is not None:
        q = select(FindingRow.kind, FindingRow.group_key, FindingRow.seq_key, FindingRow.rank_key).where(
            FindingRow.job_id == job_id, FindingRow.resolution == RESOLUTION_ENDED
        )
        closed = {(k, g, sq, r) for k, g, sq, r in session.execute(q).tuples()}
    for key, f in current.items():
        if key in existing or key in closed:
            continue
        kind, group_key, seq_key, rank_key = key
        # What only the end's diagnosis saw (a job whose whole history arrived after it ended)
        # is kept, closed as ended at once, and pages nobody (no event).
        row = FindingRow(
            job_id=job_id,
            kind=kind,
            group_key=group_key,
            seq_key=seq_key,
            rank_key=rank_key,
            opened_at_ns=now_ns,
            updated_at_ns=now_ns,
            resolved_at_ns=None if ended_at_ns is None else now_ns,
            resolution=None if ended_at_ns is None else RESOLUTION_ENDED,
            data=f.to_json(),
        )
        session.add(row)
        if ended_at_ns is None:
            new_rows.append(row)
    session.flush()
    events.extend(FindingEvent("finding.opened", r.id, r.kind, r.data) for r in new_rows)
    values: dict[str, Any] = {
        "report": report,
        "status": status,
        "diagnosed_at_ns": now_ns,
        "ended_at_ns": ended_at_ns,
    }
    session.execute(update(Job).where(Job.id == job_id).values(**values))
    if last_seen_ns is not None:
        session.execute(
            update(Job)
            .where(Job.id == job_id, Job.last_seen_ns < last_seen_ns)
            .values(last_seen_ns=last_seen_ns)
        )
    return events
