"""HTTP routes: ingest, the JSON read API, /metrics and /healthz (OpenAPI docs at /docs while reads
are open; the admin API is `admin`)."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from flightdeck.analysis.diagnose import missing_ranks
from flightdeck.limits import MAX_JOB
from flightdeck.nixl_rates import RATE_WINDOW_S, window_stats
from flightdeck.params import AttemptQuery, GroupQuery, JobParam, RankQuery, SeqQuery
from flightdeck.server import store
from flightdeck.server.access import check_read
from flightdeck.server.digests import DIGEST_PATH, digest_request
from flightdeck.server.errors import NotFoundError
from flightdeck.server.ingest_http import INGEST_PATH, ingest_request
from flightdeck.server.models import JOB_STATUSES, FindingRow, Job
from flightdeck.server.services import Services

NS = 1_000_000_000

router = APIRouter()


async def services_dep(request: Request) -> Services:
    """The process's services (one per app). Async: FastAPI runs a plain function dependency in
    its thread pool, a thread hop per request for an attribute read."""
    svc: Services = request.app.state.services
    return svc


ServicesDep = Annotated[Services, Depends(services_dep)]


async def read_auth(request: Request, svc: ServicesDep) -> None:
    """Require a token that may read when `require_read_token` is set (see `access`)."""
    if svc.settings.require_read_token:
        await run_in_threadpool(check_read, svc.settings, svc.ingest, request.headers.get("authorization"))


ReadAuth = Depends(read_auth)


def _s(ns: int | None) -> float | None:
    return None if ns is None else round(ns / NS, 3)


# --- ingest --------------------------------------------------------------------------------------


@router.post(INGEST_PATH, tags=["ingest"], summary="Push a batch of snapshots (flightdeck.wire format)")
async def ingest(request: Request, svc: ServicesDep) -> dict[str, Any]:
    """Apply one batch (JSON, optionally gzip); idempotent by batch_id. Needs a collector token.

    Served by `ingest_http.IngestEndpoint` in front of the app, with the same function."""
    return await ingest_request(svc, request.headers, request.stream(), time.perf_counter())


@router.post(DIGEST_PATH, tags=["ingest"], summary="Push progress digests (flightdeck.digest format)")
async def digest(request: Request, svc: ServicesDep) -> dict[str, Any]:
    """Fold a collector's per-rank progress digests in; the answer names the jobs whose entries the
    collector is to ship now. Served by `ingest_http.IngestEndpoint` in front of the app, with the
    same function."""
    return await digest_request(svc, request.headers, request.stream())


# --- read API ------------------------------------------------------------------------------------


def _read(svc: Services) -> Session:
    return svc.db.read()


def _job_or_404(session: Session, job: str, attempt: int | None) -> Job:
    row = store.get_job(session=session, name=job, attempt=attempt)
    if row is None:
        raise NotFoundError(f"no job {job!r}" + (f" attempt {attempt}" if attempt is not None else ""))
    return row


def _job_summary(j: Job, open_count: int) -> dict[str, Any]:
    return {
        "job": j.name,
        "attempt": j.attempt,
        "status": j.status,
        "world_size": j.world_size,
        "first_seen_s": _s(j.first_seen_ns),
        "last_seen_s": _s(j.last_seen_ns),
        "diagnosed_at_s": _s(j.diagnosed_at_ns),
        "ended_at_s": _s(j.ended_at_ns),
        "open_findings": open_count,
    }


#: Query parameters of the job list: a status, a part of the job name, a page.
StatusQuery = Annotated[str | None, Query(pattern="^(" + "|".join(JOB_STATUSES) + ")$")]
SearchQuery = Annotated[str | None, Query(min_length=1, max_length=MAX_JOB)]
#: `<last_seen_ns>.<id>` of the last job of the previous page (the `Link: rel="next"` header).
BeforeQuery = Annotated[str | None, Query(pattern=r"^[0-9]{1,19}\.[0-9]{1,10}$")]
LimitQuery = Annotated[int, Query(ge=1, le=1000)]


def job_cursor(j: Job) -> str:
    """The `before` value of the page after `j`."""
    return f"{j.last_seen_ns}.{j.id}"


def parse_cursor(before: str | None) -> tuple[int, int] | None:
    """`job_cursor`'s value back (already checked by `BeforeQuery`'s pattern)."""
    if before is None:
        return None
    seen, _, job_id = before.partition(".")
    return int(seen), int(job_id)


def _finding_json(r: FindingRow) -> dict[str, Any]:
    return {
        "id": r.id,
        "kind": r.kind,
        "open": r.resolved_at_ns is None,
        "opened_at_s": _s(r.opened_at_ns),
        "updated_at_s": _s(r.updated_at_ns),
        "resolved_at_s": _s(r.resolved_at_ns),
        # "ended": closed because its job ended with it open (elapsed frozen at the end).
        "resolution": r.resolution,
        "finding": r.data,
    }


@router.get("/api/v1/jobs", tags=["jobs"], dependencies=[ReadAuth])
def list_jobs(
    svc: ServicesDep,
    request: Request,
    response: Response,
    status: StatusQuery = None,
    q: SearchQuery = None,
    before: BeforeQuery = None,
    limit: LimitQuery = 200,
) -> list[dict[str, Any]]:
    """Job attempts with their status (and when they ended), most recently seen first: of one
    `status`, whose name contains `q` (case-insensitive); `limit` per page, the next page at the
    URL of the `Link: <...>; rel="next"` header."""

    with _read(svc) as session:
        jobs = store.list_jobs(
            session=session, status=status, name=q, before=parse_cursor(before), limit=limit + 1
        )
        more, jobs = len(jobs) > limit, jobs[:limit]
        counts = store.open_finding_counts(session=session, job_ids=[j.id for j in jobs])
        if more:
            nxt = request.url.include_query_params(before=job_cursor(jobs[-1]))
            response.headers["Link"] = f'<{nxt}>; rel="next"'
        return [_job_summary(j, counts.get(j.id, 0)) for j in jobs]


@router.get("/api/v1/jobs/{job:path}/findings", tags=["jobs"], dependencies=[ReadAuth])
def get_findings(svc: ServicesDep, job: JobParam, attempt: AttemptQuery = None) -> dict[str, Any]:
    """Every finding episode of the job, open and resolved, with when it opened and resolved."""

    with _read(svc) as session:
        j = _job_or_404(session, job, attempt)
        rows = store.findings_history(session=session, job_id=j.id)
        return {"job": j.name, "attempt": j.attempt, "findings": [_finding_json(r) for r in rows]}


@router.get("/api/v1/jobs/{job:path}/timeline", tags=["jobs"], dependencies=[ReadAuth])
def get_timeline(
    svc: ServicesDep,
    job: JobParam,
    attempt: AttemptQuery = None,
    group: GroupQuery = None,
    rank_from: RankQuery = None,
    rank_to: RankQuery = None,
    seq_from: SeqQuery = None,
    seq_to: SeqQuery = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> dict[str, Any]:
    """The job's entries in a window (inclusive bounds), by process group, sequence id and rank."""

    with _read(svc) as session:
        j = _job_or_404(session, job, attempt)
        entries = store.timeline(
            session=session,
            job_id=j.id,
            group=group,
            rank_from=rank_from,
            rank_to=rank_to,
            seq_from=seq_from,
            seq_to=seq_to,
            limit=limit,
        )
        return {"job": j.name, "attempt": j.attempt, "entries": entries}


# Job names may hold "/" (`{job:path}`): this route comes after the sub-routes, which would
# otherwise be read as part of the name.
@router.get("/api/v1/jobs/{job:path}", tags=["jobs"], dependencies=[ReadAuth])
def get_job(svc: ServicesDep, job: JobParam, attempt: AttemptQuery = None) -> dict[str, Any]:
    """The job's status and its open findings, in the shape of `flightdeck analyze --format json`
    (`healthy`, `job`, `now_s`, `ranks`, `findings`, `warnings`) plus `status` and `attempt`."""

    with _read(svc) as session:
        j = _job_or_404(session, job, attempt)
        report = j.report
        if report is None:
            ranks = [r.rank for r, _ in store.job_ranks(session=session, job_id=j.id)]
            expected = j.world_size or (max(ranks) + 1 if ranks else 0)
            without, missing = missing_ranks(ranks, expected)
            report = {
                "healthy": True,
                "job": j.name,
                "now_s": _s(j.last_seen_ns),
                "ranks": {
                    "expected": expected,
                    "with_dump": ranks,
                    "without_dump": without,
                    "without_dump_count": missing,
                },
                "findings": [],
                "warnings": [],
            }
        # An ended job's report is its verdict at the end; its findings are closed (`ended`).
        open_count = 0 if j.ended_at_ns is not None else len(report["findings"])
        return {**report, **_job_summary(j, open_count)}


@router.get("/api/v1/nixl/agents", tags=["nixl"], dependencies=[ReadAuth])
def get_nixl_agents(svc: ServicesDep) -> list[dict[str, Any]]:
    """Every NIXL agent with its latest sample, its counters summed over restarts, and `window`:
    its rates, new errors and transfer-time quantiles over the last `RATE_WINDOW_S` of samples
    (null until two samples are kept)."""

    with _read(svc) as session:
        history = store.nixl_history(session=session, window_ns=int(RATE_WINDOW_S * NS))
        out = []
        for a in store.nixl_agents(session=session):
            window = window_stats([*history.get(a.id, []), a.sample])
            out.append(
                {
                    "host": a.host,
                    "agent": a.agent,
                    "source": a.source,
                    "pid": a.pid,
                    "local_rank": a.local_rank,
                    "run": a.run,
                    "read_time_s": _s(a.read_time_ns),
                    "totals": store.nixl_totals(a),
                    "latest": a.sample,
                    "window": None if window is None else window.to_json(),
                }
            )
        return out


# --- operations ----------------------------------------------------------------------------------


@router.get("/metrics", tags=["operations"], response_class=Response, dependencies=[ReadAuth])
def metrics(svc: ServicesDep) -> Response:
    """Prometheus metrics (see docs/metrics.md)."""
    return Response(generate_latest(svc.registry), media_type=CONTENT_TYPE_LATEST)


@router.get(
    "/healthz",
    tags=["operations"],
    responses={503: {"description": "database unreachable, or its schema missing or not this version's"}},
)
def healthz(svc: ServicesDep, response: Response) -> dict[str, str]:
    """Liveness, database reachability and schema version: 200 when the database answers and
    its schema is the one this server needs, else 503 with the reason."""
    try:
        problem = svc.schema.check(force=True)
    except OperationalError:
        raise svc.db_unavailable() from None
    if problem is not None:
        response.status_code = 503
        return {"status": "unavailable", "database": svc.db.dialect, "reason": problem}
    return {"status": "ok", "database": svc.db.dialect}
