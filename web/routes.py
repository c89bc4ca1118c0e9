"""The HTML pages: a read-only FastAPI router over a `WebData`.

    app.include_router(make_router(data, WebSettings()))

Each page is one template; an htmx request (header `HX-Request`) gets one named block of the same
template, chosen by the `HX-Target` element id (see `_FRAGMENTS`). `?format=json` returns the view
model the page was rendered from: every HTML page has a JSON twin.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import hashlib
import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flightdeck.limits import INT64_MAX, MAX_JOB
from flightdeck.params import (
    GroupQuery,
    GroupRequired,
    JobParam,
    RankPath,
    RankRequired,
    SeqQuery,
    SeqRequired,
)
from flightdeck.web import runbook, views
from flightdeck.web.data import EntryLike, RankDetail, WebData
from flightdeck.web.render import STATIC, make_env, render

#: The Content-Security-Policy of every page: no inline script or style, nothing from elsewhere.
CSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'"
SECURITY_HEADERS: dict[str, str] = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}

#: Per page template: htmx target id -> block; the first is the default for other htmx requests.
_FRAGMENTS: dict[str, tuple[str, ...]] = {
    "jobs.html": ("jobs",),
    "job.html": ("live", "timeline"),
    "cell.html": ("cell",),
    "rank.html": ("rank",),
    "nixl.html": ("agents",),
    "runbook.html": ("main",),
}

_STATIC_TYPES = {
    "htmx.min.js": "text/javascript; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "web.css": "text/css; charset=utf-8",
}


@dataclass(frozen=True, slots=True)
class RunbookView:
    """The runbook page: its body, rendered from Markdown with every text escaped."""

    body: str


@dataclass(frozen=True, slots=True)
class WebSettings:
    """Settings of the web pages (the server maps its `FLIGHTDECK_SERVER_WEB_*` settings onto these)."""

    #: When set, every page needs `Authorization: Bearer <token>` (or this token as the basic-auth
    #: password, which is what a browser can send). None: no login, for a trusted network.
    token: str | None = None
    #: When set together with `basic_password`, HTTP basic auth with this user is accepted.
    basic_user: str | None = None
    basic_password: str | None = None
    #: Path prefix the router is mounted under (e.g. "/ui"), for links; "" at the root.
    base_path: str = ""
    #: Collectives per timeline page.
    columns: int = views.DEFAULT_COLUMNS

    def __post_init__(self) -> None:
        if self.token is not None and len(self.token) < 16:
            raise ValueError("token must be at least 16 characters")
        if (self.basic_user is None) != (self.basic_password is None):
            raise ValueError("basic_user and basic_password go together")
        if self.base_path and (not self.base_path.startswith("/") or self.base_path.endswith("/")):
            raise ValueError("base_path must start with '/' and not end with '/'")
        if not 1 <= self.columns <= 500:
            raise ValueError("columns must be in 1..500")

    @property
    def login_required(self) -> bool:
        """Whether any credential is configured."""
        return self.token is not None or self.basic_user is not None


class SecurityHeadersMiddleware:
    """Pure ASGI middleware adding `SECURITY_HEADERS` to every HTTP response that lacks them.

    The router already sets them on its own responses; add this to the app to cover the rest
    (`app.add_middleware(SecurityHeadersMiddleware)`).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                have = {k.lower() for k, _ in headers}
                for k, v in SECURITY_HEADERS.items():
                    if k.lower().encode() not in have:
                        headers.append((k.lower().encode(), v.encode()))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _auth_dependency(settings: WebSettings) -> Callable[[Request], None]:
    """A dependency refusing requests without the configured credentials (constant-time compare)."""

    def check(request: Request) -> None:
        if not settings.login_required:
            return
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and settings.token is not None and _same(value, settings.token):
            return
        if scheme.lower() == "basic":
            try:
                user, _, password = base64.b64decode(value, validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                user, password = "", ""
            if settings.token is not None and _same(password, settings.token):
                return
            if (
                settings.basic_user is not None
                and settings.basic_password is not None
                and _same(user, settings.basic_user)
                and _same(password, settings.basic_password)
            ):
                return
        raise HTTPException(
            status_code=401,
            detail="login required",
            headers={"WWW-Authenticate": 'Basic realm="flightdeck", charset="UTF-8"', **SECURITY_HEADERS},
        )

    return check


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


#: What an error page is titled, by status (anything else: "Error").
_ERROR_TITLES = {
    400: "Bad request",
    401: "Login required",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    422: "Bad request",
}


@functools.cache
def _env(base_path: str) -> Any:
    """The pages' template environment for a base path (one per path: the error handlers and
    every router under it share it)."""
    env = make_env()
    env.globals["url"] = lambda path: base_path + path
    return env


def error_page(
    status_code: int, detail: str, *, headers: Mapping[str, str] | None = None, base_path: str = ""
) -> HTMLResponse:
    """The HTML answer of a page that failed (404, a bad filter, a login): a page of the dashboard
    with the reason, not the JSON body the API gives. `headers` (e.g. WWW-Authenticate) are kept."""
    view = {"status": status_code, "title": _ERROR_TITLES.get(status_code, "Error"), "detail": detail}
    html = render(_env(base_path), "error.html", {"v": view, "here": base_path + "/"})
    all_headers = {**SECURITY_HEADERS, "Cache-Control": "no-store", **(headers or {})}
    return HTMLResponse(html, status_code=status_code, headers=all_headers)


def _jsonable(obj: Any) -> Any:
    """A view model as JSON-able data (dataclasses, sets and tuples included)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, set | frozenset):
        return sorted(_jsonable(v) for v in obj)
    return obj


def make_router(data: WebData, settings: WebSettings | None = None) -> APIRouter:
    """The HTML pages over `data`. Read-only: every route is a GET."""
    cfg = settings or WebSettings()
    env = _env(cfg.base_path)
    static = {name: (STATIC / name).read_bytes() for name in _STATIC_TYPES}
    etags = {name: '"' + hashlib.sha256(body).hexdigest()[:16] + '"' for name, body in static.items()}
    router = APIRouter(dependencies=[Depends(_auth_dependency(cfg))], include_in_schema=False)

    def fragment_etag(request: Request, version: str) -> str:
        # One page of one version, as this request asks for it (query, whole page or fragment).
        key = "\x00".join(
            (
                version,
                str(request.url.query),
                request.headers.get("hx-request", ""),
                request.headers.get("hx-target", ""),
            )
        )
        return '"' + hashlib.sha256(key.encode()).hexdigest()[:24] + '"'

    def page(
        request: Request, template: str, view: Any, *, status_code: int = 200, etag: str | None = None
    ) -> Response:
        if request.query_params.get("format") == "json":
            return JSONResponse(_jsonable(view), status_code=status_code, headers=SECURITY_HEADERS)
        # The decoded path, quoted again: a job id may hold "?", "#", "%" or spaces.
        ctx = {"v": view, "here": cfg.base_path + quote(request.scope["path"]) + _query(request)}
        block = None
        if request.headers.get("hx-request") == "true":
            names = _FRAGMENTS[template]
            target = request.headers.get("hx-target", "")
            block = target if target in names else names[0]
        html = render(env, template, ctx, block)
        return HTMLResponse(html, status_code=status_code, headers=_page_headers(etag))

    @router.get("/", response_class=HTMLResponse)
    def jobs_page(
        request: Request,
        status: Annotated[str, Query(max_length=16)] = "",
        q: Annotated[str, Query(max_length=MAX_JOB)] = "",
        before: Annotated[str, Query(max_length=32, pattern=r"^([0-9]{1,19}\.[0-9]{1,10})?$")] = "",
    ) -> Response:
        # An unknown status (an old bookmark) filters nothing rather than failing the page.
        status = status if status in views.FILTER_STATUSES else ""
        jobs = data.list_jobs(
            status=status or None, search=q.strip() or None, before=before or None, limit=views.JOBS_PAGE
        )
        return page(
            request, "jobs.html", views.jobs_view(jobs, status=status, search=q.strip(), page=views.JOBS_PAGE)
        )

    @router.get("/nixl", response_class=HTMLResponse)
    def nixl_page(request: Request) -> Response:
        return page(request, "nixl.html", views.nixl_view(data.nixl_agents()))

    @router.get("/runbook", response_class=HTMLResponse)
    def runbook_page(request: Request) -> Response:
        # Every alert's runbook_url points here by default (`#<alert name>`): see web/runbook.py.
        return page(request, "runbook.html", RunbookView(body=runbook.page_html()))

    @router.get("/static/{name}")
    def static_file(name: str, request: Request) -> Response:
        # A fixed set of files read at start-up: no path from the URL ever reaches the filesystem.
        if name not in static:
            raise HTTPException(status_code=404, detail="no such file")
        headers = {**SECURITY_HEADERS, "ETag": etags[name], "Cache-Control": "no-cache"}
        if request.headers.get("if-none-match") == etags[name]:
            return Response(status_code=304, headers=headers)
        return Response(static[name], media_type=_STATIC_TYPES[name], headers=headers)

    @router.get("/jobs/{job:path}/cell", response_class=HTMLResponse)
    def cell_page(
        request: Request, job: JobParam, group: GroupRequired, seq: SeqRequired, rank: RankRequired
    ) -> Response:
        report = data.job_report(job)
        if report is None:
            raise HTTPException(status_code=404, detail="no such job")
        timeline = data.timeline(job, group=group, ranks=None, seqs=(seq, seq))
        if not any(t.rank == rank for t in timeline.ranks):
            raise HTTPException(status_code=404, detail="no such rank")
        # Ranks that never entered this seq: fetch their latest entry in the group, and stacks.
        last: dict[int, EntryLike] = {}
        details: dict[int, RankDetail] = {}
        culprits = {
            int(r)
            for f in report.get("findings") or []
            if str(f.get("process_group")) == group and f.get("collective_seq_id") == seq
            for r in f.get("culprit_ranks") or []
        }
        for t in timeline.ranks:
            if t.rank != rank and t.rank not in culprits:
                continue
            held = any(views.seq_of(e) == seq for e in t.entries)
            if not held and t.last_seq is not None:
                tail = data.timeline(job, group=group, ranks=[t.rank], seqs=(t.last_seq, t.last_seq))
                if tail.ranks and tail.ranks[0].entries:
                    last[t.rank] = tail.ranks[0].entries[-1]
            d = data.rank_detail(job, t.rank)
            if d is not None:
                details[t.rank] = d
        view = views.cell_view(
            report, timeline, job=job, group=group, seq=seq, rank=rank, last_entries=last, details=details
        )
        return page(request, "cell.html", view)

    @router.get("/jobs/{job:path}/ranks/{rank:int}", response_class=HTMLResponse)
    def rank_page(request: Request, job: JobParam, rank: RankPath) -> Response:
        report = data.job_report(job)
        detail = None if report is None else data.rank_detail(job, rank)
        if report is None or detail is None:
            raise HTTPException(status_code=404, detail="no such job or rank")
        return page(request, "rank.html", views.rank_view(report, detail, job=job))

    # Job ids may hold "/" (`{job:path}`), so the job page is matched after its sub-pages: it
    # would otherwise take ".../cell" and ".../ranks/3" for part of the id.
    @router.get("/jobs/{job:path}", response_class=HTMLResponse)
    def job_page(
        request: Request,
        job: JobParam,
        group: GroupQuery = None,
        start: SeqQuery = None,
        ranks: str = Query(default="", max_length=2000),
        expand: str = Query(default="", max_length=20000),
        view: Literal["seq", "time"] = "seq",
    ) -> Response:
        # A poll of a job that has not changed is answered from its version alone: the browser
        # revalidates (Cache-Control: no-cache) and keeps what it has on a 304.
        version = data.job_version(job) if request.query_params.get("format") != "json" else None
        etag = None if version is None else fragment_etag(request, version)
        if etag is not None and etag in request.headers.get("if-none-match", ""):
            return Response(status_code=304, headers=_page_headers(etag))
        report, meta = data.job_report(job), data.job_meta(job)
        if report is None or meta is None:
            raise HTTPException(status_code=404, detail="no such job")
        try:
            rank_set = views.parse_ranks(ranks)
            expanded = [int(x) for x in expand.split(",") if x.strip()]
            if any(not 0 <= x <= INT64_MAX for x in expanded):
                raise ValueError("expand: a sequence id out of range")
        except ValueError as exc:
            raise HTTPException(status_code=400, detail=f"bad filter: {exc}") from None
        group = group or views.default_group(report, meta)
        gmeta = next((g for g in meta.get("groups") or [] if str(g.get("name")) == group), None)
        window = None
        if gmeta is not None and gmeta.get("max_seq") is not None:
            incident = views.incident_finding(report, group)
            window = views.plan_window(
                min_seq=int(gmeta["min_seq"]),
                max_seq=int(gmeta["max_seq"]),
                stuck_seq=None if incident is None else int(incident["collective_seq_id"]),
                start=start,
                size=cfg.columns,
            )
        timeline = data.timeline(
            job,
            group=group,
            ranks=None if rank_set is None else sorted(rank_set),
            seqs=None if window is None else (window.first, window.last),
            detail="spans" if view == "time" else "cells",
        )
        model = views.job_view(
            report,
            meta,
            timeline,
            group=group,
            window=window,
            rank_filter=ranks.strip(),
            expand=expanded,
            view=view,
        )
        return page(request, "job.html", model, etag=etag)

    return router


def _page_headers(etag: str | None) -> dict[str, str]:
    # Vary: the same URL answers with a whole page or a fragment depending on HX-Request. A page
    # with a version is revalidated on every use (no-cache) and kept by this browser only
    # (private); one without is not stored at all.
    headers = {**SECURITY_HEADERS, "Vary": "HX-Request, HX-Target"}
    if etag is None:
        headers["Cache-Control"] = "no-store"
    else:
        headers["Cache-Control"] = "private, no-cache"
        headers["ETag"] = etag
    return headers


def _query(request: Request) -> str:
    # The polling URL repeats the page's own query (minus a JSON switch), so a refresh keeps
    # the page, filter and expanded rows the reader chose.
    items = [(k, v) for k, v in request.query_params.multi_items() if k != "format"]
    return "?" + urlencode(items) if items else ""
